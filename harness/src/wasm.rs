//! Building the filter: `cargo build --release --target wasm32-wasip1 -p pinroute`, and the
//! same filter as a native Envoy dynamic module.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::envoy::{default_wasm_path, native, repo_root};

pub const TARGET: &str = "wasm32-wasip1";

/// Adds the wasm target to the active toolchain when it is missing.
pub fn ensure_target() -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("running rustup (is the Rust toolchain installed with rustup?)")?;
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|t| t.trim() == TARGET)
    {
        return Ok(());
    }
    log::info!("adding the Rust target {TARGET}");
    run(Command::new("rustup").args(["target", "add", TARGET]))
}

/// Builds the release filter and returns the path of `pinroute.wasm`.
pub fn build_filter() -> Result<PathBuf> {
    build_package("pinroute")?;
    let wasm = default_wasm_path();
    let size = std::fs::metadata(&wasm)
        .with_context(|| format!("{} was not built", wasm.display()))?
        .len();
    log::info!("built {} ({size} bytes)", wasm.display());
    Ok(wasm)
}

/// Builds the filter as a native Envoy dynamic module and returns the path of
/// `libpinroute.so` (`crate::envoy::native`).
pub fn build_native_module() -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(Command::new(cargo).current_dir(repo_root()).args([
        "build",
        "--profile",
        native::PROFILE,
        "-p",
        "pinroute",
        "--features",
        "dynamic-module",
    ]))?;
    let module = native::default_module_path();
    anyhow::ensure!(module.exists(), "{} was not built", module.display());
    log::info!("built {}", module.display());
    Ok(module)
}

/// Builds the test host's own filter (`tests/testfilter`) and returns its path.
pub fn build_test_filter() -> Result<PathBuf> {
    build_package("pinroute-testfilter")?;
    Ok(repo_root()
        .join("target")
        .join(TARGET)
        .join("release/pinroute_testfilter.wasm"))
}

fn build_package(package: &str) -> Result<()> {
    ensure_target()?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(Command::new(cargo).current_dir(repo_root()).args([
        "build",
        "--release",
        "--target",
        TARGET,
        "-p",
        package,
    ]))
}

pub fn run(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed: {status}");
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::envoy::test_support::real_wasm;

    /// The first `about N KB` of `text` (another `about`, of GB say, is passed over).
    fn documented_kb(text: &str) -> Option<f64> {
        text.split("about ").skip(1).find_map(|after| {
            let (number, rest) = after.split_once(' ')?;
            rest.starts_with("KB").then(|| number.parse().ok())?
        })
    }

    #[test]
    fn the_documented_size_is_the_first_in_kb() {
        let text = "needs about 12 GB of disk; the filter (about 840 KB) and about 3 KB more";
        assert_eq!(documented_kb(text), Some(840.0));
        assert_eq!(documented_kb("about 12 GB only"), None);
    }

    /// The README and docs/deploy.md give the filter's size: true to a tenth.
    #[test]
    fn the_documented_filter_size_is_true() {
        let Some(wasm) = real_wasm() else { return };
        let built_kb = std::fs::metadata(wasm).unwrap().len() as f64 / 1000.0;
        for (doc, text) in [
            ("README.md", include_str!("../../README.md")),
            ("docs/deploy.md", include_str!("../../docs/deploy.md")),
        ] {
            let kb = documented_kb(text).unwrap();
            assert!(
                (built_kb - kb).abs() <= kb / 10.0,
                "{doc} says about {kb} KB; the filter is {built_kb} KB"
            );
        }
    }
}

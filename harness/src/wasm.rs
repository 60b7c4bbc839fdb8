//! Building the filter: `cargo build --release --target wasm32-wasip1 -p pinroute`.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::envoy::{default_wasm_path, repo_root};

pub const TARGET: &str = "wasm32-wasip1";

/// Adds the wasm target to the active toolchain when it is missing.
pub fn ensure_target() -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("running rustup (is the Rust toolchain installed with rustup?)")?;
    if String::from_utf8_lossy(&installed.stdout).lines().any(|t| t.trim() == TARGET) {
        return Ok(());
    }
    log::info!("adding the Rust target {TARGET}");
    run(Command::new("rustup").args(["target", "add", TARGET]))
}

/// Builds the release filter and returns the path of `pinroute.wasm`.
pub fn build_filter() -> Result<PathBuf> {
    ensure_target()?;
    let root = repo_root();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(Command::new(cargo)
        .current_dir(&root)
        .args(["build", "--release", "--target", TARGET, "-p", "pinroute"]))?;
    let wasm = default_wasm_path();
    let size = std::fs::metadata(&wasm).with_context(|| format!("{} was not built", wasm.display()))?.len();
    log::info!("built {} ({size} bytes)", wasm.display());
    Ok(wasm)
}

pub fn run(command: &mut Command) -> Result<()> {
    let status = command.status().with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed: {status}");
    }
    Ok(())
}

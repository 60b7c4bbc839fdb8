//! The Python baseline proxy (`harness/lab/python/disagg_proxy.py`, FastAPI + httpx) in its own
//! venv, `.cache/bench-venv`, installed from `harness/lab/python/bench-requirements.txt`.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::child::ServingChild;
use super::sims::SimAddresses;
use pinroute_harness::venv::{lock_file, pip_install, run_visibly};

pub const VENV_DIR: &str = ".cache/bench-venv";
const REQUIREMENTS: &str = "harness/lab/python/bench-requirements.txt";
const PROXY_SCRIPT: &str = "harness/lab/python/disagg_proxy.py";
/// Written into the venv once the requirements are installed: a copy of them.
const STAMP: &str = "bench-requirements.installed";

/// The venv's python, with the requirements installed (creating the venv on first use).
pub fn bench_python(repo_root: &Path) -> Result<PathBuf> {
    let venv = repo_root.join(VENV_DIR);
    let requirements_path = repo_root.join(REQUIREMENTS);
    let requirements = fs::read_to_string(&requirements_path)
        .with_context(|| format!("reading {}", requirements_path.display()))?;
    let python = venv.join("bin/python");
    let stamp = venv.join(STAMP);
    if python.is_file() && fs::read_to_string(&stamp).is_ok_and(|s| s == requirements) {
        return Ok(python);
    }
    let _lock = lock_file(&venv)?;
    if !python.is_file() {
        eprintln!("pinroute-lab: python3 -m venv {}", venv.display());
        run_visibly(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    }
    eprintln!(
        "pinroute-lab: pip install -r {REQUIREMENTS} into {}",
        venv.display()
    );
    run_visibly(pip_install(&python).arg("-r").arg(&requirements_path))?;
    fs::write(&stamp, requirements).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(python)
}

/// The running proxy; killed when dropped.
pub struct PythonProxy(ServingChild);

impl PythonProxy {
    pub async fn start(
        python: &Path,
        repo_root: &Path,
        sims: &SimAddresses,
        work_dir: &Path,
    ) -> Result<Self> {
        let address = pinroute_harness::stack::refusing_address()?;
        let mut command = Command::new(python);
        command
            .arg(repo_root.join(PROXY_SCRIPT))
            .args(["--listen", &address.to_string()])
            .args(["--prefill", &sims.prefill.to_string()])
            .args(["--decode", &sims.decode.to_string()]);
        let log = work_dir.join("python-proxy.log");
        let child = ServingChild::start(&mut command, address, &log, "the Python proxy").await?;
        Ok(PythonProxy(child))
    }

    pub fn pid(&self) -> u32 {
        self.0.pid()
    }

    pub fn address(&self) -> SocketAddr {
        self.0.address()
    }
}

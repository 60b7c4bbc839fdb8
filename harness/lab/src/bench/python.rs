//! The Python baseline proxy (`harness/lab/python/disagg_proxy.py`, FastAPI + httpx) in its own
//! venv, `.cache/bench-venv`, installed from `harness/lab/python/bench-requirements.txt`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;

use super::child::ServingChild;
use super::sims::SimAddresses;
use pinroute_harness::venv::python_with;

pub const VENV_DIR: &str = ".cache/bench-venv";
const REQUIREMENTS: &str = "harness/lab/python/bench-requirements.txt";
const PROXY_SCRIPT: &str = "harness/lab/python/disagg_proxy.py";

/// The venv's python, with the requirements installed (creating the venv on first use).
pub fn bench_python(repo_root: &Path) -> Result<PathBuf> {
    python_with(&repo_root.join(VENV_DIR), &repo_root.join(REQUIREMENTS))
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

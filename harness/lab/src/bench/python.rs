//! The Python baseline proxy (`harness/lab/python/disagg_proxy.py`, FastAPI + httpx) in its own
//! venv, `.cache/bench-venv`, installed from `harness/lab/python/bench-requirements.txt`.

use std::fs::{self, File};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use super::child::{stop, wait_until_serving};
use super::sims::SimAddresses;
use pinroute_harness::venv::{lock_file, pip_install, run_visibly};

pub const VENV_DIR: &str = ".cache/bench-venv";
const REQUIREMENTS: &str = "harness/lab/python/bench-requirements.txt";
const PROXY_SCRIPT: &str = "harness/lab/python/disagg_proxy.py";
/// Written into the venv once the requirements are installed: a copy of them.
const STAMP: &str = "bench-requirements.installed";
const READY_TIMEOUT: Duration = Duration::from_secs(30);

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
pub struct PythonProxy {
    child: Child,
    address: SocketAddr,
}

impl PythonProxy {
    pub async fn start(
        python: &Path,
        repo_root: &Path,
        sims: &SimAddresses,
        work_dir: &Path,
    ) -> Result<Self> {
        let address = pinroute_harness::stack::refusing_address()?;
        let log_path = work_dir.join("python-proxy.log");
        let log =
            File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let child = Command::new(python)
            .arg(repo_root.join(PROXY_SCRIPT))
            .args(["--listen", &address.to_string()])
            .args(["--prefill", &sims.prefill.to_string()])
            .args(["--decode", &sims.decode.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("sharing the proxy log")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {PROXY_SCRIPT}"))?;
        let mut proxy = PythonProxy { child, address };
        proxy.wait_ready(&log_path).await?;
        Ok(proxy)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    async fn wait_ready(&mut self, log_path: &Path) -> Result<()> {
        let url = format!("http://{}/health", self.address);
        wait_until_serving(
            &mut self.child,
            &url,
            READY_TIMEOUT,
            "the Python proxy",
            log_path,
        )
        .await
    }
}

impl Drop for PythonProxy {
    fn drop(&mut self) {
        stop(&mut self.child, "the Python proxy");
    }
}

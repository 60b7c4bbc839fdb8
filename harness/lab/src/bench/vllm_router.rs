//! vllm-router (`pip install vllm-router`, a Rust proxy shipped in a wheel) in its own venv,
//! `.cache/vllm-router-venv`, run in prefill/decode mode in front of the sim workers.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;

use super::child::ServingChild;
use pinroute_harness::stack::refusing_address;
use pinroute_harness::venv::python_installed;

pub const VENV_DIR: &str = ".cache/vllm-router-venv";
/// The release measured (`docs/benchmarks.md`).
pub const VERSION: &str = "0.1.17";

/// The venv's `vllm-router`, installed on first use.
pub fn router_binary(repo_root: &Path) -> Result<PathBuf> {
    let venv = repo_root.join(VENV_DIR);
    python_installed(&venv, VERSION, |pip| {
        pip.arg(format!("vllm-router=={VERSION}"))
    })?;
    Ok(venv.join("bin/vllm-router"))
}

/// vllm-router's selection policy for both pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Its default: an approximate radix tree of request text per worker, shortest queue
    /// when the load is out of balance.
    CacheAware,
    RoundRobin,
}

impl Policy {
    fn as_arg(self) -> &'static str {
        match self {
            Policy::CacheAware => "cache_aware",
            Policy::RoundRobin => "round_robin",
        }
    }
}

/// A running vllm-router; killed when dropped.
pub struct VllmRouter(ServingChild);

impl VllmRouter {
    /// Starts it in prefill/decode mode over these workers, with `threads` tokio workers
    /// (`None`: tokio's default, one per CPU), and waits until it serves.
    pub async fn start(
        binary: &Path,
        prefill: &[SocketAddr],
        decode: &[SocketAddr],
        policy: Policy,
        work_dir: &Path,
        threads: Option<u32>,
    ) -> Result<Self> {
        let address = refusing_address()?;
        let metrics = refusing_address()?;
        let log = work_dir.join(format!("vllm-router-{}.log", policy.as_arg()));
        let mut command = Command::new(binary);
        command.arg("--vllm-pd-disaggregation");
        for worker in prefill {
            command.args(["--prefill", &format!("http://{worker}")]);
        }
        for worker in decode {
            command.args(["--decode", &format!("http://{worker}")]);
        }
        command
            .args(["--policy", policy.as_arg()])
            .args(["--host", &address.ip().to_string()])
            .args(["--port", &address.port().to_string()])
            .args(["--prometheus-port", &metrics.port().to_string()])
            .args(["--worker-startup-check-interval", "1"])
            .args(["--worker-startup-timeout-secs", "60"])
            .args(["--health-check-interval-secs", "5"])
            .arg("--disable-circuit-breaker")
            // `warning` does not parse (and falls back to a log line per request).
            .args(["--log-level", "error"]);
        if let Some(threads) = threads {
            command.env("TOKIO_WORKER_THREADS", threads.to_string());
        }
        let child = ServingChild::start(&mut command, address, &log, "vllm-router").await?;
        Ok(VllmRouter(child))
    }

    pub fn pid(&self) -> u32 {
        self.0.pid()
    }

    pub fn address(&self) -> SocketAddr {
        self.0.address()
    }
}

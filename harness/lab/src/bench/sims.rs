//! The benchmark's workers: one prefill (id 101) and one decode (id 201) sim worker, in a
//! child process of their own so that their CPU time is measured apart from the load
//! generator's and they do not share its tokio runtime.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use pinroute_harness::sim::{SimConfig, SimRole, SimWorker};

pub const PREFILL_ID: u64 = 101;
pub const DECODE_ID: u64 = 201;
/// The sim workers record every request (for tests); the benchmark forgets them this often
/// so that a long run does not hoard its 256 KB prompts.
const FORGET_REQUESTS_EVERY: Duration = Duration::from_millis(200);
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Where the two workers listen (the first line the child prints).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimAddresses {
    pub prefill: SocketAddr,
    pub decode: SocketAddr,
}

/// The running child process; stopped when dropped.
pub struct SimProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    pub addresses: SimAddresses,
}

impl SimProcess {
    /// Starts `<this executable> bench --serve-sims` and waits for its addresses.
    pub async fn start(token_latency: Duration, log_path: &Path) -> Result<SimProcess> {
        let executable = std::env::current_exe().context("locating this executable")?;
        let log =
            File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let mut child = Command::new(executable)
            .args(["bench", "--serve-sims", "--token-latency-us"])
            .arg(token_latency.as_micros().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("starting the sim worker process")?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .context("no stdout of the sim worker process")?;
        let reading = tokio::task::spawn_blocking(move || first_line(stdout));
        let line = match tokio::time::timeout(START_TIMEOUT, reading).await {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => Err(anyhow::Error::from(e)),
            Err(_) => Err(anyhow::anyhow!("no addresses within {START_TIMEOUT:?}")),
        };
        let mut process = SimProcess {
            child,
            stdin,
            addresses: placeholder_addresses(),
        };
        let line =
            line.with_context(|| format!("sim worker process (log: {})", log_path.display()))?;
        process.addresses =
            serde_json::from_str(&line).with_context(|| format!("sim addresses {line:?}"))?;
        Ok(process)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

fn placeholder_addresses() -> SimAddresses {
    let none = SocketAddr::from(([127, 0, 0, 1], 0));
    SimAddresses {
        prefill: none,
        decode: none,
    }
}

fn first_line(stdout: std::process::ChildStdout) -> Result<String> {
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .context("reading the sim worker process")?;
    if line.trim().is_empty() {
        bail!("the sim worker process exited without printing its addresses");
    }
    Ok(line)
}

impl Drop for SimProcess {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let pid = self.child.id();
        if let Err(e) = self.child.kill() {
            log::debug!("stopping the sim worker process {pid}: {e}");
        }
        if let Err(e) = self.child.wait() {
            log::warn!("reaping the sim worker process {pid}: {e}");
        }
    }
}

/// The child side: serves both workers until its stdin closes (the parent went away).
pub async fn serve_sims(token_latency: Duration) -> Result<()> {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let prefill = SimConfig::new(PREFILL_ID, SimRole::Prefill).with_token_latency(token_latency);
    let decode = SimConfig::new(DECODE_ID, SimRole::Decode).with_token_latency(token_latency);
    let prefill = SimWorker::start(prefill, any).await?;
    let decode = SimWorker::start(decode, any).await?;
    let addresses = SimAddresses {
        prefill: prefill.addr(),
        decode: decode.addr(),
    };
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{}", serde_json::to_string(&addresses)?)
        .context("printing the sim addresses")?;
    stdout.flush().context("printing the sim addresses")?;
    let forget = tokio::spawn(async move {
        loop {
            tokio::time::sleep(FORGET_REQUESTS_EVERY).await;
            prefill.clear_requests();
            decode.clear_requests();
        }
    });
    let mut stdin = tokio::io::stdin();
    let mut buffer = [0u8; 64];
    while stdin
        .read(&mut buffer)
        .await
        .map(|n| n > 0)
        .unwrap_or(false)
    {}
    forget.abort();
    Ok(())
}

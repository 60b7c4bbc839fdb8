//! A proxy the benchmark runs as a child process: waiting until it serves, and stopping it.

use std::fs::File;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

const POLL_INTERVAL: Duration = Duration::from_millis(100);
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// A proxy serving HTTP on `address`, its output in a log; killed when dropped.
pub struct ServingChild {
    child: Child,
    address: SocketAddr,
    what: &'static str,
}

impl ServingChild {
    /// Starts `command` with its output in `log_path` and waits until `/health` answers.
    pub async fn start(
        command: &mut Command,
        address: SocketAddr,
        log_path: &Path,
        what: &'static str,
    ) -> Result<Self> {
        let log =
            File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(
                log.try_clone()
                    .with_context(|| format!("sharing {what}'s log"))?,
            )
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        let mut serving = ServingChild {
            child,
            address,
            what,
        };
        let url = format!("http://{address}/health");
        wait_until_serving(&mut serving.child, &url, READY_TIMEOUT, what, log_path).await?;
        Ok(serving)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for ServingChild {
    fn drop(&mut self) {
        stop(&mut self.child, self.what);
    }
}

/// Polls `url` until it answers 2xx, failing early if `child` exits; `log` is named in the
/// error.
pub async fn wait_until_serving(
    child: &mut Child,
    url: &str,
    timeout: Duration,
    what: &str,
    log: &Path,
) -> Result<()> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()?;
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited ({status}): {}", tail(log));
        }
        if http
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    bail!(
        "{what} did not answer {url} within {timeout:?}: {}",
        tail(log)
    )
}

/// Kills and reaps `child`.
pub fn stop(child: &mut Child, what: &str) {
    let pid = child.id();
    if let Err(e) = child.kill() {
        log::debug!("stopping {what} {pid}: {e}");
    }
    if let Err(e) = child.wait() {
        log::warn!("reaping {what} {pid}: {e}");
    }
}

/// The last lines of a log.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines
        .get(lines.len().saturating_sub(20)..)
        .unwrap_or_default()
        .join("\n")
}

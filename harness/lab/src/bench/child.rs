//! A proxy the benchmark runs as a child process: waiting until it serves, and stopping it.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

const POLL_INTERVAL: Duration = Duration::from_millis(100);

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

//! One running vLLM instance: its own process group (vLLM spawns an engine process), output in
//! a log file, health and Prometheus metrics over HTTP; the whole group is stopped on drop.

use std::fs::{self, File};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::commands::{EngineTls, PairRole, ServeCommand};
use super::metrics::counter_total;
use crate::tls_front::https_get;

/// What ZMQ raises when a port vLLM binds is taken.
const STARTUP_FAULT: &str = "Address already in use";

/// How long a stopped instance gets to exit after SIGTERM before its group is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);
const POLL_INTERVAL: Duration = Duration::from_millis(250);
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// A vLLM OpenAI server started from a [`ServeCommand`]; stopped (whole process group) on drop.
/// An [attached](VllmServer::attach) server was started elsewhere and is left alone.
#[derive(Debug)]
pub struct VllmServer {
    id: u64,
    role: PairRole,
    address: SocketAddr,
    log_path: PathBuf,
    process: Option<Started>,
    http: reqwest::Client,
    /// vLLM's own TLS, when the server serves HTTPS and requires a client certificate.
    tls: Option<EngineTls>,
}

#[derive(Debug)]
struct Started {
    child: Mutex<Child>,
    pid: u32,
}

fn http_client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(HTTP_TIMEOUT)
        .build()
        .context("building an HTTP client")
}

impl VllmServer {
    /// Starts `command` in a new process group with stdout and stderr in `log_path`. Returns
    /// at once: see [`VllmServer::wait_healthy`].
    pub fn spawn(
        id: u64,
        address: SocketAddr,
        command: &ServeCommand,
        log_path: &Path,
        tls: Option<&EngineTls>,
    ) -> Result<Self> {
        let log =
            File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let log_err = log.try_clone().context("duplicating the log file handle")?;
        let child = Command::new(&command.program)
            .args(&command.args)
            .envs(command.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {command}"))?;
        let pid = child.id();
        log::info!(
            "started vLLM {} {id} (pid {pid}) on {address}, log in {}",
            command.role.as_str(),
            log_path.display()
        );
        Ok(Self {
            id,
            role: command.role,
            address,
            log_path: log_path.to_owned(),
            process: Some(Started {
                child: Mutex::new(child),
                pid,
            }),
            http: http_client()?,
            tls: tls.cloned(),
        })
    }

    /// A server already listening at `address`, its output in `log_path`.
    pub fn attach(id: u64, role: PairRole, address: SocketAddr, log_path: &Path) -> Result<Self> {
        anyhow::ensure!(
            log_path.is_file(),
            "{} is missing: the suite reads the engines' logs",
            log_path.display()
        );
        Ok(Self {
            id,
            role,
            address,
            log_path: log_path.to_owned(),
            process: None,
            http: http_client()?,
            tls: None,
        })
    }

    /// The model name the server answers to (its first `/v1/models` entry).
    pub async fn served_model_name(&self) -> Result<String> {
        let url = self.url("/v1/models");
        let models: serde_json::Value = serde_json::from_str(&self.get_ok("/v1/models").await?)
            .with_context(|| format!("reading {url}"))?;
        models
            .pointer("/data/0/id")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
            .with_context(|| format!("{url} lists no model: {models}"))
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn role(&self) -> PairRole {
        self.role
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The process id, unless attached.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.pid)
    }

    /// `http://<address><path>`, or `https://` behind vLLM's own TLS.
    pub fn url(&self, path: &str) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.address)
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// A name for messages: `prefill 101`.
    pub fn name(&self) -> String {
        format!("{} {}", self.role.as_str(), self.id)
    }

    /// The last `lines` lines of the instance's log.
    pub fn log_tail(&self, lines: usize) -> String {
        match fs::read_to_string(&self.log_path) {
            Ok(text) => {
                let skipped = text.lines().count().saturating_sub(lines);
                text.lines().skip(skipped).collect::<Vec<_>>().join("\n")
            }
            Err(e) => format!("(cannot read {}: {e})", self.log_path.display()),
        }
    }

    /// The whole log so far.
    pub fn log(&self) -> Result<String> {
        fs::read_to_string(&self.log_path)
            .with_context(|| format!("reading {}", self.log_path.display()))
    }

    /// How many lines of the log contain `needle`.
    pub fn log_lines_containing(&self, needle: &str) -> Result<usize> {
        Ok(self
            .log()?
            .lines()
            .filter(|line| line.contains(needle))
            .count())
    }

    /// `Some(status)` once the server process has exited (never for an attached server).
    pub fn exit_status(&self) -> Result<Option<ExitStatus>> {
        let Some(process) = &self.process else {
            return Ok(None);
        };
        let mut child = process
            .child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        child
            .try_wait()
            .with_context(|| format!("polling vLLM {}", self.name()))
    }

    /// An error carrying the log tail when the server has exited.
    pub fn ensure_running(&self) -> Result<()> {
        match self.exit_status()? {
            None => Ok(()),
            Some(status) => {
                Err(self.with_log_tail(anyhow!("vLLM {} exited: {status}", self.name())))
            }
        }
    }

    /// Fails when the log shows a fault vLLM survives but never recovers from while starting,
    /// such as a side channel whose port was taken (its listener thread dies, the engine waits).
    pub fn ensure_no_startup_fault(&self) -> Result<()> {
        match self.log_lines_containing(STARTUP_FAULT) {
            Ok(0) | Err(_) => Ok(()),
            Ok(_) => Err(self.with_log_tail(anyhow!(
                "vLLM {} cannot start: {STARTUP_FAULT}",
                self.name()
            ))),
        }
    }

    /// Adds the log tail to an error about this instance.
    pub fn with_log_tail(&self, error: anyhow::Error) -> anyhow::Error {
        error.context(format!(
            "log of vLLM {} ({}) ends:\n{}",
            self.name(),
            self.log_path.display(),
            self.log_tail(40)
        ))
    }

    /// `GET /health` answers 200.
    pub async fn is_healthy(&self) -> bool {
        self.get("/health")
            .await
            .is_ok_and(|(status, _)| (200..300).contains(&status))
    }

    /// `GET path`: the status and the body, over vLLM's own TLS when it serves it.
    async fn get(&self, path: &str) -> Result<(u16, String)> {
        let url = self.url(path);
        if let Some(tls) = &self.tls {
            let get = https_get(self.address, &tls.ca, &tls.client, path);
            return tokio::time::timeout(HTTP_TIMEOUT, get)
                .await
                .map_err(|_| anyhow!("GET {url}: no answer in {HTTP_TIMEOUT:?}"))?;
        }
        let response = self.http.get(&url).send().await;
        let response = response.with_context(|| format!("GET {url}"))?;
        let status = response.status().as_u16();
        let body = response.text().await;
        Ok((status, body.with_context(|| format!("reading {url}"))?))
    }

    /// `GET path`, answered 2xx: the body.
    async fn get_ok(&self, path: &str) -> Result<String> {
        match self.get(path).await? {
            (200..=299, body) => Ok(body),
            (status, body) => Err(anyhow!("vLLM {} {path}: {status} {body}", self.name())),
        }
    }

    /// Waits for `GET /health` to answer 200, failing at once when the process exits.
    pub async fn wait_healthy(&self, deadline: Instant) -> Result<()> {
        loop {
            self.ensure_running()?;
            if self.is_healthy().await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(
                    self.with_log_tail(anyhow!("vLLM {} was not healthy in time", self.name()))
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// `GET /metrics` (Prometheus text).
    pub async fn metrics(&self) -> Result<String> {
        self.get_ok("/metrics").await
    }

    /// A counter summed over its label sets (engines, models); 0 when absent.
    pub async fn counter(&self, name: &str) -> Result<f64> {
        Ok(counter_total(&self.metrics().await?, name))
    }

    /// SIGTERM to the process group, then SIGKILL after a grace period; reaps the server.
    /// An attached server is left running.
    pub fn stop(&self) {
        let Some(process) = &self.process else {
            return;
        };
        let group = Pid::from_raw(i32::try_from(process.pid).unwrap_or(i32::MAX));
        let mut child = process
            .child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if matches!(child.try_wait(), Ok(None)) {
            signal_group(group, Signal::SIGTERM);
            wait_for_exit(&mut child, STOP_GRACE);
        }
        // The engine process may outlive the API server: kill whatever is left of the group.
        signal_group(group, Signal::SIGKILL);
        if let Err(e) = child.wait() {
            log::warn!("reaping vLLM (pid {}): {e}", process.pid);
        }
    }
}

impl Drop for VllmServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn signal_group(group: Pid, signal: Signal) {
    match killpg(group, signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => log::warn!("{signal} to process group {group}: {e}"),
    }
}

fn wait_for_exit(child: &mut Child, grace: Duration) {
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_side_channel_port_ends_the_start_up_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("decode.log");
        fs::write(&log, "INFO starting\n").unwrap();
        let address = "127.0.0.1:1".parse().unwrap();
        let server = VllmServer::attach(201, PairRole::Decode, address, &log).unwrap();
        server.ensure_no_startup_fault().unwrap();
        fs::write(
            &log,
            "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:43263')\n",
        )
        .unwrap();
        let error = format!("{:#}", server.ensure_no_startup_fault().unwrap_err());
        assert!(error.contains("cannot start"), "{error}");
        assert!(error.contains("43263"), "the log tail is shown: {error}");
    }
}

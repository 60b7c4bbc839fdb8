//! A running Envoy: started from a rendered bootstrap, queried through its admin API, killed
//! when dropped.

use std::fs::{self, File};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde::Deserialize;
use serde_json::Value;

const CONFIG_FILE: &str = "envoy.yaml";
const LOG_FILE: &str = "envoy.log";
const ACCESS_LOG_FILE: &str = "access.log";
const ADMIN_ADDRESS_FILE: &str = "admin-address";
const LOG_TAIL_LINES: usize = 40;
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// How several Envoys on one machine keep out of each other's way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HotRestart {
    /// `--disable-hot-restart`: no shared memory, no domain socket; any number of instances.
    Disabled,
    /// `--use-dynamic-base-id`. Leaves a small `/dev/shm/envoy_shared_memory_*` behind when
    /// killed.
    DynamicBaseId,
    /// `--base-id N`.
    BaseId(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyOptions {
    pub concurrency: u32,
    pub log_level: String,
    pub hot_restart: HotRestart,
    /// How long to wait for `GET /ready` to answer 200.
    pub ready_timeout: Duration,
    /// Environment variables Envoy gets besides this process's own (the dynamic module's
    /// search path, `native::module_env`).
    pub env: Vec<(String, String)>,
    /// A command Envoy runs under, with its arguments (`valgrind --tool=callgrind`, say):
    /// Envoy's own command line follows them.
    pub wrapper: Vec<String>,
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        Self {
            concurrency: 2,
            log_level: "warn".into(),
            hot_restart: HotRestart::Disabled,
            ready_timeout: Duration::from_secs(20),
            env: Vec::new(),
            wrapper: Vec::new(),
        }
    }
}

/// A running Envoy child process. Killed (and reaped) on drop.
#[derive(Debug)]
pub struct Envoy {
    child: Child,
    admin: SocketAddr,
    listen: SocketAddr,
    log_path: PathBuf,
    access_log_path: PathBuf,
    http: reqwest::Client,
}

impl Envoy {
    /// Starts Envoy with default options; see [`Envoy::start_with`].
    pub async fn start(binary: &Path, bootstrap_yaml: &str, work_dir: &Path) -> Result<Self> {
        Self::start_with(binary, bootstrap_yaml, work_dir, &EnvoyOptions::default()).await
    }

    /// Writes the bootstrap to `work_dir/envoy.yaml`, starts Envoy with its log in
    /// `work_dir/envoy.log` (stdout, the access log, in `work_dir/access.log`) and waits until
    /// it is ready. Ports 0 in the bootstrap are fine: the bound addresses are read back.
    /// One `work_dir` per instance.
    pub async fn start_with(
        binary: &Path,
        bootstrap_yaml: &str,
        work_dir: &Path,
        options: &EnvoyOptions,
    ) -> Result<Self> {
        let config_path = work_dir.join(CONFIG_FILE);
        fs::write(&config_path, bootstrap_yaml)
            .with_context(|| format!("writing {}", config_path.display()))?;
        let admin_address_path = work_dir.join(ADMIN_ADDRESS_FILE);
        remove_if_present(&admin_address_path)?;
        let log_path = work_dir.join(LOG_FILE);
        let access_log_path = work_dir.join(ACCESS_LOG_FILE);
        let mut command = envoy_command(binary, &config_path, &admin_address_path, options);
        let child = spawn_logged(&mut command, &log_path, &access_log_path)?;
        log::info!(
            "started Envoy (pid {}), log in {}",
            child.id(),
            log_path.display()
        );
        let mut starting = Starting {
            child: Some(child),
            log_path: &log_path,
        };
        let admin = starting
            .admin_address(&admin_address_path, options.ready_timeout)
            .await?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .context("building HTTP client")?;
        starting
            .wait_ready(&http, admin, options.ready_timeout)
            .await?;
        let listen = starting.or_log_tail(first_listener(&http, admin).await)?;
        let child = starting.into_child()?;
        Ok(Self {
            child,
            admin,
            listen,
            log_path,
            access_log_path,
            http,
        })
    }

    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// The address the first listener is bound to.
    pub fn listen(&self) -> SocketAddr {
        self.listen
    }

    /// `http://<listen><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listen)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Envoy's own log (its stderr).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The access log (Envoy's stdout); Envoy writes it out every 10 s
    /// (`--file-flush-interval-msec`), or sooner when its buffer fills.
    pub fn access_log_path(&self) -> &Path {
        &self.access_log_path
    }

    /// The access log's line of the request `request_id`, once Envoy has written it out.
    pub async fn access_log_entry(&self, request_id: &str) -> Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let log = std::fs::read_to_string(&self.access_log_path).unwrap_or_default();
            for line in log.lines() {
                let entry: Value = serde_json::from_str(line)
                    .with_context(|| format!("an access log line that is not JSON: {line}"))?;
                if entry.get("request_id").and_then(Value::as_str) == Some(request_id) {
                    return Ok(entry);
                }
            }
            ensure!(
                Instant::now() < deadline,
                "no access log line names {request_id} in 15 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The last lines of Envoy's log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log_path)
    }

    /// `GET /stats/prometheus`.
    pub async fn stats_prometheus(&self) -> Result<String> {
        self.admin_get("/stats/prometheus").await
    }

    /// The value of one counter or gauge by its Envoy name (e.g.
    /// `cluster.pinroute_decode.upstream_rq_total`), or `None` if Envoy has no such stat.
    pub async fn stat(&self, name: &str) -> Result<Option<u64>> {
        let stats = self.admin_get("/stats").await?;
        stat_value(&stats, name)
    }

    /// `GET http://<admin><path>`, which must answer 200.
    pub async fn admin_get(&self, path: &str) -> Result<String> {
        admin_get(&self.http, self.admin, path).await
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// An Envoy not yet ready: killed if dropped, and its log tail added to any failure.
struct Starting<'a> {
    child: Option<Child>,
    log_path: &'a Path,
}

impl Starting<'_> {
    async fn admin_address(&mut self, path: &Path, timeout: Duration) -> Result<SocketAddr> {
        let deadline = Instant::now() + timeout;
        loop {
            self.ensure_running()?;
            if let Some(address) = read_admin_address(path)? {
                return Ok(address);
            }
            if Instant::now() >= deadline {
                return self.or_log_tail(Err(anyhow::anyhow!(
                    "Envoy did not open its admin listener within {timeout:?}"
                )));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    async fn wait_ready(
        &mut self,
        http: &reqwest::Client,
        admin: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.ensure_running()?;
            let ready = admin_get(http, admin, "/ready").await;
            if ready.is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return self.or_log_tail(ready.map(drop).context("Envoy was not ready in time"));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    fn ensure_running(&mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            bail!("Envoy is gone")
        };
        match child.try_wait().context("polling the Envoy process")? {
            None => Ok(()),
            Some(status) => self.or_log_tail(Err(anyhow::anyhow!("Envoy exited: {status}"))),
        }
    }

    fn or_log_tail<T>(&self, result: Result<T>) -> Result<T> {
        result.with_context(|| {
            format!(
                "Envoy failed to start; its log ends:\n{}",
                log_tail(self.log_path)
            )
        })
    }

    fn into_child(mut self) -> Result<Child> {
        self.child.take().context("Envoy is gone")
    }
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            kill(child);
        }
    }
}

fn envoy_command(
    binary: &Path,
    config_path: &Path,
    admin_address_path: &Path,
    options: &EnvoyOptions,
) -> Command {
    let mut command = match options.wrapper.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(binary);
            command
        }
        None => Command::new(binary),
    };
    command
        .arg("-c")
        .arg(config_path)
        .arg("--admin-address-path")
        .arg(admin_address_path)
        .args(["--concurrency", &options.concurrency.to_string()])
        .args(["--log-level", &options.log_level])
        .envs(options.env.iter().map(|(name, value)| (name, value)));
    match options.hot_restart {
        HotRestart::Disabled => command.arg("--disable-hot-restart"),
        HotRestart::DynamicBaseId => command.arg("--use-dynamic-base-id"),
        HotRestart::BaseId(id) => command.args(["--base-id", &id.to_string()]),
    };
    command
}

fn spawn_logged(command: &mut Command, log_path: &Path, access_log_path: &Path) -> Result<Child> {
    let log = File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let access_log = File::create(access_log_path)
        .with_context(|| format!("creating {}", access_log_path.display()))?;
    command
        .stdin(Stdio::null())
        .stdout(access_log)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {command:?}"))
}

fn kill(child: &mut Child) {
    let pid = child.id();
    if let Err(e) = child.kill() {
        log::warn!("killing Envoy (pid {pid}): {e}");
    }
    if let Err(e) = child.wait() {
        log::warn!("reaping Envoy (pid {pid}): {e}");
    }
}

fn remove_if_present(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// The admin address Envoy writes once its admin listener is bound.
fn read_admin_address(path: &Path) -> Result<Option<SocketAddr>> {
    let Ok(text) = fs::read_to_string(path) else {
        return Ok(None);
    };
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .with_context(|| format!("admin address {text:?} in {}", path.display()))
}

/// The stat `name` of the Envoy whose admin interface is `admin`, for a caller that does
/// not own its [`Envoy`].
pub async fn admin_stat(admin: SocketAddr, name: &str) -> Result<Option<u64>> {
    stat_value(&admin_stats_text(admin).await?, name)
}

/// The text of `/stats` of the Envoy whose admin interface is `admin` (read with
/// [`stat_value`] and [`cumulative_quantile`]).
pub async fn admin_stats_text(admin: SocketAddr) -> Result<String> {
    let http = reqwest::Client::builder().no_proxy().build()?;
    admin_get(&http, admin, "/stats").await
}

async fn admin_get(http: &reqwest::Client, admin: SocketAddr, path: &str) -> Result<String> {
    let url = format!("http://{admin}{path}");
    let response = http
        .get(&url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = response.status();
    let body = response
        .text()
        .await
        .with_context(|| format!("reading GET {url}"))?;
    if status.is_success() {
        Ok(body)
    } else {
        bail!("GET {url}: {status}: {}", body.trim())
    }
}

#[derive(Deserialize)]
struct Listeners {
    listener_statuses: Vec<ListenerStatus>,
}

#[derive(Deserialize)]
struct ListenerStatus {
    local_address: Address,
}

#[derive(Deserialize)]
struct Address {
    socket_address: SocketAddress,
}

#[derive(Deserialize)]
struct SocketAddress {
    address: String,
    port_value: u16,
}

async fn first_listener(http: &reqwest::Client, admin: SocketAddr) -> Result<SocketAddr> {
    let body = admin_get(http, admin, "/listeners?format=json").await?;
    let listeners: Listeners = serde_json::from_str(&body).context("parsing /listeners")?;
    let Some(first) = listeners.listener_statuses.first() else {
        bail!("Envoy has no listener")
    };
    let socket = &first.local_address.socket_address;
    let ip = socket
        .address
        .parse()
        .with_context(|| format!("listener address {:?}", socket.address))?;
    Ok(SocketAddr::new(ip, socket.port_value))
}

/// The value of stat `name` in the text output of `/stats`.
fn stat_text<'a>(stats: &'a str, name: &str) -> Option<&'a str> {
    stats.lines().find_map(|line| {
        line.split_once(": ")
            .filter(|(stat, _)| *stat == name)
            .map(|(_, value)| value)
    })
}

/// The quantile `quantile` (`P50`) since Envoy started of histogram `name` in the text output
/// of `/stats` (`name: P0(interval,cumulative) P25(…) …`); `None` without it or its values.
pub fn cumulative_quantile(stats: &str, name: &str, quantile: &str) -> Option<f64> {
    let value = stat_text(stats, name)?;
    let start = value.find(&format!("{quantile}("))? + quantile.len() + 1;
    let pair = value.get(start..)?.split(')').next()?;
    pair.split(',').nth(1)?.trim().parse().ok()
}

/// Finds `name: value` in the text output of `/stats`.
pub fn stat_value(stats: &str, name: &str) -> Result<Option<u64>> {
    let Some(value) = stat_text(stats, name) else {
        return Ok(None);
    };
    value
        .trim()
        .parse()
        .map(Some)
        .with_context(|| format!("stat {name} has value {value:?}"))
}

fn log_tail(path: &Path) -> String {
    match fs::read_to_string(path) {
        Ok(text) => {
            let skipped = text.lines().count().saturating_sub(LOG_TAIL_LINES);
            text.lines().skip(skipped).collect::<Vec<_>>().join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;
    use crate::envoy::test_support::{
        DISAGGREGATED_REGISTRY, envoy, options, real_wasm, stub_wasm,
    };
    use crate::envoy::{BootstrapOptions, render_bootstrap};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn ephemeral_bootstrap(wasm: &Path) -> String {
        let opts = BootstrapOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin: "127.0.0.1:0".parse().unwrap(),
            ..options(DISAGGREGATED_REGISTRY, wasm)
        };
        render_bootstrap(&opts).unwrap()
    }

    /// Envoy with the rendered bootstrap and a filter that does nothing; it stops first
    /// when dropped, then its files go.
    struct StubEnvoy {
        envoy: Envoy,
        _wasm: tempfile::NamedTempFile,
        _dir: tempfile::TempDir,
    }

    impl StubEnvoy {
        async fn start() -> StubEnvoy {
            let wasm = stub_wasm();
            let dir = tempfile::tempdir().unwrap();
            let yaml = ephemeral_bootstrap(wasm.path());
            let envoy = Envoy::start(&envoy(), &yaml, dir.path()).await.unwrap();
            StubEnvoy {
                envoy,
                _wasm: wasm,
                _dir: dir,
            }
        }
    }

    #[tokio::test]
    async fn starts_ready_on_ephemeral_ports_and_dies_on_drop() {
        let stub = StubEnvoy::start().await;
        let envoy = &stub.envoy;
        assert_ne!(envoy.admin().port(), 0);
        assert_ne!(envoy.listen().port(), 0);
        assert_eq!(envoy.admin_get("/ready").await.unwrap().trim(), "LIVE");
        assert_eq!(envoy.stat("server.live").await.unwrap(), Some(1));
        assert_eq!(envoy.stat("no.such.stat").await.unwrap(), None);
        assert!(
            envoy
                .stats_prometheus()
                .await
                .unwrap()
                .contains("envoy_server_live")
        );
        let proc_dir = PathBuf::from(format!("/proc/{}", envoy.pid()));
        assert!(proc_dir.exists());
        drop(stub);
        assert!(!proc_dir.exists(), "Envoy survived its handle");
    }

    #[tokio::test]
    async fn starts_with_the_pinroute_filter() {
        let Some(wasm) = real_wasm() else { return };
        let dir = tempfile::tempdir().unwrap();
        let envoy = Envoy::start(&envoy(), &ephemeral_bootstrap(&wasm), dir.path())
            .await
            .unwrap();
        assert_eq!(envoy.admin_get("/ready").await.unwrap().trim(), "LIVE");
    }

    #[tokio::test]
    async fn plugin_configuration_reaches_envoy_intact() {
        let stub = StubEnvoy::start().await;
        let envoy = &stub.envoy;
        let dump: serde_json::Value =
            serde_json::from_str(&envoy.admin_get("/config_dump").await.unwrap()).unwrap();
        let configuration = find_key(&dump, "configuration").unwrap();
        let value = configuration["value"].as_str().unwrap();
        let mut expected: serde_json::Value = serde_json::from_str(DISAGGREGATED_REGISTRY).unwrap();
        // The bootstrap gives the filter's own decode call the route's timeout.
        let route_ms = crate::envoy::DEFAULT_ROUTE_TIMEOUT.as_millis() as u64;
        expected["decode_timeout_ms"] = route_ms.into();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(value).unwrap(),
            expected
        );
    }

    fn find_key<'a>(value: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
        match value {
            serde_json::Value::Object(map) => map
                .get(key)
                .or_else(|| map.values().find_map(|v| find_key(v, key))),
            serde_json::Value::Array(items) => items.iter().find_map(|v| find_key(v, key)),
            _ => None,
        }
    }

    /// With the filter doing nothing (stub), client copies of the steering headers must not
    /// reach ORIGINAL_DST: header_mutation strips them, so nothing is dialled.
    #[tokio::test]
    async fn client_steering_headers_are_stripped() {
        let stub = StubEnvoy::start().await;
        let envoy = &stub.envoy;
        let target = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target_address = target.local_addr().unwrap().to_string();
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        for header in ["x-pinroute-upstream", "x-envoy-original-dst-host"] {
            let response = client
                .get(envoy.url("/v1/models"))
                .header(header, &target_address)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 503, "{header}");
        }
        let accepted = tokio::time::timeout(Duration::from_millis(200), target.accept()).await;
        assert!(accepted.is_err(), "Envoy dialled a client-named address");
    }

    /// Envoy's own answers, with no filter to answer for it: a route with no host (503) and
    /// a request no route takes (404) are OpenAI-shaped JSON (`docs/semantics.md` §6).
    #[tokio::test]
    async fn envoys_own_answers_are_json_without_the_filter() {
        let stub = StubEnvoy::start().await;
        let envoy = &stub.envoy;
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let no_host = client.get(envoy.url("/v1/models")).send().await.unwrap();
        assert_json_error(no_host, 503, "unavailable", "server_error").await;
        let mut tcp = tokio::net::TcpStream::connect(envoy.listen())
            .await
            .unwrap();
        let connect = "CONNECT gw:443 HTTP/1.1\r\nhost: gw:443\r\n\r\n";
        tcp.write_all(connect.as_bytes()).await.unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 404"), "{answer}");
        assert!(
            head.contains("x-pinroute-error-code: unknown_path"),
            "{head}"
        );
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["code"], "unknown_path", "{body}");
    }

    fn metrics_bootstrap(wasm: &Path, serve_metrics: bool) -> String {
        let edge = crate::envoy::EdgeOptions {
            serve_metrics,
            ..Default::default()
        };
        render_bootstrap(&BootstrapOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin: crate::stack::refusing_address().unwrap(),
            edge,
            ..options(DISAGGREGATED_REGISTRY, wasm)
        })
        .unwrap()
    }

    /// `GET /metrics`, which benchmark clients probe: a typed 404 saying where the metrics
    /// are, or with `serve_metrics` Envoy's Prometheus stats; any other method is not served.
    #[tokio::test]
    async fn metrics_are_a_typed_404_or_envoys_prometheus_stats() {
        let wasm = stub_wasm();
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let yaml = metrics_bootstrap(wasm.path(), false);
        let plain = Envoy::start(&envoy(), &yaml, dir.path()).await.unwrap();
        let probe = client.get(plain.url("/metrics")).send().await.unwrap();
        assert_json_error(probe, 404, "unknown_path", "invalid_request_error").await;
        drop(plain);
        let yaml = metrics_bootstrap(wasm.path(), true);
        let serving = Envoy::start(&envoy(), &yaml, dir.path()).await.unwrap();
        let metrics = client.get(serving.url("/metrics")).send().await.unwrap();
        assert_eq!(metrics.status(), 200);
        assert!(metrics.text().await.unwrap().contains("envoy_server_live"));
        let post = client.post(serving.url("/metrics")).send().await.unwrap();
        assert_eq!(
            post.status(),
            503,
            "POST /metrics reached the admin interface"
        );
    }

    /// The filter never sees `GET /metrics`: a probe is no client error of pinroute's, while
    /// another path no route serves is.
    #[tokio::test]
    async fn a_metrics_probe_counts_as_no_pinroute_error() {
        let Some(wasm) = real_wasm() else { return };
        let dir = tempfile::tempdir().unwrap();
        let yaml = metrics_bootstrap(&wasm, false);
        let envoy = Envoy::start(&envoy(), &yaml, dir.path()).await.unwrap();
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let unknown_path = "wasmcustom.pinroute.errors.unknown_path";
        for (path, counted) in [("/metrics", 0), ("/sleep", 1)] {
            let response = client.get(envoy.url(path)).send().await.unwrap();
            assert_json_error(response, 404, "unknown_path", "invalid_request_error").await;
            assert_eq!(
                envoy.stat(unknown_path).await.unwrap(),
                Some(counted),
                "{path}"
            );
        }
    }

    /// `docs/metrics.md`'s table of Envoy's own answers: each code with the stats it names,
    /// the first being the one a request over HTTP/1 moves.
    fn documented_envoy_stats() -> Vec<(String, Vec<String>)> {
        let docs = include_str!("../../../docs/metrics.md");
        let (_, section) = docs.split_once("## Envoy's own answers").unwrap();
        let table = section.split("\n## ").next().unwrap();
        let backticked = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect()
        };
        table
            .lines()
            .filter_map(|row| {
                let cells: Vec<&str> = row.split('|').collect();
                let code = backticked(cells.get(1)?).pop()?;
                Some((code, backticked(cells.get(2)?)))
            })
            .collect()
    }

    /// What a client sends to get each code Envoy answers that a stub filter lets it make.
    const ENVOY_ANSWERS: [(&str, &str); 7] = [
        (
            "bad_request",
            "GET / HTTP/1.1\r\nhost: x\r\nbad header\r\n\r\n",
        ),
        (
            "underscore_in_header",
            "GET /v1/models HTTP/1.1\r\nhost: x\r\nx_data_parallel_rank: 1\r\n\r\n",
        ),
        (
            "unknown_path",
            "CONNECT gw:443 HTTP/1.1\r\nhost: gw:443\r\n\r\n",
        ),
        ("request_timeout", "GET /v1/models HTTP/1.1\r\nhost: x\r\n"),
        (
            "headers_too_large",
            "GET /v1/models HTTP/1.1\r\nx-big: {70k}\r\n\r\n",
        ),
        ("request_refused", "GET /v1/models HTTP/1.0\r\n\r\n"),
        (
            "unavailable",
            "GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        ),
    ];

    /// docs/metrics.md says which Envoy stat counts each code Envoy answers itself: every
    /// stat it names exists, and one request of each code it can make here moves its stat by
    /// one and is logged with its code.
    #[tokio::test]
    async fn envoys_own_answers_are_counted_where_metrics_md_says() {
        let wasm = stub_wasm();
        let dir = tempfile::tempdir().unwrap();
        let edge = crate::envoy::EdgeOptions {
            request_headers_timeout: Duration::from_secs(1),
            ..Default::default()
        };
        let yaml = render_bootstrap(&BootstrapOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin: "127.0.0.1:0".parse().unwrap(),
            edge,
            ..options(DISAGGREGATED_REGISTRY, wasm.path())
        })
        .unwrap();
        let envoy = Envoy::start(&envoy(), &yaml, dir.path()).await.unwrap();
        let documented = documented_envoy_stats();
        assert_eq!(documented.len(), 9, "{documented:?}");
        for (code, stats) in &documented {
            // Envoy defines its http2 stats with its first HTTP/2 connection.
            for stat in stats.iter().filter(|stat| !stat.starts_with("http2.")) {
                assert!(
                    envoy.stat(stat).await.unwrap().is_some(),
                    "{code}: no {stat}"
                );
            }
        }
        for (code, request) in ENVOY_ANSWERS {
            let stat = &documented.iter().find(|(c, _)| c == code).unwrap().1[0];
            let before = envoy.stat(stat).await.unwrap().unwrap();
            let mut tcp = tokio::net::TcpStream::connect(envoy.listen())
                .await
                .unwrap();
            let request = request.replace("{70k}", &"a".repeat(70 * 1024));
            tcp.write_all(request.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            tcp.read_to_end(&mut answer).await.unwrap();
            let answer = String::from_utf8_lossy(&answer).into_owned();
            assert!(
                answer.contains(&format!("x-pinroute-error-code: {code}")),
                "{answer}"
            );
            let counted = || async { envoy.stat(stat).await.unwrap() == Some(before + 1) };
            assert!(
                within(Duration::from_secs(5), counted).await,
                "{code}: {stat}"
            );
        }
        // Envoy writes its access log out every 10 s.
        let logged = || async {
            let log = tokio::fs::read_to_string(envoy.access_log_path()).await;
            let log = log.unwrap_or_default();
            ENVOY_ANSWERS
                .iter()
                .all(|(code, _)| log.contains(&format!(r#""error_code":"{code}""#)))
        };
        let log = || std::fs::read_to_string(envoy.access_log_path()).unwrap();
        assert!(within(Duration::from_secs(30), logged).await, "{}", log());
    }

    /// Whether `condition` holds within `time`, asked every [`POLL_INTERVAL`].
    async fn within<F: Future<Output = bool>>(time: Duration, condition: impl Fn() -> F) -> bool {
        let deadline = Instant::now() + time;
        while !condition().await {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        true
    }

    async fn assert_json_error(response: reqwest::Response, status: u16, code: &str, kind: &str) {
        assert_eq!(response.status(), status);
        let header = |name: &str| response.headers().get(name).unwrap().to_str().unwrap();
        assert_eq!(header("content-type"), "application/json");
        assert_eq!(header("x-pinroute-error-code"), code);
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], code, "{body}");
        assert_eq!(body["error"]["type"], kind, "{body}");
        assert!(body["error"]["message"].is_string(), "{body}");
    }

    #[tokio::test]
    async fn several_envoys_run_at_once() {
        let wasm = stub_wasm();
        let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let yaml = ephemeral_bootstrap(wasm.path());
        let a = Envoy::start(&envoy(), &yaml, dir_a.path()).await.unwrap();
        let b = Envoy::start(&envoy(), &yaml, dir_b.path()).await.unwrap();
        assert_ne!(a.admin(), b.admin());
        assert_ne!(a.listen(), b.listen());
    }

    /// Linux lets two Envoys with SO_REUSEPORT share a port, each taking part of the
    /// connections; the rendered bootstrap turns it off, so the second one fails.
    #[tokio::test]
    async fn a_second_envoy_on_the_same_listen_address_fails_to_start() {
        let wasm = stub_wasm();
        let listen = crate::stack::refusing_address().unwrap();
        let yaml = render_bootstrap(&BootstrapOptions {
            listen,
            admin: "127.0.0.1:0".parse().unwrap(),
            ..options(DISAGGREGATED_REGISTRY, wasm.path())
        })
        .unwrap();
        let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let first = Envoy::start(&envoy(), &yaml, dir_a.path()).await.unwrap();
        assert_eq!(first.listen(), listen);
        let err = Envoy::start(&envoy(), &yaml, dir_b.path())
            .await
            .unwrap_err();
        let message = format!("{err:#}");
        assert!(
            message.contains(&format!("cannot bind '{listen}': Address already in use")),
            "{message}"
        );
    }

    #[tokio::test]
    async fn failed_start_reports_the_log_tail() {
        let dir = tempfile::tempdir().unwrap();
        let err = Envoy::start(&envoy(), "static_resources: {bogus: 1}\n", dir.path())
            .await
            .unwrap_err();
        let message = format!("{err:#}");
        assert!(message.contains("Envoy exited"), "{message}");
        assert!(message.contains("bogus"), "{message}");
    }

    #[test]
    fn parses_stats_text() {
        let stats = "a.b: 3\na.bc: 4\nh: P0(nan,1) P25(nan,2)\n";
        assert_eq!(stat_value(stats, "a.b").unwrap(), Some(3));
        assert_eq!(stat_value(stats, "a").unwrap(), None);
        assert!(stat_value(stats, "h").is_err());
    }
}

//! A real Prometheus server (Debian's `prometheus`, or `PROMETHEUS_BIN`) scraping Envoy's
//! admin `/stats/prometheus`, and its query API: what the dashboard test and the panel
//! rendering read.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use serde::Deserialize;
use serde_json::Value;
use tokio::process::{Child, Command};

use crate::vllm::free_loopback_address;

/// How often Prometheus scrapes Envoy: often, so a short test has many samples.
pub const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);

/// A running Prometheus, killed on drop.
pub struct Prometheus {
    child: Child,
    address: SocketAddr,
    http: reqwest::Client,
}

/// One series of an instant query: its labels and value.
#[derive(Debug, Clone)]
pub struct Sample {
    pub labels: Value,
    pub value: f64,
}

/// One series of a range query: its labels and (unix seconds, value) points.
#[derive(Debug, Clone)]
pub struct Series {
    pub labels: Value,
    pub points: Vec<(f64, f64)>,
}

/// The Prometheus binary: `PROMETHEUS_BIN`, else `prometheus` on the `PATH`.
pub fn binary() -> PathBuf {
    std::env::var_os("PROMETHEUS_BIN").map_or_else(|| PathBuf::from("prometheus"), PathBuf::from)
}

impl Prometheus {
    /// Starts Prometheus with its data in `work_dir`, scraping Envoy's admin at `envoy_admin`
    /// every [`SCRAPE_INTERVAL`], and waits until it is ready.
    pub async fn start(envoy_admin: SocketAddr, work_dir: &Path) -> Result<Self> {
        let config = work_dir.join("prometheus.yml");
        std::fs::write(&config, scrape_config(envoy_admin))?;
        let address = free_loopback_address()?;
        let log = std::fs::File::create(work_dir.join("prometheus.log"))?;
        let child = Command::new(binary())
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                work_dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "starting {} (Debian's `prometheus` package, or set PROMETHEUS_BIN)",
                    binary().display()
                )
            })?;
        let http = reqwest::Client::builder().no_proxy().build()?;
        let mut prometheus = Self {
            child,
            address,
            http,
        };
        prometheus.wait_ready().await?;
        Ok(prometheus)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = format!("http://{}/-/ready", self.address);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("prometheus exited before it was ready: {status}");
            }
            if let Ok(reply) = self.http.get(&url).send().await
                && reply.status().is_success()
            {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "prometheus not ready in 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until Envoy has been scraped successfully `scrapes` times more.
    pub async fn wait_for_scrapes(&self, scrapes: u32) -> Result<()> {
        let first = self.scrape_count().await?;
        let deadline = Instant::now() + SCRAPE_INTERVAL * (scrapes + 10);
        while self.scrape_count().await? < first + f64::from(scrapes) {
            ensure!(
                Instant::now() < deadline,
                "Prometheus is not scraping Envoy"
            );
            tokio::time::sleep(SCRAPE_INTERVAL / 4).await;
        }
        Ok(())
    }

    /// Successful scrapes of Envoy so far (`up` samples equal to 1 over the last hour).
    async fn scrape_count(&self) -> Result<f64> {
        let samples = self.query("count_over_time((up == 1)[1h:1s])").await?;
        Ok(samples.first().map_or(0.0, |s| s.value))
    }

    /// An instant query at the current time.
    pub async fn query(&self, expr: &str) -> Result<Vec<Sample>> {
        match self.api("query", &[("query", expr.to_owned())]).await? {
            Data::Vector(series) => Ok(series
                .into_iter()
                .map(|s| Sample {
                    labels: s.metric,
                    value: number(&s.value.1),
                })
                .collect()),
            Data::Scalar((_, value)) => Ok(vec![Sample {
                labels: Value::Null,
                value: number(&value),
            }]),
            Data::Matrix(_) => bail!("{expr}: a range vector, not an instant one"),
        }
    }

    /// A range query over the last `span`, one point every `step`.
    pub async fn query_range(
        &self,
        expr: &str,
        span: Duration,
        step: Duration,
    ) -> Result<Vec<Series>> {
        let end = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
        let start = end - span.as_secs_f64();
        let params = [
            ("query", expr.to_owned()),
            ("start", format!("{start:.3}")),
            ("end", format!("{end:.3}")),
            ("step", format!("{}", step.as_secs_f64())),
        ];
        let Data::Matrix(series) = self.api("query_range", &params).await? else {
            bail!("{expr}: a range query answered without a matrix");
        };
        Ok(series
            .into_iter()
            .map(|s| Series {
                labels: s.metric,
                points: s.values.iter().map(|(t, v)| (*t, number(v))).collect(),
            })
            .collect())
    }

    /// `GET /api/v1/<endpoint>`: the answer's data, or its error.
    async fn api(&self, endpoint: &str, params: &[(&str, String)]) -> Result<Data> {
        let url = format!("http://{}/api/v1/{endpoint}", self.address);
        let reply: Reply = self
            .http
            .get(url)
            .query(params)
            .send()
            .await?
            .json()
            .await?;
        match reply.data {
            Some(data) if reply.status == "success" => Ok(data),
            _ => bail!("prometheus refused {params:?}: {:?}", reply.error),
        }
    }
}

/// The query API's answer (`/api/v1/query`, `/api/v1/query_range`).
#[derive(Deserialize)]
struct Reply {
    status: String,
    data: Option<Data>,
    error: Option<String>,
}

/// Values are strings ("1.5", "NaN", "+Inf") after their unix time.
#[derive(Deserialize)]
#[serde(tag = "resultType", content = "result", rename_all = "lowercase")]
enum Data {
    Vector(Vec<InstantSeries>),
    Scalar((f64, String)),
    Matrix(Vec<RangeSeries>),
}

#[derive(Deserialize)]
struct InstantSeries {
    metric: Value,
    value: (f64, String),
}

#[derive(Deserialize)]
struct RangeSeries {
    metric: Value,
    values: Vec<(f64, String)>,
}

fn scrape_config(envoy_admin: SocketAddr) -> String {
    let interval = SCRAPE_INTERVAL.as_secs();
    format!(
        "global:\n  scrape_interval: {interval}s\n  evaluation_interval: {interval}s\n\
         scrape_configs:\n- job_name: envoy\n  metrics_path: /stats/prometheus\n  \
         static_configs:\n  - targets: ['{envoy_admin}']\n"
    )
}

fn number(value: &str) -> f64 {
    value.parse().unwrap_or(f64::NAN)
}

//! `envoy-config`: prints the Envoy bootstrap for a worker registry.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use pinroute_harness::envoy::{
    ANY_ORIGIN, BootstrapOptions, DEFAULT_REQUEST_HEADERS_TIMEOUT, DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_ROUTE_TIMEOUT, EdgeOptions, default_wasm_path, exposure_warnings, render_bootstrap,
};

#[derive(clap::Args)]
pub struct Args {
    /// The plugin configuration: `{"workers": [...]}` plus optional filter settings.
    #[arg(long, value_name = "FILE")]
    workers: PathBuf,
    /// Address of the gateway listener.
    #[arg(long, value_name = "IP:PORT")]
    listen: SocketAddr,
    /// Address of Envoy's admin API.
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:9901")]
    admin: SocketAddr,
    /// The pinroute filter [default: <repo>/target/wasm32-wasip1/release/pinroute.wasm].
    #[arg(long, value_name = "PATH")]
    wasm: Option<PathBuf>,
    /// Route (whole request) timeout in seconds; 0 disables it.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_ROUTE_TIMEOUT.as_secs())]
    route_timeout: u64,
    /// Seconds a client has to send its request headers; 0 disables it.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_REQUEST_HEADERS_TIMEOUT.as_secs())]
    request_headers_timeout: u64,
    /// Seconds a client has to send its whole request (408 after that; the prefill hop's
    /// budget is added, a streamed response is never cut); 0 disables it.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_REQUEST_TIMEOUT.as_secs())]
    request_timeout: u64,
    /// A browser origin allowed by CORS (`https://app.example.com`), repeatable; `*` allows
    /// any.
    #[arg(long = "cors-origin", value_name = "ORIGIN", default_value = ANY_ORIGIN)]
    cors_origins: Vec<String>,
    /// No CORS: browsers' preflights get the filter's 405, pages cannot read answers.
    #[arg(long, conflicts_with = "cors_origins")]
    no_cors: bool,
    /// Answer `GET /metrics` on the listener with Envoy's Prometheus stats (pinroute's
    /// included) instead of a 404, for benchmark clients that read the server's metrics.
    #[arg(long)]
    metrics: bool,
}

impl Args {
    fn edge(&self) -> EdgeOptions {
        EdgeOptions {
            request_headers_timeout: Duration::from_secs(self.request_headers_timeout),
            request_timeout: Duration::from_secs(self.request_timeout),
            cors_origins: if self.no_cors {
                Vec::new()
            } else {
                self.cors_origins.clone()
            },
            serve_metrics: self.metrics,
        }
    }
}

pub fn run(args: &Args) -> Result<()> {
    let plugin_config = std::fs::read_to_string(&args.workers)
        .with_context(|| format!("reading {}", args.workers.display()))?;
    let wasm = args.wasm.clone().unwrap_or_else(default_wasm_path);
    if !wasm.is_file() {
        log::warn!(
            "{} does not exist (yet): Envoy will refuse to start without it",
            wasm.display()
        );
    }
    let options = BootstrapOptions {
        listen: args.listen,
        admin: args.admin,
        wasm,
        plugin_config,
        route_timeout: Duration::from_secs(args.route_timeout),
        edge: args.edge(),
    };
    let bootstrap = render_bootstrap(&options)
        .with_context(|| format!("rendering the bootstrap for {}", args.workers.display()))?;
    for warning in exposure_warnings(&options) {
        log::warn!("{warning}");
    }
    std::io::stdout()
        .write_all(bootstrap.as_bytes())
        .context("writing the bootstrap")
}

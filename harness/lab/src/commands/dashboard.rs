//! `dashboard`: the Grafana dashboard's panels drawn from a real Prometheus scraping Envoy
//! while the demo traffic runs (docs/metrics.md, "The dashboard").

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use pinroute_harness::dashboard::{demo_spec, panels, send_demo_round};
use pinroute_harness::envoy::repo_root;
use pinroute_harness::prometheus::{Prometheus, SCRAPE_INTERVAL};
use pinroute_harness::stack::Stack;
use pinroute_harness::wasm::{build_filter, build_native_module};
use pinroute_lab::dashboard::{draw, query_panels};

/// Pause between two rounds of the demo traffic.
const ROUND_EVERY: Duration = Duration::from_millis(100);

#[derive(clap::Args)]
pub struct Args {
    /// How long the demo traffic runs.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Run the filter as the native Envoy dynamic module instead of the `.wasm`.
    #[arg(long)]
    native: bool,
    /// Where to write the SVG [default: target/dashboard/dashboard.svg].
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

pub async fn run(args: &Args) -> Result<()> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| repo_root().join("target/dashboard/dashboard.svg"));
    let work_dir = tempfile::tempdir()?;
    let mut spec = demo_spec(build_filter()?);
    spec.native_module = args.native.then(build_native_module).transpose()?;
    let stack = Stack::start(&spec, work_dir.path()).await?;
    let prometheus = Prometheus::start(stack.envoy.admin(), work_dir.path()).await?;
    prometheus.wait_for_scrapes(2).await?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let span = Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut round = 0;
    while started.elapsed() < span {
        send_demo_round(&stack, &http, round).await?;
        round += 1;
        tokio::time::sleep(ROUND_EVERY).await;
    }
    prometheus.wait_for_scrapes(2).await?;
    println!("{round} rounds of the demo traffic in {} s", args.seconds);
    let drawn = query_panels(&prometheus, &panels()?, span, SCRAPE_INTERVAL * 2, "10s").await?;
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    draw(&out, &drawn)?;
    println!("Wrote {}", out.display());
    Ok(())
}

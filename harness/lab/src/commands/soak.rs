//! `soak`: the load and fault soak (docs/soak.md): many requests at high concurrency through
//! Envoy + pinroute + sim workers while a prefill and a decode worker are killed and
//! restarted; fails unless every answer is of the class its request should get.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use pinroute_harness::envoy::repo_root;
use pinroute_harness::wasm::{build_filter, build_native_module};
use pinroute_lab::soak::chaos::{FULL_SCHEDULE, QUICK_SCHEDULE};
use pinroute_lab::soak::report::SoakReport;
use pinroute_lab::soak::{SoakOptions, run_soak};

const FULL_REQUESTS: u64 = 60_000;
const QUICK_REQUESTS: u64 = 12_000;
const MIN_CONCURRENCY: usize = 64;

#[derive(clap::Args)]
pub struct Args {
    /// Requests to send [default: 60000, quick: 12000].
    #[arg(long)]
    requests: Option<u64>,
    /// Closed-loop virtual users (at least 64).
    #[arg(long, default_value_t = MIN_CONCURRENCY)]
    concurrency: usize,
    /// The CI run: 12000 requests, one kill and restart of each victim.
    #[arg(long)]
    quick: bool,
    /// Use this filter instead of building it.
    #[arg(long, value_name = "FILE")]
    wasm: Option<PathBuf>,
    /// Directory for soak.json, soak.md and Envoy's files [default: target/soak].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Time each sim worker takes per generated token.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 1000)]
    token_latency_us: u64,
    /// Tokens a request asks for (each asks for between this and twice this).
    #[arg(long, default_value_t = 8)]
    max_tokens: u32,
    /// Mutual TLS on both sides: the clients to Envoy, Envoy to every worker (each behind a
    /// TLS front that requires the gateway's certificate), from a CA made for the run.
    #[arg(long)]
    tls: bool,
    /// Run the filter as the native Envoy dynamic module instead of the `.wasm`.
    #[arg(long)]
    native: bool,
}

pub async fn run(args: &Args) -> Result<()> {
    if args.concurrency < MIN_CONCURRENCY {
        bail!("--concurrency must be at least {MIN_CONCURRENCY}");
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| repo_root().join("target/soak"));
    let work_dir = out.join("envoy");
    std::fs::create_dir_all(&work_dir)
        .with_context(|| format!("creating {}", work_dir.display()))?;
    let wasm = match &args.wasm {
        Some(path) => path.clone(),
        None => build_filter()?,
    };
    let mut options = options(args, wasm, work_dir);
    options.native_module = args.native.then(build_native_module).transpose()?;
    let report = run_soak(&options).await?;
    let markdown = report.to_markdown();
    println!("{markdown}");
    write_outputs(&report, &markdown, &out)?;
    if !report.passed() {
        bail!(
            "soak failed: {} (Envoy log: {})",
            report.failures.join("; "),
            options.work_dir.join("envoy.log").display()
        );
    }
    Ok(())
}

fn options(args: &Args, wasm: PathBuf, work_dir: PathBuf) -> SoakOptions {
    let default_requests = if args.quick {
        QUICK_REQUESTS
    } else {
        FULL_REQUESTS
    };
    let schedule = if args.quick {
        QUICK_SCHEDULE.to_vec()
    } else {
        FULL_SCHEDULE.to_vec()
    };
    SoakOptions {
        command: command_line(),
        requests: args.requests.unwrap_or(default_requests),
        concurrency: args.concurrency,
        schedule,
        wasm,
        work_dir,
        token_latency: Duration::from_micros(args.token_latency_us),
        max_tokens: args.max_tokens.max(1),
        tls: args.tls,
        native_module: None,
    }
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("pinroute-lab {}", args.join(" "))
}

fn write_outputs(report: &SoakReport, markdown: &str, out: &Path) -> Result<()> {
    let json_path = out.join("soak.json");
    let json = serde_json::to_string_pretty(report).context("serialising the soak report")?;
    std::fs::write(&json_path, json).with_context(|| format!("writing {}", json_path.display()))?;
    let md_path = out.join("soak.md");
    std::fs::write(&md_path, markdown).with_context(|| format!("writing {}", md_path.display()))?;
    println!("Wrote {} and {}", json_path.display(), md_path.display());
    Ok(())
}

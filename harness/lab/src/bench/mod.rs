//! `pinroute-lab bench`: what pinroute costs, side by side with the floor and the
//! alternatives, on one machine, in one run.
//!
//! End to end ([`e2e`]): one prefill and one decode sim worker in a child process
//! ([`sims`]), and the ways to send the two hops of a streamed completion ([`Scenario`]):
//! the load generator itself (the floor), Envoy without the filter on the decode hop,
//! Envoy with pinroute, a Python FastAPI + httpx proxy, and vllm-router ([`vllm_router`]). Each scenario runs at every
//! prompt size and concurrency with the closed-loop generator of [`crate::load`]; CPU
//! time and peak memory of every process come from `/proc` ([`procfs`]).
//!
//! Micro-benchmark ([`micro`]): `benches/policy.rs`, the policy core stage by stage, run
//! natively, under wasmtime ([`wasmtime_runner`]) and under V8 (Node).
//!
//! Results: a table on stdout ([`table`]), `bench.json` and `bench.md`, SVG plots
//! ([`plot`]), and the targets checked ([`results`]).

pub mod child;
pub mod counted;
pub mod e2e;
pub mod gateways;
pub mod micro;
pub mod plot;
pub mod prefix;
pub mod procfs;
pub mod prompt;
pub mod python;
pub mod registry_axis;
pub mod results;
pub mod rounds;
pub mod sims;
pub mod table;
pub mod versus;
pub mod vllm_router;
pub mod wasmtime_runner;
pub mod workload;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

pub use gateways::Scenario;
pub use results::BenchResults;

use counted::CountedWork;
use e2e::{E2eOptions, count_registry_work, run_e2e, run_registry_axis};
use gateways::GatewayInputs;
use pinroute_harness::envoy::{ENVOY_VERSION, EnvoyOptions, envoy_binary, repo_root};
use registry_axis::RegistryRun;
use results::{Meta, check_targets, compare_with_floor};
use sims::{SimProcess, Workers};

/// Everything `bench` can be asked.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchOptions {
    pub e2e: Option<E2eOptions>,
    /// Sizes and time per stage of the micro-benchmark; `None` skips it.
    pub micro: Option<(Vec<usize>, u64)>,
    pub token_latency: Duration,
    pub quick: bool,
    /// Where `bench.json`, `bench.md` and the plots go.
    pub out_dir: PathBuf,
}

/// Runs the benchmark, writes its files and returns the results.
pub async fn run_bench(options: &BenchOptions) -> Result<BenchResults> {
    let load_before = procfs::load_average()?;
    warn_if_busy(load_before);
    let root = repo_root();
    let micro = match &options.micro {
        Some((sizes, budget_ms)) => micro::run_micro(sizes, *budget_ms)?,
        None => Vec::new(),
    };
    let (runs, registry, counted, wasm_bytes) = match &options.e2e {
        Some(e2e) => end_to_end(e2e, options, &root).await?,
        None => (Vec::new(), Vec::new(), Vec::new(), filter_size()),
    };
    let mut results = BenchResults {
        meta: meta(options, load_before, wasm_bytes),
        runs,
        registry,
        counted,
        micro,
        targets: Vec::new(),
    };
    compare_with_floor(&mut results.runs);
    results.targets = check_targets(&results);
    write_outputs(&results, &options.out_dir)?;
    Ok(results)
}

fn warn_if_busy(load: [f64; 3]) {
    let cpus = procfs::cpus() as f64;
    if load[0] > 0.25 * cpus {
        log::warn!(
            "load average {:.2} on {cpus} CPUs: other work is running, latency and throughput figures will be noisy",
            load[0]
        );
    }
}

async fn end_to_end(
    e2e: &E2eOptions,
    options: &BenchOptions,
    root: &Path,
) -> Result<(
    Vec<results::RunResult>,
    Vec<RegistryRun>,
    Vec<CountedWork>,
    Option<u64>,
)> {
    let needs_envoy = e2e.scenarios.iter().any(|s| s.runs_envoy());
    let wasm = match (&e2e.wasm, e2e.scenarios.iter().any(|s| s.runs_pinroute())) {
        (_, false) => None,
        (Some(given), true) => Some(given.clone()),
        (None, true) => Some(pinroute_harness::wasm::build_filter()?),
    };
    let native_module = match e2e.scenarios.iter().any(|s| s.runs_native_module()) {
        true => Some(pinroute_harness::wasm::build_native_module()?),
        false => None,
    };
    let envoy = if needs_envoy {
        Some(envoy_binary(root)?)
    } else {
        None
    };
    let python = if e2e.scenarios.contains(&Scenario::Python) {
        Some(python::bench_python(root)?)
    } else {
        None
    };
    let vllm_router = if e2e
        .scenarios
        .iter()
        .any(|s| s.vllm_router_policy().is_some())
    {
        Some(vllm_router::router_binary(root)?)
    } else {
        None
    };
    let work_dir = root.join(".cache/bench");
    std::fs::create_dir_all(&work_dir)
        .with_context(|| format!("creating {}", work_dir.display()))?;
    let every_address = !e2e.registry.is_empty();
    let log = work_dir.join("sims.log");
    let sims = SimProcess::start(options.token_latency, every_address, &log).await?;
    let none = PathBuf::new();
    let workers = Workers::one_each(sims.addresses);
    let inputs = GatewayInputs {
        workers: &workers,
        envoy_binary: envoy.as_deref().unwrap_or(&none),
        wasm: wasm.as_deref().unwrap_or(&none),
        native_module: native_module.as_deref(),
        python: python.as_deref(),
        vllm_router: vllm_router.as_deref(),
        repo_root: root,
        work_dir: &work_dir,
        threads: e2e.proxy_threads,
    };
    let runs = run_e2e(e2e, &inputs, sims.pid()).await?;
    let registry = run_registry_axis(e2e, &inputs, sims.addresses, sims.pid()).await?;
    let counted = count_registry_work(e2e, &inputs, sims.addresses).await?;
    let wasm_bytes = wasm
        .as_deref()
        .and_then(|w| std::fs::metadata(w).ok())
        .map(|m| m.len())
        .or_else(filter_size);
    Ok((runs, registry, counted, wasm_bytes))
}

/// The size of an already built release filter, if any.
fn filter_size() -> Option<u64> {
    std::fs::metadata(pinroute_harness::envoy::default_wasm_path())
        .ok()
        .map(|m| m.len())
}

fn meta(options: &BenchOptions, load_before: [f64; 3], wasm_bytes: Option<u64>) -> Meta {
    let e2e = options.e2e.as_ref();
    Meta {
        unix_time: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        cpus: procfs::cpus(),
        cpu_model: procfs::cpu_model(),
        load_average_before: load_before,
        quick: options.quick,
        scenarios: e2e.map_or_else(Vec::new, |e| e.scenarios.clone()),
        sizes: e2e.map_or_else(
            || {
                options
                    .micro
                    .as_ref()
                    .map_or_else(Vec::new, |m| m.0.clone())
            },
            |e| e.sizes.clone(),
        ),
        concurrencies: e2e.map_or_else(Vec::new, |e| e.concurrencies.clone()),
        warmup_s: e2e.map_or(0.0, |e| e.warmup.as_secs_f64()),
        duration_s: e2e.map_or(0.0, |e| e.duration.as_secs_f64()),
        token_latency_us: u64::try_from(options.token_latency.as_micros()).unwrap_or(u64::MAX),
        max_tokens: e2e.map_or(0, |e| e.max_tokens),
        envoy_version: ENVOY_VERSION.to_string(),
        envoy_concurrency: e2e.map_or(EnvoyOptions::default().concurrency, |e| e.proxy_threads),
        wasm_bytes,
        source: source_revision(),
        rounds: e2e.map_or(1, |e| e.rounds),
    }
}

/// `git rev-parse --short HEAD`, with `+` when `src/` differs from it.
fn source_revision() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .current_dir(repo_root())
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain", "--", "src"]).is_some_and(|s| !s.is_empty());
    if dirty { format!("{head}+") } else { head }
}

/// `bench.json`, `bench.md` and the SVG plots in `dir`.
pub fn write_outputs(results: &BenchResults, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = dir.join("bench.json");
    let text = serde_json::to_string_pretty(results).context("encoding the results")?;
    std::fs::write(&json, text).with_context(|| format!("writing {}", json.display()))?;
    let markdown = dir.join("bench.md");
    std::fs::write(&markdown, table::render(results, table::Style::Markdown))
        .with_context(|| format!("writing {}", markdown.display()))?;
    let plots = plot::write_plots(results, dir)?;
    log::info!(
        "wrote {}, {} and {} plots in {}",
        json.display(),
        markdown.display(),
        plots.len(),
        dir.display()
    );
    Ok(())
}

/// Reads an earlier `bench.json`.
pub fn read_results(path: &Path) -> Result<BenchResults> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

//! `bench`: the end-to-end benchmark (floor, Envoy alone, Envoy + pinroute, Python proxy,
//! vllm-router) and the policy core's micro-benchmark; with `--workload prefix`, the
//! prefix-aware routing benchmark instead; see `docs/benchmarks.md`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use pinroute_harness::envoy::{EnvoyOptions, repo_root};
use pinroute_lab::bench::e2e::E2eOptions;
use pinroute_lab::bench::prefix::fleet::FleetSpec;
use pinroute_lab::bench::prefix::report as prefix_report;
use pinroute_lab::bench::prefix::traffic::{Sharing, Traffic};
use pinroute_lab::bench::prefix::{Chooser, PrefixOptions, run_prefix_bench};
use pinroute_lab::bench::{
    BenchOptions, Scenario, read_results, registry_axis, results, run_bench, sims, table,
    write_outputs,
};
use serde_json::json;

const FULL_SIZES: [usize; 4] = [1024, 8 * 1024, 32 * 1024, 256 * 1024];
const FULL_CONCURRENCY: [usize; 4] = [1, 16, 64, 256];
const QUICK_SIZES: [usize; 1] = [1024];
const QUICK_CONCURRENCY: [usize; 2] = [1, 16];
/// The registry-size axis of a full run: N prefill + N decode workers.
const FULL_REGISTRY: [u64; 4] = [1, 10, 100, 1000];
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const PREFIX_CONCURRENCY: [usize; 3] = [8, 32, 64];
const QUICK_PREFIX_CONCURRENCY: [usize; 1] = [16];
const AGREEMENT_CONCURRENCY: [usize; 4] = [8, 32, 64, 128];
/// Agreement runs pooled per row: a single run's figure at 64 users and more moves by up to
/// 15 points with its prompts (`docs/benchmarks.md`).
const AGREEMENT_SALTS: u64 = 3;

/// What `bench` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// What the gateway costs: one completion per prompt size and concurrency.
    Size,
    /// How each gateway places requests that share long prompt beginnings.
    Prefix,
}

#[derive(clap::Args)]
pub struct Args {
    /// A short run (CI smoke test): 1 KB prompts at concurrency 1 and 16, 1.5 s per run,
    /// a short micro-benchmark. Explicit options below still apply.
    #[arg(long)]
    quick: bool,
    /// Scenarios to run, comma-separated: floor, envoy, envoy-2hop, pinroute, python,
    /// vllm-router.
    #[arg(long, value_delimiter = ',', value_parser = parse_scenario)]
    scenarios: Option<Vec<Scenario>>,
    /// Prompt sizes (client body bytes), comma-separated: 1k, 32k, 256k, or a number.
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Option<Vec<usize>>,
    /// Concurrencies (closed-loop virtual users), comma-separated.
    #[arg(long, value_delimiter = ',')]
    concurrency: Option<Vec<usize>>,
    /// Seconds measured per run, after the warm-up [default: 8, quick: 1.5].
    #[arg(long, value_name = "SECONDS")]
    duration: Option<f64>,
    /// Seconds of warm-up per run, not measured [default: 2, quick: 0.5].
    #[arg(long, value_name = "SECONDS")]
    warmup: Option<f64>,
    /// Time each sim worker takes per generated token.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 1000)]
    token_latency_us: u64,
    /// Tokens each decode streams back.
    #[arg(long, default_value_t = 8)]
    max_tokens: u32,
    /// Milliseconds per stage and size of the micro-benchmark [default: 300, quick: 30].
    #[arg(long, value_name = "MS")]
    micro_budget_ms: Option<u64>,
    /// Skip the policy micro-benchmark.
    #[arg(long, conflicts_with = "micro_only")]
    no_micro: bool,
    /// Only the policy micro-benchmark.
    #[arg(long)]
    micro_only: bool,
    /// The registry-size axis: N prefill + N decode workers (loopback aliases of the sims),
    /// comma-separated; envoy-2hop and the pinroute builds among --scenarios (with
    /// envoy-2hop-named, the baseline of their share), unpinned, at 1 KB and concurrency 16
    /// [default: 1,10,100,1000; quick: none].
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "N",
        conflicts_with = "no_registry"
    )]
    registry: Option<Vec<u64>>,
    /// No registry-size axis.
    #[arg(long)]
    no_registry: bool,
    /// Rounds of the registry-size axis: each proxy and size is run this many times, one
    /// round after the other, and its median run by CPU per request kept.
    #[arg(long, value_name = "N", default_value_t = 3)]
    registry_rounds: u32,
    /// Rounds of the size table: at each size and concurrency the scenarios take turns this
    /// many times, and each keeps its median run by CPU per request (the rounds' range is
    /// shown beside it).
    #[arg(long, value_name = "N", default_value_t = 1)]
    rounds: u32,
    /// Worker threads of each proxy: Envoy's `--concurrency` and vllm-router's tokio workers
    /// (`TOKIO_WORKER_THREADS`), so that both run as many.
    #[arg(long, value_name = "N", default_value_t = EnvoyOptions::default().concurrency)]
    proxy_threads: u32,
    /// Run this filter instead of building it (to compare two builds in the same way).
    #[arg(long, value_name = "FILE")]
    wasm: Option<PathBuf>,
    /// Directory for bench.json, bench.md and the SVG plots [default: target/bench].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print the table and redraw the plots of an earlier bench.json instead of running.
    #[arg(long, value_name = "FILE")]
    from_json: Option<PathBuf>,
    /// Internal: serve the benchmark's sim workers until stdin closes.
    #[arg(long, hide = true)]
    serve_sims: bool,
    /// Internal: with --serve-sims, listen on every address (for the registry-size axis).
    #[arg(long, hide = true)]
    sims_on_every_address: bool,
    /// `size` (the default): the cost table; `prefix`: prefix-aware routing, side by side
    /// with round robin, sessions, vllm-router and an oracle (its own options below).
    #[arg(long, value_enum, default_value = "size")]
    workload: Workload,
    /// Prefix workload: traffics, comma-separated: system-prompts, conversations.
    #[arg(long, value_delimiter = ',', value_parser = parse_traffic)]
    traffic: Option<Vec<Traffic>>,
    /// Prefix workload: choosers, comma-separated: round-robin, pinroute-load,
    /// pinroute-session, pinroute-prefix, pinroute-prefix-local, vllm-router, oracle.
    #[arg(long, value_delimiter = ',', value_parser = parse_chooser)]
    choosers: Option<Vec<Chooser>>,
    /// Prefix workload: prefill sim workers.
    #[arg(long, default_value_t = 4)]
    prefill_workers: u64,
    /// Prefix workload: decode sim workers.
    #[arg(long, default_value_t = 2)]
    decode_workers: u64,
    /// Prefix workload: model counts to compare, comma-separated (`1,2`): each runs every
    /// traffic, concurrency and chooser on a fleet serving that many models, each with
    /// its own prefill and decode workers and `--concurrency` users; the report sets each
    /// model's share beside one model alone. Above 1, pinroute choosers only.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    models: Vec<u64>,
    /// Prefix workload: blocks of 16 tokens in each worker's prefix cache.
    #[arg(long, default_value_t = 1024)]
    cache_blocks: usize,
    /// Prefix workload: prefill compute per uncached prompt token.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 20)]
    prefill_us_per_token: u64,
    /// Prefix workload: `local_prefill_max_bytes` of pinroute-prefix-local.
    #[arg(long, default_value_t = 1024)]
    local_prefill_max_bytes: usize,
    /// Prefix workload: `local_prefill_suffix_bytes` of pinroute-prefix-local.
    #[arg(long, default_value_t = 2048)]
    local_prefill_suffix_bytes: usize,
    /// Prefix workload: filter settings (JSON) for every pinroute gateway, to try others
    /// than the defaults.
    #[arg(long, value_name = "JSON", default_value = "{}")]
    pinroute_settings: String,
    /// Prefix workload: seconds measured in each replica-agreement run, after the warm-up;
    /// one run per traffic, --agreement-concurrency and engine_load off and on (0: none)
    /// [default: 6, quick: 2].
    #[arg(long, value_name = "SECONDS")]
    agreement_seconds: Option<f64>,
    /// Prefix workload: users of the replica-agreement runs, comma-separated
    /// [default: 8,32,64,128; quick: 16].
    #[arg(long, value_delimiter = ',', value_name = "USERS")]
    agreement_concurrency: Option<Vec<usize>>,
    /// Prefix workload: how the two replicas of the agreement runs share the requests: all to
    /// both (`mirrored`), or each to one in turn and one in four also to the other (`split`).
    #[arg(long, value_enum, value_name = "SHARING", default_value_t = Sharing::Mirrored)]
    agreement_sharing: Sharing,
    /// Prefix workload: the first run's prompt salt (each run adds one; printed with the
    /// results), to send another build the same prompts [default: the time].
    #[arg(long, value_name = "N")]
    salt: Option<u64>,
    /// Prefix workload: runs with different prompts pooled in each replica-agreement row
    /// [default: 3, quick: 1].
    #[arg(long, value_name = "RUNS")]
    agreement_salts: Option<u64>,
}

pub async fn run(args: &Args) -> Result<()> {
    if args.serve_sims {
        let token_latency = Duration::from_micros(args.token_latency_us);
        return sims::serve_sims(token_latency, args.sims_on_every_address).await;
    }
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| repo_root().join("target/bench"));
    if args.workload == Workload::Prefix {
        return prefix(args, out_dir).await;
    }
    let results = match &args.from_json {
        Some(path) => {
            // Judged again: the targets are this source's, the figures the run's.
            let mut results = read_results(path)?;
            results.targets = results::check_targets(&results);
            write_outputs(&results, &out_dir)?;
            results
        }
        None => run_bench(&options(args, out_dir)?).await?,
    };
    println!("{}", table::render(&results, table::Style::Text));
    // A peer's own failures (vllm-router drops some 256 KB requests) are its result, shown
    // in the errors column; only the proxies this project ships fail the command.
    let failed: u64 = results
        .runs
        .iter()
        .filter(|r| !r.scenario.is_peer())
        .map(|r| r.unexpected)
        .sum();
    if failed > 0 {
        bail!("{failed} requests failed their check (see the errors column and bench.json)");
    }
    Ok(())
}

fn options(args: &Args, out_dir: PathBuf) -> Result<BenchOptions> {
    let (sizes, concurrencies, duration, warmup, budget) = if args.quick {
        (
            QUICK_SIZES.to_vec(),
            QUICK_CONCURRENCY.to_vec(),
            1.5,
            0.5,
            30,
        )
    } else {
        (
            FULL_SIZES.to_vec(),
            FULL_CONCURRENCY.to_vec(),
            8.0,
            2.0,
            300,
        )
    };
    let sizes = args.sizes.clone().unwrap_or(sizes);
    let registry = match (&args.registry, args.no_registry || args.quick) {
        (Some(given), _) => given.clone(),
        (None, true) => Vec::new(),
        (None, false) => FULL_REGISTRY.to_vec(),
    };
    let e2e = E2eOptions {
        // Envoy naming its hosts adds nothing to the size table's one worker of each role,
        // and the module counting its time is its own measure: by default only the registry
        // axis runs them, as its baseline and beside the module.
        scenarios: args.scenarios.clone().unwrap_or_else(|| {
            Scenario::ALL
                .into_iter()
                .filter(|s| ![registry_axis::BASELINE, registry_axis::TIMED].contains(s))
                .collect()
        }),
        sizes: sizes.clone(),
        concurrencies: args.concurrency.clone().unwrap_or(concurrencies),
        warmup: seconds(args.warmup.unwrap_or(warmup))?,
        duration: seconds(args.duration.unwrap_or(duration))?,
        max_tokens: args.max_tokens,
        request_timeout: REQUEST_TIMEOUT,
        wasm: args.wasm.clone(),
        registry,
        registry_rounds: args.registry_rounds,
        proxy_threads: args.proxy_threads,
        rounds: args.rounds,
    };
    if e2e.concurrencies.contains(&0) {
        bail!("--concurrency must be at least 1");
    }
    if e2e.proxy_threads == 0 {
        bail!("--proxy-threads must be at least 1");
    }
    if e2e.registry_rounds == 0 || e2e.rounds == 0 {
        bail!("--rounds and --registry-rounds must be at least 1");
    }
    for count in &e2e.registry {
        sims::check_alias_count(*count).map_err(|e| anyhow::anyhow!("--registry: {e}"))?;
    }
    Ok(BenchOptions {
        e2e: (!args.micro_only).then_some(e2e),
        micro: (!args.no_micro).then(|| (sizes, args.micro_budget_ms.unwrap_or(budget))),
        token_latency: Duration::from_micros(args.token_latency_us),
        quick: args.quick,
        out_dir,
    })
}

async fn prefix(args: &Args, out_dir: std::path::PathBuf) -> Result<()> {
    let (concurrencies, agreement_users, duration, warmup, agreement) = if args.quick {
        let quick = QUICK_PREFIX_CONCURRENCY.to_vec();
        (quick.clone(), quick, 2.0, 1.0, 2.0)
    } else {
        (
            PREFIX_CONCURRENCY.to_vec(),
            AGREEMENT_CONCURRENCY.to_vec(),
            6.0,
            2.0,
            6.0,
        )
    };
    let options = PrefixOptions {
        traffics: args
            .traffic
            .clone()
            .unwrap_or_else(|| Traffic::ALL.to_vec()),
        concurrencies: args.concurrency.clone().unwrap_or(concurrencies),
        choosers: args
            .choosers
            .clone()
            .unwrap_or_else(|| Chooser::ALL.to_vec()),
        warmup: seconds(args.warmup.unwrap_or(warmup))?,
        duration: seconds(args.duration.unwrap_or(duration))?,
        max_tokens: args.max_tokens,
        models: args.models.clone(),
        fleet: FleetSpec {
            prefill_workers: args.prefill_workers,
            decode_workers: args.decode_workers,
            models: 1,
            cache_blocks: args.cache_blocks,
            prefill_us_per_token: args.prefill_us_per_token,
            token_latency_us: args.token_latency_us,
        },
        local_settings: json!({
            "local_prefill_max_bytes": args.local_prefill_max_bytes,
            "local_prefill_suffix_bytes": args.local_prefill_suffix_bytes,
        }),
        pinroute_settings: serde_json::from_str(&args.pinroute_settings)
            .map_err(|e| anyhow::anyhow!("--pinroute-settings: {e}"))?,
        agreement: seconds(args.agreement_seconds.unwrap_or(agreement))?,
        agreement_concurrencies: args
            .agreement_concurrency
            .clone()
            .unwrap_or(agreement_users),
        agreement_sharing: args.agreement_sharing,
        salt: args.salt,
        agreement_salts: args.agreement_salts.unwrap_or(if args.quick {
            1
        } else {
            AGREEMENT_SALTS
        }),
        request_timeout: REQUEST_TIMEOUT,
        out_dir,
    };
    if options.concurrencies.contains(&0) {
        bail!("--concurrency must be at least 1");
    }
    if options.agreement_concurrencies.contains(&0) {
        bail!("--agreement-concurrency must be at least 1");
    }
    let results = run_prefix_bench(&options).await?;
    println!("{}", prefix_report::render(&results, table::Style::Text));
    let runs = results.runs.iter().map(|r| r.unexpected);
    let failed: u64 = runs
        .chain(results.agreement.iter().map(|a| a.unexpected))
        .sum();
    if failed > 0 {
        bail!("{failed} requests failed their check (see the errors column and prefix.json)");
    }
    Ok(())
}

fn parse_traffic(text: &str) -> Result<Traffic, String> {
    text.parse().map_err(|e: anyhow::Error| e.to_string())
}

fn parse_chooser(text: &str) -> Result<Chooser, String> {
    Chooser::ALL
        .into_iter()
        .find(|c| c.as_str() == text.trim())
        .ok_or_else(|| format!("unknown chooser {text:?}"))
}

fn seconds(value: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(value).map_err(|e| anyhow::anyhow!("{value} seconds: {e}"))
}

fn parse_scenario(text: &str) -> Result<Scenario, String> {
    text.parse().map_err(|e: anyhow::Error| e.to_string())
}

/// `1k` = 1024 bytes, `256k`, `1m`, or plain bytes.
fn parse_size(text: &str) -> Result<usize, String> {
    let lower = text.trim().to_ascii_lowercase();
    let (digits, unit) = match lower.strip_suffix(['k', 'm']) {
        Some(digits) if lower.ends_with('k') => (digits, 1024),
        Some(digits) => (digits, 1024 * 1024),
        None => (lower.as_str(), 1),
    };
    let value: usize = digits
        .trim()
        .parse()
        .map_err(|e| format!("size {text:?}: {e}"))?;
    match value.checked_mul(unit) {
        Some(size) if size >= 256 => Ok(size),
        _ => Err(format!("size {text:?}: expected 256 bytes or more")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parsed(line: &[&str]) -> Result<BenchOptions> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let cli = <Cli as clap::Parser>::try_parse_from(line)?;
        options(&cli.args, PathBuf::from("out"))
    }

    #[test]
    fn every_proxy_runs_the_threads_asked_for_and_two_by_default() {
        let threads = |line: &[&str]| parsed(line).unwrap().e2e.unwrap().proxy_threads;
        assert_eq!(threads(&["bench"]), 2);
        assert_eq!(threads(&["bench", "--proxy-threads", "1"]), 1);
        assert!(parsed(&["bench", "--proxy-threads", "0"]).is_err());
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1k").unwrap(), 1024);
        assert_eq!(parse_size("256K").unwrap(), 262_144);
        assert_eq!(parse_size("1m").unwrap(), 1_048_576);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("12").is_err());
        assert!(parse_size("abc").is_err());
    }
}

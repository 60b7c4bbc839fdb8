//! `pinroute-lab soak`: tens of thousands of requests through Envoy + pinroute + sim
//! workers while workers are killed and restarted, every answer judged against the class its
//! request should get (`docs/soak.md`).
//!
//! - [`mix`]: the requests (pins by header and `nvext`, ranks, sessions, unpinned, SSE,
//!   chat and completions, invalid ones) and what each should get;
//! - [`chaos`]: the kills and restarts, as the load progresses, and when each worker was down;
//! - [`outcome`]: judging one answer (the exact rules, and the two outcomes a kill causes that
//!   are counted apart);
//! - [`workload`]: the [`crate::load`] workload that sends and judges;
//! - [`probe`]: Envoy's memory, wasm VM failure stats and error log;
//! - [`recovery`]: after the soak, every worker back in service and unpinned load spread evenly;
//! - [`report`]: the table and the JSON.

pub mod chaos;
pub mod deployment;
pub mod mix;
pub mod outcome;
pub mod probe;
pub mod recovery;
pub mod report;
pub mod tally;
pub mod workload;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::load::{ClientTls, LoadReport, LoadSpec, Stop, run_load};
use crate::tls::RunTls;
use chaos::{Action, Step, run_chaos};
use deployment::{HOSTILE_PREFILL, LONGEST_OUTAGE, WorkerTiming, stack_spec};
use pinroute::policy::config::Settings;
use pinroute_harness::sim::{Fault, MetricsFault};
use pinroute_harness::stack::{Stack, StackSpec, WorkerFronts};
use probe::{EnvoyStats, access_log_flags, scan_log, watch_rss};
use recovery::Recovery;
use report::{Measured, SoakReport};
use workload::{Shared, SoakWorkload};

/// A request without a complete answer after this long counts as unanswered.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// Seconds to wait for Envoy's access log to name every request it must confirm.
const ACCESS_LOG_WAITS: usize = 5;
/// Margin on top of the passive-health period for a restarted worker to be back.
const AFTERMATH_MARGIN: Duration = Duration::from_secs(1);

/// How to run a soak.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// The command line, for the report.
    pub command: String,
    pub requests: u64,
    pub concurrency: usize,
    pub schedule: Vec<Step>,
    pub wasm: PathBuf,
    /// Envoy's files (bootstrap, log, access log).
    pub work_dir: PathBuf,
    pub token_latency: Duration,
    /// Tokens a request asks for (up to twice this).
    pub max_tokens: u32,
    /// Mutual TLS on both sides: clients to Envoy, Envoy to every worker (behind TLS fronts).
    pub tls: bool,
    /// The native dynamic module to run in place of the `.wasm`.
    pub native_module: Option<PathBuf>,
}

/// Starts the stack, runs the load and the chaos together, and reports.
pub async fn run_soak(options: &SoakOptions) -> Result<SoakReport> {
    let mut spec = stack_spec(
        options.wasm.clone(),
        WorkerTiming {
            token_latency: options.token_latency,
        },
    );
    spec.native_module = options.native_module.clone();
    let client_tls = match options.tls {
        true => Some(with_tls(&mut spec, &options.work_dir.join("tls"))?),
        false => None,
    };
    let mut stack = Stack::start(&spec, &options.work_dir)
        .await
        .context("starting Envoy and the sim workers")?;
    let hostile = stack.worker(HOSTILE_PREFILL)?;
    hostile.set_fault(Fault::Hostile);
    hostile.set_metrics_fault(MetricsFault::Garbage);
    let wasm = options.native_module.is_none();
    let envoy_start = EnvoyStats::read(&stack.envoy, wasm).await?;
    let shared = Arc::new(Shared::new());
    let pid = stack.envoy.pid();
    let admin = stack.envoy.admin();
    let workload = SoakWorkload {
        gateway: stack.envoy.listen(),
        shared: shared.clone(),
        max_tokens: options.max_tokens,
        answer_timeout: ANSWER_TIMEOUT,
        aftermath: LONGEST_OUTAGE + AFTERMATH_MARGIN,
        token_latency: options.token_latency,
        tls: client_tls.clone(),
    };
    log::info!(
        "soak: {} requests at concurrency {}",
        options.requests,
        options.concurrency
    );
    let (load, chaos, rss) = tokio::join!(
        run_load_then_finish(workload, options),
        run_chaos(
            &mut stack,
            &options.schedule,
            options.requests,
            &shared.progress,
            &shared.outages,
            shared.epoch
        ),
        watch_rss(admin, pid, &shared.progress, options.requests),
    );
    let chaos = chaos?;
    tokio::time::sleep(LONGEST_OUTAGE + AFTERMATH_MARGIN).await;
    settle_with_access_log(&shared, stack.envoy.access_log_path()).await?;
    let recovery = Recovery::check(stack.envoy.listen(), client_tls).await;
    // A prefill hop may wait on a worker that stopped answering for its whole timeout.
    let limit = Settings::default().prefill_timeout() + AFTERMATH_MARGIN;
    match probe::wait_for_open_requests(&stack.envoy, limit).await? {
        (0, _) => {}
        (open, Some(took)) => log::warn!(
            "soak: {open} requests were still open in Envoy after the run; all ended within {took:?}"
        ),
        (open, None) => log::warn!(
            "soak: {open} requests were still open in Envoy after the run, some still after {limit:?}"
        ),
    }
    let measured = Measured {
        command: options.command.clone(),
        requests: options.requests,
        scheduled_kills: options
            .schedule
            .iter()
            .filter(|s| s.action == Action::Kill)
            .count(),
        tally: shared.tally.snapshot(),
        load,
        chaos,
        recovery,
        envoy_start,
        envoy_end: EnvoyStats::read(&stack.envoy, wasm).await?,
        rss: rss?,
        log: scan_log(stack.envoy.log_path())?,
    };
    Ok(SoakReport::new(measured))
}

/// Puts mutual TLS on both sides of `spec`, from a CA made in `dir`; how clients reach it.
fn with_tls(spec: &mut StackSpec, dir: &Path) -> Result<ClientTls> {
    let tls = RunTls::create(dir, true)?;
    spec.edge.tls = Some(tls.listener);
    if let Some((server, worker_tls)) = tls.workers {
        spec.worker_fronts = Some(WorkerFronts {
            server,
            client_ca: Some(tls.ca),
        });
        spec.edge.worker_tls = Some(worker_tls);
    }
    Ok(tls.client)
}

async fn run_load_then_finish(workload: SoakWorkload, options: &SoakOptions) -> LoadReport {
    let shared = workload.shared.clone();
    let spec = LoadSpec {
        concurrency: options.concurrency,
        stop: Stop::Requests(options.requests),
        warmup: Duration::ZERO,
        request_timeout: ANSWER_TIMEOUT * 2,
    };
    let report = run_load(Arc::new(workload), &spec).await;
    shared.progress.finish();
    report
}

/// Confirms the verdicts that need Envoy's access log, once it has them (Envoy writes it
/// about once a second).
async fn settle_with_access_log(shared: &Shared, access_log: &Path) -> Result<()> {
    let wanted = shared.tally.deferred_ids();
    let mut flags = access_log_flags(access_log)?;
    for _ in 0..ACCESS_LOG_WAITS {
        if wanted.iter().all(|id| flags.contains_key(id)) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        flags = access_log_flags(access_log)?;
    }
    shared.tally.settle(&flags);
    Ok(())
}

//! The end-to-end runs: every scenario, prompt size and concurrency against the same sim
//! workers, with the CPU and memory of every process involved.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::time::Instant;

use super::counted::{self, CountedWork};
use super::gateways::{Gateway, GatewayInputs, Scenario, start_gateway};
use super::plot::short_size;
use super::procfs::{self, MachineTicks, TICKS_PER_SECOND};
use super::registry_axis::{self, RegistryRun};
use super::results::{CpuUse, OwnTime, RunResult, TARGET_CONCURRENCY};
use super::rounds;
use super::sims::{SimAddresses, Workers};
use super::workload::{Bodies, Completion, NamedHosts, Route};
use crate::load::{LoadReport, LoadSpec, Stop, run_load};
use pinroute_harness::envoy::native;
use pinroute_harness::envoy::{admin_stats_text, cumulative_quantile, stat_value};

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct E2eOptions {
    pub scenarios: Vec<Scenario>,
    pub sizes: Vec<usize>,
    pub concurrencies: Vec<usize>,
    pub warmup: Duration,
    pub duration: Duration,
    pub max_tokens: u32,
    pub request_timeout: Duration,
    /// The filter to run instead of building this tree's (to compare two builds).
    pub wasm: Option<PathBuf>,
    /// The registry-size axis: N prefill + N decode workers for each N (`registry_axis`);
    /// empty: none.
    pub registry: Vec<u64>,
    /// Times each proxy and size of the registry axis is run; the median run is kept.
    pub registry_rounds: u32,
    /// Worker threads of each proxy (Envoy's `--concurrency`, vllm-router's tokio workers).
    pub proxy_threads: u32,
    /// Times each scenario runs at each size and concurrency; the median run is kept.
    pub rounds: u32,
}

impl E2eOptions {
    fn run_count(&self) -> u64 {
        let cells = self.scenarios.len() * self.sizes.len() * self.concurrencies.len();
        cells as u64 * u64::from(self.rounds.max(1))
    }
}

/// The processes whose CPU is measured.
#[derive(Debug, Clone, Copy)]
struct Pids {
    proxy: Option<u32>,
    sims: u32,
}

/// CPU counters at one instant.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    at: Instant,
    proxy: Option<u64>,
    sims: u64,
    loadgen: u64,
    machine: MachineTicks,
}

fn snapshot(pids: Pids) -> Result<Snapshot> {
    Ok(Snapshot {
        at: Instant::now(),
        proxy: pids.proxy.map(procfs::process_ticks).transpose()?,
        sims: procfs::process_ticks(pids.sims)?,
        loadgen: procfs::own_ticks()?,
        machine: procfs::machine_ticks()?,
    })
}

/// Runs everything in `options`; the sim workers are already running. Every proxy is
/// started first and the scenarios take turns at each size and concurrency, so that other
/// work on the machine, if any, weighs on all of them alike.
pub async fn run_e2e(
    options: &E2eOptions,
    inputs: &GatewayInputs<'_>,
    sims_pid: u32,
) -> Result<Vec<RunResult>> {
    let progress = progress_bar(options.run_count());
    let mut gateways = Vec::new();
    for scenario in &options.scenarios {
        progress.set_message(format!("starting {scenario}"));
        gateways.push((*scenario, start_gateway(*scenario, inputs).await?));
    }
    let mut results = Vec::new();
    for size in &options.sizes {
        let contenders =
            contenders(&gateways, *size, Pins::Sent, options, inputs, sims_pid).await?;
        for concurrency in &options.concurrencies {
            for _ in 0..options.rounds.max(1) {
                for contender in &contenders {
                    let scenario = contender.scenario;
                    let cell = format!("{scenario} {} c={concurrency}", short_size(*size));
                    progress.set_message(cell);
                    let result = contender.run(*size, options, *concurrency).await?;
                    progress.suspend(|| eprintln!("{}", one_line(&result)));
                    results.push(result);
                    progress.inc(1);
                }
            }
        }
    }
    progress.finish_and_clear();
    let mut results = rounds::medians(
        results,
        |a, b| (a.scenario, a.size, a.concurrency) == (b.scenario, b.size, b.concurrency),
        |run| run.cpu.proxy_s_per_1k,
        RunResult::keep_rounds,
    );
    results.sort_by_key(|r| (r.size, r.scenario, r.concurrency));
    Ok(results)
}

/// The registry-size axis: for each registry size, Envoy alone and the pinroute builds among
/// `options.scenarios` with that many aliased workers of each role, unpinned, one after the
/// other at 1 KB and concurrency 16. Each proxy runs alone, stopped before the next starts:
/// an idle Envoy left running holds a connection to every one of its thousands of hosts,
/// and the one measured after it paid for them (up to 0.14 ms per request more, measured).
pub async fn run_registry_axis(
    options: &E2eOptions,
    inputs: &GatewayInputs<'_>,
    sims: SimAddresses,
    sims_pid: u32,
) -> Result<Vec<RegistryRun>> {
    let mut scenarios: Vec<Scenario> = registry_axis::SCENARIOS
        .into_iter()
        .filter(|s| options.scenarios.contains(s))
        .collect();
    if scenarios.iter().any(|s| s.runs_pinroute()) {
        scenarios.insert(0, registry_axis::BASELINE);
    }
    if scenarios.contains(&Scenario::PinrouteNative) {
        scenarios.push(registry_axis::TIMED);
    }
    if options.registry.is_empty() || scenarios.is_empty() {
        return Ok(Vec::new());
    }
    let rounds = options.registry_rounds.max(1);
    let progress =
        progress_bar((options.registry.len() * scenarios.len()) as u64 * u64::from(rounds));
    let size = registry_axis::SIZE;
    let mut runs = Vec::new();
    for round in 1..=rounds {
        for count in &options.registry {
            let workers = Workers::aliased(sims, *count)?;
            let inputs = GatewayInputs {
                workers: &workers,
                ..*inputs
            };
            for scenario in &scenarios {
                progress.set_message(format!(
                    "{scenario} with {count}+{count} workers, round {round} of {rounds}"
                ));
                let gateway = [(*scenario, start_gateway(*scenario, &inputs).await?)];
                let [contender] =
                    contenders(&gateway, size, Pins::None, options, &inputs, sims_pid)
                        .await?
                        .try_into()
                        .map_err(|_| anyhow::anyhow!("{scenario}: no workload"))?;
                let run = contender.run(size, options, TARGET_CONCURRENCY).await?;
                progress.suspend(|| eprintln!("{count}+{count} workers: {}", one_line(&run)));
                runs.push(RegistryRun::single(*count, run));
                progress.inc(1);
            }
        }
    }
    progress.finish_and_clear();
    Ok(registry_axis::medians(runs))
}

/// The filter's instructions per request at each registry size of `options`, for each
/// pinroute build it runs (`counted`): the native module's only where valgrind is installed.
pub async fn count_registry_work(
    options: &E2eOptions,
    inputs: &GatewayInputs<'_>,
    sims: SimAddresses,
) -> Result<Vec<CountedWork>> {
    let wasm = options.scenarios.contains(&Scenario::Pinroute);
    let native = match (
        options.scenarios.contains(&Scenario::PinrouteNative),
        counted::valgrind(),
    ) {
        (true, None) => {
            log::warn!(
                "valgrind is not installed: the native module's instructions are not counted"
            );
            None
        }
        (wanted, valgrind) => valgrind.filter(|_| wanted),
    };
    let mut counted = Vec::new();
    for count in &options.registry {
        let workers = Workers::aliased(sims, *count)?;
        let inputs = GatewayInputs {
            workers: &workers,
            ..*inputs
        };
        if wasm {
            counted.push(counted::count_wasm(inputs.wasm, &workers, *count)?);
        }
        if let Some(valgrind) = &native {
            log::info!(
                "counting the native module's instructions with {count}+{count} workers under callgrind"
            );
            let work =
                counted::count_native(valgrind, &inputs, *count, options.request_timeout).await?;
            counted.push(work);
        }
    }
    Ok(counted)
}

/// Whether pinroute's requests carry the pins of the sims' workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pins {
    Sent,
    None,
}

/// A scenario ready to be measured at one prompt size.
struct Contender {
    scenario: Scenario,
    workload: Arc<Completion>,
    pids: Pids,
    /// The admin interface of an Envoy whose module counts its own time.
    own_time: Option<SocketAddr>,
}

impl Contender {
    /// One measured run at `concurrency`; `size` is the workload's nominal prompt size.
    async fn run(
        &self,
        size: usize,
        options: &E2eOptions,
        concurrency: usize,
    ) -> Result<RunResult> {
        let measured = measure(
            &self.workload,
            options,
            concurrency,
            self.pids,
            self.own_time,
        )
        .await?;
        Ok(run_result(self.scenario, size, &self.workload, measured))
    }
}

/// Every scenario's workload at `size`, each checked with a few requests.
async fn contenders(
    gateways: &[(Scenario, Option<Gateway>)],
    size: usize,
    pins: Pins,
    options: &E2eOptions,
    inputs: &GatewayInputs<'_>,
    sims_pid: u32,
) -> Result<Vec<Contender>> {
    let mut contenders = Vec::new();
    let sims = inputs.workers.first();
    for (scenario, gateway) in gateways {
        let address = gateway.as_ref().map(Gateway::address);
        let route = Route::of(*scenario, sims.prefill, sims.decode, address)?;
        let workload = Arc::new(Completion {
            route: match pins {
                Pins::Sent => route,
                Pins::None => route.unpinned(),
            },
            bodies: Bodies::new(size, options.max_tokens),
            tls: gateway.as_ref().and_then(Gateway::client_tls),
            named: (*scenario == Scenario::EnvoyTwoHopsNamed)
                .then(|| NamedHosts::new(inputs.workers)),
        });
        check_workload(&workload, *scenario, options.request_timeout).await?;
        let pids = Pids {
            proxy: gateway.as_ref().map(Gateway::pid),
            sims: sims_pid,
        };
        let own_time = gateway
            .as_ref()
            .filter(|_| *scenario == registry_axis::TIMED)
            .and_then(Gateway::envoy_admin);
        contenders.push(Contender {
            scenario: *scenario,
            workload,
            pids,
            own_time,
        });
    }
    Ok(contenders)
}

pub(crate) fn progress_bar(runs: u64) -> ProgressBar {
    let bar = ProgressBar::new(runs);
    let style =
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} runs  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style.progress_chars("=> "));
    bar.enable_steady_tick(Duration::from_millis(250));
    bar
}

/// Rounds of [`check_workload`]'s requests before a scenario is judged not to work.
const CHECK_ROUNDS: usize = 3;

/// A few requests one at a time: the scenario works before it is measured. A round with a
/// failure is tried again (a proxy's pooled connection may have been closed by an idle
/// worker just as it sent on it, as vllm-router's was at 256 KB): the scenario does not work
/// when no round of [`CHECK_ROUNDS`] passes. A peer that does not is measured all the same,
/// its failures counted in its errors column (vllm-router's stale pooled connections, up to
/// one per user of the last run, outlast the check's rounds).
async fn check_workload(
    workload: &Arc<Completion>,
    scenario: Scenario,
    timeout: Duration,
) -> Result<()> {
    let spec = LoadSpec {
        concurrency: 1,
        stop: Stop::Requests(3),
        warmup: Duration::ZERO,
        request_timeout: timeout,
    };
    let mut problems = Vec::new();
    for _ in 0..CHECK_ROUNDS {
        let report = run_load(workload.clone(), &spec).await;
        if report.outcomes.unexpected == 0 {
            if !problems.is_empty() {
                log::warn!(
                    "{scenario}: failed before it worked: {}",
                    problems.join("; ")
                );
            }
            return Ok(());
        }
        problems.extend(report.problems);
    }
    let problems = problems.join("; ");
    if scenario.is_peer() {
        log::warn!("{scenario} failed its check, measured all the same: {problems}");
        return Ok(());
    }
    bail!("the {scenario} scenario does not work: {problems}")
}

struct Measured {
    report: LoadReport,
    cpu: CpuUse,
    peak_rss_mib: Option<f64>,
    own_time: Option<OwnTime>,
}

/// One closed-loop run, with CPU counters read at the edges of the measured period.
async fn measure(
    workload: &Arc<Completion>,
    options: &E2eOptions,
    concurrency: usize,
    pids: Pids,
    own_time_admin: Option<SocketAddr>,
) -> Result<Measured> {
    if let Some(pid) = pids.proxy {
        procfs::reset_peak_rss(pid)?;
    }
    let spec = LoadSpec {
        concurrency,
        stop: Stop::Duration(options.duration),
        warmup: options.warmup,
        request_timeout: options.request_timeout,
    };
    let measure_from = Instant::now() + options.warmup;
    let measure_to = measure_from + options.duration;
    let first = tokio::spawn(snapshot_at(measure_from, pids));
    let last = tokio::spawn(snapshot_at(measure_to, pids));
    let counted = own_time_admin.map(|admin| {
        (
            tokio::spawn(own_time_at(measure_from, admin)),
            tokio::spawn(own_time_at(measure_to, admin)),
        )
    });
    let report = run_load(workload.clone(), &spec).await;
    let (first, last) = (first.await??, last.await??);
    let cpu = cpu_use(&first, &last, report.outcomes.total);
    let own_time = match counted {
        Some((first, last)) => Some(own_time(&first.await??, &last.await??)?),
        None => None,
    };
    let peak_rss_mib = pids
        .proxy
        .map(procfs::peak_rss_kib)
        .transpose()?
        .map(|kib| kib as f64 / 1024.0);
    Ok(Measured {
        report,
        cpu,
        peak_rss_mib,
        own_time,
    })
}

async fn own_time_at(at: Instant, admin: SocketAddr) -> Result<String> {
    tokio::time::sleep_until(at).await;
    admin_stats_text(admin).await
}

/// The native module's requests counter.
const REQUESTS_STAT: &str = "wasmcustom.pinroute.requests";

/// The module's own time and Envoy's per request between two readings of its `/stats`.
fn own_time(first: &str, last: &str) -> Result<OwnTime> {
    let [module, envoy, reads] = native::OWN_TIME_STATS;
    let mut deltas = [0.0; 4];
    for (delta, name) in deltas.iter_mut().zip([module, envoy, reads, REQUESTS_STAT]) {
        let (Some(a), Some(b)) = (stat_value(first, name)?, stat_value(last, name)?) else {
            bail!(
                "the module did not count its own time (is {} set?)",
                native::OWN_TIME_ENV
            );
        };
        *delta = b.saturating_sub(a) as f64;
    }
    let [module, envoy, reads, requests] = deltas;
    if requests == 0.0 {
        bail!("the module counted no request while its time was measured");
    }
    let per_request_us = |ns: f64| ns / requests / 1000.0;
    Ok(OwnTime {
        module_us: per_request_us(module),
        envoy_us: per_request_us(envoy),
        clock_reads: reads / requests,
        request_median_us: cumulative_quantile(last, native::OWN_TIME_REQUEST_HISTOGRAM, "P50")
            .map(|ns| ns / 1000.0),
    })
}

async fn snapshot_at(at: Instant, pids: Pids) -> Result<Snapshot> {
    tokio::time::sleep_until(at).await;
    snapshot(pids)
}

fn cpu_use(first: &Snapshot, last: &Snapshot, requests: u64) -> CpuUse {
    let seconds = last.at.duration_since(first.at).as_secs_f64().max(1e-9);
    let cpu_seconds = |a: u64, b: u64| b.saturating_sub(a) as f64 / TICKS_PER_SECOND;
    let cores = |cpu: f64| cpu / seconds;
    let proxy = first.proxy.zip(last.proxy).map(|(a, b)| cpu_seconds(a, b));
    let sims = cpu_seconds(first.sims, last.sims);
    let loadgen = cpu_seconds(first.loadgen, last.loadgen);
    let machine = cpu_seconds(first.machine.busy, last.machine.busy);
    let ours = sims + loadgen + proxy.unwrap_or(0.0);
    CpuUse {
        proxy_cores: proxy.map(cores),
        proxy_s_per_1k: proxy
            .filter(|_| requests > 0)
            .map(|cpu| cpu * 1000.0 / requests as f64),
        sims_cores: cores(sims),
        loadgen_cores: cores(loadgen),
        machine_busy_cores: cores(machine),
        others_cores: cores((machine - ours).max(0.0)),
    }
}

fn run_result(
    scenario: Scenario,
    size: usize,
    workload: &Completion,
    measured: Measured,
) -> RunResult {
    let report = &measured.report;
    RunResult {
        scenario,
        size,
        body_bytes: workload.bodies.client.len(),
        concurrency: report.concurrency,
        completed: report.outcomes.total,
        throughput_rps: report.throughput(),
        unexpected: report.outcomes.unexpected,
        classes: report.outcomes.classes.clone(),
        problems: report.problems.clone(),
        ttfb: report.first_byte_summary(),
        last_byte: report.last_byte_summary(),
        cpu: measured.cpu,
        proxy_peak_rss_mib: measured.peak_rss_mib,
        vs_floor: None,
        cpu_rounds: Vec::new(),
        own_time: measured.own_time,
    }
}

fn one_line(r: &RunResult) -> String {
    let proxy = r
        .cpu
        .proxy_cores
        .map_or(String::new(), |c| format!(" proxy {c:.2} cores"));
    let errors = if r.unexpected > 0 {
        format!(" ERRORS {}: {}", r.unexpected, r.problems.join("; "))
    } else {
        String::new()
    };
    format!(
        "{:<8} {:>6} B c={:<3} {:>7.0} req/s  TTFB p50 {:.2} p99 {:.2} ms  last p50 {:.2} ms {proxy} sims {:.2} loadgen {:.2} busy {:.2} (others {:.2}){errors}",
        r.scenario.as_str(),
        r.body_bytes,
        r.concurrency,
        r.throughput_rps,
        r.ttfb.p50_ms,
        r.ttfb.p99_ms,
        r.last_byte.p50_ms,
        r.cpu.sims_cores,
        r.cpu.loadgen_cores,
        r.cpu.machine_busy_cores,
        r.cpu.others_cores,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn own_time_is_what_the_module_counted_per_request_between_two_readings() {
        let stats = |own, envoy, reads, requests| {
            format!(
                "wasmcustom.pinroute.module.clock_reads: {reads}\n\
                 wasmcustom.pinroute.module.envoy_ns: {envoy}\n\
                 wasmcustom.pinroute.module.own_ns: {own}\n\
                 wasmcustom.pinroute.module.request_own_ns: P0(nan,9000) P25(nan,14000) \
                 P50(15000,16500) P75(nan,18000) P100(nan,90000)\n\
                 wasmcustom.pinroute.requests: {requests}\n"
            )
        };
        let first = stats(1_000_000, 5_000_000, 300, 100);
        let last = stats(17_000_000, 33_000_000, 100_300, 1_100);
        let own = own_time(&first, &last).unwrap();
        assert_eq!(
            own,
            OwnTime {
                module_us: 16.0,
                envoy_us: 28.0,
                clock_reads: 100.0,
                request_median_us: Some(16.5),
            }
        );
        let uncounted = "wasmcustom.pinroute.requests: 100\n";
        assert!(
            own_time(uncounted, &last).is_err(),
            "the variable was not set"
        );
        assert!(own_time(&last, &last).is_err(), "no request in between");
    }
}

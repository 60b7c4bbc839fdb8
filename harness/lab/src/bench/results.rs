//! The benchmark's results (written as `bench.json`), their ratios to the floor, and the
//! targets it checks them against.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::counted::CountedWork;
use super::gateways::Scenario;
use super::micro::MicroRun;
use super::registry_axis::{self, RegistryRun};
use crate::load::{LatencySummary, StatusClass};

/// The concurrency the latency targets are stated at.
pub const TARGET_CONCURRENCY: usize = 16;
pub const WASM_SIZE_LIMIT: u64 = 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResults {
    pub meta: Meta,
    pub runs: Vec<RunResult>,
    /// The registry-size axis (`registry_axis`): unpinned, N workers of each role.
    #[serde(default)]
    pub registry: Vec<RegistryRun>,
    /// The filter's instructions per request by registry size (`counted`).
    #[serde(default)]
    pub counted: Vec<CountedWork>,
    pub micro: Vec<MicroRun>,
    pub targets: Vec<TargetCheck>,
}

/// How the run was made, and on what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub unix_time: u64,
    pub cpus: usize,
    /// The processor's model (empty in results saved before it was kept).
    #[serde(default)]
    pub cpu_model: String,
    /// 1, 5 and 15 minute load averages just before the first run.
    pub load_average_before: [f64; 3],
    pub quick: bool,
    pub scenarios: Vec<Scenario>,
    pub sizes: Vec<usize>,
    pub concurrencies: Vec<usize>,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub token_latency_us: u64,
    pub max_tokens: u32,
    pub envoy_version: String,
    pub envoy_concurrency: u32,
    pub wasm_bytes: Option<u64>,
    /// The commit measured, `+` when `src/` had uncommitted changes.
    #[serde(default)]
    pub source: String,
    /// Rounds each cell ran (`--rounds`); its median run by proxy CPU is kept.
    #[serde(default = "one_round")]
    pub rounds: u32,
}

fn one_round() -> u32 {
    1
}

/// One scenario at one prompt size and concurrency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub scenario: Scenario,
    /// The nominal prompt size (1024, 32768, 262144).
    pub size: usize,
    /// The client request body actually sent.
    pub body_bytes: usize,
    pub concurrency: usize,
    pub completed: u64,
    pub throughput_rps: f64,
    /// Requests that failed the check (status, complete stream, prefill taken).
    pub unexpected: u64,
    pub classes: BTreeMap<StatusClass, u64>,
    pub problems: Vec<String>,
    /// To the first byte of the streamed answer (the first token).
    pub ttfb: LatencySummary,
    /// To the end of the streamed answer.
    pub last_byte: LatencySummary,
    pub cpu: CpuUse,
    /// Peak resident memory of the proxy process during the run (`VmHWM`).
    pub proxy_peak_rss_mib: Option<f64>,
    pub vs_floor: Option<VsFloor>,
    /// The proxy's CPU per request (ms) of every round of this cell, in the order they ran,
    /// when it ran in several (`--rounds`): this run is their median.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_rounds: Vec<f64>,
    /// The native module's own time per request and Envoy's inside its calls, as it counted
    /// them (`pinroute-native-timed` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_time: Option<OwnTime>,
}

impl RunResult {
    /// Takes from every round of its cell (`rounds`, in the order they ran) their CPU per
    /// request and their failures, so that a failed request in any round fails the bench.
    pub fn keep_rounds(&mut self, rounds: &[RunResult]) {
        self.cpu_rounds = rounds.iter().filter_map(|r| r.cpu.proxy_s_per_1k).collect();
        self.unexpected = rounds.iter().map(|r| r.unexpected).sum();
        self.problems = rounds.iter().flat_map(|r| r.problems.clone()).collect();
        self.problems.dedup();
    }
}

/// CPU used during the measured period, in cores (1.0 = one CPU busy all the time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuUse {
    pub proxy_cores: Option<f64>,
    /// CPU seconds of the proxy process per 1,000 requests.
    pub proxy_s_per_1k: Option<f64>,
    pub sims_cores: f64,
    pub loadgen_cores: f64,
    /// The whole machine, including processes that are not part of the benchmark.
    pub machine_busy_cores: f64,
    /// `machine_busy_cores` minus the benchmark's own processes: other work on the machine.
    pub others_cores: f64,
}

/// What the native module counted of its time during a run (`PINROUTE_OWN_TIME`), per
/// request: its own code, and Envoy's work inside the callbacks it made.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OwnTime {
    pub module_us: f64,
    pub envoy_us: f64,
    /// The counting's own readings of the clock, which both figures include.
    pub clock_reads: f64,
    /// The median request's own time in the module (since Envoy started), which a thread
    /// preempted inside a hook now and then does not move as it moves the mean.
    #[serde(default)]
    pub request_median_us: Option<f64>,
}

/// A run compared with the floor at the same size and concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct VsFloor {
    pub added_ttfb_p50_ms: f64,
    pub added_last_byte_p50_ms: f64,
    pub throughput_ratio: f64,
}

/// One target of the benchmark and how the run measured against it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetCheck {
    pub target: String,
    pub measured: String,
    /// `None` when the run did not measure it (scenario or size skipped).
    pub met: Option<bool>,
}

impl BenchResults {
    pub fn run(&self, scenario: Scenario, size: usize, concurrency: usize) -> Option<&RunResult> {
        self.runs
            .iter()
            .find(|r| r.scenario == scenario && r.size == size && r.concurrency == concurrency)
    }

    /// The highest throughput of `scenario` at `size`, over every concurrency.
    pub fn max_throughput(&self, scenario: Scenario, size: usize) -> Option<f64> {
        self.runs
            .iter()
            .filter(|r| r.scenario == scenario && r.size == size)
            .map(|r| r.throughput_rps)
            .max_by(f64::total_cmp)
    }
}

/// Fills `vs_floor` of every run that has a floor run to compare with.
pub fn compare_with_floor(runs: &mut [RunResult]) {
    let floors: Vec<RunResult> = runs
        .iter()
        .filter(|r| r.scenario == Scenario::Floor)
        .cloned()
        .collect();
    for run in runs.iter_mut() {
        let floor = floors
            .iter()
            .find(|f| f.size == run.size && f.concurrency == run.concurrency);
        run.vs_floor = floor.map(|floor| VsFloor {
            added_ttfb_p50_ms: run.ttfb.p50_ms - floor.ttfb.p50_ms,
            added_last_byte_p50_ms: run.last_byte.p50_ms - floor.last_byte.p50_ms,
            throughput_ratio: ratio(run.throughput_rps, floor.throughput_rps),
        });
    }
}

fn ratio(value: f64, reference: f64) -> f64 {
    if reference > 0.0 {
        value / reference
    } else {
        f64::NAN
    }
}

/// A prompt size as people say it: `1 KB`, `32 KB`, `256 KB`.
pub fn size_label(size: usize) -> String {
    match size {
        s if s >= 1024 * 1024 && s % (1024 * 1024) == 0 => format!("{} MB", s / (1024 * 1024)),
        s if s >= 1024 => format!("{} KB", s / 1024),
        s => format!("{s} B"),
    }
}

/// Every target that the results can speak to.
pub fn check_targets(results: &BenchResults) -> Vec<TargetCheck> {
    let mut checks = vec![
        added_latency_check(results, 1024, 1.0),
        added_latency_check(results, 256 * 1024, 2.5),
    ];
    for size in &results.meta.sizes {
        checks.push(throughput_check(
            results,
            *size,
            Scenario::Floor,
            0.8,
            Judged::AtTargetAndMaximum,
        ));
        checks.push(throughput_check(
            results,
            *size,
            Scenario::Python,
            10.0,
            Judged::AtMaximum,
        ));
    }
    checks.push(wasm_size_check(results.meta.wasm_bytes));
    checks.extend(super::versus::check_targets(results));
    checks.extend(registry_axis::check_targets(results));
    checks
}

fn added_latency_check(results: &BenchResults, size: usize, limit_ms: f64) -> TargetCheck {
    let target = format!(
        "pinroute adds at most {limit_ms} ms to the floor's p50 time to first byte at {}, concurrency {TARGET_CONCURRENCY}",
        size_label(size)
    );
    let added = results
        .run(Scenario::Pinroute, size, TARGET_CONCURRENCY)
        .and_then(|r| r.vs_floor)
        .map(|v| v.added_ttfb_p50_ms);
    match added {
        Some(added) => TargetCheck {
            target,
            measured: format!("+{added:.2} ms"),
            met: Some(added <= limit_ms),
        },
        None => not_measured(target),
    }
}

/// Which throughput ratios a target is judged on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Judged {
    /// At the target concurrency and at the maximum over concurrencies.
    AtTargetAndMaximum,
    /// At the maximum over concurrencies only: at the target concurrency a fast proxy is
    /// bound by the workers' latency (16 users over ~20 ms requests), not by its own cost.
    AtMaximum,
}

/// pinroute's throughput as a multiple of `reference`'s: at the target concurrency, and
/// at each one's best concurrency (maximum sustained throughput).
fn throughput_check(
    results: &BenchResults,
    size: usize,
    reference: Scenario,
    at_least: f64,
    judged: Judged,
) -> TargetCheck {
    let on = match judged {
        Judged::AtTargetAndMaximum => {
            format!("at concurrency {TARGET_CONCURRENCY} and at the maximum over concurrencies")
        }
        Judged::AtMaximum => "at the maximum over concurrencies".to_string(),
    };
    let target = format!(
        "pinroute carries at least {at_least}x the {reference} scenario's throughput at {}, {on}",
        size_label(size)
    );
    let at = |scenario| {
        results
            .run(scenario, size, TARGET_CONCURRENCY)
            .map(|r| r.throughput_rps)
    };
    let at_target = at(Scenario::Pinroute)
        .zip(at(reference))
        .map(|(p, r)| ratio(p, r));
    let at_max = results
        .max_throughput(Scenario::Pinroute, size)
        .zip(results.max_throughput(reference, size))
        .map(|(p, r)| ratio(p, r));
    match (at_target, at_max) {
        (Some(at_target), Some(at_max)) => TargetCheck {
            target,
            measured: format!(
                "{at_target:.2}x at concurrency {TARGET_CONCURRENCY}, {at_max:.2}x at maximum"
            ),
            met: Some(at_max >= at_least && (judged == Judged::AtMaximum || at_target >= at_least)),
        },
        _ => not_measured(target),
    }
}

fn wasm_size_check(wasm_bytes: Option<u64>) -> TargetCheck {
    let target = "the release pinroute.wasm is smaller than 1 MiB".to_string();
    match wasm_bytes {
        Some(bytes) => TargetCheck {
            target,
            measured: format!("{bytes} bytes ({:.0} KiB)", bytes as f64 / 1024.0),
            met: Some(bytes < WASM_SIZE_LIMIT),
        },
        None => not_measured(target),
    }
}

fn not_measured(target: String) -> TargetCheck {
    TargetCheck {
        target,
        measured: "not measured in this run".into(),
        met: None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn run(
        scenario: Scenario,
        size: usize,
        concurrency: usize,
        rps: f64,
        p50: f64,
    ) -> RunResult {
        RunResult {
            scenario,
            size,
            body_bytes: size,
            concurrency,
            completed: 100,
            throughput_rps: rps,
            unexpected: 0,
            classes: BTreeMap::new(),
            problems: vec![],
            ttfb: LatencySummary {
                p50_ms: p50,
                ..LatencySummary::default()
            },
            last_byte: LatencySummary {
                p50_ms: p50 * 2.0,
                ..LatencySummary::default()
            },
            cpu: CpuUse::default(),
            proxy_peak_rss_mib: None,
            vs_floor: None,
            cpu_rounds: vec![],
            own_time: None,
        }
    }

    pub(crate) fn results(runs: Vec<RunResult>) -> BenchResults {
        BenchResults {
            meta: Meta {
                unix_time: 0,
                cpus: 2,
                cpu_model: String::new(),
                load_average_before: [0.0; 3],
                quick: true,
                scenarios: Scenario::ALL.to_vec(),
                sizes: vec![1024],
                concurrencies: vec![1, 16],
                warmup_s: 0.0,
                duration_s: 1.0,
                token_latency_us: 1000,
                max_tokens: 8,
                envoy_version: "1.40.0".into(),
                envoy_concurrency: 2,
                wasm_bytes: Some(500_000),
                source: String::new(),
                rounds: 1,
            },
            runs,
            registry: vec![],
            counted: Vec::new(),
            micro: vec![],
            targets: vec![],
        }
    }

    #[test]
    fn ratios_and_targets() {
        let mut runs = vec![
            run(Scenario::Floor, 1024, 16, 1000.0, 3.0),
            run(Scenario::Pinroute, 1024, 16, 900.0, 3.5),
            run(Scenario::Python, 1024, 16, 100.0, 9.0),
            run(Scenario::Floor, 1024, 1, 100.0, 2.0),
            run(Scenario::Pinroute, 1024, 1, 95.0, 2.4),
            run(Scenario::Python, 1024, 1, 50.0, 5.0),
        ];
        compare_with_floor(&mut runs);
        let vs = runs[1].vs_floor.unwrap();
        assert!((vs.added_ttfb_p50_ms - 0.5).abs() < 1e-9);
        assert!((vs.throughput_ratio - 0.9).abs() < 1e-9);
        let checks = check_targets(&results(runs));
        assert_eq!(checks[0].met, Some(true), "{checks:?}");
        assert_eq!(checks[1].met, None, "256 KB was not run");
        assert_eq!(checks[2].met, Some(true), "0.9x floor at 16, 0.9x at max");
        assert_eq!(
            checks[3].met,
            Some(false),
            "9x Python at 16 is short of 10x"
        );
        assert_eq!(checks[4].met, Some(true));
    }

    #[test]
    fn a_failure_in_a_round_that_is_not_the_median_still_counts() {
        let round = |cpu: f64, unexpected: u64| {
            let mut run = run(Scenario::PinrouteNative, 1024, 16, 4000.0, 3.0);
            run.cpu.proxy_s_per_1k = Some(cpu);
            run.unexpected = unexpected;
            run.problems = (0..unexpected).map(|_| "HTTP 502".to_string()).collect();
            run
        };
        let rounds = [round(0.20, 0), round(0.30, 2), round(0.25, 0)];
        let mut median = rounds[2].clone();
        median.keep_rounds(&rounds);
        assert_eq!(median.cpu_rounds, vec![0.20, 0.30, 0.25]);
        assert_eq!(median.unexpected, 2);
        assert_eq!(median.problems, vec!["HTTP 502".to_string()]);
    }

    #[test]
    fn labels_sizes() {
        assert_eq!(size_label(1024), "1 KB");
        assert_eq!(size_label(256 * 1024), "256 KB");
        assert_eq!(size_label(100), "100 B");
    }
}

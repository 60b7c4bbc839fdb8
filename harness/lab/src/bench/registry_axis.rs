//! The registry-size axis: Envoy alone and each pinroute build in front of N prefill + N
//! decode workers (loopback aliases of the two sims: as many hosts, pools and connections as
//! that many machines), unpinned, at 1 KB and concurrency 16. What grows with the registry is
//! seen apart: Envoy's own hosts and pools (`envoy-2hop` with N-host clusters, and
//! `envoy-2hop-named`, whose hops name their workers in rotation through the clusters and
//! headers pinroute uses) from the filter's share (pinroute minus `envoy-2hop-named` at the
//! same N). The native module's share is a few hundredths of a millisecond, less than a
//! round's CPU moves end to end; beside it, the module counting its own time
//! (`pinroute-native-timed`) tells its own code apart from Envoy's work inside its calls, and
//! the instructions each build executes per request (`counted`), which judge the target.

use serde::{Deserialize, Serialize};

use super::counted;
use super::gateways::Scenario;
use super::results::{BenchResults, OwnTime, RunResult, TARGET_CONCURRENCY, TargetCheck};
use super::rounds::Difference;
use super::table::{Style, grid, ms};

/// The prompt size of the axis's runs.
pub const SIZE: usize = 1024;
/// The scenarios the axis runs, when the bench runs them; with a pinroute build, the
/// baseline of its share ([`BASELINE`]) too.
pub const SCENARIOS: [Scenario; 3] = [
    Scenario::EnvoyTwoHops,
    Scenario::Pinroute,
    Scenario::PinrouteNative,
];
/// Envoy doing for the hops what it does for pinroute's, without the filter.
pub const BASELINE: Scenario = Scenario::EnvoyTwoHopsNamed;
/// The native module counting its own time: run beside [`Scenario::PinrouteNative`], whose
/// own share it tells apart from Envoy's work inside the module's calls.
pub const TIMED: Scenario = Scenario::PinrouteNativeTimed;
/// How far the filter's own share at the largest registry may be above its share at the
/// smallest.
const FLAT_WITHIN: f64 = 0.10;

/// One run with `workers` prefill and `workers` decode workers: of several rounds, the
/// median by CPU per request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegistryRun {
    pub workers: u64,
    pub run: RunResult,
    /// The CPU per request of every round, in the order they ran (empty in results saved
    /// before rounds were kept).
    #[serde(default)]
    pub cpu_rounds: Vec<f64>,
    /// What the module counted of its own time in every round ([`TIMED`] only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub own_rounds: Vec<OwnTime>,
}

impl RegistryRun {
    pub fn single(workers: u64, run: RunResult) -> RegistryRun {
        let cpu_rounds = run.cpu.proxy_s_per_1k.into_iter().collect();
        let own_rounds = run.own_time.into_iter().collect();
        RegistryRun {
            workers,
            run,
            cpu_rounds,
            own_rounds,
        }
    }

    fn cpu_ms(&self) -> Option<f64> {
        self.run.cpu.proxy_s_per_1k
    }

    /// The module's own µs per request over the rounds (its counters' mean): their median,
    /// lowest and highest.
    fn module_us(&self) -> Option<Spread> {
        Spread::of(self.own_rounds.iter().map(|own| own.module_us))
    }

    /// The median request's own µs in the module, likewise.
    fn request_median_us(&self) -> Option<Spread> {
        Spread::of(
            self.own_rounds
                .iter()
                .filter_map(|own| own.request_median_us),
        )
    }

    /// Envoy's µs per request inside the module's calls, likewise.
    fn envoy_us(&self) -> Option<Spread> {
        Spread::of(self.own_rounds.iter().map(|own| own.envoy_us))
    }
}

/// Rounds' values: their median (the upper one of an even count), lowest and highest.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Spread {
    median: f64,
    low: f64,
    high: f64,
}

impl Spread {
    fn of(values: impl Iterator<Item = f64>) -> Option<Spread> {
        let (median, low, high) = super::rounds::median_and_range(values)?;
        Some(Spread { median, low, high })
    }

    /// `16.1`, or over rounds `16.1 (15.8 to 16.9)`.
    fn render(&self) -> String {
        if self.low == self.high {
            return format!("{:.1}", self.median);
        }
        format!("{:.1} ({:.1} to {:.1})", self.median, self.low, self.high)
    }
}

/// One run per registry size and scenario, in the order first run: the median of its
/// rounds by CPU per request (`rounds::medians`), every round's CPU kept.
pub fn medians(rounds: Vec<RegistryRun>) -> Vec<RegistryRun> {
    super::rounds::medians(
        rounds,
        |a, b| (a.workers, a.run.scenario) == (b.workers, b.run.scenario),
        RegistryRun::cpu_ms,
        |median, cell| {
            let runs: Vec<RunResult> = cell.iter().map(|r| r.run.clone()).collect();
            median.run.keep_rounds(&runs);
            median.cpu_rounds = std::mem::take(&mut median.run.cpu_rounds);
            median.own_rounds = cell.iter().flat_map(|r| r.own_rounds.clone()).collect();
        },
    )
}

/// The run of `scenario` with `workers` of each role.
fn find(runs: &[RegistryRun], scenario: Scenario, workers: u64) -> Option<&RegistryRun> {
    runs.iter()
        .find(|r| r.run.scenario == scenario && r.workers == workers)
}

/// A pinroute build's CPU per request minus [`BASELINE`]'s with as many workers, round by
/// round (`rounds::Difference`).
fn filter_share(runs: &[RegistryRun], build: &RegistryRun) -> Option<Difference> {
    let envoy = find(runs, BASELINE, build.workers)?;
    let single = build.cpu_ms().zip(envoy.cpu_ms()).map(|(b, e)| b - e);
    Difference::of(&build.cpu_rounds, &envoy.cpu_rounds, single)
}

fn filter_share_ms(runs: &[RegistryRun], build: &RegistryRun) -> Option<f64> {
    filter_share(runs, build).map(|share| share.median)
}

/// One row per registry size and scenario.
pub fn render(runs: &[RegistryRun], style: Style) -> String {
    let header = [
        "workers",
        "scenario",
        "req/s",
        "TTFB p50",
        "CPU ms/req",
        "rounds' CPU",
        "filter ms/req",
        "module µs/req",
        "median request's µs",
        "Envoy in its calls µs/req",
        "proxy RSS MiB",
        "errors",
    ]
    .map(String::from);
    let dash = || "-".to_string();
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            let share = r
                .run
                .scenario
                .runs_pinroute()
                .then(|| filter_share(runs, r))
                .flatten();
            vec![
                format!("{0}+{0}", r.workers),
                r.run.scenario.to_string(),
                format!("{:.0}", r.run.throughput_rps),
                ms(r.run.ttfb.p50_ms),
                r.cpu_ms().map_or_else(dash, |v| format!("{v:.3}")),
                super::rounds::spread(&r.cpu_rounds).unwrap_or_else(dash),
                share.map_or_else(dash, |share| share.render()),
                r.module_us().map_or_else(dash, |us| us.render()),
                r.request_median_us().map_or_else(dash, |us| us.render()),
                r.envoy_us().map_or_else(dash, |us| us.render()),
                r.run
                    .proxy_peak_rss_mib
                    .map_or_else(dash, |v| format!("{v:.0}")),
                r.run.unexpected.to_string(),
            ]
        })
        .collect();
    grid(&header, &rows, style)
}

/// For each pinroute build: its own share with the most workers within 10 % of its share with
/// the fewest. Where the bench counted them (`counted`), the share is the instructions the
/// filter executed per request, which no other work on the machine moves; else the native
/// module's, when [`TIMED`] ran, the time the median request took in its own code (Envoy's
/// work inside its calls is Envoy's hosts and pools; the mean beside it counts the waits of a
/// thread preempted inside a hook); else the build's CPU per request minus [`BASELINE`]'s.
pub fn check_targets(results: &BenchResults) -> Vec<TargetCheck> {
    let runs = &results.registry;
    let (Some(fewest), Some(most)) = (
        runs.iter().map(|r| r.workers).min(),
        runs.iter().map(|r| r.workers).max(),
    ) else {
        return Vec::new();
    };
    [Scenario::Pinroute, Scenario::PinrouteNative]
        .into_iter()
        .filter(|build| runs.iter().any(|r| r.run.scenario == *build))
        .map(|build| {
            let counted =
                |workers| counted::find(&results.counted, build, workers).map(|c| c.filter);
            let timed =
                |workers| find(runs, TIMED, workers).and_then(RegistryRun::request_median_us);
            if let (Some(few), Some(many), true) = (counted(fewest), counted(most), fewest < most) {
                return counted_check(results, build, (fewest, few), (most, many));
            }
            match (build, timed(fewest), timed(most)) {
                (Scenario::PinrouteNative, Some(few), Some(many)) if fewest < most => {
                    own_time_check(runs, (fewest, few), (most, many))
                }
                _ => cpu_share_check(runs, build, fewest, most),
            }
        })
        .collect()
}

/// The build's instructions per request, as `counted` counted them, at the fewest and the
/// most workers; Envoy's other instructions (native) and the CPU share beside them.
fn counted_check(
    results: &BenchResults,
    build: Scenario,
    (fewest, few): (u64, f64),
    (most, many): (u64, f64),
) -> TargetCheck {
    let target = flat_target(
        build,
        "own work per request (the instructions it executes, counted)",
        fewest,
        most,
    );
    let envoy = |workers| counted::find(&results.counted, build, workers).and_then(|c| c.envoy);
    let envoy = match (envoy(most), envoy(fewest)) {
        (Some(many), Some(few)) => {
            format!("; Envoy's other instructions {many:.0} against {few:.0}")
        }
        _ => String::new(),
    };
    let cpu_share = |workers| cpu_share_text(&results.registry, build, workers);
    TargetCheck {
        target,
        measured: format!(
            "{many:.0} instructions against {few:.0} ({:+.1} %){envoy}; its CPU share {} ms against {}",
            (many / few - 1.0) * 100.0,
            cpu_share(most),
            cpu_share(fewest),
        ),
        met: Some(many <= few * (1.0 + FLAT_WITHIN)),
    }
}

/// The build's CPU share with `workers` of each role, in ms, or `-` where not measured.
fn cpu_share_text(runs: &[RegistryRun], build: Scenario, workers: u64) -> String {
    find(runs, build, workers)
        .and_then(|r| filter_share_ms(runs, r))
        .map_or_else(|| "-".into(), |ms| format!("{ms:.3}"))
}

fn flat_target(build: Scenario, share: &str, fewest: u64, most: u64) -> String {
    format!(
        "{build}'s {share} with {most}+{most} workers is within {:.0} % of its share with {fewest}+{fewest} (unpinned, 1 KB, concurrency {TARGET_CONCURRENCY})",
        FLAT_WITHIN * 100.0
    )
}

/// The build's CPU per request minus [`BASELINE`]'s, at the fewest and the most workers.
fn cpu_share_check(runs: &[RegistryRun], build: Scenario, fewest: u64, most: u64) -> TargetCheck {
    let target = flat_target(
        build,
        &format!("own CPU per request (minus {BASELINE})"),
        fewest,
        most,
    );
    let share = |workers| find(runs, build, workers).and_then(|r| filter_share_ms(runs, r));
    match (share(fewest), share(most)) {
        (Some(few), Some(many)) if fewest < most => TargetCheck {
            target,
            measured: format!("{many:.3} ms against {few:.3} ms"),
            met: Some(many <= few * (1.0 + FLAT_WITHIN)),
        },
        _ => TargetCheck {
            target,
            measured: "not measured in this run".into(),
            met: None,
        },
    }
}

/// The native module's own time per request, as [`TIMED`] counted it, at the fewest and the
/// most workers; Envoy's inside its calls and the CPU share beside it.
fn own_time_check(
    runs: &[RegistryRun],
    (fewest, few): (u64, Spread),
    (most, many): (u64, Spread),
) -> TargetCheck {
    let build = Scenario::PinrouteNative;
    let target = flat_target(
        build,
        "own time per request (the median request's in its code, as it counts it; Envoy's work inside its calls apart)",
        fewest,
        most,
    );
    let median_of = |workers, spread: fn(&RegistryRun) -> Option<Spread>| {
        find(runs, TIMED, workers)
            .and_then(spread)
            .map_or_else(|| "-".into(), |us| format!("{:.1}", us.median))
    };
    let cpu_share = |workers| cpu_share_text(runs, build, workers);
    TargetCheck {
        target,
        measured: format!(
            "{} µs against {} µs; its mean {} µs against {}; Envoy inside its calls {} µs against {}; its CPU share {} ms against {}",
            many.render(),
            few.render(),
            median_of(most, RegistryRun::module_us),
            median_of(fewest, RegistryRun::module_us),
            median_of(most, RegistryRun::envoy_us),
            median_of(fewest, RegistryRun::envoy_us),
            cpu_share(most),
            cpu_share(fewest),
        ),
        met: Some(many.median <= few.median * (1.0 + FLAT_WITHIN)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::bench::results::tests::{results, run};
    use crate::bench::rounds::spread;

    fn at(workers: u64, scenario: Scenario, cpu_ms: f64) -> RegistryRun {
        let mut run = run(scenario, SIZE, TARGET_CONCURRENCY, 1000.0, 1.0);
        run.cpu.proxy_s_per_1k = Some(cpu_ms);
        RegistryRun::single(workers, run)
    }

    /// Rounds at one worker of each role: each the baseline's CPU, then `build`'s.
    fn rounds(build: Scenario, cpu_ms: &[(f64, f64)]) -> Vec<RegistryRun> {
        cpu_ms
            .iter()
            .flat_map(|&(baseline, ours)| [at(1, BASELINE, baseline), at(1, build, ours)])
            .collect()
    }

    #[test]
    fn the_filter_share_is_judged_against_envoy_naming_as_many_workers() {
        let mut results = results(vec![]);
        results.registry = vec![
            at(1, Scenario::EnvoyTwoHops, 0.19),
            at(1, BASELINE, 0.20),
            at(1, Scenario::Pinroute, 0.30),
            at(1, Scenario::PinrouteNative, 0.24),
            at(1000, Scenario::EnvoyTwoHops, 0.30),
            at(1000, BASELINE, 0.40),
            at(1000, Scenario::Pinroute, 0.505),
            at(1000, Scenario::PinrouteNative, 0.445),
        ];
        let checks = check_targets(&results);
        assert_eq!(checks.len(), 2);
        assert_eq!(checks[0].met, Some(true), "0.105 within 10 % of 0.100");
        assert_eq!(checks[1].met, Some(false), "0.045 is 12.5 % over 0.040");
        let table = render(&results.registry, Style::Text);
        assert!(table.contains("1000+1000"), "{table}");
        assert!(table.contains("0.105"), "{table}");
    }

    #[test]
    fn the_native_module_is_judged_by_the_time_it_counted_in_its_own_code() {
        let timed = |workers, median_us: &[f64], envoy_us| {
            let mut run = at(workers, TIMED, 0.3);
            run.own_rounds = median_us
                .iter()
                .map(|&median| OwnTime {
                    module_us: median + 3.0,
                    envoy_us,
                    clock_reads: 100.0,
                    request_median_us: Some(median),
                })
                .collect();
            run
        };
        let mut results = results(vec![]);
        results.registry = vec![
            at(1, BASELINE, 0.20),
            at(1, Scenario::PinrouteNative, 0.21),
            timed(1, &[16.0, 15.0, 17.0], 28.0),
            at(1000, BASELINE, 0.30),
            at(1000, Scenario::PinrouteNative, 0.34),
            timed(1000, &[17.0, 17.5, 16.5], 31.0),
        ];
        let checks = check_targets(&results);
        assert_eq!(checks.len(), 1);
        assert_eq!(
            checks[0].met,
            Some(true),
            "17.0 within 10 % of 16.0, though the CPU share went from 0.010 to 0.040: {:?}",
            checks[0]
        );
        assert!(
            checks[0]
                .measured
                .contains("17.0 (16.5 to 17.5) µs against 16.0 (15.0 to 17.0) µs"),
            "{:?}",
            checks[0]
        );
        assert!(checks[0].measured.contains("its mean 20.0 µs against 19.0"));
        assert!(checks[0].measured.contains("31.0 µs against 28.0"));
        let table = render(&results.registry, Style::Text);
        assert!(table.contains("16.0 (15.0 to 17.0)"), "{table}");

        results.registry[5] = timed(1000, &[19.0, 18.0, 17.8], 31.0);
        assert_eq!(
            check_targets(&results)[0].met,
            Some(false),
            "18.0 is 12.5 % over 16.0"
        );
    }

    #[test]
    fn counted_instructions_judge_a_build_before_its_time_or_cpu() {
        let counted = |workers, build, filter, envoy| counted::CountedWork {
            workers,
            build,
            filter,
            envoy,
        };
        let mut results = results(vec![]);
        results.registry = vec![
            at(1, BASELINE, 0.20),
            at(1, Scenario::Pinroute, 0.25),
            at(1, Scenario::PinrouteNative, 0.21),
            at(1000, BASELINE, 0.30),
            at(1000, Scenario::Pinroute, 0.45),
            at(1000, Scenario::PinrouteNative, 0.34),
        ];
        results.counted = vec![
            counted(1, Scenario::Pinroute, 134_000.0, None),
            counted(1, Scenario::PinrouteNative, 68_000.0, Some(420_000.0)),
            counted(1000, Scenario::Pinroute, 143_000.0, None),
            counted(1000, Scenario::PinrouteNative, 76_000.0, Some(550_000.0)),
        ];
        let checks = check_targets(&results);
        assert_eq!(checks.len(), 2);
        assert_eq!(
            checks[0].met,
            Some(true),
            "143,000 within 10 % of 134,000, though the CPU share tripled: {:?}",
            checks[0]
        );
        assert!(
            checks[0].measured.starts_with(
                "143000 instructions against 134000 (+6.7 %); its CPU share 0.150 ms against 0.050"
            ),
            "{:?}",
            checks[0]
        );
        assert_eq!(checks[1].met, Some(false), "76,000 is 11.8 % over 68,000");
        assert!(
            checks[1]
                .measured
                .contains("Envoy's other instructions 550000 against 420000"),
            "{:?}",
            checks[1]
        );
        let table = counted::render(&results.counted, Style::Text);
        assert!(table.contains("callgrind (x86)"), "{table}");
    }

    #[test]
    fn one_registry_size_judges_nothing() {
        let mut results = results(vec![]);
        results.registry = vec![at(10, BASELINE, 0.2), at(10, Scenario::Pinroute, 0.3)];
        let checks = check_targets(&results);
        assert_eq!(checks[0].met, None);
    }

    #[test]
    fn rounds_keep_the_median_run_of_each_size_and_scenario() {
        let rounds = rounds(
            Scenario::Pinroute,
            &[(0.20, 0.35), (0.26, 0.30), (0.22, 0.31)],
        );
        let kept = medians(rounds);
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[0].run.scenario, BASELINE);
        assert_eq!(kept[0].cpu_ms(), Some(0.22));
        assert_eq!(kept[0].cpu_rounds, vec![0.20, 0.26, 0.22]);
        assert_eq!(kept[1].cpu_ms(), Some(0.31));
        assert_eq!(spread(&kept[1].cpu_rounds).as_deref(), Some("0.300–0.350"));
        assert_eq!(
            spread(&at(1, BASELINE, 0.2).cpu_rounds),
            None,
            "one round: no spread"
        );
    }

    #[test]
    fn with_rounds_the_share_is_the_median_of_the_rounds_differences() {
        let rounds = rounds(
            Scenario::PinrouteNative,
            &[(0.20, 0.25), (0.30, 0.40), (0.22, 0.35)],
        );
        let kept = medians(rounds);
        let share = filter_share(&kept, &kept[1]).unwrap();
        assert!(
            (share.median - 0.10).abs() < 1e-9,
            "{share:?}: 0.05, 0.10, 0.13 round by round, not 0.35 - 0.22"
        );
        let table = render(&kept, Style::Text);
        assert!(table.contains("0.100 (0.050 to 0.130)"), "{table}");
    }
}

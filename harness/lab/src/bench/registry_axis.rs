//! The registry-size axis: Envoy alone and each pinroute build in front of N prefill + N
//! decode workers (loopback aliases of the two sims: as many hosts, pools and connections as
//! that many machines), unpinned, at 1 KB and concurrency 16. What grows with the registry is
//! seen apart: Envoy's own hosts and pools (`envoy-2hop` with N-host clusters, and
//! `envoy-2hop-named`, whose hops name their workers in rotation through the clusters and
//! headers pinroute uses) from the filter's share (pinroute minus `envoy-2hop-named` at the
//! same N).

use serde::{Deserialize, Serialize};

use super::gateways::Scenario;
use super::results::{BenchResults, RunResult, TARGET_CONCURRENCY, TargetCheck};
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
}

impl RegistryRun {
    pub fn single(workers: u64, run: RunResult) -> RegistryRun {
        let cpu_rounds = run.cpu.proxy_s_per_1k.into_iter().collect();
        RegistryRun {
            workers,
            run,
            cpu_rounds,
        }
    }

    fn cpu_ms(&self) -> Option<f64> {
        self.run.cpu.proxy_s_per_1k
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
/// the fewest.
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
            let target = format!(
                "{build}'s own CPU per request (minus {BASELINE}) with {most}+{most} workers is within {:.0} % of its share with {fewest}+{fewest} (unpinned, 1 KB, concurrency {TARGET_CONCURRENCY})",
                FLAT_WITHIN * 100.0
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
        })
        .collect()
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

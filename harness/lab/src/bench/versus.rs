//! pinroute (each build that ran: the `.wasm`, the native module) side by side with
//! vllm-router, the router users would pick instead, in each policy that ran (its default
//! `cache_aware`, its cheapest `round_robin`), and with Envoy's own two hops (`envoy-2hop`),
//! so that pinroute minus that is what the filter costs: one table per build and policy, one
//! row per prompt size and concurrency, and the targets judged on them.

use super::gateways::Scenario;
use super::results::{BenchResults, RunResult, TARGET_CONCURRENCY, TargetCheck, size_label};
use super::rounds::Difference;
use super::table::{Style, grid, ms};

/// The filter's own CPU per request at 1 KB, in ms, at most: the `.wasm`'s, the native
/// module's.
const WASM_SHARE_LIMIT_MS: f64 = 0.05;
const NATIVE_SHARE_LIMIT_MS: f64 = 0.03;

/// The builds of pinroute and the policies of vllm-router compared.
const BUILDS: [Scenario; 2] = [Scenario::Pinroute, Scenario::PinrouteNative];
const PEERS: [Scenario; 2] = [Scenario::VllmRouter, Scenario::VllmRouterRoundRobin];

/// One size and concurrency: a pinroute build and, when run, the two references.
#[derive(Clone, Copy)]
struct Row<'a> {
    pinroute: &'a RunResult,
    router: Option<&'a RunResult>,
    envoy: Option<&'a RunResult>,
}

impl Row<'_> {
    fn throughput_ratio(&self) -> Option<f64> {
        self.router
            .filter(|r| r.throughput_rps > 0.0)
            .map(|r| self.pinroute.throughput_rps / r.throughput_rps)
    }

    /// The build's CPU per request minus Envoy's own two hops' (`rounds::Difference`).
    fn filter_share(&self) -> Option<Difference> {
        let envoy = self.envoy?;
        let single = cpu_ms(self.pinroute).zip(cpu_ms(envoy)).map(|(p, e)| p - e);
        Difference::of(&self.pinroute.cpu_rounds, &envoy.cpu_rounds, single)
    }

    fn filter_share_ms(&self) -> Option<f64> {
        self.filter_share().map(|share| share.median)
    }
}

/// CPU of the proxy process per request, in ms.
fn cpu_ms(run: &RunResult) -> Option<f64> {
    run.cpu.proxy_s_per_1k
}

/// Every run of `build`, beside `peer`'s and Envoy's.
fn rows(results: &BenchResults, build: Scenario, peer: Scenario) -> Vec<Row<'_>> {
    results
        .runs
        .iter()
        .filter(|r| r.scenario == build)
        .map(|pinroute| {
            let other = |scenario| results.run(scenario, pinroute.size, pinroute.concurrency);
            Row {
                pinroute,
                router: other(peer),
                envoy: other(Scenario::EnvoyTwoHops),
            }
        })
        .collect()
}

/// The pairs of a build and a peer that both ran (a build alone, beside Envoy, when no peer
/// did).
fn pairs(results: &BenchResults) -> Vec<(Scenario, Option<Scenario>)> {
    let ran = |scenario| results.runs.iter().any(|r| r.scenario == scenario);
    let mut pairs = Vec::new();
    for build in BUILDS.into_iter().filter(|b| ran(*b)) {
        let peers: Vec<Scenario> = PEERS.into_iter().filter(|p| ran(*p)).collect();
        if peers.is_empty() {
            pairs.push((build, None));
        }
        pairs.extend(peers.into_iter().map(|peer| (build, Some(peer))));
    }
    pairs
}

/// The side-by-side tables, each under its title; empty when no reference ran.
pub fn render(results: &BenchResults, style: Style) -> Vec<(String, String)> {
    let mut tables = Vec::new();
    for (build, peer) in pairs(results) {
        let rows = rows(results, build, peer.unwrap_or(Scenario::VllmRouter));
        if rows.iter().all(|r| r.router.is_none() && r.envoy.is_none()) {
            continue;
        }
        let peer_name = peer.map_or("vllm-router", |p| p.peer_name());
        let title = format!("{build} against {peer_name} and Envoy's own two hops");
        let header = [
            "prompt".to_string(),
            "conc".to_string(),
            format!("req/s ÷ {peer_name}"),
            format!("TTFB p50 {build} / {peer_name}"),
            format!("CPU ms/req {build} / {peer_name} / envoy-2hop"),
            format!("CPU ÷ {peer_name}"),
            "filter ms/req".to_string(),
        ];
        let cells: Vec<Vec<String>> = rows.iter().map(cells).collect();
        tables.push((title, grid(&header, &cells, style)));
    }
    tables
}

fn cells(row: &Row<'_>) -> Vec<String> {
    let p = row.pinroute;
    let dash = || "-".to_string();
    let cpu = |run: Option<&RunResult>| run.and_then(cpu_ms).map_or_else(dash, three);
    let cpu_ratio = cpu_ms(p)
        .zip(row.router.and_then(cpu_ms))
        .map_or_else(dash, |(p, r)| format!("{:.2}", p / r));
    vec![
        size_label(p.size),
        p.concurrency.to_string(),
        row.throughput_ratio()
            .map_or_else(dash, |r| format!("{r:.2}")),
        format!(
            "{} / {}",
            ms(p.ttfb.p50_ms),
            row.router.map_or_else(dash, |r| ms(r.ttfb.p50_ms))
        ),
        format!(
            "{} / {} / {}",
            cpu(Some(p)),
            cpu(row.router),
            cpu(row.envoy)
        ),
        cpu_ratio,
        row.filter_share().map_or_else(dash, |share| share.render()),
    ]
}

fn three(value: f64) -> String {
    format!("{value:.3}")
}

/// The targets against vllm-router and Envoy's own two hops: the `.wasm`'s against
/// `cache_aware` (CPU at concurrency 16), the native module's against both policies in every
/// cell, and each build's own share.
pub fn check_targets(results: &BenchResults) -> Vec<TargetCheck> {
    let mut checks = Vec::new();
    let wasm = rows(results, Scenario::Pinroute, Scenario::VllmRouter);
    checks.push(cpu_check(&wasm));
    checks.extend(peer_checks(&wasm, "pinroute", "vllm-router"));
    checks.push(filter_share_check(&wasm, "pinroute", WASM_SHARE_LIMIT_MS));
    let native = Scenario::PinrouteNative;
    if results.runs.iter().any(|r| r.scenario == native) {
        for peer in PEERS {
            let rows = rows(results, native, peer);
            let peer_name = peer.peer_name();
            checks.push(judged_on_every_row(
                &rows,
                &format!(
                    "{native}'s gateway CPU per request is at most {peer_name}'s in every cell"
                ),
                cpu_at_most_peers,
            ));
            checks.extend(peer_checks(&rows, native.as_str(), peer_name));
        }
        let rows = rows(results, native, Scenario::VllmRouter);
        checks.push(filter_share_check(
            &rows,
            native.as_str(),
            NATIVE_SHARE_LIMIT_MS,
        ));
    }
    checks
}

/// Throughput and TTFB against the peer, in every cell.
fn peer_checks(rows: &[Row<'_>], build: &str, peer: &str) -> [TargetCheck; 2] {
    [
        judged_on_every_row(
            rows,
            &format!("{build}'s throughput is at least {peer}'s at every size and concurrency"),
            throughput_at_least_peers,
        ),
        judged_on_every_row(
            rows,
            &format!("{build}'s TTFB p50 is at most {peer}'s at every size and concurrency"),
            |row| {
                row.router.map(|r| {
                    let (p, r) = (row.pinroute.ttfb.p50_ms, r.ttfb.p50_ms);
                    (p <= r, format!("{} / {} ms", ms(p), ms(r)))
                })
            },
        ),
    ]
}

fn cpu_check(rows: &[Row<'_>]) -> TargetCheck {
    let at_target: Vec<Row<'_>> = rows
        .iter()
        .filter(|r| r.pinroute.concurrency == TARGET_CONCURRENCY)
        .copied()
        .collect();
    judged_on_every_row(
        &at_target,
        &format!(
            "pinroute's gateway CPU per request is at most vllm-router's at every size, concurrency {TARGET_CONCURRENCY}"
        ),
        cpu_at_most_peers,
    )
}

/// Whether the build's CPU per request is at most the peer's, with both figures, and
/// Envoy's own two hops' where those alone cost more than the peer: a cell no filter can
/// meet.
fn cpu_at_most_peers(row: &Row<'_>) -> Option<(bool, String)> {
    let (p, r) = cpu_ms(row.pinroute).zip(row.router.and_then(cpu_ms))?;
    let floor = row.envoy.and_then(cpu_ms).filter(|e| *e > r);
    let floor = floor.map_or_else(String::new, |e| format!(" (envoy-2hop alone {e:.3})"));
    Some((p <= r, format!("{p:.3} / {r:.3} ms{floor}")))
}

/// Whether the build carries at least the peer's throughput, with the ratio, and Envoy's own
/// two hops' where those alone carry less than the peer.
fn throughput_at_least_peers(row: &Row<'_>) -> Option<(bool, String)> {
    let ratio = row.throughput_ratio()?;
    let floor = row
        .envoy
        .zip(row.router)
        .filter(|(e, r)| r.throughput_rps > 0.0 && e.throughput_rps < r.throughput_rps)
        .map_or_else(String::new, |(e, r)| {
            let envoy = e.throughput_rps / r.throughput_rps;
            format!(" (envoy-2hop alone {envoy:.2}x)")
        });
    Some((ratio >= 1.0, format!("{ratio:.2}x{floor}")))
}

fn filter_share_check(rows: &[Row<'_>], build: &str, limit_ms: f64) -> TargetCheck {
    let target = format!(
        "{build}'s own CPU (minus envoy-2hop) is at most {limit_ms} ms per request at 1 KB, concurrency {TARGET_CONCURRENCY}"
    );
    let share = rows
        .iter()
        .find(|r| r.pinroute.size == 1024 && r.pinroute.concurrency == TARGET_CONCURRENCY)
        .and_then(Row::filter_share_ms);
    match share {
        Some(share) => TargetCheck {
            target,
            measured: format!("{share:.3} ms"),
            met: Some(share <= limit_ms),
        },
        None => TargetCheck {
            target,
            measured: "not measured in this run".into(),
            met: None,
        },
    }
}

/// Met when every row that measured it meets it; each row's figure is listed.
fn judged_on_every_row(
    rows: &[Row<'_>],
    target: &str,
    judge: impl Fn(&Row<'_>) -> Option<(bool, String)>,
) -> TargetCheck {
    let judged: Vec<(bool, String)> = rows
        .iter()
        .filter_map(|row| {
            let (met, figure) = judge(row)?;
            let at = format!(
                "{} c{}",
                size_label(row.pinroute.size),
                row.pinroute.concurrency
            );
            Some((met, format!("{at} {figure}")))
        })
        .collect();
    TargetCheck {
        target: target.to_string(),
        met: (!judged.is_empty()).then(|| judged.iter().all(|(met, _)| *met)),
        measured: if judged.is_empty() {
            "not measured in this run".into()
        } else {
            judged
                .iter()
                .map(|(_, figure)| figure.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::bench::results::tests::{results, run};

    fn with_cpu(mut run: RunResult, ms_per_request: f64) -> RunResult {
        run.cpu.proxy_s_per_1k = Some(ms_per_request);
        run
    }

    /// The native module against `round_robin` at 1 KB: behind at 16 users, where Envoy's
    /// own two hops are already behind too; ahead at 64.
    fn runs() -> Vec<RunResult> {
        let cell = |scenario, users, rps, cpu| with_cpu(run(scenario, 1024, users, rps, 5.0), cpu);
        vec![
            cell(Scenario::PinrouteNative, 16, 760.0, 0.52),
            cell(Scenario::VllmRouterRoundRobin, 16, 780.0, 0.44),
            cell(Scenario::EnvoyTwoHops, 16, 770.0, 0.47),
            cell(Scenario::PinrouteNative, 64, 4000.0, 0.20),
            cell(Scenario::VllmRouterRoundRobin, 64, 3600.0, 0.25),
            cell(Scenario::EnvoyTwoHops, 64, 4400.0, 0.17),
        ]
    }

    #[test]
    fn a_cell_where_envoy_alone_is_behind_the_peer_says_so() {
        let checks = check_targets(&results(runs()));
        let missed = [
            (
                "pinroute-native's gateway CPU per request is at most vllm-router round_robin's",
                "1 KB c16 0.520 / 0.440 ms (envoy-2hop alone 0.470); 1 KB c64 0.200 / 0.250 ms",
            ),
            (
                "pinroute-native's throughput is at least vllm-router round_robin's",
                "1 KB c16 0.97x (envoy-2hop alone 0.99x); 1 KB c64 1.11x",
            ),
        ];
        for (target, measured) in missed {
            let check = checks
                .iter()
                .find(|c| c.target.starts_with(target))
                .unwrap();
            assert_eq!(
                (check.met, check.measured.as_str()),
                (Some(false), measured)
            );
        }
    }

    #[test]
    fn with_rounds_the_filter_share_is_the_median_of_the_rounds_differences() {
        let mut runs = runs();
        runs[0].cpu_rounds = vec![0.52, 0.60, 0.50];
        runs[2].cpu_rounds = vec![0.47, 0.48, 0.40];
        let results = results(runs);
        let rows = rows(&results, Scenario::PinrouteNative, Scenario::VllmRouter);
        let share = rows[0].filter_share_ms().unwrap();
        assert!(
            (share - 0.10).abs() < 1e-9,
            "{share}: 0.05, 0.12, 0.10 round by round"
        );
        assert_eq!(
            rows[1].filter_share_ms(),
            Some(0.20 - 0.17),
            "one round: the runs"
        );
    }
}

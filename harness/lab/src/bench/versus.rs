//! pinroute side by side with vllm-router, the router users would pick instead, and with
//! Envoy's own two hops (`envoy-2hop`), so that pinroute minus that is what the filter
//! costs: one row per prompt size and concurrency, and the targets judged on them.

use super::gateways::Scenario;
use super::results::{BenchResults, RunResult, TARGET_CONCURRENCY, TargetCheck, size_label};
use super::table::{Style, grid, ms};

/// The filter's own CPU per request at 1 KB, in ms, at most.
const FILTER_SHARE_LIMIT_MS: f64 = 0.05;

/// One size and concurrency: pinroute and, when run, the two references.
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

    fn filter_share_ms(&self) -> Option<f64> {
        cpu_ms(self.pinroute)
            .zip(self.envoy.and_then(cpu_ms))
            .map(|(p, e)| p - e)
    }
}

/// CPU of the proxy process per request, in ms.
fn cpu_ms(run: &RunResult) -> Option<f64> {
    run.cpu.proxy_s_per_1k
}

fn rows(results: &BenchResults) -> Vec<Row<'_>> {
    results
        .runs
        .iter()
        .filter(|r| r.scenario == Scenario::Pinroute)
        .map(|pinroute| {
            let other = |scenario| results.run(scenario, pinroute.size, pinroute.concurrency);
            Row {
                pinroute,
                router: other(Scenario::VllmRouter),
                envoy: other(Scenario::EnvoyTwoHops),
            }
        })
        .collect()
}

/// The side-by-side table; empty when neither reference ran.
pub fn render(results: &BenchResults, style: Style) -> String {
    let rows = rows(results);
    if rows.iter().all(|r| r.router.is_none() && r.envoy.is_none()) {
        return String::new();
    }
    let header = [
        "prompt",
        "conc",
        "req/s ÷ vllm-router",
        "TTFB p50 pinroute / vllm-router",
        "CPU ms/req pinroute / vllm-router / envoy-2hop",
        "CPU ÷ vllm-router",
        "filter ms/req",
    ]
    .map(String::from);
    let cells: Vec<Vec<String>> = rows.iter().map(cells).collect();
    grid(&header, &cells, style)
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
        row.filter_share_ms().map_or_else(dash, three),
    ]
}

fn three(value: f64) -> String {
    format!("{value:.3}")
}

/// The targets against vllm-router and Envoy's own two hops.
pub fn check_targets(results: &BenchResults) -> Vec<TargetCheck> {
    let rows = rows(results);
    vec![
        cpu_check(&rows),
        judged_on_every_row(
            &rows,
            "pinroute's throughput is at least vllm-router's at every size and concurrency",
            |row| {
                row.throughput_ratio()
                    .map(|r| (r >= 1.0, format!("{r:.2}x")))
            },
        ),
        judged_on_every_row(
            &rows,
            "pinroute's TTFB p50 is at most vllm-router's at every size and concurrency",
            |row| {
                row.router.map(|r| {
                    let (p, r) = (row.pinroute.ttfb.p50_ms, r.ttfb.p50_ms);
                    (p <= r, format!("{} / {} ms", ms(p), ms(r)))
                })
            },
        ),
        filter_share_check(&rows),
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
        |row| {
            cpu_ms(row.pinroute)
                .zip(row.router.and_then(cpu_ms))
                .map(|(p, r)| (p <= r, format!("{p:.3} / {r:.3} ms")))
        },
    )
}

fn filter_share_check(rows: &[Row<'_>]) -> TargetCheck {
    let target = format!(
        "the filter's own CPU (pinroute minus envoy-2hop) is at most {FILTER_SHARE_LIMIT_MS} ms per request at 1 KB, concurrency {TARGET_CONCURRENCY}"
    );
    let share = rows
        .iter()
        .find(|r| r.pinroute.size == 1024 && r.pinroute.concurrency == TARGET_CONCURRENCY)
        .and_then(Row::filter_share_ms);
    match share {
        Some(share) => TargetCheck {
            target,
            measured: format!("{share:.3} ms"),
            met: Some(share <= FILTER_SHARE_LIMIT_MS),
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

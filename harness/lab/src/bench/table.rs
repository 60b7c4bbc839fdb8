//! The results as text tables (stdout) and as Markdown (`bench.md`, pasted into
//! `docs/benchmarks.md`).

use std::fmt::Write as _;

use super::gateways::Scenario;
use super::micro::MicroRun;
use super::results::{BenchResults, RunResult, TargetCheck, size_label};

/// Plain text or Markdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Text,
    Markdown,
}

/// Everything: how it was run, one table per prompt size, the micro-benchmark, targets.
pub fn render(results: &BenchResults, style: Style) -> String {
    let mut out = String::new();
    out.push_str(&heading(results, style));
    for size in &results.meta.sizes {
        let runs: Vec<&RunResult> = results.runs.iter().filter(|r| r.size == *size).collect();
        if runs.is_empty() {
            continue;
        }
        let body_bytes = runs.first().map_or(0, |r| r.body_bytes);
        let _ = writeln!(
            out,
            "\n{}{} prompt (client body {body_bytes} bytes)\n",
            title_mark(style),
            size_label(*size)
        );
        out.push_str(&grid(
            &run_header(),
            &runs.iter().map(|r| run_row(r)).collect::<Vec<_>>(),
            style,
        ));
    }
    for (title, table) in super::versus::render(results, style) {
        let _ = writeln!(
            out,
            "\n{}{title} (CPU: proxy process per request; filter: pinroute minus envoy-2hop)\n",
            title_mark(style)
        );
        out.push_str(&table);
    }
    if !results.registry.is_empty() {
        let _ = writeln!(
            out,
            "\n{}By registry size: N prefill + N decode workers, unpinned, {}, concurrency {} (CPU: proxy process per request, the median of the rounds; filter: pinroute minus envoy-2hop-named, Envoy naming as many workers without the filter)\n",
            title_mark(style),
            size_label(super::registry_axis::SIZE),
            super::results::TARGET_CONCURRENCY,
        );
        out.push_str(&super::registry_axis::render(&results.registry, style));
    }
    if !results.counted.is_empty() {
        let _ = writeln!(
            out,
            "\n{}The filter's work by registry size, counted in instructions: unpinned, {}, one request at a time (the `.wasm` in the ABI tests' host, the native module in Envoy under callgrind)\n",
            title_mark(style),
            size_label(super::registry_axis::SIZE),
        );
        out.push_str(&super::counted::render(&results.counted, style));
    }
    if !results.micro.is_empty() {
        let _ = writeln!(
            out,
            "\n{}Policy core per request, microseconds (benches/policy.rs)\n",
            title_mark(style)
        );
        let (header, rows) = micro_table(&results.micro, &results.meta.sizes);
        out.push_str(&grid(&header, &rows, style));
        let (header, rows) = registry_table(&results.micro);
        if !rows.is_empty() {
            let _ = writeln!(
                out,
                "\n{}An unpinned request's choice of both workers by registry size (N prefill + N decode workers, 8 KB body), microseconds\n",
                title_mark(style)
            );
            out.push_str(&grid(&header, &rows, style));
        }
    }
    let _ = writeln!(out, "\n{}Targets\n", title_mark(style));
    out.push_str(&targets(&results.targets, style));
    out
}

pub(crate) fn title_mark(style: Style) -> &'static str {
    match style {
        Style::Text => "== ",
        Style::Markdown => "#### ",
    }
}

fn heading(results: &BenchResults, style: Style) -> String {
    let m = &results.meta;
    let load = m.load_average_before;
    let wasm = m
        .wasm_bytes
        .map_or("not built".to_string(), |b| format!("{b} bytes"));
    let lines = [
        format!(
            "{}, load average before the run {:.2} / {:.2} / {:.2}{}",
            super::procfs::machine(m.cpus, &m.cpu_model),
            load[0],
            load[1],
            load[2],
            if m.quick { " (quick run)" } else { "" }
        ),
        format!(
            "sim workers: {} µs per token, {} tokens streamed; {:.1} s measured per run after {:.1} s of warm-up{}",
            m.token_latency_us,
            m.max_tokens,
            m.duration_s,
            m.warmup_s,
            match m.rounds {
                0 | 1 => String::new(),
                n => format!("; each cell the median of {n} rounds by proxy CPU (their range in brackets)"),
            }
        ),
        format!(
            "Envoy {} with --concurrency {} (vllm-router with as many tokio workers); pinroute.wasm {wasm}, source {}",
            m.envoy_version, m.envoy_concurrency, m.source
        ),
        "latencies in ms (TTFB: first byte of the streamed answer); +p50: TTFB p50 minus the floor's; \
         CPU in cores (1.0 = one CPU) and proxy CPU seconds per 1,000 requests"
            .to_string(),
    ];
    match style {
        Style::Text => lines.iter().map(|l| format!("{l}\n")).collect(),
        Style::Markdown => lines.iter().map(|l| format!("- {l}\n")).collect(),
    }
}

fn run_header() -> Vec<String> {
    [
        "scenario",
        "conc",
        "req/s",
        "x floor",
        "TTFB p50",
        "p90",
        "p99",
        "+p50",
        "last p50",
        "p90",
        "p99",
        "proxy s/1k",
        "proxy cores",
        "proxy RSS MiB",
        "sims cores",
        "loadgen cores",
        "busy cores",
        "errors",
    ]
    .map(String::from)
    .to_vec()
}

fn run_row(run: &RunResult) -> Vec<String> {
    let vs = run.vs_floor;
    vec![
        run.scenario.to_string(),
        run.concurrency.to_string(),
        format!("{:.0}", run.throughput_rps),
        vs.map_or("-".into(), |v| format!("{:.2}", v.throughput_ratio)),
        ms(run.ttfb.p50_ms),
        ms(run.ttfb.p90_ms),
        ms(run.ttfb.p99_ms),
        match (run.scenario, vs) {
            (Scenario::Floor, _) | (_, None) => "-".into(),
            (_, Some(v)) => format!("{:+.2}", v.added_ttfb_p50_ms),
        },
        ms(run.last_byte.p50_ms),
        ms(run.last_byte.p90_ms),
        ms(run.last_byte.p99_ms),
        proxy_cpu(run),
        optional(run.cpu.proxy_cores, 2),
        optional(run.proxy_peak_rss_mib, 0),
        format!("{:.2}", run.cpu.sims_cores),
        format!("{:.2}", run.cpu.loadgen_cores),
        format!("{:.2}", run.cpu.machine_busy_cores),
        run.unexpected.to_string(),
    ]
}

pub(crate) fn ms(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

/// CPU per request; with rounds, the kept median and the rounds' range.
fn proxy_cpu(run: &RunResult) -> String {
    let median = optional(run.cpu.proxy_s_per_1k, 3);
    match super::rounds::spread(&run.cpu_rounds) {
        Some(spread) => format!("{median} ({spread})"),
        None => median,
    }
}

fn optional(value: Option<f64>, decimals: usize) -> String {
    value.map_or("-".into(), |v| format!("{v:.decimals$}"))
}

/// The registry-size axis's stages are named `<stage> <N>+<N>`.
fn registry_axis(stage: &str) -> Option<(&str, &str)> {
    stage
        .split_once(' ')
        .filter(|(_, pools)| pools.contains('+'))
}

/// One row per stage and runtime of the registry-size axis, one column per registry.
fn registry_table(runs: &[MicroRun]) -> (Vec<String>, Vec<Vec<String>>) {
    let mut stages: Vec<&str> = Vec::new();
    let mut registries: Vec<&str> = Vec::new();
    for row in runs.iter().flat_map(|r| &r.rows) {
        if let Some((stage, registry)) = registry_axis(&row.stage) {
            if !stages.contains(&stage) {
                stages.push(stage);
            }
            if !registries.contains(&registry) {
                registries.push(registry);
            }
        }
    }
    let mut header = vec!["stage".to_string(), "runtime".to_string()];
    header.extend(registries.iter().map(|r| format!("{r} workers")));
    let mut rows = Vec::new();
    for stage in &stages {
        for run in runs {
            let mut row = vec![stage.to_string(), run.runtime.clone()];
            row.extend(registries.iter().map(|registry| {
                let ns = run
                    .rows
                    .iter()
                    .find(|r| r.stage == format!("{stage} {registry}"));
                ns.map_or("-".into(), |r| micros(r.ns_per_op))
            }));
            rows.push(row);
        }
    }
    (header, rows)
}

/// One row per stage, one column per (size, runtime).
fn micro_table(runs: &[MicroRun], sizes: &[usize]) -> (Vec<String>, Vec<Vec<String>>) {
    let mut stages: Vec<String> = Vec::new();
    for row in runs.iter().flat_map(|r| &r.rows) {
        if registry_axis(&row.stage).is_some() {
            continue;
        }
        if !stages.contains(&row.stage) {
            stages.push(row.stage.clone());
        }
    }
    let body_sizes: Vec<usize> = micro_body_sizes(runs, sizes.len());
    let mut header = vec!["stage".to_string()];
    for body in &body_sizes {
        for run in runs {
            header.push(format!("{} {}", size_label(nominal(*body)), run.runtime));
        }
    }
    let rows = stages
        .iter()
        .map(|stage| {
            let mut row = vec![stage.clone()];
            for body in &body_sizes {
                row.extend(
                    runs.iter()
                        .map(|run| run.ns(stage, *body).map_or("-".into(), micros)),
                );
            }
            row
        })
        .collect();
    (header, rows)
}

fn micro_body_sizes(runs: &[MicroRun], limit: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = Vec::new();
    for row in runs.iter().flat_map(|r| &r.rows) {
        if registry_axis(&row.stage).is_none() && !sizes.contains(&row.body_bytes) {
            sizes.push(row.body_bytes);
        }
    }
    sizes.truncate(limit.max(1));
    sizes
}

/// The nominal size a body of `bytes` was made for (bodies are a few bytes short).
fn nominal(bytes: usize) -> usize {
    bytes.div_ceil(1024) * 1024
}

fn micros(ns: f64) -> String {
    let us = ns / 1000.0;
    if us >= 100.0 {
        format!("{us:.0}")
    } else if us >= 1.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.2}")
    }
}

pub(crate) fn targets(checks: &[TargetCheck], style: Style) -> String {
    let mut out = String::new();
    for check in checks {
        let verdict = match check.met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "not run",
        };
        let _ = match style {
            Style::Text => writeln!(out, "[{verdict:>7}] {}: {}", check.target, check.measured),
            Style::Markdown => writeln!(
                out,
                "- **{verdict}**: {} — {}",
                check.target, check.measured
            ),
        };
    }
    out
}

/// Columns padded to their widest cell (text), or a Markdown table.
pub(crate) fn grid(header: &[String], rows: &[Vec<String>], style: Style) -> String {
    match style {
        Style::Text => text_grid(header, rows),
        Style::Markdown => markdown_grid(header, rows),
    }
}

fn text_grid(header: &[String], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .chain(header.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| -> String {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, width))| {
                if i == 0 {
                    format!("{cell:<width$}")
                } else {
                    format!("{cell:>width$}")
                }
            })
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(header);
    rows.iter().for_each(|row| out.push_str(&line(row)));
    out
}

fn markdown_grid(header: &[String], rows: &[Vec<String>]) -> String {
    let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
    let mut out = line(header);
    let rule: Vec<String> = (0..header.len())
        .map(|i| if i == 0 { ":--".into() } else { "--:".into() })
        .collect();
    out.push_str(&line(&rule));
    rows.iter().for_each(|row| out.push_str(&line(row)));
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn grids_align_and_mark_down() {
        let header = vec!["a".to_string(), "bb".to_string()];
        let rows = vec![vec!["long".to_string(), "1".to_string()]];
        assert_eq!(text_grid(&header, &rows), "a     bb\nlong   1\n");
        assert_eq!(
            markdown_grid(&header, &rows),
            "| a | bb |\n| :-- | --: |\n| long | 1 |\n"
        );
    }

    #[test]
    fn nominal_sizes() {
        assert_eq!(nominal(1021), 1024);
        assert_eq!(nominal(262138), 262144);
        assert_eq!(micros(1500.0), "1.5");
    }
}

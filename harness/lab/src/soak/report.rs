//! The soak's result: what it prints (a Markdown table) and writes (JSON), and whether it
//! passed.

use std::fmt::Write as _;

use serde::Serialize;

use super::chaos::{Action, ChaosRecord};
use super::outcome::Judgement;
use super::probe::{EnvoyStats, LogScan, RssKib, SCRAPED, context_growth};
use super::recovery::Recovery;
use super::tally::{KindCounts, TallySnapshot};
use crate::load::{LatencySummary, LoadReport};

/// One row of the expected × actual table.
#[derive(Debug, Clone, Serialize)]
pub struct ClassRow {
    pub expected: String,
    pub actual: String,
    pub verdict: Judgement,
    pub requests: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct KindRow {
    pub kind: &'static str,
    #[serde(flatten)]
    pub counts: KindCounts,
}

/// Everything measured, and the verdict.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    pub command: String,
    pub requests: u64,
    pub concurrency: usize,
    pub totals: KindCounts,
    pub classes: Vec<ClassRow>,
    pub kinds: Vec<KindRow>,
    pub chaos: Vec<ChaosRecord>,
    pub recovery: Recovery,
    pub vm_failures: u64,
    pub envoy_stats_start: EnvoyStats,
    pub envoy_stats_end: EnvoyStats,
    pub envoy_rss_kib: RssKib,
    pub envoy_log: LogScan,
    pub elapsed_seconds: f64,
    pub throughput_rps: f64,
    pub first_byte_ms: LatencySummary,
    pub last_byte_ms: LatencySummary,
    /// The first mismatches and missing answers, described.
    pub problems: Vec<String>,
    /// Why the soak failed (empty: it passed).
    pub failures: Vec<String>,
}

/// What [`SoakReport::new`] is made from.
pub struct Measured {
    pub command: String,
    pub requests: u64,
    pub scheduled_kills: usize,
    pub tally: TallySnapshot,
    pub load: LoadReport,
    pub chaos: Vec<ChaosRecord>,
    pub recovery: Recovery,
    pub envoy_start: EnvoyStats,
    pub envoy_end: EnvoyStats,
    pub rss: RssKib,
    pub log: LogScan,
}

impl SoakReport {
    pub fn new(measured: Measured) -> SoakReport {
        let mut totals = KindCounts::default();
        measured
            .tally
            .kinds
            .iter()
            .for_each(|(_, counts)| totals.merge(counts));
        let classes = measured
            .tally
            .cells
            .iter()
            .map(|(cell, requests)| ClassRow {
                expected: cell.expected.clone(),
                actual: cell.actual.clone(),
                verdict: cell.judgement,
                requests: *requests,
            })
            .collect();
        let kinds = measured
            .tally
            .kinds
            .iter()
            .map(|(kind, counts)| KindRow {
                kind: kind.label(),
                counts: counts.clone(),
            })
            .collect();
        let vm_failures = measured.envoy_start.vm_failures_until(&measured.envoy_end)
            + measured.log.vm_failure_lines;
        let mut report = SoakReport {
            command: measured.command,
            requests: measured.requests,
            concurrency: measured.load.concurrency,
            totals,
            classes,
            kinds,
            chaos: measured.chaos,
            recovery: measured.recovery,
            vm_failures,
            envoy_stats_start: measured.envoy_start,
            envoy_stats_end: measured.envoy_end,
            envoy_rss_kib: measured.rss,
            envoy_log: measured.log,
            elapsed_seconds: measured.load.elapsed.as_secs_f64(),
            throughput_rps: measured.load.throughput(),
            first_byte_ms: measured.load.first_byte_summary(),
            last_byte_ms: measured.load.last_byte_summary(),
            problems: measured.tally.problems,
            failures: Vec::new(),
        };
        report.failures = report.find_failures(measured.scheduled_kills);
        report
    }

    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    fn find_failures(&self, scheduled_kills: usize) -> Vec<String> {
        let t = &self.totals;
        let kills = self
            .chaos
            .iter()
            .filter(|c| c.action == Action::Kill && c.during_load)
            .count();
        let mut failures = Vec::new();
        if t.mismatched > 0 {
            failures.push(format!(
                "{} answers differ from the class their request should get",
                t.mismatched
            ));
        }
        if t.no_answer > 0 {
            failures.push(format!(
                "{} requests got no answer (transport error or timeout)",
                t.no_answer
            ));
        }
        if t.sent != t.answered() + t.no_answer {
            failures.push(format!(
                "{} requests sent but {} judged",
                t.sent,
                t.answered() + t.no_answer
            ));
        }
        if self.vm_failures > 0 {
            failures.push(format!(
                "{} wasm VM failures (Envoy stats and log)",
                self.vm_failures
            ));
        }
        if self.envoy_stats_end.open_requests > 0 {
            failures.push(format!(
                "{} requests still open in Envoy after the soak (left hanging)",
                self.envoy_stats_end.open_requests
            ));
        }
        let scraped = context_growth(&self.envoy_stats_start, &self.envoy_stats_end)
            .into_iter()
            .find(|(name, _)| name == SCRAPED)
            .map_or(0, |(_, grown)| grown);
        if scraped == 0 {
            failures.push("the engines' load was never read (no metrics page scraped)".into());
        }
        failures.extend(self.recovery.problems.iter().cloned());
        if kills < scheduled_kills {
            failures.push(format!(
                "only {kills} of {scheduled_kills} kills ran while the load did"
            ));
        }
        failures
    }

    /// The report as Markdown (readable in a terminal too).
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        self.write_summary(&mut out);
        self.write_classes(&mut out);
        self.write_kinds(&mut out);
        self.write_chaos(&mut out);
        self.write_context(&mut out);
        self.write_problems(&mut out);
        out
    }

    fn write_summary(&self, out: &mut String) {
        let t = &self.totals;
        let verdict = if self.passed() { "PASSED" } else { "FAILED" };
        let rss = &self.envoy_rss_kib;
        let (start, end) = (&self.envoy_stats_start, &self.envoy_stats_end);
        let l = &self.last_byte_ms;
        let f = &self.first_byte_ms;
        let _ = writeln!(out, "Soak: `{}` — **{verdict}**\n", self.command);
        let _ = writeln!(out, "| measure | value |\n|---|---|");
        let rows = [
            (
                "requests sent",
                format!("{} (concurrency {})", t.sent, self.concurrency),
            ),
            ("answered as expected", t.as_expected.to_string()),
            (
                "cut by kill (decode worker killed mid-request)",
                t.cut_by_kill.to_string(),
            ),
            (
                "KV lost with its killed prefill worker",
                t.kv_lost.to_string(),
            ),
            (
                "**answered, but not the expected class**",
                t.mismatched.to_string(),
            ),
            (
                "**without an answer** (transport error / timeout)",
                t.no_answer.to_string(),
            ),
            (
                "clients that left during the prefill hop or the decode stream",
                t.left.to_string(),
            ),
            (
                "**requests still open in Envoy** after the soak",
                end.open_requests.to_string(),
            ),
            (
                "**wasm VM failures** (Envoy stats, log)",
                self.vm_failure_detail(),
            ),
            (
                "filter VM memory (`pinroute.vm.memory_bytes`): start → 10% → end",
                format!(
                    "{} → {} → {} MiB",
                    mib(start.vm_memory_bytes / 1024),
                    mib(rss.vm_warm_bytes / 1024),
                    mib(end.vm_memory_bytes / 1024)
                ),
            ),
            (
                "Envoy RSS: start → 10% → end (peak)",
                format!(
                    "{} → {} → {} MiB ({} MiB)",
                    mib(rss.start),
                    mib(rss.warm),
                    mib(rss.end),
                    mib(rss.peak)
                ),
            ),
            (
                "Envoy heap allocated: start → end",
                format!(
                    "{} → {} MiB",
                    mib(start.memory_allocated / 1024),
                    mib(end.memory_allocated / 1024)
                ),
            ),
            (
                "Envoy error log lines",
                self.envoy_log.error_lines.to_string(),
            ),
            (
                "after the soak: unpinned requests by decode worker",
                Recovery::spread(&self.recovery.decode),
            ),
            (
                "after the soak: unpinned requests by prefill worker",
                Recovery::spread(&self.recovery.prefill),
            ),
            (
                "duration, throughput",
                format!(
                    "{:.1} s, {:.0} requests/s",
                    self.elapsed_seconds, self.throughput_rps
                ),
            ),
            (
                "latency to first byte p50 / p90 / p99 / max",
                format!(
                    "{:.1} / {:.1} / {:.1} / {:.1} ms",
                    f.p50_ms, f.p90_ms, f.p99_ms, f.max_ms
                ),
            ),
            (
                "latency to last byte p50 / p90 / p99 / max",
                format!(
                    "{:.1} / {:.1} / {:.1} / {:.1} ms",
                    l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms
                ),
            ),
        ];
        for (measure, value) in rows {
            let _ = writeln!(out, "| {measure} | {value} |");
        }
    }

    fn vm_failure_detail(&self) -> String {
        let end = &self.envoy_stats_end;
        let counters: u64 = end.vm_failure_counters.iter().map(|(_, v)| v).sum();
        format!(
            "{} (vm_reload_* {counters}, VMs created {} → {}, active {} → {}, log lines {})",
            self.vm_failures,
            self.envoy_stats_start.vm_created,
            end.vm_created,
            self.envoy_stats_start.vm_active,
            end.vm_active,
            self.envoy_log.vm_failure_lines
        )
    }

    fn write_context(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\nWhat the faults set in motion (Envoy counters, growth during the run):\n"
        );
        let _ = writeln!(out, "| counter | count |\n|---|---:|");
        for (name, grown) in context_growth(&self.envoy_stats_start, &self.envoy_stats_end) {
            let _ = writeln!(out, "| `{name}` | {grown} |");
        }
    }

    fn write_classes(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\nResponses by class, against the class each request should get:\n"
        );
        let _ = writeln!(
            out,
            "| expected | actual | requests | verdict |\n|---|---|---:|---|"
        );
        for row in &self.classes {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                row.expected,
                row.actual,
                row.requests,
                row.verdict.label()
            );
        }
    }

    fn write_kinds(&self, out: &mut String) {
        let _ = writeln!(out, "\nBy kind of request:\n");
        let _ = writeln!(
            out,
            "| request | sent | as expected | cut by kill | KV lost | mismatched | no answer | left |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
        let all = KindRow {
            kind: "**all**",
            counts: self.totals.clone(),
        };
        for row in self.kinds.iter().chain(std::iter::once(&all)) {
            let c = &row.counts;
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                row.kind,
                c.sent,
                c.as_expected,
                c.cut_by_kill,
                c.kv_lost,
                c.mismatched,
                c.no_answer,
                c.left
            );
        }
    }

    fn write_chaos(&self, out: &mut String) {
        let _ = writeln!(out, "\nKills and restarts:\n");
        let _ = writeln!(
            out,
            "| at | after requests | action | worker |\n|---:|---:|---|---|"
        );
        for record in &self.chaos {
            let during = if record.during_load {
                ""
            } else {
                " (after the load)"
            };
            let _ = writeln!(
                out,
                "| {:.2} s | {} | {:?}{during} | {} |",
                record.at_seconds, record.after_requests, record.action, record.worker
            );
        }
    }

    fn write_problems(&self, out: &mut String) {
        if !self.problems.is_empty() {
            let _ = writeln!(out, "\nFirst problems:\n");
            self.problems.iter().for_each(|p| {
                let _ = writeln!(out, "- {p}");
            });
        }
        if !self.envoy_log.first_errors.is_empty() {
            let _ = writeln!(out, "\nFirst Envoy error log lines:\n");
            self.envoy_log.first_errors.iter().for_each(|line| {
                let _ = writeln!(out, "    {line}");
            });
        }
        if !self.passed() {
            let _ = writeln!(out, "\nFailed: {}", self.failures.join("; "));
        }
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

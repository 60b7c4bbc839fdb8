//! The prefix benchmark's results (`prefix.json`), its tables and plots, and the targets
//! checked against them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use plotters::style::RGBColor;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::fleet::FleetSpec;
use super::traffic::{LABELS, Traffic};
use super::{Chooser, Measured};
use crate::bench::plot::{Line, Panel, draw_panels};
use crate::bench::results::TargetCheck;
use crate::bench::table::{Style, grid, ms, targets, title_mark};
use crate::load::LatencySummary;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefixResults {
    pub meta: Meta,
    pub runs: Vec<PrefixRun>,
    pub agreement: Vec<ReplicaAgreement>,
    pub targets: Vec<TargetCheck>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub unix_time: u64,
    pub cpus: usize,
    pub load_average_before: [f64; 3],
    /// Each traffic's name and shape.
    pub traffics: Vec<(String, String)>,
    pub choosers: Vec<Chooser>,
    pub concurrencies: Vec<usize>,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub max_tokens: u32,
    pub fleet: FleetSpec,
    /// The model counts compared; the first is the one the main tables show.
    #[serde(default = "one_model")]
    pub models: Vec<u64>,
    pub local_settings: Value,
    #[serde(default)]
    pub pinroute_settings: Value,
    pub vllm_router: String,
}

fn one_model() -> Vec<u64> {
    vec![1]
}

fn one() -> u64 {
    1
}

/// One chooser on one traffic at one concurrency (users per model), on a fleet of `models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefixRun {
    pub traffic: Traffic,
    pub chooser: Chooser,
    pub concurrency: usize,
    #[serde(default = "one")]
    pub models: u64,
    /// Each model's own figures, in model order.
    #[serde(default)]
    pub per_model: Vec<ModelShare>,
    pub completed: u64,
    pub throughput_rps: f64,
    pub ttfb: LatencySummary,
    pub last_byte: LatencySummary,
    /// The share of prompt tokens the worker that prefilled them found in its cache.
    pub hit_rate: f64,
    /// The share of requests whose prefill hop pinroute skipped (pinroute only).
    pub skipped_share: Option<f64>,
    /// How pinroute chose the prefill worker of its requests: `affinity`, `spilled`,
    /// `remembered`, `session`, `load`, as shares (pinroute only).
    pub prefill_placements: BTreeMap<String, f64>,
    /// pinroute's counters over the measured period.
    pub counters: BTreeMap<String, u64>,
    pub unexpected: u64,
    pub problems: Vec<String>,
}

/// One model's requests in a run: those answered as expected per second, and the hit rate
/// on its workers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelShare {
    pub throughput_rps: f64,
    pub hit_rate: f64,
}

/// How often two pinroute replicas chose the same prefill worker for the same request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaAgreement {
    pub traffic: String,
    pub concurrency: usize,
    pub pairs: u64,
    pub agreed: u64,
}

impl ReplicaAgreement {
    pub fn share(&self) -> f64 {
        if self.pairs == 0 {
            0.0
        } else {
            self.agreed as f64 / self.pairs as f64
        }
    }
}

impl PrefixRun {
    pub fn new(
        traffic: Traffic,
        chooser: Chooser,
        concurrency: usize,
        models: u64,
        measured: Measured,
    ) -> Self {
        let report = &measured.report;
        let seconds = report.elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
        let per_model = LABELS
            .iter()
            .zip(&measured.hit_rates)
            .map(|(label, hit_rate)| {
                let outcomes = report.by_label.get(label);
                let answered = outcomes.map_or(0, |o| o.total.saturating_sub(o.unexpected));
                ModelShare {
                    throughput_rps: answered as f64 / seconds,
                    hit_rate: *hit_rate,
                }
            })
            .collect();
        let total = report.outcomes.total;
        let counters = measured.counters;
        let requests = counters.get("requests").copied().unwrap_or(0);
        let share = |n: u64| {
            if requests > 0 {
                n as f64 / requests as f64
            } else {
                0.0
            }
        };
        let skipped = ["prefill.local_short_prompt", "prefill.local_next_turn"]
            .iter()
            .map(|name| counters.get(*name).copied().unwrap_or(0))
            .sum();
        let prefill_placements = counters
            .iter()
            .filter_map(|(name, n)| {
                Some((
                    name.strip_prefix("placement.prefill.")?.to_string(),
                    share(*n),
                ))
            })
            .filter(|(_, share)| *share > 0.0)
            .collect();
        PrefixRun {
            traffic,
            chooser,
            concurrency,
            models,
            per_model,
            completed: total,
            throughput_rps: report.throughput(),
            ttfb: report.first_byte_summary(),
            last_byte: report.last_byte_summary(),
            hit_rate: measured.hit_rate,
            skipped_share: (!counters.is_empty()).then(|| share(skipped)),
            prefill_placements,
            counters,
            unexpected: report.outcomes.unexpected,
            problems: report.problems.clone(),
        }
    }

    pub fn one_line(&self) -> String {
        let errors = match self.unexpected {
            0 => String::new(),
            n => format!(" ERRORS {n}: {}", self.problems.join("; ")),
        };
        format!(
            "{:<15} {:<22} c={:<3} models={} {:>6.0} req/s  TTFT p50 {} p99 {} ms  hit rate {:.2}{errors}",
            self.traffic.as_str(),
            self.chooser.as_str(),
            self.concurrency,
            self.models,
            self.throughput_rps,
            ms(self.ttfb.p50_ms),
            ms(self.ttfb.p99_ms),
            self.hit_rate,
        )
    }
}

impl PrefixResults {
    /// The run of the main tables: on the first model count.
    fn run(&self, traffic: Traffic, chooser: Chooser, concurrency: usize) -> Option<&PrefixRun> {
        let models = self.meta.models.first().copied().unwrap_or(1);
        self.run_of(traffic, chooser, concurrency, models)
    }

    fn run_of(
        &self,
        traffic: Traffic,
        chooser: Chooser,
        concurrency: usize,
        models: u64,
    ) -> Option<&PrefixRun> {
        self.runs.iter().find(|r| {
            (r.traffic, r.chooser, r.concurrency, r.models)
                == (traffic, chooser, concurrency, models)
        })
    }

    fn traffics(&self) -> Vec<Traffic> {
        let mut traffics: Vec<Traffic> = self.runs.iter().map(|r| r.traffic).collect();
        traffics.sort();
        traffics.dedup();
        traffics
    }
}

/// The prefix-aware pinroute configurations the targets are checked for.
const PREFIX_AWARE: [Chooser; 2] = [Chooser::PinroutePrefix, Chooser::PinrouteLocal];

/// Every target the results can speak to.
pub fn check_targets(results: &PrefixResults) -> Vec<TargetCheck> {
    let mut checks = Vec::new();
    for traffic in results.traffics() {
        for chooser in PREFIX_AWARE {
            checks.push(compare_everywhere(
                results,
                traffic,
                chooser,
                Compared::HitRateVsOracle,
            ));
            checks.push(compare_everywhere(
                results,
                traffic,
                chooser,
                Compared::HitRateVsRouter,
            ));
            checks.push(compare_everywhere(
                results,
                traffic,
                chooser,
                Compared::TtftVsRouter,
            ));
        }
    }
    for chooser in PREFIX_AWARE {
        checks.push(throughput_over_round_robin(results, chooser));
    }
    if results.meta.models.len() > 1 {
        checks.push(models_alike(results));
    }
    for agreement in &results.agreement {
        checks.push(TargetCheck {
            target: format!(
                "two pinroute replicas choose the same prefill worker for at least 90% of {} requests (concurrency {})",
                agreement.traffic, agreement.concurrency
            ),
            measured: format!(
                "{:.1}% of {} pairs",
                100.0 * agreement.share(),
                agreement.pairs
            ),
            met: Some(agreement.pairs > 0 && agreement.share() >= 0.9),
        });
    }
    checks
}

#[derive(Debug, Clone, Copy)]
enum Compared {
    HitRateVsOracle,
    HitRateVsRouter,
    TtftVsRouter,
}

/// A comparison at every concurrency; the worst one is reported.
fn compare_everywhere(
    results: &PrefixResults,
    traffic: Traffic,
    chooser: Chooser,
    compared: Compared,
) -> TargetCheck {
    let (other, what) = match compared {
        Compared::HitRateVsOracle => (
            Chooser::Oracle,
            "a prefix-cache hit rate at least 0.9 of the oracle's",
        ),
        Compared::HitRateVsRouter => (
            Chooser::VllmRouter,
            "a prefix-cache hit rate at least vllm-router's",
        ),
        Compared::TtftVsRouter => (Chooser::VllmRouter, "a TTFT p50 at most vllm-router's"),
    };
    let target = format!("{chooser} has {what} on {traffic}, at every concurrency");
    let pairs: Vec<(usize, f64, f64)> = results
        .meta
        .concurrencies
        .iter()
        .filter_map(|c| {
            let ours = results.run(traffic, chooser, *c)?;
            let theirs = results.run(traffic, other, *c)?;
            Some(match compared {
                Compared::TtftVsRouter => (*c, ours.ttfb.p50_ms, theirs.ttfb.p50_ms),
                _ => (*c, ours.hit_rate, theirs.hit_rate),
            })
        })
        .collect();
    if pairs.is_empty() {
        return TargetCheck {
            target,
            measured: "not measured".into(),
            met: None,
        };
    }
    let ok = |(_, ours, theirs): &(usize, f64, f64)| match compared {
        Compared::HitRateVsOracle => *ours >= 0.9 * theirs,
        Compared::HitRateVsRouter => *ours >= *theirs,
        Compared::TtftVsRouter => *ours <= *theirs,
    };
    let shown: Vec<String> = pairs
        .iter()
        .map(|(c, ours, theirs)| match compared {
            Compared::TtftVsRouter => format!("c={c}: {} vs {} ms", ms(*ours), ms(*theirs)),
            _ => format!("c={c}: {ours:.3} vs {theirs:.3}"),
        })
        .collect();
    TargetCheck {
        target,
        measured: shown.join(", "),
        met: Some(pairs.iter().all(ok)),
    }
}

/// On system prompts (long and shared), at the highest concurrency: at least 1.5× round robin.
fn throughput_over_round_robin(results: &PrefixResults, chooser: Chooser) -> TargetCheck {
    let traffic = Traffic::SystemPrompts;
    let concurrency = results
        .meta
        .concurrencies
        .iter()
        .copied()
        .max()
        .unwrap_or(0);
    let target = format!(
        "{chooser} carries at least 1.5x round robin's throughput on {traffic} (long shared prefixes), concurrency {concurrency}"
    );
    let ours = results.run(traffic, chooser, concurrency);
    let theirs = results.run(traffic, Chooser::RoundRobin, concurrency);
    match (ours, theirs) {
        (Some(ours), Some(theirs)) if theirs.throughput_rps > 0.0 => {
            let ratio = ours.throughput_rps / theirs.throughput_rps;
            TargetCheck {
                target,
                measured: format!(
                    "{ratio:.2}x ({:.0} vs {:.0} req/s)",
                    ours.throughput_rps, theirs.throughput_rps
                ),
                met: Some(ratio >= 1.5),
            }
        }
        _ => TargetCheck {
            target,
            measured: "not measured".into(),
            met: None,
        },
    }
}

/// Each model of a fleet of several against one model alone (`--models`): what routing by
/// model may cost a model.
const MODEL_THROUGHPUT_KEPT: f64 = 0.95;
const MODEL_HIT_RATE_KEPT: f64 = 0.02;

/// Each model's share beside one model alone, for every run of more models.
struct ModelComparison<'r> {
    alone: &'r ModelShare,
    run: &'r PrefixRun,
    model: usize,
    share: &'r ModelShare,
}

impl ModelComparison<'_> {
    fn kept(&self) -> bool {
        self.share.throughput_rps >= MODEL_THROUGHPUT_KEPT * self.alone.throughput_rps
            && self.share.hit_rate >= self.alone.hit_rate - MODEL_HIT_RATE_KEPT
    }
}

impl PrefixResults {
    fn model_comparisons(&self) -> Vec<ModelComparison<'_>> {
        let alone_count = self.meta.models.first().copied().unwrap_or(1);
        let mut comparisons = Vec::new();
        for run in self.runs.iter().filter(|r| r.models != alone_count) {
            let alone = self
                .run_of(run.traffic, run.chooser, run.concurrency, alone_count)
                .and_then(|a| a.per_model.first());
            let Some(alone) = alone else { continue };
            for (model, share) in run.per_model.iter().enumerate() {
                comparisons.push(ModelComparison {
                    alone,
                    run,
                    model,
                    share,
                });
            }
        }
        comparisons
    }
}

fn models_alike(results: &PrefixResults) -> TargetCheck {
    let target = format!(
        "each model of several keeps its throughput (>= {MODEL_THROUGHPUT_KEPT:.2}x) and hit rate (>= -{MODEL_HIT_RATE_KEPT:.2}) beside one model alone, everywhere"
    );
    let comparisons = results.model_comparisons();
    let worst = comparisons.iter().min_by(|a, b| {
        let ratio = |c: &&ModelComparison<'_>| {
            c.share.throughput_rps / c.alone.throughput_rps.max(f64::MIN_POSITIVE)
        };
        ratio(a).total_cmp(&ratio(b))
    });
    match worst {
        None => TargetCheck {
            target,
            measured: "not measured".into(),
            met: None,
        },
        Some(worst) => TargetCheck {
            target,
            measured: format!(
                "lowest: model {} of {} on {} c={}: {:.0} vs {:.0} req/s, hit rate {:.3} vs {:.3}",
                worst.model,
                worst.run.models,
                worst.run.traffic,
                worst.run.concurrency,
                worst.share.throughput_rps,
                worst.alone.throughput_rps,
                worst.share.hit_rate,
                worst.alone.hit_rate
            ),
            met: Some(comparisons.iter().all(ModelComparison::kept)),
        },
    }
}

fn models_table(results: &PrefixResults, style: Style) -> String {
    let header: Vec<String> = [
        "traffic",
        "chooser",
        "users/model",
        "models",
        "model",
        "req/s",
        "x alone",
        "hit rate",
        "alone",
    ]
    .iter()
    .map(|h| h.to_string())
    .collect();
    let rows: Vec<Vec<String>> = results
        .model_comparisons()
        .iter()
        .map(|c| {
            vec![
                c.run.traffic.to_string(),
                c.run.chooser.to_string(),
                c.run.concurrency.to_string(),
                c.run.models.to_string(),
                c.model.to_string(),
                format!("{:.0}", c.share.throughput_rps),
                format!(
                    "{:.2}",
                    c.share.throughput_rps / c.alone.throughput_rps.max(f64::MIN_POSITIVE)
                ),
                format!("{:.3}", c.share.hit_rate),
                format!("{:.3}", c.alone.hit_rate),
            ]
        })
        .collect();
    grid(&header, &rows, style)
}

/// How it was run, a table per traffic, the replicas' agreement, the targets.
pub fn render(results: &PrefixResults, style: Style) -> String {
    let mut out = String::new();
    let meta = &results.meta;
    let fleet = &meta.fleet;
    let _ = writeln!(
        out,
        "- {} CPUs, load average before the run {:.2} / {:.2} / {:.2}",
        meta.cpus,
        meta.load_average_before[0],
        meta.load_average_before[1],
        meta.load_average_before[2]
    );
    let _ = writeln!(
        out,
        "- sim workers: {} prefill and {} decode per model ({} models), a prefix cache of {} blocks of 16 tokens each, {} µs of prefill compute per uncached token, {} µs per generated token, {} tokens streamed",
        fleet.prefill_workers,
        fleet.decode_workers,
        meta.models
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", then "),
        fleet.cache_blocks,
        fleet.prefill_us_per_token,
        fleet.token_latency_us,
        meta.max_tokens
    );
    let _ = writeln!(
        out,
        "- {:.1} s measured per run after {:.1} s of warm-up, caches emptied before each run; pinroute-prefix-local: {}; vllm-router {}",
        meta.duration_s, meta.warmup_s, meta.local_settings, meta.vllm_router
    );
    if meta
        .pinroute_settings
        .as_object()
        .is_some_and(|s| !s.is_empty())
    {
        let _ = writeln!(out, "- every pinroute gateway: {}", meta.pinroute_settings);
    }
    for (name, shape) in &meta.traffics {
        let _ = writeln!(out, "- {name}: {shape}");
    }
    for traffic in results.traffics() {
        let _ = writeln!(out, "\n{}{traffic}\n", title_mark(style));
        let header: Vec<String> = [
            "chooser",
            "conc",
            "req/s",
            "x rr",
            "TTFT p50",
            "p99",
            "last p50",
            "hit rate",
            "x oracle",
            "skipped",
            "prefill placed by",
            "errors",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect();
        let mut rows = Vec::new();
        for chooser in &meta.choosers {
            for concurrency in &meta.concurrencies {
                if let Some(run) = results.run(traffic, *chooser, *concurrency) {
                    rows.push(row(results, run));
                }
            }
        }
        out.push_str(&grid(&header, &rows, style));
    }
    if !results.agreement.is_empty() {
        let _ = writeln!(
            out,
            "\n{}Two replicas, no shared state\n",
            title_mark(style)
        );
        let header: Vec<String> = ["traffic", "conc", "pairs", "same prefill worker"]
            .iter()
            .map(|h| h.to_string())
            .collect();
        let rows: Vec<Vec<String>> = results
            .agreement
            .iter()
            .map(|a| {
                vec![
                    a.traffic.clone(),
                    a.concurrency.to_string(),
                    a.pairs.to_string(),
                    format!("{:.1}%", 100.0 * a.share()),
                ]
            })
            .collect();
        out.push_str(&grid(&header, &rows, style));
    }
    if results.meta.models.len() > 1 {
        let _ = writeln!(
            out,
            "\n{}Several models: each one beside one model alone\n",
            title_mark(style)
        );
        out.push_str(&models_table(results, style));
    }
    let _ = writeln!(out, "\n{}Targets\n", title_mark(style));
    out.push_str(&targets(&results.targets, style));
    out
}

fn row(results: &PrefixResults, run: &PrefixRun) -> Vec<String> {
    let versus = |other: Chooser, value: fn(&PrefixRun) -> f64| {
        results
            .run(run.traffic, other, run.concurrency)
            .map(value)
            .filter(|v| *v > 0.0)
            .map_or("-".to_string(), |v| format!("{:.2}", value(run) / v))
    };
    vec![
        run.chooser.as_str().to_string(),
        run.concurrency.to_string(),
        format!("{:.0}", run.throughput_rps),
        versus(Chooser::RoundRobin, |r| r.throughput_rps),
        ms(run.ttfb.p50_ms),
        ms(run.ttfb.p99_ms),
        ms(run.last_byte.p50_ms),
        format!("{:.3}", run.hit_rate),
        versus(Chooser::Oracle, |r| r.hit_rate),
        run.skipped_share
            .map_or("-".to_string(), |s| format!("{:.0}%", 100.0 * s)),
        placements(&run.prefill_placements),
        run.unexpected.to_string(),
    ]
}

/// `affinity 80% spilled 20%`; `-` when none.
fn placements(shares: &BTreeMap<String, f64>) -> String {
    let shown: Vec<String> = shares
        .iter()
        .map(|(how, share)| format!("{how} {:.0}%", 100.0 * share))
        .collect();
    if shown.is_empty() {
        "-".into()
    } else {
        shown.join(" ")
    }
}

/// `prefix.json`, `prefix.md` and a plot per traffic in `dir`.
pub fn write_outputs(results: &PrefixResults, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = dir.join("prefix.json");
    let text = serde_json::to_string_pretty(results).context("encoding the results")?;
    std::fs::write(&json, text).with_context(|| format!("writing {}", json.display()))?;
    let markdown = dir.join("prefix.md");
    std::fs::write(&markdown, render(results, Style::Markdown))
        .with_context(|| format!("writing {}", markdown.display()))?;
    for traffic in results.traffics() {
        let path = dir.join(format!("prefix-{traffic}.svg"));
        draw_panels(&path, &panels(results, traffic))?;
    }
    Ok(())
}

fn panels(results: &PrefixResults, traffic: Traffic) -> [Panel; 3] {
    let concurrencies = &results.meta.concurrencies;
    let ticks: Vec<String> = concurrencies.iter().map(usize::to_string).collect();
    let lines = |value: fn(&PrefixRun) -> f64| -> Vec<Line> {
        results
            .meta
            .choosers
            .iter()
            .map(|chooser| Line {
                label: chooser.as_str().to_string(),
                color: color(*chooser),
                points: concurrencies
                    .iter()
                    .enumerate()
                    .filter_map(|(i, c)| {
                        Some((i as f64, value(results.run(traffic, *chooser, *c)?)))
                    })
                    .collect(),
            })
            .collect()
    };
    let panel = |title: &str, y_desc, value| Panel {
        title: format!("{title} ({traffic})"),
        x_desc: "concurrency",
        x_ticks: ticks.clone(),
        y_desc,
        lines: lines(value),
    };
    [
        panel("Prefix-cache hit rate", "% of prompt tokens", |r| {
            100.0 * r.hit_rate
        }),
        panel("Time to first token, p50", "ms", |r| r.ttfb.p50_ms),
        panel("Throughput", "requests/s", |r| r.throughput_rps),
    ]
}

fn color(chooser: Chooser) -> RGBColor {
    match chooser {
        Chooser::RoundRobin => RGBColor(127, 127, 127),
        Chooser::PinrouteLoad => RGBColor(31, 119, 180),
        Chooser::PinrouteSession => RGBColor(148, 103, 189),
        Chooser::PinroutePrefix => RGBColor(214, 39, 40),
        Chooser::PinrouteLocal => RGBColor(140, 86, 75),
        Chooser::VllmRouter => RGBColor(255, 127, 14),
        Chooser::Oracle => RGBColor(40, 40, 40),
    }
}

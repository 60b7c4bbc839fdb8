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
use super::traffic::{LABELS, Sharing, Traffic};
use super::{Chooser, Measured, Scrape};
use crate::bench::plot::{Line, Panel, draw_panels};
use crate::bench::procfs;
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
    /// The processor's model (empty in results saved before it was kept).
    #[serde(default)]
    pub cpu_model: String,
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
    /// Seconds measured per replica-agreement run, and the user counts they ran at.
    #[serde(default)]
    pub agreement_s: f64,
    #[serde(default)]
    pub agreement_concurrencies: Vec<usize>,
    #[serde(default)]
    pub agreement_sharing: Sharing,
    /// The first run's salt (`--salt`).
    #[serde(default)]
    pub salt: u64,
    /// Runs with different prompts pooled in each agreement row.
    #[serde(default = "one")]
    pub agreement_salts: u64,
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

/// How often two pinroute replicas chose the same prefill worker for the same request, and
/// what they gave: the hit rate over the fleet (both replicas' prefills; the second of a pair
/// finds the first's blocks where they agreed), the first replica's TTFT and placements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaAgreement {
    pub traffic: Traffic,
    /// Users, each sending its requests to both replicas.
    pub concurrency: usize,
    /// Whether the replicas read the engines' load (`engine_load`).
    #[serde(default)]
    pub scrape: Scrape,
    pub pairs: u64,
    pub agreed: u64,
    #[serde(default)]
    pub hit_rate: f64,
    #[serde(default)]
    pub ttfb: LatencySummary,
    #[serde(default)]
    pub prefill_placements: BTreeMap<String, f64>,
    #[serde(default)]
    pub counters: BTreeMap<String, u64>,
    #[serde(default)]
    pub unexpected: u64,
    #[serde(default)]
    pub problems: Vec<String>,
}

impl ReplicaAgreement {
    pub fn new(traffic: Traffic, concurrency: usize, scrape: Scrape, measured: Measured) -> Self {
        let report = &measured.report;
        ReplicaAgreement {
            traffic,
            concurrency,
            scrape,
            pairs: measured.agreement.pairs,
            agreed: measured.agreement.agreed,
            hit_rate: measured.hit_rate,
            ttfb: report.first_byte_summary(),
            prefill_placements: prefill_placements(&measured.counters),
            counters: measured.counters,
            unexpected: report.outcomes.unexpected,
            problems: report.problems.clone(),
        }
    }

    /// Runs of one traffic, user count and scrape with different prompts, as one: pairs,
    /// counters and errors summed, hit rate and TTFT the runs' mean (the worst p99 and max).
    pub fn pooled(runs: Vec<ReplicaAgreement>) -> Option<ReplicaAgreement> {
        let count = runs.len() as f64;
        let mut runs = runs.into_iter();
        let mut pooled = runs.next()?;
        let mean = |sum: f64| sum / count;
        let (mut hit_rate, mut p50, mut p90, mut mean_ms) = (
            pooled.hit_rate,
            pooled.ttfb.p50_ms,
            pooled.ttfb.p90_ms,
            pooled.ttfb.mean_ms,
        );
        for run in runs {
            pooled.pairs += run.pairs;
            pooled.agreed += run.agreed;
            hit_rate += run.hit_rate;
            p50 += run.ttfb.p50_ms;
            p90 += run.ttfb.p90_ms;
            mean_ms += run.ttfb.mean_ms;
            pooled.ttfb.p99_ms = pooled.ttfb.p99_ms.max(run.ttfb.p99_ms);
            pooled.ttfb.max_ms = pooled.ttfb.max_ms.max(run.ttfb.max_ms);
            for (name, n) in run.counters {
                *pooled.counters.entry(name).or_default() += n;
            }
            pooled.unexpected += run.unexpected;
            pooled.problems.extend(run.problems);
        }
        pooled.hit_rate = mean(hit_rate);
        pooled.ttfb.p50_ms = mean(p50);
        pooled.ttfb.p90_ms = mean(p90);
        pooled.ttfb.mean_ms = mean(mean_ms);
        pooled.prefill_placements = prefill_placements(&pooled.counters);
        Some(pooled)
    }

    pub fn share(&self) -> f64 {
        if self.pairs == 0 {
            0.0
        } else {
            self.agreed as f64 / self.pairs as f64
        }
    }

    pub fn one_line(&self) -> String {
        format!(
            "{:<15} replicas c={:<3} scrape {:<3} agreed {:>5.1}% of {:>5}  TTFT p50 {} p99 {} ms  hit rate {:.2}{}",
            self.traffic.as_str(),
            self.concurrency,
            self.scrape.as_str(),
            100.0 * self.share(),
            self.pairs,
            ms(self.ttfb.p50_ms),
            ms(self.ttfb.p99_ms),
            self.hit_rate,
            errors(self.unexpected, &self.problems),
        )
    }
}

/// ` ERRORS n: the problems`; empty when none.
fn errors(unexpected: u64, problems: &[String]) -> String {
    match unexpected {
        0 => String::new(),
        n => format!(" ERRORS {n}: {}", problems.join("; ")),
    }
}

/// `n` as a share of the requests pinroute counted (0 when none).
fn share_of_requests(counters: &BTreeMap<String, u64>, n: u64) -> f64 {
    match counters.get("requests").copied().unwrap_or(0) {
        0 => 0.0,
        requests => n as f64 / requests as f64,
    }
}

/// How many runs an agreement row pools, for the report's description.
fn pooled_runs(salts: u64) -> String {
    if salts > 1 {
        format!(
            "each row {salts} runs with different prompts (pairs summed, hit rate and TTFT p50 the runs' mean, p99 the worst)"
        )
    } else {
        "each row one run".to_string()
    }
}

/// How pinroute chose the prefill worker, as shares of its requests (those above 0).
fn prefill_placements(counters: &BTreeMap<String, u64>) -> BTreeMap<String, f64> {
    counters
        .iter()
        .filter_map(|(name, n)| {
            let how = name.strip_prefix("placement.prefill.")?;
            Some((how.to_string(), share_of_requests(counters, *n)))
        })
        .filter(|(_, share)| *share > 0.0)
        .collect()
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
        let skipped = ["prefill.local_short_prompt", "prefill.local_next_turn"]
            .iter()
            .map(|name| counters.get(*name).copied().unwrap_or(0))
            .sum();
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
            skipped_share: (!counters.is_empty()).then(|| share_of_requests(&counters, skipped)),
            prefill_placements: prefill_placements(&counters),
            counters,
            unexpected: report.outcomes.unexpected,
            problems: report.problems.clone(),
        }
    }

    pub fn one_line(&self) -> String {
        format!(
            "{:<15} {:<22} c={:<3} models={} {:>6.0} req/s  TTFT p50 {} p99 {} ms  hit rate {:.2}{}",
            self.traffic.as_str(),
            self.chooser.as_str(),
            self.concurrency,
            self.models,
            self.throughput_rps,
            ms(self.ttfb.p50_ms),
            ms(self.ttfb.p99_ms),
            self.hit_rate,
            errors(self.unexpected, &self.problems),
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
        sorted(self.runs.iter().map(|r| r.traffic))
    }

    fn agreement_traffics(&self) -> Vec<Traffic> {
        sorted(self.agreement.iter().map(|a| a.traffic))
    }

    fn agreement_of(
        &self,
        traffic: Traffic,
        users: usize,
        scrape: Scrape,
    ) -> Option<&ReplicaAgreement> {
        self.agreement
            .iter()
            .find(|a| (a.traffic, a.concurrency, a.scrape) == (traffic, users, scrape))
    }
}

fn sorted(traffics: impl Iterator<Item = Traffic>) -> Vec<Traffic> {
    let mut traffics: Vec<Traffic> = traffics.collect();
    traffics.sort();
    traffics.dedup();
    traffics
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
    for traffic in results.agreement_traffics() {
        checks.push(agreement_under_load(results, traffic));
        checks.push(scrape_keeps(results, traffic, Kept::HitRate));
        checks.push(scrape_keeps(results, traffic, Kept::TtftP50));
    }
    checks
}

/// Two replicas reading the engines' load agree at least this often at [`CROWDED_USERS`].
const AGREEMENT_WITH_SCRAPE: f64 = 0.95;
const CROWDED_USERS: [usize; 2] = [64, 128];
/// Where the replicas agree anyway, reading the engines' load may cost at most this much
/// hit rate (absolute) and TTFT p50 (relative).
const CALM_USERS: [usize; 2] = [8, 32];
const HIT_RATE_SLACK: f64 = 0.01;
const TTFT_SLACK: f64 = 0.10;

/// A target judged at several user counts: each count's figures, and whether it was met.
type Judged = (String, Option<bool>);

fn agreement_under_load(results: &PrefixResults, traffic: Traffic) -> TargetCheck {
    let target = format!(
        "with engine_load, two pinroute replicas choose the same prefill worker for at least {:.0}% of {traffic} requests at {} users",
        100.0 * AGREEMENT_WITH_SCRAPE,
        users_list(&CROWDED_USERS)
    );
    let judged =
        CROWDED_USERS.map(
            |users| match results.agreement_of(traffic, users, Scrape::On) {
                Some(on) => (
                    format!(
                        "{users} users: {:.1}% of {} pairs",
                        100.0 * on.share(),
                        on.pairs
                    ),
                    Some(on.pairs > 0 && on.share() >= AGREEMENT_WITH_SCRAPE),
                ),
                None => not_measured(users),
            },
        );
    judgement(target, &judged)
}

/// What reading the engines' load must not cost.
#[derive(Debug, Clone, Copy)]
enum Kept {
    HitRate,
    TtftP50,
}

fn scrape_keeps(results: &PrefixResults, traffic: Traffic, kept: Kept) -> TargetCheck {
    let what = match kept {
        Kept::HitRate => format!("a prefix-cache hit rate at most {HIT_RATE_SLACK} below"),
        Kept::TtftP50 => format!("a TTFT p50 at most {:.0}% above", 100.0 * TTFT_SLACK),
    };
    let target = format!(
        "with engine_load, two pinroute replicas give {traffic} {what} what they give without it, at {} users",
        users_list(&CALM_USERS)
    );
    let judged = CALM_USERS.map(|users| {
        let on = results.agreement_of(traffic, users, Scrape::On);
        let off = results.agreement_of(traffic, users, Scrape::Off);
        match on.zip(off) {
            Some((on, off)) => kept.judge(users, on, off),
            None => not_measured(users),
        }
    });
    judgement(target, &judged)
}

impl Kept {
    fn judge(self, users: usize, on: &ReplicaAgreement, off: &ReplicaAgreement) -> Judged {
        let both_ran = on.pairs > 0 && off.pairs > 0;
        match self {
            Kept::HitRate => (
                format!(
                    "{users} users: {:.3} vs {:.3} off",
                    on.hit_rate, off.hit_rate
                ),
                Some(both_ran && on.hit_rate >= off.hit_rate - HIT_RATE_SLACK),
            ),
            Kept::TtftP50 => (
                format!(
                    "{users} users: {} vs {} ms off",
                    ms(on.ttfb.p50_ms),
                    ms(off.ttfb.p50_ms)
                ),
                Some(both_ran && on.ttfb.p50_ms <= off.ttfb.p50_ms * (1.0 + TTFT_SLACK)),
            ),
        }
    }
}

fn not_measured(users: usize) -> Judged {
    (format!("{users} users: not measured"), None)
}

/// Missed if missed anywhere; not judged while a user count was not measured.
fn judgement(target: String, judged: &[Judged]) -> TargetCheck {
    let met: Vec<Option<bool>> = judged.iter().map(|(_, met)| *met).collect();
    let met = if met.contains(&Some(false)) {
        Some(false)
    } else if met.contains(&None) {
        None
    } else {
        Some(true)
    };
    let measured: Vec<&str> = judged.iter().map(|(figures, _)| figures.as_str()).collect();
    TargetCheck {
        target,
        measured: measured.join(", "),
        met,
    }
}

/// `64 and 128`.
fn users_list(users: &[usize]) -> String {
    let users: Vec<String> = users.iter().map(usize::to_string).collect();
    users.join(" and ")
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
        "- {}, load average before the run {:.2} / {:.2} / {:.2}",
        procfs::machine(meta.cpus, &meta.cpu_model),
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
        "- {:.1} s measured per run after {:.1} s of warm-up, caches emptied and queued compute dropped before each run, prompts salted from {} (`--salt`); pinroute-prefix-local: {}; vllm-router {}",
        meta.duration_s, meta.warmup_s, meta.salt, meta.local_settings, meta.vllm_router
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
    if !results.agreement.is_empty() {
        let _ = writeln!(
            out,
            "- two replicas: {:.1} s measured per run after the same warm-up, {}, {}, the off and on runs of a user count sending the same prompts; scrape off: each counts its own requests in flight, on: both read the engines' load (`engine_load`); hit rate over both replicas' prefills, TTFT and placements the first replica's",
            meta.agreement_s,
            meta.agreement_sharing.describe(),
            pooled_runs(meta.agreement_salts)
        );
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
        out.push_str(&agreement_table(results, style));
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

fn agreement_table(results: &PrefixResults, style: Style) -> String {
    let header: Vec<String> = [
        "traffic",
        "users",
        "scrape",
        "agreement",
        "pairs",
        "hit rate",
        "TTFT p50",
        "TTFT p99",
        "prefill placed by",
        "errors",
    ]
    .iter()
    .map(|h| h.to_string())
    .collect();
    let rows: Vec<Vec<String>> = results
        .agreement
        .iter()
        .map(|a| {
            vec![
                a.traffic.to_string(),
                a.concurrency.to_string(),
                a.scrape.to_string(),
                format!("{:.1}%", 100.0 * a.share()),
                a.pairs.to_string(),
                format!("{:.3}", a.hit_rate),
                ms(a.ttfb.p50_ms),
                ms(a.ttfb.p99_ms),
                placements(&a.prefill_placements),
                a.unexpected.to_string(),
            ]
        })
        .collect();
    grid(&header, &rows, style)
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    const PAIRS: u64 = 1000;

    fn agreement(
        traffic: Traffic,
        users: usize,
        scrape: Scrape,
        share: f64,
        hit_rate: f64,
        ttft_p50_ms: f64,
    ) -> ReplicaAgreement {
        ReplicaAgreement {
            traffic,
            concurrency: users,
            scrape,
            pairs: PAIRS,
            agreed: (share * PAIRS as f64).round() as u64,
            hit_rate,
            ttfb: LatencySummary {
                p50_ms: ttft_p50_ms,
                p99_ms: 3.0 * ttft_p50_ms,
                ..LatencySummary::default()
            },
            prefill_placements: BTreeMap::from([("affinity".to_string(), 1.0)]),
            counters: BTreeMap::new(),
            unexpected: 0,
            problems: Vec::new(),
        }
    }

    #[test]
    fn pooled_runs_sum_their_pairs_and_placements_and_average_the_rest() {
        let mut first = agreement(Traffic::Conversations, 64, Scrape::On, 0.9, 0.8, 10.0);
        let mut second = agreement(Traffic::Conversations, 64, Scrape::On, 0.7, 0.6, 20.0);
        first.counters = BTreeMap::from([
            ("requests".to_string(), 10),
            ("placement.prefill.affinity".to_string(), 10),
        ]);
        second.counters = BTreeMap::from([
            ("requests".to_string(), 30),
            ("placement.prefill.spilled".to_string(), 30),
        ]);
        second.problems = vec!["one timed out".to_string()];
        let pooled = ReplicaAgreement::pooled(vec![first, second]).unwrap();
        assert_eq!((pooled.pairs, pooled.agreed), (2 * PAIRS, 1600));
        assert!((pooled.share() - 0.8).abs() < 1e-9);
        assert!((pooled.hit_rate - 0.7).abs() < 1e-9);
        assert!((pooled.ttfb.p50_ms - 15.0).abs() < 1e-9);
        assert!((pooled.ttfb.p99_ms - 60.0).abs() < 1e-9, "the worst p99");
        assert_eq!(pooled.counters["requests"], 40);
        assert_eq!(
            pooled.prefill_placements,
            BTreeMap::from([
                ("affinity".to_string(), 0.25),
                ("spilled".to_string(), 0.75)
            ])
        );
        assert_eq!(pooled.problems, ["one timed out"]);
        assert!(ReplicaAgreement::pooled(Vec::new()).is_none());
    }

    /// Both settings at every user count of a full run, on system prompts: every target met.
    fn all_met() -> Vec<ReplicaAgreement> {
        let mut agreements = Vec::new();
        for users in [8, 32, 64, 128] {
            let off = agreement(Traffic::SystemPrompts, users, Scrape::Off, 0.9, 0.95, 10.0);
            let on = agreement(Traffic::SystemPrompts, users, Scrape::On, 0.97, 0.95, 10.0);
            agreements.extend([off, on]);
        }
        agreements
    }

    fn results(agreement: Vec<ReplicaAgreement>) -> PrefixResults {
        PrefixResults {
            meta: Meta {
                unix_time: 0,
                cpus: 2,
                cpu_model: String::new(),
                load_average_before: [0.0; 3],
                traffics: Vec::new(),
                choosers: vec![Chooser::PinroutePrefix],
                concurrencies: vec![8],
                warmup_s: 1.0,
                duration_s: 2.0,
                max_tokens: 8,
                fleet: FleetSpec {
                    prefill_workers: 4,
                    decode_workers: 2,
                    models: 1,
                    cache_blocks: 1024,
                    prefill_us_per_token: 20,
                    token_latency_us: 1000,
                },
                models: vec![1],
                local_settings: Value::Null,
                pinroute_settings: Value::Null,
                vllm_router: String::new(),
                agreement_s: 6.0,
                agreement_concurrencies: vec![8, 32, 64, 128],
                agreement_sharing: Sharing::Mirrored,
                salt: 1,
                agreement_salts: 1,
            },
            runs: Vec::new(),
            agreement,
            targets: Vec::new(),
        }
    }

    /// The agreement targets of system prompts: under load, hit rate kept, TTFT kept.
    fn judged(agreement: Vec<ReplicaAgreement>) -> [TargetCheck; 3] {
        let checks = check_targets(&results(agreement));
        let ours: Vec<TargetCheck> = checks
            .into_iter()
            .filter(|c| c.target.contains("engine_load"))
            .collect();
        ours.try_into().unwrap()
    }

    /// The entry of `users` and `scrape` in `agreements`.
    fn entry(
        agreements: &mut [ReplicaAgreement],
        users: usize,
        scrape: Scrape,
    ) -> &mut ReplicaAgreement {
        agreements
            .iter_mut()
            .find(|a| (a.concurrency, a.scrape) == (users, scrape))
            .unwrap()
    }

    #[test]
    fn every_agreement_target_is_met_with_its_figures_shown() {
        let [under_load, hit_rate, ttft] = judged(all_met());
        assert_eq!(under_load.met, Some(true), "{under_load:?}");
        assert!(
            under_load
                .target
                .contains("95% of system-prompts requests at 64 and 128")
        );
        assert_eq!(
            under_load.measured,
            "64 users: 97.0% of 1000 pairs, 128 users: 97.0% of 1000 pairs"
        );
        assert_eq!(hit_rate.met, Some(true), "{hit_rate:?}");
        assert_eq!(
            hit_rate.measured,
            "8 users: 0.950 vs 0.950 off, 32 users: 0.950 vs 0.950 off"
        );
        assert_eq!(ttft.met, Some(true), "{ttft:?}");
        assert!(
            ttft.measured.starts_with("8 users: 10.00 vs 10.00 ms off"),
            "{ttft:?}"
        );
    }

    #[test]
    fn under_load_the_replicas_reading_the_engines_must_agree_at_each_user_count() {
        let mut agreements = all_met();
        entry(&mut agreements, 128, Scrape::On).agreed = 949;
        let [under_load, ..] = judged(agreements);
        assert_eq!(under_load.met, Some(false), "{under_load:?}");
        assert!(
            under_load
                .measured
                .contains("128 users: 94.9% of 1000 pairs")
        );
    }

    #[test]
    fn agreement_without_the_engines_load_is_not_judged() {
        let mut agreements = all_met();
        for users in [64, 128] {
            entry(&mut agreements, users, Scrape::Off).agreed = 0;
        }
        let [under_load, ..] = judged(agreements);
        assert_eq!(under_load.met, Some(true), "{under_load:?}");
    }

    #[test]
    fn a_user_count_not_run_leaves_a_target_unjudged_unless_another_missed() {
        let crowded = |a: &ReplicaAgreement| a.concurrency != 128;
        let agreements: Vec<ReplicaAgreement> = all_met().into_iter().filter(crowded).collect();
        let [under_load, ..] = judged(agreements.clone());
        assert_eq!(under_load.met, None, "{under_load:?}");
        assert!(under_load.measured.ends_with("128 users: not measured"));
        let mut agreements = agreements;
        entry(&mut agreements, 64, Scrape::On).agreed = 500;
        let [under_load, ..] = judged(agreements);
        assert_eq!(under_load.met, Some(false), "{under_load:?}");
    }

    #[test]
    fn the_hit_rate_may_fall_by_a_hundredth_at_most() {
        let mut agreements = all_met();
        entry(&mut agreements, 32, Scrape::On).hit_rate = 0.941;
        let [_, hit_rate, _] = judged(agreements.clone());
        assert_eq!(hit_rate.met, Some(true), "{hit_rate:?}");
        entry(&mut agreements, 32, Scrape::On).hit_rate = 0.939;
        let [_, hit_rate, _] = judged(agreements);
        assert_eq!(hit_rate.met, Some(false), "{hit_rate:?}");
        assert!(hit_rate.measured.contains("32 users: 0.939 vs 0.950 off"));
    }

    #[test]
    fn the_ttft_may_rise_by_a_tenth_at_most() {
        let mut agreements = all_met();
        entry(&mut agreements, 8, Scrape::On).ttfb.p50_ms = 10.9;
        let [.., ttft] = judged(agreements.clone());
        assert_eq!(ttft.met, Some(true), "{ttft:?}");
        entry(&mut agreements, 8, Scrape::On).ttfb.p50_ms = 11.1;
        let [.., ttft] = judged(agreements);
        assert_eq!(ttft.met, Some(false), "{ttft:?}");
        assert!(ttft.measured.contains("8 users: 11.10 vs 10.00 ms off"));
    }

    #[test]
    fn a_run_without_pairs_misses_what_it_was_to_keep() {
        let mut agreements = all_met();
        entry(&mut agreements, 8, Scrape::On).pairs = 0;
        let [_, hit_rate, ttft] = judged(agreements);
        assert_eq!((hit_rate.met, ttft.met), (Some(false), Some(false)));
    }

    #[test]
    fn the_table_shows_each_setting_and_the_json_names_it() {
        let results = results(all_met());
        let table = render(&results, Style::Markdown);
        assert!(
            table.contains("| system-prompts | 64 | on | 97.0% | 1000 | 0.950 | 10.00 | 30.00 | affinity 100% | 0 |"),
            "{table}"
        );
        let json = serde_json::to_value(&results.agreement[1]).unwrap();
        assert_eq!(json["scrape"], "on");
        let mut older = serde_json::to_value(&results.agreement[0]).unwrap();
        older.as_object_mut().unwrap().remove("scrape");
        let older: ReplicaAgreement = serde_json::from_value(older).unwrap();
        assert_eq!(older.scrape, Scrape::Off);
    }
}

//! `pinroute-lab bench --workload prefix`: how well each gateway places requests that share
//! long prompt beginnings, on the same sim workers with a prefix cache ([`fleet`]), for the
//! traffic of [`traffic`]: prefix-cache hit rate, time to first token and throughput, side
//! by side with round robin, sessions, vllm-router's `cache_aware` and an oracle; and how
//! often two pinroute replicas agree, on their own in-flight counts and on the engines' load
//! ([`report`] has the targets).

pub mod fleet;
pub mod report;
pub mod traffic;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::e2e::progress_bar;
use super::procfs;
use super::vllm_router::{Policy, VllmRouter, router_binary};
use crate::load::{LoadReport, LoadSpec, Stop, run_load};
use fleet::{Fleet, FleetSpec, Prefilled};
use pinroute_harness::envoy::{
    BootstrapOptions, DEFAULT_ROUTE_TIMEOUT, Envoy, envoy_binary, render_bootstrap, repo_root,
};
use report::{PrefixResults, PrefixRun, ReplicaAgreement, check_targets};
use traffic::{Agreed, PrefixTraffic, Sharing, Target, Traffic};

/// A way of choosing the workers, compared in the prefix benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Chooser {
    /// vllm-router `--policy round_robin`.
    RoundRobin,
    /// pinroute with prefix affinity off: load alone, as before it.
    PinrouteLoad,
    /// pinroute, each user's (or conversation's) session id in `x-dynamo-session-id`.
    PinrouteSession,
    /// pinroute, prefix affinity, every request taking both hops.
    PinroutePrefix,
    /// pinroute, prefix affinity and conditional disaggregation.
    PinrouteLocal,
    /// vllm-router `--policy cache_aware` (its default).
    VllmRouter,
    /// Both workers pinned: the prefill worker holding the longest prefix, the decode
    /// worker with the fewest requests.
    Oracle,
}

impl Chooser {
    pub const ALL: [Chooser; 7] = [
        Chooser::RoundRobin,
        Chooser::PinrouteLoad,
        Chooser::PinrouteSession,
        Chooser::PinroutePrefix,
        Chooser::PinrouteLocal,
        Chooser::VllmRouter,
        Chooser::Oracle,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Chooser::RoundRobin => "round-robin",
            Chooser::PinrouteLoad => "pinroute-load",
            Chooser::PinrouteSession => "pinroute-session",
            Chooser::PinroutePrefix => "pinroute-prefix",
            Chooser::PinrouteLocal => "pinroute-prefix-local",
            Chooser::VllmRouter => "vllm-router",
            Chooser::Oracle => "oracle",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Chooser::RoundRobin => "vllm-router 0.1.17 --policy round_robin",
            Chooser::PinrouteLoad => {
                "pinroute, prefix affinity off (prefix_affinity_bytes: 0): least loaded of two"
            }
            Chooser::PinrouteSession => {
                "pinroute, x-dynamo-session-id per user (system prompts) or conversation"
            }
            Chooser::PinroutePrefix => "pinroute, prefix affinity, conditional disaggregation off",
            Chooser::PinrouteLocal => "pinroute, prefix affinity and conditional disaggregation",
            Chooser::VllmRouter => "vllm-router 0.1.17 --policy cache_aware (its default)",
            Chooser::Oracle => {
                "pinned by an oracle that sees every cache: the longest cached prefix"
            }
        }
    }

    /// The pinroute gateway it goes through, if any.
    fn pinroute(self) -> Option<Variant> {
        match self {
            Chooser::PinrouteLoad => Some(Variant::Load),
            Chooser::PinrouteSession | Chooser::PinroutePrefix | Chooser::Oracle => {
                Some(Variant::Prefix)
            }
            Chooser::PinrouteLocal => Some(Variant::Local),
            Chooser::RoundRobin | Chooser::VllmRouter => None,
        }
    }
}

impl std::fmt::Display for Chooser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a pinroute gateway reads the engines' load from their metrics (`engine_load`,
/// `docs/semantics.md` §5) or counts only its own requests in flight.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Scrape {
    #[default]
    Off,
    On,
}

impl Scrape {
    pub const BOTH: [Scrape; 2] = [Scrape::Off, Scrape::On];

    pub fn as_str(self) -> &'static str {
        match self {
            Scrape::Off => "off",
            Scrape::On => "on",
        }
    }

    /// `settings` without `engine_load`, or with it (the given one, else every default).
    fn apply(self, settings: &mut Value) {
        let Some(settings) = settings.as_object_mut() else {
            return;
        };
        match self {
            Scrape::Off => {
                settings.remove("engine_load");
            }
            Scrape::On => {
                settings.entry("engine_load").or_insert_with(|| json!({}));
            }
        }
    }
}

impl std::fmt::Display for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The pinroute configurations the choosers need: one Envoy each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Load,
    Prefix,
    Local,
}

/// Everything `bench --workload prefix` can be asked.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixOptions {
    pub traffics: Vec<Traffic>,
    pub concurrencies: Vec<usize>,
    pub choosers: Vec<Chooser>,
    pub warmup: Duration,
    pub duration: Duration,
    pub max_tokens: u32,
    /// The fleet of one model; each entry of `models` runs the whole comparison on a fleet
    /// of that many models, each with workers of its own and `concurrencies` users.
    pub fleet: FleetSpec,
    pub models: Vec<u64>,
    /// The conditional-disaggregation settings of `pinroute-prefix-local`.
    pub local_settings: Value,
    /// Filter settings given to every pinroute gateway (before each one's own).
    pub pinroute_settings: Value,
    /// Measured length of each replica-agreement run: one per traffic, user count of
    /// `agreement_concurrencies` and [`Scrape`], after `warmup`.
    pub agreement: Duration,
    pub agreement_concurrencies: Vec<usize>,
    pub agreement_sharing: Sharing,
    /// The first run's prompts (each run adds one): the same salt, the same prompts, so two
    /// builds can be compared on the same traffic. `None`: the time.
    pub salt: Option<u64>,
    /// Runs with different prompts pooled in each agreement row: which workers a run's
    /// prompts hash to weighs more than most changes measured.
    pub agreement_salts: u64,
    pub request_timeout: Duration,
    pub out_dir: PathBuf,
}

/// Runs it, writes `prefix.json`, `prefix.md` and the plots, and returns the results.
pub async fn run_prefix_bench(options: &PrefixOptions) -> Result<PrefixResults> {
    check_models(options)?;
    let load_before = procfs::load_average()?;
    let root = repo_root();
    let work_dir = root.join(".cache/bench/prefix");
    std::fs::create_dir_all(&work_dir)
        .with_context(|| format!("creating {}", work_dir.display()))?;
    let mut runs = Vec::new();
    let mut agreement = Vec::new();
    let mut salt = options.salt.unwrap_or_else(unix_seconds);
    let first_salt = salt;
    for (index, models) in options.models.iter().enumerate() {
        let spec = FleetSpec {
            models: *models,
            ..options.fleet
        };
        let fleet = Arc::new(Fleet::start(&spec).await?);
        let gateways = Gateways::start(options, &fleet, &root, &work_dir).await?;
        runs.extend(run_matrix(options, &fleet, &gateways, &mut salt).await?);
        if index == 0 {
            agreement =
                replica_agreement(options, &gateways, &fleet, &root, &work_dir, &mut salt).await?;
        }
    }
    let mut results = PrefixResults {
        meta: report::Meta {
            unix_time: unix_seconds(),
            cpus: procfs::cpus(),
            cpu_model: procfs::cpu_model(),
            load_average_before: load_before,
            traffics: options
                .traffics
                .iter()
                .map(|t| (t.as_str().to_string(), t.describe()))
                .collect(),
            choosers: options.choosers.clone(),
            concurrencies: options.concurrencies.clone(),
            warmup_s: options.warmup.as_secs_f64(),
            duration_s: options.duration.as_secs_f64(),
            max_tokens: options.max_tokens,
            fleet: options.fleet,
            models: options.models.clone(),
            local_settings: options.local_settings.clone(),
            pinroute_settings: options.pinroute_settings.clone(),
            vllm_router: super::vllm_router::VERSION.to_string(),
            agreement_s: options.agreement.as_secs_f64(),
            agreement_concurrencies: options.agreement_concurrencies.clone(),
            agreement_sharing: options.agreement_sharing,
            salt: first_salt,
            agreement_salts: options.agreement_salts,
        },
        runs,
        agreement,
        targets: Vec::new(),
    };
    results.targets = check_targets(&results);
    report::write_outputs(&results, &options.out_dir)?;
    Ok(results)
}

/// Only pinroute routes by model here: vllm-router's P/D mode and the oracle take every
/// worker for one model's.
fn check_models(options: &PrefixOptions) -> Result<()> {
    let several = options.models.iter().any(|m| *m > 1);
    let by_model = |c: &&Chooser| c.pinroute().is_some() && **c != Chooser::Oracle;
    if let Some(chooser) = options.choosers.iter().find(|c| several && !by_model(c)) {
        anyhow::bail!("--models above 1: {chooser} does not route by model; choose pinroute ones");
    }
    if let Some(models) = options
        .models
        .iter()
        .find(|m| **m == 0 || **m > traffic::MAX_MODELS)
    {
        anyhow::bail!("--models {models}: from 1 to {}", traffic::MAX_MODELS);
    }
    Ok(())
}

/// Every traffic, concurrency and chooser on one fleet.
async fn run_matrix(
    options: &PrefixOptions,
    fleet: &Arc<Fleet>,
    gateways: &Gateways,
    salt: &mut u64,
) -> Result<Vec<PrefixRun>> {
    let models = fleet.models();
    let mut runs = Vec::new();
    let total = options.traffics.len() * options.concurrencies.len() * options.choosers.len();
    let progress = progress_bar(total as u64);
    for traffic in &options.traffics {
        for concurrency in &options.concurrencies {
            for chooser in &options.choosers {
                progress.set_message(format!(
                    "{traffic} c={concurrency} {chooser} models={models}"
                ));
                *salt += 1;
                let target = gateways.target(*chooser, fleet)?;
                let workload =
                    PrefixTraffic::new(*traffic, target, *salt, options.max_tokens, models);
                let envoy = chooser.pinroute().and_then(|v| gateways.envoy(v));
                let users = concurrency * usize::try_from(models).unwrap_or(1);
                let duration = options.duration;
                let run = measure(fleet, Arc::new(workload), options, users, duration, envoy);
                let run = run.await?;
                let run = PrefixRun::new(*traffic, *chooser, *concurrency, models, run);
                progress.suspend(|| eprintln!("{}", run.one_line()));
                runs.push(run);
                progress.inc(1);
            }
        }
    }
    progress.finish_and_clear();
    Ok(runs)
}

/// The gateways of the run, each started once.
struct Gateways {
    envoys: Vec<(Variant, Envoy)>,
    /// The filter, when a pinroute gateway is among them.
    wasm: Option<PathBuf>,
    round_robin: Option<VllmRouter>,
    cache_aware: Option<VllmRouter>,
}

impl Gateways {
    async fn start(
        options: &PrefixOptions,
        fleet: &Fleet,
        root: &Path,
        work_dir: &Path,
    ) -> Result<Gateways> {
        let choosers = &options.choosers;
        let mut variants: Vec<Variant> = choosers.iter().filter_map(|c| c.pinroute()).collect();
        variants.dedup();
        let mut envoys = Vec::new();
        let mut wasm = None;
        if !variants.is_empty() {
            let filter = pinroute_harness::wasm::build_filter()?;
            let binary = envoy_binary(root)?;
            for variant in [Variant::Load, Variant::Prefix, Variant::Local] {
                if !variants.contains(&variant) {
                    continue;
                }
                let yaml = bootstrap(fleet, &gateway_settings(options, variant), &filter)?;
                let dir = work_dir.join(format!("envoy-{variant:?}").to_lowercase());
                std::fs::create_dir_all(&dir)?;
                envoys.push((variant, Envoy::start(&binary, &yaml, &dir).await?));
            }
            wasm = Some(filter);
        }
        let wants = |chooser| choosers.contains(&chooser);
        let router = |policy| async move {
            let binary = router_binary(root)?;
            let (prefill, decode) = (fleet.prefill_addresses(), fleet.decode_addresses());
            VllmRouter::start(&binary, &prefill, &decode, policy, work_dir, None).await
        };
        let round_robin = match wants(Chooser::RoundRobin) {
            true => Some(router(Policy::RoundRobin).await?),
            false => None,
        };
        let cache_aware = match wants(Chooser::VllmRouter) {
            true => Some(router(Policy::CacheAware).await?),
            false => None,
        };
        Ok(Gateways {
            envoys,
            wasm,
            round_robin,
            cache_aware,
        })
    }

    fn envoy(&self, variant: Variant) -> Option<&Envoy> {
        self.envoys
            .iter()
            .find(|(v, _)| *v == variant)
            .map(|(_, envoy)| envoy)
    }

    fn target(&self, chooser: Chooser, fleet: &Arc<Fleet>) -> Result<Target> {
        let missing = || anyhow::anyhow!("the {chooser} gateway is not running");
        let unpinned = |gateway, session| Target::Unpinned { gateway, session };
        Ok(match chooser {
            Chooser::RoundRobin => unpinned(
                self.round_robin.as_ref().ok_or_else(missing)?.address(),
                false,
            ),
            Chooser::VllmRouter => unpinned(
                self.cache_aware.as_ref().ok_or_else(missing)?.address(),
                false,
            ),
            Chooser::Oracle => Target::Oracle {
                gateway: self.envoy(Variant::Prefix).ok_or_else(missing)?.listen(),
                fleet: fleet.clone(),
            },
            other => {
                let variant = other.pinroute().ok_or_else(missing)?;
                let envoy = self.envoy(variant).ok_or_else(missing)?;
                unpinned(envoy.listen(), other == Chooser::PinrouteSession)
            }
        })
    }
}

/// The filter settings of a variant's gateway: every pinroute gateway's, then its own.
fn gateway_settings(options: &PrefixOptions, variant: Variant) -> Value {
    let mut settings = options.pinroute_settings.clone();
    merge(
        &mut settings,
        &variant_settings(variant, &options.local_settings),
    );
    settings
}

fn variant_settings(variant: Variant, local: &Value) -> Value {
    match variant {
        Variant::Load => json!({"prefix_affinity_bytes": 0}),
        Variant::Prefix => json!({"local_prefill_max_bytes": 0, "local_prefill_suffix_bytes": 0}),
        Variant::Local => local.clone(),
    }
}

fn merge(into: &mut Value, from: &Value) {
    if let (Some(into), Some(from)) = (into.as_object_mut(), from.as_object()) {
        into.extend(from.clone());
    }
}

fn bootstrap(fleet: &Fleet, settings: &Value, wasm: &Path) -> Result<String> {
    let any = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    render_bootstrap(&BootstrapOptions {
        listen: any,
        admin: any,
        wasm: wasm.to_path_buf(),
        plugin_config: fleet.plugin_config(settings).to_string(),
        route_timeout: DEFAULT_ROUTE_TIMEOUT,
        edge: pinroute_harness::envoy::EdgeOptions::default(),
    })
}

/// What one run measured.
pub struct Measured {
    pub report: LoadReport,
    pub hit_rate: f64,
    /// Each model's hit rate, on its own workers.
    pub hit_rates: Vec<f64>,
    /// pinroute's counters over the measured period (`wasmcustom.pinroute.` left out), when
    /// the chooser is pinroute.
    pub counters: BTreeMap<String, u64>,
    /// The pairs compared over the measured period, when sent to two replicas.
    pub agreement: Agreed,
}

/// One closed-loop run on cold caches, with the fleet's cache counters, pinroute's own and
/// the replicas' agreement read at the edges of the measured period.
async fn measure(
    fleet: &Arc<Fleet>,
    workload: Arc<PrefixTraffic>,
    options: &PrefixOptions,
    concurrency: usize,
    duration: Duration,
    envoy: Option<&Envoy>,
) -> Result<Measured> {
    fleet.reset();
    let spec = LoadSpec {
        concurrency,
        stop: Stop::Duration(duration),
        warmup: options.warmup,
        request_timeout: options.request_timeout,
    };
    let from = Instant::now() + options.warmup;
    let until = from + duration;
    let agreement = &workload.agreement;
    let edges = async {
        tokio::time::sleep_until(from).await;
        let first = (
            fleet.prefilled(),
            counters(envoy).await?,
            agreement.so_far(),
        );
        tokio::time::sleep_until(until).await;
        let last = (
            fleet.prefilled(),
            counters(envoy).await?,
            agreement.so_far(),
        );
        Ok::<_, anyhow::Error>((first, last))
    };
    let (report, edges) = tokio::join!(run_load(workload.clone(), &spec), edges);
    let ((first, before, agreed_before), (last, after, agreed_after)) = edges?;
    let counters = after
        .into_iter()
        .map(|(name, value)| {
            let earlier = before.get(&name).copied().unwrap_or(0);
            (name, value.saturating_sub(earlier))
        })
        .collect();
    let hit_rates = last
        .iter()
        .zip(&first)
        .map(|(last, first)| last.hit_rate_since(first))
        .collect();
    Ok(Measured {
        report,
        hit_rate: Prefilled::total(&last).hit_rate_since(&Prefilled::total(&first)),
        hit_rates,
        counters,
        agreement: agreed_after.since(agreed_before),
    })
}

/// Every counter of the pinroute filter in `envoy` (none without one).
async fn counters(envoy: Option<&Envoy>) -> Result<BTreeMap<String, u64>> {
    let Some(envoy) = envoy else {
        return Ok(BTreeMap::new());
    };
    let stats = envoy.admin_get("/stats?filter=wasmcustom.pinroute").await?;
    Ok(stats
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(": ")?;
            let name = name.strip_prefix("wasmcustom.pinroute.")?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect())
}

/// Two replicas of `pinroute-prefix` with no shared state, every request sent to both: for
/// each traffic and user count, a pair on its own in-flight counts and a pair reading the
/// engines' load, one after the other.
async fn replica_agreement(
    options: &PrefixOptions,
    gateways: &Gateways,
    fleet: &Arc<Fleet>,
    root: &Path,
    work_dir: &Path,
    salt: &mut u64,
) -> Result<Vec<ReplicaAgreement>> {
    let (Some(wasm), Some(_)) = (&gateways.wasm, gateways.envoy(Variant::Prefix)) else {
        return Ok(Vec::new());
    };
    if options.agreement.is_zero() {
        return Ok(Vec::new());
    }
    let mut pairs = Vec::new();
    for scrape in Scrape::BOTH {
        pairs.push(ReplicaPair::start(options, fleet, scrape, wasm, root, work_dir).await?);
    }
    let users = &options.agreement_concurrencies;
    let salts = options.agreement_salts.max(1);
    let run_count = options.traffics.len() * users.len() * pairs.len() * salts as usize;
    let progress = progress_bar(run_count as u64);
    let mut agreements = Vec::new();
    for traffic in &options.traffics {
        for users in users {
            let mut by_pair: Vec<Vec<ReplicaAgreement>> =
                pairs.iter().map(|_| Vec::new()).collect();
            for _ in 0..salts {
                // The same prompts for both pairs: which workers a run's system prompts hash
                // to weighs more than the scrape does.
                *salt += 1;
                for (pair, runs) in pairs.iter().zip(&mut by_pair) {
                    let scrape = pair.scrape;
                    progress.set_message(format!("{traffic} users={users} scrape {scrape}"));
                    let agreement = pair
                        .measure(options, fleet, *traffic, *users, *salt)
                        .await?;
                    progress.suspend(|| eprintln!("{}", agreement.one_line()));
                    runs.push(agreement);
                    progress.inc(1);
                }
            }
            agreements.extend(by_pair.into_iter().filter_map(ReplicaAgreement::pooled));
        }
    }
    progress.finish_and_clear();
    Ok(agreements)
}

/// Two Envoys with the same `pinroute-prefix` configuration, reading the engines' load or not.
struct ReplicaPair {
    scrape: Scrape,
    first: Envoy,
    second: Envoy,
}

impl ReplicaPair {
    async fn start(
        options: &PrefixOptions,
        fleet: &Fleet,
        scrape: Scrape,
        wasm: &Path,
        root: &Path,
        work_dir: &Path,
    ) -> Result<ReplicaPair> {
        let mut settings = gateway_settings(options, Variant::Prefix);
        scrape.apply(&mut settings);
        let yaml = bootstrap(fleet, &settings, wasm)?;
        let binary = envoy_binary(root)?;
        let start = |replica: &str| {
            let dir = work_dir.join(format!("envoy-replica-{replica}-scrape-{scrape}"));
            let (binary, yaml) = (&binary, &yaml);
            async move {
                std::fs::create_dir_all(&dir)?;
                Envoy::start(binary, yaml, &dir).await
            }
        };
        Ok(ReplicaPair {
            scrape,
            first: start("a").await?,
            second: start("b").await?,
        })
    }

    /// One run of `traffic` by `users` through both replicas; the latency and the placements
    /// are the first replica's, the hit rate the whole fleet's.
    async fn measure(
        &self,
        options: &PrefixOptions,
        fleet: &Arc<Fleet>,
        traffic: Traffic,
        users: usize,
        salt: u64,
    ) -> Result<ReplicaAgreement> {
        let target = Target::Pair {
            first: self.first.listen(),
            second: self.second.listen(),
            sharing: options.agreement_sharing,
        };
        let workload =
            PrefixTraffic::new(traffic, target, salt, options.max_tokens, fleet.models());
        let workload = Arc::new(workload);
        let envoy = Some(&self.first);
        let measured = measure(fleet, workload, options, users, options.agreement, envoy).await?;
        Ok(ReplicaAgreement::new(traffic, users, self.scrape, measured))
    }
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

//! The filter's stats in Envoy (`/stats`, `/stats/prometheus`), summed over worker threads.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

use super::host::{Host, MetricKind};
use crate::policy::error::RouteError;
use crate::policy::resolve::{LocalPrefill, PrefillPlan, Route};
use crate::policy::select::Placement;

/// Every counter but the per-code error counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    Requests,
    PrefillOk,
    PrefillFailed,
    PrefillRefused,
    PrefillRetried,
    AggregatedFallback,
    DecodeRouted,
    DecodeFailed,
    DecodeRetried,
    PinPrefillWorker,
    PinPrefillRank,
    PinDecodeWorker,
    PinDecodeRank,
    PinSession,
    WorkerConnectFailed,
    WorkerMarkedUnhealthy,
    PanicPrefill,
    PanicDecode,
    RegistryRefreshed,
    RegistryRefreshFailed,
    EngineScraped,
    EngineScrapeFailed,
    LocalShortPrompt,
    LocalNextTurn,
    LocalByPicker,
    LocalStateful,
    Placed(Pool, Placement),
}

/// The pool a placement was made in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    Prefill,
    Decode,
}

const COUNTERS: &[(Counter, &str)] = &[
    (Counter::Requests, "pinroute.requests"),
    (Counter::PrefillOk, "pinroute.prefill.ok"),
    (Counter::PrefillFailed, "pinroute.prefill.failed"),
    (Counter::PrefillRefused, "pinroute.prefill.refused"),
    (Counter::PrefillRetried, "pinroute.prefill.retried"),
    (
        Counter::AggregatedFallback,
        "pinroute.prefill.aggregated_fallback",
    ),
    (Counter::DecodeRouted, "pinroute.decode.routed"),
    (Counter::DecodeFailed, "pinroute.decode.failed"),
    (Counter::DecodeRetried, "pinroute.decode.retried"),
    (Counter::PinPrefillWorker, "pinroute.pins.prefill_worker"),
    (Counter::PinPrefillRank, "pinroute.pins.prefill_rank"),
    (Counter::PinDecodeWorker, "pinroute.pins.decode_worker"),
    (Counter::PinDecodeRank, "pinroute.pins.decode_rank"),
    (Counter::PinSession, "pinroute.pins.session"),
    (
        Counter::WorkerConnectFailed,
        "pinroute.workers.connect_failed",
    ),
    (
        Counter::WorkerMarkedUnhealthy,
        "pinroute.workers.marked_unhealthy",
    ),
    (Counter::PanicPrefill, "pinroute.workers.panic_prefill"),
    (Counter::PanicDecode, "pinroute.workers.panic_decode"),
    (Counter::RegistryRefreshed, "pinroute.registry.refreshed"),
    (
        Counter::RegistryRefreshFailed,
        "pinroute.registry.refresh_failed",
    ),
    (Counter::EngineScraped, "pinroute.engine.scraped"),
    (Counter::EngineScrapeFailed, "pinroute.engine.scrape_failed"),
    (
        Counter::LocalShortPrompt,
        "pinroute.prefill.local_short_prompt",
    ),
    (Counter::LocalNextTurn, "pinroute.prefill.local_next_turn"),
    (Counter::LocalByPicker, "pinroute.prefill.local_by_picker"),
    (Counter::LocalStateful, "pinroute.prefill.local_stateful"),
    placed(
        Pool::Prefill,
        Placement::Load,
        "pinroute.placement.prefill.load",
    ),
    placed(
        Pool::Prefill,
        Placement::Session,
        "pinroute.placement.prefill.session",
    ),
    placed(
        Pool::Prefill,
        Placement::Remembered,
        "pinroute.placement.prefill.remembered",
    ),
    placed(
        Pool::Prefill,
        Placement::Affinity,
        "pinroute.placement.prefill.affinity",
    ),
    placed(
        Pool::Prefill,
        Placement::Spilled,
        "pinroute.placement.prefill.spilled",
    ),
    placed(
        Pool::Prefill,
        Placement::Picker,
        "pinroute.placement.prefill.picker",
    ),
    placed(
        Pool::Decode,
        Placement::Picker,
        "pinroute.placement.decode.picker",
    ),
    placed(
        Pool::Decode,
        Placement::Load,
        "pinroute.placement.decode.load",
    ),
    placed(
        Pool::Decode,
        Placement::Session,
        "pinroute.placement.decode.session",
    ),
    placed(
        Pool::Decode,
        Placement::Remembered,
        "pinroute.placement.decode.remembered",
    ),
    placed(
        Pool::Decode,
        Placement::Affinity,
        "pinroute.placement.decode.affinity",
    ),
    placed(
        Pool::Decode,
        Placement::Spilled,
        "pinroute.placement.decode.spilled",
    ),
];

const fn placed(pool: Pool, placement: Placement, name: &'static str) -> (Counter, &'static str) {
    (Counter::Placed(pool, placement), name)
}

const PREFILL_LATENCY: &str = "pinroute.prefill.latency_ms";
const VM_MEMORY: &str = "pinroute.vm.memory_bytes";

thread_local! {
    /// The linear memory this VM last added to the memory gauge.
    static REPORTED_MEMORY: Cell<i64> = const { Cell::new(0) };
}

/// Metric ids of one VM; a metric that could not be defined is skipped, never fatal.
#[derive(Debug, Default)]
pub struct Metrics {
    counters: Vec<Option<u32>>,
    /// `pinroute.errors.<code>` for each of [`RouteError::CODES`], with its id.
    errors: Vec<(String, Option<u32>)>,
    /// Counters of each model (`pinroute.model.<what>.<model>`), by model then by what they
    /// count, defined when first counted: only for models the registry names, so a client's
    /// `model` never makes a new one. Looked up without a copy of either name.
    per_model: RefCell<HashMap<String, HashMap<String, Option<u32>>>>,
    prefill_latency: Option<u32>,
    vm_memory: Option<u32>,
}

/// Every metric the filter may define, by kind and name, with the per-model counters of
/// `models` (the registry's): what a host that defines metrics only while it configures the
/// filter defines then. [`Metrics::define`] defines the others at once, the per-model ones
/// when first counted.
#[cfg_attr(
    not(all(feature = "dynamic-module", not(target_arch = "wasm32"))),
    allow(dead_code)
)]
pub fn fixed_metrics<M: AsRef<str>>(models: &[M]) -> Vec<(MetricKind, String)> {
    let counters = COUNTERS.iter().map(|(_, name)| name.to_string());
    let errors = RouteError::CODES.iter().map(|code| error_metric(code));
    let counted_per_model: Vec<String> = COUNTERS
        .iter()
        .filter(|(counter, _)| matches!(counter, Counter::Requests | Counter::Placed(..)))
        .map(|(_, name)| name.to_string())
        .chain(RouteError::CODES.iter().map(|code| error_metric(code)))
        .collect();
    let per_model = models.iter().flat_map(|model| {
        counted_per_model
            .iter()
            .map(move |name| model_metric(name, model.as_ref()))
    });
    counters
        .chain(errors)
        .chain(per_model)
        .map(|name| (MetricKind::Counter, name))
        .chain([
            (MetricKind::Histogram, PREFILL_LATENCY.to_owned()),
            (MetricKind::Gauge, VM_MEMORY.to_owned()),
        ])
        .collect()
}

/// `name` (`pinroute.<what>`) counted for `model`: `pinroute.model.<what>.<model>`.
fn model_metric(name: &str, model: &str) -> String {
    let what = name.trim_start_matches("pinroute.");
    format!("pinroute.model.{what}.{model}")
}

fn error_metric(code: &str) -> String {
    format!("pinroute.errors.{code}")
}

impl Metrics {
    pub fn define(host: &impl Host) -> Self {
        let define = |kind, name: &str| host.define_metric(kind, name).ok();
        let counters = COUNTERS
            .iter()
            .map(|(_, name)| define(MetricKind::Counter, name))
            .collect();
        let errors = RouteError::CODES
            .iter()
            .map(|code| {
                let name = error_metric(code);
                let id = define(MetricKind::Counter, &name);
                (name, id)
            })
            .collect();
        Self {
            counters,
            errors,
            per_model: RefCell::default(),
            prefill_latency: define(MetricKind::Histogram, PREFILL_LATENCY),
            vm_memory: define(MetricKind::Gauge, VM_MEMORY),
        }
    }

    pub fn count(&self, host: &impl Host, counter: Counter) {
        let id = COUNTERS
            .iter()
            .position(|(c, _)| *c == counter)
            .and_then(|i| self.counters.get(i));
        increment(host, id.copied().flatten());
    }

    /// Hops whose pool's panic mode decided them: the prefill hop, the token-generating one.
    pub fn count_panics(&self, host: &impl Host, prefill: bool, token: bool) {
        for (panic, counter) in [
            (prefill, Counter::PanicPrefill),
            (token, Counter::PanicDecode),
        ] {
            if panic {
                self.count(host, counter);
            }
        }
    }

    /// `counter` again for one model the registry names: `pinroute.requests` is counted as
    /// `pinroute.model.requests.<model>`.
    pub fn count_for_model(&self, host: &impl Host, model: &str, counter: Counter) {
        if let Some((_, name)) = COUNTERS.iter().find(|(c, _)| *c == counter) {
            self.count_model_metric(host, name, model);
        }
    }

    /// Counts `name` (a name of [`COUNTERS`] or an error's) for `model`.
    fn count_model_metric(&self, host: &impl Host, name: &str, model: &str) {
        let mut per_model = self.per_model.borrow_mut();
        if !per_model.contains_key(model) {
            per_model.insert(model.to_owned(), HashMap::new());
        }
        let Some(ids) = per_model.get_mut(model) else {
            return;
        };
        if !ids.contains_key(name) {
            let id = host
                .define_metric(MetricKind::Counter, &model_metric(name, model))
                .ok();
            ids.insert(name.to_owned(), id);
        }
        increment(host, ids.get(name).copied().flatten());
    }

    /// How an unpinned hop's worker was chosen, and a prefill hop skipped by choice
    /// (`docs/semantics.md` §4, §5); the placements again for `model`, if the registry names it.
    pub fn count_route(&self, host: &impl Host, route: &Route, model: Option<&str>) {
        let placements = [
            (Pool::Prefill, route.prefill_placement),
            (Pool::Decode, route.decode.placement),
        ];
        for (pool, placement) in placements {
            if let Some(placement) = placement {
                self.count(host, Counter::Placed(pool, placement));
                if let Some(model) = model {
                    self.count_for_model(host, model, Counter::Placed(pool, placement));
                }
            }
        }
        match route.prefill {
            PrefillPlan::Local(LocalPrefill::ShortPrompt) => {
                self.count(host, Counter::LocalShortPrompt)
            }
            PrefillPlan::Local(LocalPrefill::NextTurn) => self.count(host, Counter::LocalNextTurn),
            PrefillPlan::Local(LocalPrefill::Picker) => self.count(host, Counter::LocalByPicker),
            PrefillPlan::Local(LocalPrefill::Stateful) => self.count(host, Counter::LocalStateful),
            _ => {}
        }
    }

    /// An error answered, counted by its code, and again for `model` if the registry names it.
    pub fn count_error(&self, host: &impl Host, error: &RouteError, model: Option<&str>) {
        let at = RouteError::CODES.iter().position(|c| *c == error.code());
        let Some((name, id)) = at.and_then(|i| self.errors.get(i)) else {
            return;
        };
        increment(host, *id);
        if let Some(model) = model {
            self.count_model_metric(host, name, model);
        }
    }

    pub fn record_prefill_latency(&self, host: &impl Host, latency: Duration) {
        if let Some(id) = self.prefill_latency {
            let millis = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
            let _ = host.record_metric(id, millis);
        }
    }

    /// Adds the change of this VM's linear memory since its last report to the gauge, so
    /// that the gauge is the sum over the VMs of all worker threads. No host call while the
    /// memory stays the same.
    pub fn report_memory(&self, host: &impl Host) {
        let (Some(id), Some(now)) = (self.vm_memory, linear_memory_bytes()) else {
            return;
        };
        REPORTED_MEMORY.with(|reported| {
            let delta = now - reported.get();
            if delta != 0 && host.increment_metric(id, delta).is_ok() {
                reported.set(now);
            }
        });
    }
}

#[cfg(target_arch = "wasm32")]
fn linear_memory_bytes() -> Option<i64> {
    let pages = core::arch::wasm32::memory_size(0);
    i64::try_from(pages).ok().map(|pages| pages * 65536)
}

/// Natively there is no VM memory to report.
#[cfg(not(target_arch = "wasm32"))]
fn linear_memory_bytes() -> Option<i64> {
    None
}

fn increment(host: &impl Host, id: Option<u32>) {
    if let Some(id) = id {
        let _ = host.increment_metric(id, 1);
    }
}

//! One per Envoy worker thread: the configuration, the round-robin counter, the live
//! registry's state and this VM's in-flight slots; it starts each request's [`Stream`].

use std::cell::Cell;
use std::rc::Rc;

use super::engine_scrape::EngineScraper;
use super::env::Env;
use super::host::Host;
use super::live_registry;
use super::metrics::{Counter, Metrics};
use super::shared::{self, Slots};
use super::span_export::SpanQueue;
use super::stream::Stream;
use crate::policy::config::Config;
use crate::policy::engine_load::EngineLoadSource;
use crate::policy::registry::Registry;

/// The root's timer: the live registry's adoption, the export of the filter's own spans, and
/// this VM's in-flight count published
/// (well within [`crate::policy::inflight::STALE_NANOS`], after which a silent VM's count is
/// forgotten).
const TICK_PERIOD: std::time::Duration = live_registry::ADOPT_PERIOD;

pub struct Root<H: Host> {
    host: H,
    config: Option<Rc<Config>>,
    /// The thread's running request count: the round-robin rotation and generated request ids.
    rotation: Rc<Cell<u64>>,
    metrics: Rc<Metrics>,
    /// Version (shared-data CAS) of the live registry in `config`.
    registry_version: Option<u32>,
    /// The registry fetch this thread has in flight.
    fetch: Option<u32>,
    /// This VM's requests in flight (`docs/semantics.md` §1).
    slots: Rc<Slots>,
    /// Spans this VM's streams made, exported on the tick.
    spans: Rc<SpanQueue>,
    /// The engines' load, as this thread last read or scraped it.
    engine: EngineScraper,
}

impl<H: Host + Clone> Root<H> {
    pub fn new(host: H) -> Self {
        Self {
            host,
            config: None,
            rotation: Rc::default(),
            metrics: Rc::default(),
            registry_version: None,
            fetch: None,
            slots: Rc::default(),
            spans: Rc::default(),
            engine: EngineScraper::default(),
        }
    }

    /// Reads the plugin configuration; `false` (Envoy refuses the filter) when it is invalid.
    pub fn configure(&mut self) -> bool {
        let raw = self.host.plugin_configuration().unwrap_or_default();
        let config = match Config::from_json(&raw) {
            Ok(config) => config,
            Err(error) => {
                log::error!("pinroute: configuration refused: {error}");
                return false;
            }
        };
        log::info!(
            "pinroute: configured with {} workers ({:?} deployment){}",
            config.registry.workers().len(),
            config.registry.deployment(),
            if config.settings.registry.is_some() {
                ", live registry"
            } else {
                ""
            }
        );
        let settings = &config.settings;
        let ticks = settings.registry.is_some()
            || settings.in_flight_limit().is_some()
            || !settings.trace_export_cluster.is_empty()
            || settings.engine_load.is_some();
        let period = settings
            .engine_load
            .as_ref()
            .map_or(TICK_PERIOD, |e| e.look_period().min(TICK_PERIOD));
        if ticks && let Err(error) = self.host.set_tick_period(period) {
            log::error!("pinroute: cannot start the timer: {error}");
            return false;
        }
        let live = config.settings.registry.is_some();
        self.config = Some(Rc::new(config));
        self.registry_version = None;
        self.metrics = Rc::new(Metrics::define(&self.host));
        shared::initialize(&self.host);
        self.slots.join(&self.host);
        if live {
            // A root made after another one fetched serves that registry from its first request.
            self.adopt_shared();
        }
        if self
            .config
            .as_ref()
            .is_some_and(|c| c.settings.engine_load.is_some())
        {
            // And the engines' figures another thread scraped.
            self.engine.adopt_shared(&self.host);
        }
        true
    }

    pub fn tick(&mut self) {
        self.slots.publish(&self.host);
        if let Some(config) = &self.config {
            let cluster = &config.settings.trace_export_cluster;
            if !cluster.is_empty() {
                self.spans.export(&self.host, cluster);
            }
            if let Some(source) = &config.settings.engine_load {
                self.engine.tick(&self.host, config, source);
                let look = source.look_period().min(TICK_PERIOD);
                let next = EngineLoadSource::until_next_look(self.host.now_nanos(), look);
                if let Err(error) = self.host.set_tick_period(next) {
                    log::debug!("pinroute: the timer not aligned: {error}");
                }
            }
        }
        let Some(source) = self
            .config
            .as_ref()
            .and_then(|c| c.settings.registry.clone())
        else {
            return;
        };
        self.adopt_shared();
        let fetches = self.host.polls_sources() && self.fetch.is_none();
        if fetches && live_registry::claim_fetch(&self.host, &source) {
            self.fetch = live_registry::dispatch_fetch(&self.host, &source);
        }
    }

    /// Takes the live registry another root fetched, if newer than this one's.
    fn adopt_shared(&mut self) {
        if let Some((registry, version)) =
            live_registry::newer_shared(&self.host, self.registry_version)
        {
            self.registry_version = Some(version);
            self.adopt(registry);
        }
    }

    /// The answer of a call the root made: the live registry's fetch, or a worker's scrape.
    pub fn on_call_answer(&mut self, token: u32, body_size: usize) {
        if let Some(config) = &self.config
            && self
                .engine
                .on_answer(&self.host, token, body_size, config, &self.metrics)
        {
            return;
        }
        if self.fetch != Some(token) {
            return;
        }
        self.fetch = None;
        match live_registry::take_fetched(&self.host, body_size) {
            Ok(registry) => {
                self.metrics.count(&self.host, Counter::RegistryRefreshed);
                self.registry_version = None;
                self.adopt(registry);
            }
            Err(why) => {
                self.metrics
                    .count(&self.host, Counter::RegistryRefreshFailed);
                log::warn!("pinroute: registry refresh failed, keeping the last good one: {why}");
            }
        }
    }

    /// A new request's state machine; none before a configuration was taken.
    pub fn new_stream(&self) -> Option<Stream<H>> {
        self.metrics.report_memory(&self.host);
        let config = self.config.clone()?;
        let env = Env::new(
            self.host.clone(),
            config,
            self.rotation.clone(),
            self.metrics.clone(),
            self.slots.clone(),
            self.spans.clone(),
            self.engine.table(),
        );
        Some(Stream::new(env))
    }

    fn adopt(&mut self, registry: Registry) {
        if let Some(config) = &self.config {
            log::info!(
                "pinroute: registry now has {} workers",
                registry.workers().len()
            );
            self.config = Some(Rc::new(config.with_registry(registry)));
        }
    }
}

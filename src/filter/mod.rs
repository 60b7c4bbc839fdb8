//! The proxy-wasm host layer: maps Envoy's callbacks onto [`crate::policy`].
//!
//! | module | what |
//! |---|---|
//! | [`host`] | the one door to the host: every proxy-wasm call, the request path's behind [`host::Host`] |
//! | [`stream`] | one request's state machine: headers, body, prefill, routed, answered |
//! | [`intake`] | what the client sent: admitted paths, methods and sizes, request id, forwarded headers, whole body |
//! | [`prefill`] | the prefill call: dispatch, retry, judging its answer |
//! | [`response`] | the routed hop and its answer: typed errors, withheld decode refusals |
//! | [`decode_retry`] | the filter's own retry of a refused decode hop Envoy cannot retry |
//! | [`env`] | what every phase works with: host, configuration, counters, request id |
//! | [`shared`] | state all Envoy threads see: passive health, requests in flight, the turn memory |
//! | [`live_registry`] | the registry fetched on a period and shared by all threads |
//! | [`metrics`] | the filter's stats |
//!
//! Host calls are made only in the phases where Envoy allows them; the SDK panics on an
//! unexpected status, and a panic kills the VM of that Envoy worker.

mod decode_retry;
mod env;
mod host;
mod intake;
mod live_registry;
mod metrics;
mod prefill;
mod response;
mod shared;
mod stream;
#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;

use crate::policy::config::Config;
use crate::policy::registry::Registry;
use env::Env;
use host::Envoy;
use metrics::{Counter, Metrics};
use stream::Stream;

/// The root's timer: the live registry's adoption, and this VM's in-flight count published
/// (well within [`crate::policy::inflight::STALE_NANOS`], after which a silent VM's count is
/// forgotten).
const TICK_PERIOD: std::time::Duration = live_registry::ADOPT_PERIOD;

proxy_wasm::main! {{
    host::start(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

/// One per Envoy worker thread: the configuration, the round-robin counter, and the live
/// registry's state.
#[derive(Default)]
struct Root {
    config: Option<Rc<Config>>,
    turns: Rc<Cell<u64>>,
    metrics: Rc<Metrics>,
    /// Version (shared-data CAS) of the live registry in `config`.
    registry_version: Option<u32>,
    /// The registry fetch this thread has in flight.
    fetch: Option<u32>,
    /// This VM's requests in flight (`docs/semantics.md` §1).
    slots: Rc<shared::Slots>,
}

impl Root {
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

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        if self.fetch != Some(token) {
            return;
        }
        self.fetch = None;
        match live_registry::take_fetched(&Envoy, body_size) {
            Ok(registry) => {
                self.metrics.count(&Envoy, Counter::RegistryRefreshed);
                self.registry_version = None;
                self.adopt(registry);
            }
            Err(why) => {
                self.metrics.count(&Envoy, Counter::RegistryRefreshFailed);
                log::warn!("pinroute: registry refresh failed, keeping the last good one: {why}");
            }
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let raw = host::plugin_configuration().unwrap_or_default();
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
        let ticks =
            config.settings.registry.is_some() || config.settings.in_flight_limit().is_some();
        if ticks && let Err(status) = host::set_tick_period(TICK_PERIOD) {
            log::error!("pinroute: cannot start the timer: {status:?}");
            return false;
        }
        self.config = Some(Rc::new(config));
        self.registry_version = None;
        self.metrics = Rc::new(Metrics::define(&Envoy));
        shared::initialize(&Envoy);
        self.slots.join(&Envoy);
        true
    }

    fn on_tick(&mut self) {
        self.slots.publish(&Envoy);
        let Some(source) = self
            .config
            .as_ref()
            .and_then(|c| c.settings.registry.clone())
        else {
            return;
        };
        if let Some((registry, version)) =
            live_registry::newer_shared(&Envoy, self.registry_version)
        {
            self.registry_version = Some(version);
            self.adopt(registry);
        }
        if self.fetch.is_none() && live_registry::claim_fetch(&Envoy, &source) {
            self.fetch = live_registry::dispatch_fetch(&Envoy, &source);
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        self.metrics.report_memory(&Envoy);
        let config = self.config.clone()?;
        let env = Env::new(
            Envoy,
            config,
            self.turns.clone(),
            self.metrics.clone(),
            self.slots.clone(),
        );
        Some(Box::new(Stream::new(env)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

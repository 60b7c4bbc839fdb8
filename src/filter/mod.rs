//! The proxy-wasm host layer: maps Envoy's callbacks onto [`crate::policy`].
//!
//! Host calls are made only in the phases where Envoy allows them; the SDK panics on an
//! unexpected status, and a panic kills the VM of that Envoy worker.

mod envoy;
mod metrics;
mod shared;
mod stream;

use std::cell::Cell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};

use crate::policy::registry::Config;
use metrics::Metrics;
use stream::Stream;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

/// One per Envoy worker thread: the configuration and the round-robin counter.
#[derive(Default)]
struct Root {
    config: Option<Rc<Config>>,
    turns: Rc<Cell<u64>>,
    metrics: Rc<Metrics>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let raw = envoy::plugin_configuration().unwrap_or_default();
        match Config::from_json(&raw) {
            Ok(config) => {
                log::info!(
                    "pinroute: configured with {} workers ({:?} deployment)",
                    config.registry.workers().len(),
                    config.registry.deployment()
                );
                self.config = Some(Rc::new(config));
                self.metrics = Rc::new(Metrics::define());
                shared::initialize();
                true
            }
            Err(error) => {
                log::error!("pinroute: configuration refused: {error}");
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let config = self.config.clone()?;
        Some(Box::new(Stream::new(config, self.turns.clone(), self.metrics.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

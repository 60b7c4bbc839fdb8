//! The prefix benchmark's workers: prefill and decode sim workers with a prefix cache and a
//! compute model, on a tokio runtime of their own (so that their work does not delay the
//! load generator's), and what only they can tell: cache hits, and the oracle's choice.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use pinroute_harness::sim::{PromptBlocks, SimConfig, SimRole, SimWorker};

/// What the fleet is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetSpec {
    pub prefill_workers: u64,
    pub decode_workers: u64,
    /// Blocks of 16 tokens each worker's prefix cache holds.
    pub cache_blocks: usize,
    pub prefill_us_per_token: u64,
    pub token_latency_us: u64,
}

/// The first prefill worker's id; decode ids start at [`FIRST_DECODE`].
pub const FIRST_PREFILL: u64 = 101;
pub const FIRST_DECODE: u64 = 201;

/// The running workers; stopped when dropped.
pub struct Fleet {
    pub prefill: Vec<SimWorker>,
    pub decode: Vec<SimWorker>,
    runtime: Option<tokio::runtime::Runtime>,
}

/// Prompt tokens prefilled over the whole fleet so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Prefilled {
    pub cached: u64,
    pub computed: u64,
}

impl Prefilled {
    /// The share of prompt tokens found in a cache, from `earlier` to `self`.
    pub fn hit_rate_since(&self, earlier: &Prefilled) -> f64 {
        let cached = self.cached.saturating_sub(earlier.cached) as f64;
        let computed = self.computed.saturating_sub(earlier.computed) as f64;
        if cached + computed > 0.0 {
            cached / (cached + computed)
        } else {
            0.0
        }
    }
}

impl Fleet {
    pub async fn start(spec: &FleetSpec) -> Result<Fleet> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("prefix-sims")
            .enable_all()
            .build()
            .context("starting the sim workers' runtime")?;
        let configs = (0..spec.prefill_workers)
            .map(|i| config(spec, FIRST_PREFILL + i, SimRole::Prefill))
            .chain(
                (0..spec.decode_workers).map(|i| config(spec, FIRST_DECODE + i, SimRole::Decode)),
            );
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut workers = Vec::new();
        for config in configs {
            let started = runtime.spawn(SimWorker::start(config, any)).await;
            workers.push(started.context("the sim worker task")??);
        }
        let decode = workers.split_off(usize::try_from(spec.prefill_workers).unwrap_or(0));
        Ok(Fleet {
            prefill: workers,
            decode,
            runtime: Some(runtime),
        })
    }

    /// The registry of the fleet, with `settings` merged in: a pinroute plugin configuration.
    pub fn plugin_config(&self, settings: &Value) -> Value {
        let entry = |w: &SimWorker| json!({"id": w.config().id, "role": w.config().role.as_str(), "address": w.addr().to_string()});
        let workers: Vec<Value> = self.prefill.iter().chain(&self.decode).map(entry).collect();
        let mut config = json!({ "workers": workers });
        if let (Some(config), Some(settings)) = (config.as_object_mut(), settings.as_object()) {
            config.extend(settings.clone());
        }
        config
    }

    pub fn prefill_addresses(&self) -> Vec<SocketAddr> {
        self.prefill.iter().map(SimWorker::addr).collect()
    }

    pub fn decode_addresses(&self) -> Vec<SocketAddr> {
        self.decode.iter().map(SimWorker::addr).collect()
    }

    /// Empties every worker's prefix cache: each run starts cold.
    pub fn clear_caches(&self) {
        self.all().for_each(SimWorker::clear_cache);
    }

    pub fn prefilled(&self) -> Prefilled {
        self.all().map(SimWorker::prompt_tokens).fold(
            Prefilled::default(),
            |sum, (cached, computed)| Prefilled {
                cached: sum.cached + cached,
                computed: sum.computed + computed,
            },
        )
    }

    /// The oracle's choice for a prompt: the prefill worker holding the longest prefix of it
    /// (ties to the fewest requests in flight, then the lowest id) and the decode worker with
    /// the fewest requests in flight.
    pub fn oracle(&self, prompt: &PromptBlocks) -> (u64, u64) {
        let prefill = self
            .prefill
            .iter()
            .max_by_key(|w| {
                let id = w.config().id;
                (
                    w.cached_blocks(prompt),
                    std::cmp::Reverse((w.in_flight(), id)),
                )
            })
            .map_or(FIRST_PREFILL, |w| w.config().id);
        let decode = self
            .decode
            .iter()
            .min_by_key(|w| (w.in_flight(), w.config().id))
            .map_or(FIRST_DECODE, |w| w.config().id);
        (prefill, decode)
    }

    fn all(&self) -> impl Iterator<Item = &SimWorker> {
        self.prefill.iter().chain(&self.decode)
    }
}

fn config(spec: &FleetSpec, id: u64, role: SimRole) -> SimConfig {
    SimConfig::new(id, role)
        .with_cache_blocks(spec.cache_blocks)
        .with_prefill_per_token(Duration::from_micros(spec.prefill_us_per_token))
        .with_token_latency(Duration::from_micros(spec.token_latency_us))
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.prefill.clear();
        self.decode.clear();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

//! The prefix benchmark's workers: prefill and decode sim workers with a prefix cache and a
//! compute model, on a tokio runtime of their own (so that their work does not delay the
//! load generator's), and what only they can tell: cache hits, and the oracle's choice.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use pinroute_harness::sim::{PromptBlocks, SimConfig, SimRole, SimWorker};

/// What the fleet is made of: per model, `prefill_workers` and `decode_workers` of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetSpec {
    pub prefill_workers: u64,
    pub decode_workers: u64,
    /// Models served, each by workers of its own; with more than one, the registry names
    /// each worker's model and the sims refuse any other, as vLLM does.
    #[serde(default = "one")]
    pub models: u64,
    /// Blocks of 16 tokens each worker's prefix cache holds.
    pub cache_blocks: usize,
    pub prefill_us_per_token: u64,
    pub token_latency_us: u64,
}

fn one() -> u64 {
    1
}

/// The name the `index`-th model is served under.
pub fn model_name(index: u64) -> String {
    format!("sim-model-{index}")
}

/// The first prefill worker's id; decode ids start at [`FIRST_DECODE`].
pub const FIRST_PREFILL: u64 = 101;
pub const FIRST_DECODE: u64 = 201;

/// The running workers; stopped when dropped.
pub struct Fleet {
    pub prefill: Vec<SimWorker>,
    pub decode: Vec<SimWorker>,
    spec: FleetSpec,
    runtime: Option<tokio::runtime::Runtime>,
}

/// Prompt tokens prefilled over the whole fleet so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Prefilled {
    pub cached: u64,
    pub computed: u64,
}

impl Prefilled {
    /// The sum over models.
    pub fn total(by_model: &[Prefilled]) -> Prefilled {
        by_model
            .iter()
            .fold(Prefilled::default(), |sum, p| Prefilled {
                cached: sum.cached + p.cached,
                computed: sum.computed + p.computed,
            })
    }

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
        let (prefills, decodes) = (spec.prefill_workers, spec.decode_workers);
        let configs = (0..prefills * spec.models)
            .map(|i| {
                config(
                    spec,
                    FIRST_PREFILL + i,
                    SimRole::Prefill,
                    i / prefills.max(1),
                )
            })
            .chain(
                (0..decodes * spec.models)
                    .map(|i| config(spec, FIRST_DECODE + i, SimRole::Decode, i / decodes.max(1))),
            );
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut workers = Vec::new();
        for config in configs {
            let started = runtime.spawn(SimWorker::start(config, any)).await;
            workers.push(started.context("the sim worker task")??);
        }
        let prefill_count = spec.prefill_workers * spec.models;
        let decode = workers.split_off(usize::try_from(prefill_count).unwrap_or(0));
        Ok(Fleet {
            prefill: workers,
            decode,
            spec: *spec,
            runtime: Some(runtime),
        })
    }

    /// The registry of the fleet, with `settings` merged in: a pinroute plugin configuration.
    pub fn plugin_config(&self, settings: &Value) -> Value {
        let entry = |w: &SimWorker| {
            let c = w.config();
            let mut entry =
                json!({"id": c.id, "role": c.role.as_str(), "address": w.addr().to_string()});
            if let (Some(models), Some(entry)) = (&c.served_models, entry.as_object_mut()) {
                entry.insert("models".into(), json!(models));
            }
            entry
        };
        let workers: Vec<Value> = self.prefill.iter().chain(&self.decode).map(entry).collect();
        let mut config = json!({ "workers": workers });
        if let (Some(config), Some(settings)) = (config.as_object_mut(), settings.as_object()) {
            config.extend(settings.clone());
        }
        config
    }

    /// How many models it serves.
    pub fn models(&self) -> u64 {
        self.spec.models
    }

    pub fn prefill_addresses(&self) -> Vec<SocketAddr> {
        self.prefill.iter().map(SimWorker::addr).collect()
    }

    pub fn decode_addresses(&self) -> Vec<SocketAddr> {
        self.decode.iter().map(SimWorker::addr).collect()
    }

    /// Every worker as at start: empty caches, and nothing queued from the last run.
    pub fn reset(&self) {
        for worker in self.all() {
            worker.clear_cache();
            worker.abort_queued();
        }
    }

    /// Prompt tokens prefilled so far by each model's workers, in model order.
    pub fn prefilled(&self) -> Vec<Prefilled> {
        (0..self.spec.models)
            .map(|model| {
                let name = model_name(model);
                let of_model: Vec<Prefilled> = self
                    .all()
                    .filter(|w| self.spec.models == 1 || w.config().model == name)
                    .map(|w| {
                        let (cached, computed) = w.prompt_tokens();
                        Prefilled { cached, computed }
                    })
                    .collect();
                Prefilled::total(&of_model)
            })
            .collect()
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

fn config(spec: &FleetSpec, id: u64, role: SimRole, model: u64) -> SimConfig {
    let config = SimConfig::new(id, role)
        .with_cache_blocks(spec.cache_blocks)
        .with_prefill_per_token(Duration::from_micros(spec.prefill_us_per_token))
        .with_token_latency(Duration::from_micros(spec.token_latency_us));
    match spec.models {
        1 => config,
        _ => config.with_served_models(&[&model_name(model)]),
    }
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

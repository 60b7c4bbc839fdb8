//! Configuration and plain data types of the worker simulator.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What a simulated worker does in a prefill/decode deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SimRole {
    /// KV producer (`kv_role: kv_producer`): answers prefill hops.
    Prefill,
    /// KV consumer (`kv_role: kv_consumer`): answers decode hops.
    Decode,
    /// A plain vLLM server without KV transfer.
    Aggregated,
}

impl SimRole {
    /// The lowercase name used in configuration and in the `sim` object.
    pub fn as_str(self) -> &'static str {
        match self {
            SimRole::Prefill => "prefill",
            SimRole::Decode => "decode",
            SimRole::Aggregated => "aggregated",
        }
    }
}

impl fmt::Display for SimRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SimRole {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> anyhow::Result<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "prefill" => Ok(SimRole::Prefill),
            "decode" => Ok(SimRole::Decode),
            "aggregated" => Ok(SimRole::Aggregated),
            other => anyhow::bail!(
                "unknown worker role {other:?}: expected prefill, decode or aggregated"
            ),
        }
    }
}

/// Everything that defines one simulated worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    pub id: u64,
    pub role: SimRole,
    /// Number of data-parallel ranks (at least 1).
    pub dp_size: u32,
    /// The served model name (`/v1/models`, `model` of responses).
    pub model: String,
    /// Sleep per generated token.
    pub token_latency: Duration,
    /// Fixed sleep before the first token when the worker computes the prompt itself
    /// (skipped when a decode worker loads the KV from a prefill worker).
    pub prefill_latency: Duration,
    /// The listener's accept backlog: connections the kernel completes before the server
    /// accepts them. A tiny one makes a burst of connections fail, as a busy server's does.
    pub backlog: u32,
    /// Compute per prompt token the worker prefills itself (not found in its prefix cache):
    /// prefills take turns on the worker's engine, and generation waits while one runs.
    /// Zero: prefill costs no time.
    pub prefill_per_token: Duration,
    /// Blocks of 16 tokens the worker's prefix cache holds; 0: no cache.
    pub cache_blocks: usize,
    /// Requests a rank's engine batches at once (vLLM's `--max-num-seqs`): more are published
    /// as waiting.
    pub max_num_seqs: u64,
    /// Prompt tokens one engine step computes (vLLM's `--max-num-batched-tokens`): a prefill
    /// is scheduled, and published as running, once the compute queued ahead of it fits in
    /// one step; until then it waits, as in vLLM's scheduler.
    pub max_num_batched_tokens: u32,
    /// The model names it serves (vLLM's `--served-model-name` and `--lora-modules` names),
    /// checked as vLLM does: another `model` is a 404. `None`: any model is served.
    pub served_models: Option<Vec<String>>,
}

impl SimConfig {
    pub const DEFAULT_MODEL: &'static str = "sim-model";
    pub const DEFAULT_TOKEN_LATENCY: Duration = Duration::from_millis(2);
    /// Tokio's own default backlog for `TcpListener::bind`.
    pub const DEFAULT_BACKLOG: u32 = 1024;
    /// vLLM's default `--max-num-seqs`.
    pub const DEFAULT_MAX_NUM_SEQS: u64 = 256;
    /// vLLM's default `--max-num-batched-tokens` for its API server (on CPU and most GPUs).
    pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: u32 = 2048;

    /// A worker with one rank and default model and latencies.
    pub fn new(id: u64, role: SimRole) -> Self {
        SimConfig {
            id,
            role,
            dp_size: 1,
            model: Self::DEFAULT_MODEL.to_string(),
            token_latency: Self::DEFAULT_TOKEN_LATENCY,
            prefill_latency: Duration::ZERO,
            backlog: Self::DEFAULT_BACKLOG,
            prefill_per_token: Duration::ZERO,
            cache_blocks: 0,
            max_num_seqs: Self::DEFAULT_MAX_NUM_SEQS,
            max_num_batched_tokens: Self::DEFAULT_MAX_NUM_BATCHED_TOKENS,
            served_models: None,
        }
    }

    /// Serves these models only; the first is also the one `model` names.
    pub fn with_served_models(mut self, models: &[&str]) -> Self {
        if let Some(first) = models.first() {
            self.model = (*first).to_owned();
        }
        self.served_models = Some(models.iter().map(|m| (*m).to_owned()).collect());
        self
    }

    /// Whether a request naming `model` is served (vLLM: a request naming none is).
    pub fn serves(&self, model: Option<&str>) -> bool {
        match (&self.served_models, model) {
            (Some(served), Some(model)) if !model.is_empty() => served.iter().any(|m| m == model),
            _ => true,
        }
    }

    pub fn with_prefill_per_token(mut self, compute: Duration) -> Self {
        self.prefill_per_token = compute;
        self
    }

    pub fn with_max_num_seqs(mut self, requests: u64) -> Self {
        self.max_num_seqs = requests.max(1);
        self
    }

    pub fn with_max_num_batched_tokens(mut self, tokens: u32) -> Self {
        self.max_num_batched_tokens = tokens;
        self
    }

    /// The compute one engine step holds: what may be queued ahead of a scheduled prefill.
    pub fn step(&self) -> Duration {
        self.prefill_per_token
            .saturating_mul(self.max_num_batched_tokens)
    }

    pub fn with_cache_blocks(mut self, blocks: usize) -> Self {
        self.cache_blocks = blocks;
        self
    }

    pub fn with_dp_size(mut self, dp_size: u32) -> Self {
        self.dp_size = dp_size;
        self
    }

    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = model.into();
        self
    }

    pub fn with_token_latency(mut self, latency: Duration) -> Self {
        self.token_latency = latency;
        self
    }

    pub fn with_prefill_latency(mut self, latency: Duration) -> Self {
        self.prefill_latency = latency;
        self
    }

    pub fn with_backlog(mut self, backlog: u32) -> Self {
        self.backlog = backlog;
        self
    }

    /// Refuses a configuration the simulator cannot serve.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.dp_size >= 1,
            "worker {}: dp_size must be at least 1",
            self.id
        );
        anyhow::ensure!(
            !self.model.is_empty(),
            "worker {}: model name is empty",
            self.id
        );
        Ok(())
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig::new(0, SimRole::Aggregated)
    }
}

/// A failure injected into the generation endpoints (`/v1/completions`,
/// `/v1/chat/completions`, `/v1/responses`, `/v1/messages`, `/inference/v1/generate`); the
/// Responses API's GET and cancel and `/v1/messages/count_tokens` fail the same way, but
/// serve plainly under the faults that alter an answer. Requests are still recorded
/// before the fault applies.
///
/// JSON shape (as used by `POST /sim/fault`, wrapped in `{"fault": ...}`):
/// `"none"`, `"hang"`, `"close"`, `{"status": 503}`, and the hostile answers
/// `{"kv_padding": 1000000}`, `{"oversized": 40000000}`, `"gzip"`, `"gzip_always"`,
/// `"truncated"` and `"hostile"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// Serve normally.
    #[default]
    None,
    /// Answer this HTTP status with an OpenAI-style JSON error.
    Status(u16),
    /// Never answer (until the worker stops).
    Hang,
    /// Drop the connection without writing a response.
    Close,
    /// Serve normally, with this many bytes more in a prefill hop's `kv_transfer_params`.
    KvPadding(usize),
    /// Answer 200 with a JSON object of this many bytes, whatever was asked.
    Oversized(usize),
    /// Serve normally, gzip-compressed when the request's `accept-encoding` names gzip (as a
    /// server with compression middleware does).
    Gzip,
    /// Serve normally, gzip-compressed whatever the request asked.
    GzipAlways,
    /// Answer 200 with a `content-length` twice what is sent, then close the connection.
    Truncated,
    /// Each request gets the next of [`HOSTILE_ANSWERS`]: the soak's hostile prefill worker.
    Hostile,
}

/// What a [`Fault::Hostile`] worker answers, in turn: `kv_transfer_params` and a body over
/// the gateway's default bounds, a truncated answer, an unasked-for compressed one.
pub const HOSTILE_ANSWERS: [Fault; 4] = [
    Fault::KvPadding(2 << 20),
    Fault::Oversized(2 << 20),
    Fault::Truncated,
    Fault::GzipAlways,
];

/// A failure injected into `GET /metrics` only: what a gateway scraping the worker's load
/// must survive.
///
/// JSON shape (as used by `POST /sim/metrics-fault`, wrapped in `{"fault": ...}`):
/// `"none"`, `"garbage"`, `"huge"`, `"hang"`, `{"status": 500}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricsFault {
    /// Serve the metrics.
    #[default]
    None,
    /// Answer 200 with noise around malformed samples: NaN and huge values, an absurd
    /// engine index, a sample without value, a 10 KB label, invalid UTF-8.
    Garbage,
    /// Answer 200 with over 100 MB of valid-looking vLLM samples, streamed.
    Huge,
    /// Never answer (until the worker stops).
    Hang,
    /// Answer this HTTP status.
    Status(u16),
}

/// One request received on a completion path, as recorded by the simulator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    pub path: String,
    /// Header names in lowercase, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The parsed JSON body, `Null` when the body was not JSON.
    pub body: serde_json::Value,
}

impl RecordedRequest {
    /// The first value of a header (the name is matched case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

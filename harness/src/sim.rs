//! A vLLM-compatible worker simulator for end-to-end tests and `pinroute-harness up`.
//!
//! A [`SimWorker`] speaks the subset of vLLM's (0.32) server pinroute relies on, plays
//! one role of a prefill/decode deployment, and proves KV hand-over: a prefill hop
//! (`kv_transfer_params.do_remote_decode: true`, capped to 1 token, `stream: false`)
//! stores a KV entry and answers NIXL-like `kv_transfer_params` (a top-level member of the
//! JSON answer, on every API); a decode hop carrying them takes that entry from the
//! prefill worker (`GET /sim/kv/{id}`) and checks that it was computed for the same
//! prompt. Every response names the worker and rank in `x-sim-worker-id` /
//! `x-sim-dp-rank` and (JSON bodies, the last SSE event or chunk that carries content) in
//! a top-level `sim` object: `{"worker_id", "role", "dp_rank", "kv_from", "prompt_tokens"}`.
//!
//! HTTP endpoints:
//! - `GET /health`, `GET /v1/models`, `GET /metrics` (Prometheus text: `sim_requests_total`,
//!   `sim_kv_produced_total`, `sim_kv_loaded_total`, `sim_generated_tokens_total`,
//!   `sim_prompt_tokens_cached_total`, `sim_prompt_tokens_computed_total`,
//!   `sim_kv_pending`, `sim_dp_rank_requests_total{dp_rank}`; and, as vLLM publishes them
//!   per data-parallel engine, `vllm:num_requests_running`, `vllm:num_requests_waiting`
//!   and `vllm:kv_cache_usage_perc` with labels `engine="<rank>"` and
//!   `model_name="<model>"`: a request waits from its arrival until its turn on the engine
//!   (behind other prefills, or loading remote KV), then runs until its answer ends; the
//!   KV-cache usage is the prefix cache's, 0 without one).
//!
//! With `cache_blocks` set, a worker models vLLM's prefix cache ([`PromptBlocks`]): a
//! bounded LRU of 16-token prompt blocks; a prompt it prefills itself (a prefill hop, or a
//! decode or aggregated worker without KV to load) costs `prefill_per_token` for each token
//! its cache lacks, the prefills of a worker taking turns, and a decode hop that loads KV
//! adds the prompt to its cache. The `sim` object then also carries `cached_tokens` and
//! `computed_tokens`, and `usage.prompt_tokens_details.cached_tokens` is set as vLLM does.
//! - `POST /v1/completions`, `POST /v1/chat/completions` (recorded, subject to faults).
//!   Response ids are `cmpl-<x-request-id>` (`chatcmpl-<x-request-id>` for chat, as vLLM).
//!   The `model` field is checked only against a worker's `served_models` (as vLLM checks
//!   its served and LoRA names: another is a 404 `NotFoundError`, `The model `x` does not
//!   exist.`), and then the answer repeats it; a KV entry is for the model that prefilled
//!   it, and a decode hop naming another model does not load it.
//! - `POST /v1/responses` (OpenAI's Responses API; recorded, subject to faults): the prompt
//!   is `instructions` + `input`, limited by `max_output_tokens` (16 by default); a prefill
//!   hop also needs `store: false`. The id is the body's `request_id`, else
//!   `resp_<x-request-id>` (vLLM draws `resp_<uuid>`). The answer is vLLM's response
//!   object, `status: "incomplete"` with `incomplete_details.reason: "max_output_tokens"`
//!   (the simulated model always stops at its limit, and vLLM reports that so); streamed:
//!   `event:`/`data:` pairs `response.created`, `response.in_progress`,
//!   `response.output_item.added`, `response.content_part.added`, a
//!   `response.output_text.delta` per token, `response.output_text.done`,
//!   `response.content_part.done`, `response.output_item.done`, `response.completed`. As
//!   vLLM with `VLLM_ENABLE_RESPONSES_API_STORE=1`, each worker keeps the responses with
//!   `store: true` (the default): `GET /v1/responses/{id}` answers one (JSON only),
//!   `POST /v1/responses/{id}/cancel` makes a background one still queued `cancelled`
//!   (any other: 400 `Cannot cancel a synchronous response.`), an unknown id or
//!   `previous_response_id` is a 404 (`Response with id '<id>' not found.`), and a known
//!   `previous_response_id` prefixes its conversation to the prompt. `background: true`
//!   (with `store`) answers the `queued` response at once and stores the finished one
//!   later (a streamed background request is answered the same way). GET and cancel are
//!   recorded and subject to faults too.
//! - `POST /v1/messages` (Anthropic's Messages API, as vLLM's `entrypoints/anthropic`):
//!   the prompt is `system` + `messages`; `model` and `max_tokens` are required. The id is
//!   the chat completion's, `chatcmpl-<x-request-id>`; null fields are left out (as vLLM's
//!   `exclude_none`), `kv_transfer_params` included; streamed: `message_start`,
//!   `content_block_start`, a `content_block_delta` (`text_delta`) per token,
//!   `content_block_stop`, `message_delta`, `message_stop`. Errors take Anthropic's shape
//!   `{"type": "error", "error": {"type", "message"}}` with vLLM's error types
//!   (`BadRequestError`, ...), except request-validation errors (a missing `max_tokens`),
//!   which vLLM answers in OpenAI's shape (`type: "Bad Request"`, `param: "body.<field>"`).
//!   `POST /v1/messages/count_tokens` answers `{"input_tokens", "context_management"}`
//!   (recorded).
//! - `POST /inference/v1/generate` (vLLM's token-in/token-out API): the prompt is
//!   `token_ids`, the limits are `sampling_params.max_tokens` (16 by default) and
//!   `min_tokens`; the answer's `request_id` is `generate-tokens-<x-request-id, else the
//!   body's request_id>`, its choices carry the generated `token_ids` (token `i` has id
//!   `i`; `output_mode: "text"` adds `text`); streamed: one `data:` chunk per token, the
//!   usage chunk with `stream_options.include_usage`, `data: [DONE]`.
//! - Control, for workers running in another process:
//!   - `GET /sim/requests`: JSON array of [`RecordedRequest`]
//!     (`[{"path": "/v1/completions", "headers": [["x-request-id", "r1"], ...], "body": {...}}]`);
//!   - `DELETE /sim/requests`: forget them (204);
//!   - `POST /sim/fault` with `{"fault": "none" | "hang" | "close" | {"status": 503}}`,
//!     `GET /sim/fault` answers the same shape;
//!   - `POST /sim/metrics-fault` with `{"fault": "none" | "garbage" | "huge" | "hang" |
//!     {"status": 500}}` ([`MetricsFault`], `GET /sim/metrics-fault` answers the same
//!     shape): fails `GET /metrics` only;
//!   - `POST /sim/engine-load` with `{"waiting": 2, "running": 1, "kv_cache_usage": 0.5,
//!     "rank": 0}` ([`EngineLoadOverride`]; without `rank`, every rank's): the published
//!     counts of the rank are its real ones plus these, its KV-cache usage this one;
//!     `DELETE /sim/engine-load` drops the overrides (204);
//!   - `GET /sim/info`: `{"id", "role", "dp_size", "model", "address", ...}`;
//!   - `GET /sim/kv/{id}`: takes a KV entry (prefill workers; 404 when absent).
//!
//! [`SimClient`] wraps the control endpoints.

mod cache;
mod completion;
mod config;
mod engine;
mod kv;
mod load;
mod messages;
mod metrics;
mod openai;
mod responses;
mod routes;
mod server;
mod state;
mod tokens;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use cache::{BLOCK_TOKENS, PromptBlocks};
pub use completion::PREFILL_LATENCY_HEADER;
pub use config::{Fault, MetricsFault, RecordedRequest, SimConfig, SimRole};
pub use kv::{KvEntry, prompt_hash};
pub use load::EngineLoadOverride;
pub use routes::{FaultRequest, MetricsFaultRequest};

use state::SimState;

/// A running simulated worker. Dropping it stops the server without waiting;
/// [`SimWorker::stop`] waits until the port is free.
pub struct SimWorker {
    state: Arc<SimState>,
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    server: Option<JoinHandle<()>>,
}

impl SimWorker {
    /// Binds `listen` (port 0 picks a free port) and serves on the current tokio runtime.
    pub async fn start(config: SimConfig, listen: SocketAddr) -> anyhow::Result<SimWorker> {
        config.validate()?;
        let listener = listen_with_backlog(listen, config.backlog)
            .with_context(|| format!("sim worker {}: cannot listen on {listen}", config.id))?;
        let addr = listener
            .local_addr()
            .context("sim worker: no local address")?;
        let (shutdown, shutdown_signal) = watch::channel(false);
        let state = Arc::new(SimState::new(config, addr, shutdown_signal.clone())?);
        let router = routes::router(state.clone());
        let server = tokio::spawn(server::serve(listener, router, shutdown_signal));
        let config = &state.config;
        log::info!(
            "sim worker {} ({}, dp_size {}) listening on {addr}",
            config.id,
            config.role,
            config.dp_size
        );
        Ok(SimWorker {
            state,
            addr,
            shutdown,
            server: Some(server),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn config(&self) -> &SimConfig {
        &self.state.config
    }

    /// Every request received on the generation paths (and on the Responses API's GET and
    /// cancel, and `count_tokens`), in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.requests()
    }

    pub fn clear_requests(&self) {
        self.state.clear_requests();
    }

    pub fn fault(&self) -> Fault {
        self.state.fault()
    }

    pub fn set_fault(&self, fault: Fault) {
        self.state.set_fault(fault);
    }

    pub fn metrics_fault(&self) -> MetricsFault {
        self.state.metrics_fault()
    }

    pub fn set_metrics_fault(&self, fault: MetricsFault) {
        self.state.set_metrics_fault(fault);
    }

    /// As `POST /sim/engine-load`: refused for a rank the worker lacks.
    pub fn set_engine_load(&self, update: EngineLoadOverride) -> anyhow::Result<()> {
        self.state
            .load
            .set_override(update)
            .map_err(anyhow::Error::msg)
    }

    /// As `DELETE /sim/engine-load`.
    pub fn clear_engine_load(&self) {
        self.state.load.clear_overrides();
    }

    /// KV entries produced and not yet taken by a decode worker.
    pub fn pending_kv(&self) -> usize {
        self.state.kv.len()
    }

    /// Responses API responses the worker stores (`store: true`).
    pub fn stored_responses(&self) -> usize {
        self.state.responses.len()
    }

    /// How many leading blocks of `prompt` the worker's prefix cache holds (0 without one).
    pub fn cached_blocks(&self, prompt: &PromptBlocks) -> usize {
        self.state
            .cache
            .as_ref()
            .map_or(0, |cache| cache.cached_blocks(&prompt.hashes))
    }

    /// Empties the worker's prefix cache.
    pub fn clear_cache(&self) {
        if let Some(cache) = &self.state.cache {
            cache.clear();
        }
    }

    /// Forgets the prefill compute queued on its engine: between two benchmark runs, what
    /// the last run's clients left behind (vLLM aborts a request whose client left).
    pub fn abort_queued(&self) {
        self.state.engine.abort_queued();
    }

    /// Completion requests being served now.
    pub fn in_flight(&self) -> u64 {
        self.state
            .in_flight
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Prompt tokens prefilled by this worker so far: found in its cache, and computed.
    pub fn prompt_tokens(&self) -> (u64, u64) {
        let counters = &self.state.counters;
        (
            state::read(&counters.cached_prompt_tokens),
            state::read(&counters.computed_prompt_tokens),
        )
    }

    /// Stops accepting, lets open requests finish (hung ones are cut, others get a
    /// short grace period) and returns once the port is free.
    pub async fn stop(mut self) {
        self.shutdown.send_replace(true);
        if let Some(server) = self.server.take()
            && let Err(error) = server.await
        {
            log::warn!(
                "sim worker {}: server task failed: {error}",
                self.state.config.id
            );
        }
        log::info!(
            "sim worker {} on {} stopped",
            self.state.config.id,
            self.addr
        );
    }
}

/// A listener on `addr` with this accept backlog (`SO_REUSEADDR`, as tokio's `bind`).
fn listen_with_backlog(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

impl SimWorker {
    /// Kills the worker the way a crashed process dies: the listener and every open
    /// connection are closed at once, requests in flight get no answer (a stream stops
    /// mid-body), with none of [`SimWorker::stop`]'s grace. Its KV entries are lost.
    /// Returns once the port is free.
    pub async fn kill(mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
            if let Err(error) = server.await
                && !error.is_cancelled()
            {
                log::warn!(
                    "sim worker {}: server task failed: {error}",
                    self.state.config.id
                );
            }
        }
        log::info!(
            "sim worker {} on {} killed",
            self.state.config.id,
            self.addr
        );
    }
}

impl Drop for SimWorker {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
    }
}

/// Client for the control endpoints of a simulator running elsewhere.
#[derive(Debug, Clone)]
pub struct SimClient {
    base: String,
    http: reqwest::Client,
}

impl SimClient {
    pub fn new(addr: SocketAddr) -> anyhow::Result<SimClient> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(std::time::Duration::from_secs(10))
            .build()?;
        Ok(SimClient {
            base: format!("http://{addr}"),
            http,
        })
    }

    pub async fn requests(&self) -> anyhow::Result<Vec<RecordedRequest>> {
        let response = self
            .http
            .get(format!("{}/sim/requests", self.base))
            .send()
            .await?;
        Ok(response.error_for_status()?.json().await?)
    }

    pub async fn clear_requests(&self) -> anyhow::Result<()> {
        self.http
            .delete(format!("{}/sim/requests", self.base))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    pub async fn set_fault(&self, fault: Fault) -> anyhow::Result<()> {
        let url = format!("{}/sim/fault", self.base);
        self.http
            .post(url)
            .json(&FaultRequest { fault })
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    pub async fn fault(&self) -> anyhow::Result<Fault> {
        let response = self
            .http
            .get(format!("{}/sim/fault", self.base))
            .send()
            .await?;
        Ok(response
            .error_for_status()?
            .json::<FaultRequest>()
            .await?
            .fault)
    }

    /// `GET /sim/info`.
    pub async fn info(&self) -> anyhow::Result<serde_json::Value> {
        let response = self
            .http
            .get(format!("{}/sim/info", self.base))
            .send()
            .await?;
        Ok(response.error_for_status()?.json().await?)
    }
    pub async fn set_metrics_fault(&self, fault: MetricsFault) -> anyhow::Result<()> {
        let url = format!("{}/sim/metrics-fault", self.base);
        self.http
            .post(url)
            .json(&MetricsFaultRequest { fault })
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    pub async fn metrics_fault(&self) -> anyhow::Result<MetricsFault> {
        let response = self
            .http
            .get(format!("{}/sim/metrics-fault", self.base))
            .send()
            .await?;
        Ok(response
            .error_for_status()?
            .json::<MetricsFaultRequest>()
            .await?
            .fault)
    }

    /// `POST /sim/engine-load`.
    pub async fn set_engine_load(&self, update: EngineLoadOverride) -> anyhow::Result<()> {
        self.http
            .post(format!("{}/sim/engine-load", self.base))
            .json(&update)
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// `DELETE /sim/engine-load`.
    pub async fn clear_engine_load(&self) -> anyhow::Result<()> {
        self.http
            .delete(format!("{}/sim/engine-load", self.base))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }
}

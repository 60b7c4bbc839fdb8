//! The generation path of every API (`/v1/completions`, `/v1/chat/completions`,
//! `/v1/responses`, `/v1/messages`, `/inference/v1/generate`): faults, rank choice, KV
//! transfer checks and (streamed) fake generation.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::{Value, json};

use super::cache::PromptBlocks;
use super::config::{Fault, HOSTILE_ANSWERS, SimRole};
use super::engine::Engine;
use super::kv::{KvEntry, fetch_remote_kv};
use super::openai::{
    ApiError, Endpoint, Generation, GenerationRequest, KvRequest, RemotePrefill, generated_text,
    sim_object,
};
use super::responses;
use super::server::close_connection;
use super::state::{InFlight, RankSelection, SimState, bump, unix_seconds};

pub(crate) const WORKER_ID_HEADER: &str = "x-sim-worker-id";
pub(crate) const DP_RANK_RESPONSE_HEADER: &str = "x-sim-dp-rank";
pub(crate) const REQUEST_ID_HEADER: &str = "x-request-id";
/// Overrides the worker's prefill latency for one request, in ms: lets test traffic hold a
/// prefill hop open (the filter passes a client's headers on to the prefill worker).
pub const PREFILL_LATENCY_HEADER: &str = "x-sim-prefill-latency-ms";
const KV_MISMATCH: &str = "kv_transfer_params do not match any prefill";

/// Serves one generation request, whatever the outcome.
pub(crate) async fn handle_completion(
    state: &SimState,
    endpoint: Endpoint,
    headers: &HeaderMap,
    raw: &Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
    state.record(endpoint.path(), headers, body.clone());
    let mut in_flight = InFlight::start(state);
    let selection = state.select_rank(headers);
    let fault = match state.fault() {
        Fault::Hostile => {
            let turn = state
                .counters
                .hostile_answers
                .fetch_add(1, Ordering::Relaxed);
            let at = usize::try_from(turn).unwrap_or(0) % HOSTILE_ANSWERS.len();
            HOSTILE_ANSWERS.get(at).copied().unwrap_or_default()
        }
        fault => fault,
    };
    if let Some(response) = apply_fault(state, endpoint, fault, selection.label()).await {
        return response;
    }
    let rank = match selection {
        RankSelection::Rank(rank) => rank,
        RankSelection::OutOfRange(requested) => {
            let message = format!(
                "data_parallel_rank {requested} is out of range [0, {}).",
                state.config.dp_size
            );
            return error_response(state, endpoint, requested, &ApiError::bad_request(message));
        }
    };
    state.count_rank_request(rank);
    in_flight.queue_on(state, rank);
    let padding = match fault {
        Fault::KvPadding(bytes) => bytes,
        _ => 0,
    };
    let compressed = fault == Fault::GzipAlways || (fault == Fault::Gzip && accepts_gzip(headers));
    match generate(state, endpoint, headers, &body, rank, in_flight, padding).await {
        Ok(response) if compressed => gzipped(response).await,
        Ok(response) => response,
        Err(error) => {
            log::debug!(
                "sim worker {}: {} -> {}: {}",
                state.config.id,
                endpoint.path(),
                error.status,
                error.message
            );
            error_response(state, endpoint, i64::from(rank), &error)
        }
    }
}

/// Serves a request beside generation (a stored response, token counting): recorded,
/// failed by the worker's fault as generation is (a hostile or altering fault serves it
/// plainly), else `answer`'s body or error in `endpoint`'s shape.
pub(crate) async fn handle_side_request(
    state: &SimState,
    endpoint: Endpoint,
    path: &str,
    headers: &HeaderMap,
    body: Value,
    answer: impl FnOnce(&Value) -> Result<Value, ApiError>,
) -> Response {
    state.record(path, headers, body.clone());
    let rank = i64::from(state.header_rank_or_zero(headers));
    let fault = match state.fault() {
        Fault::Hostile => Fault::None,
        fault => fault,
    };
    if let Some(response) = apply_fault(state, endpoint, fault, rank).await {
        return response;
    }
    match answer(&body) {
        Ok(answer) => json_response(state, rank, StatusCode::OK, &answer),
        Err(error) => error_response(state, endpoint, rank, &error),
    }
}

/// The answer a fault gives instead of serving (`None`: serve, maybe altered).
pub(crate) async fn apply_fault(
    state: &SimState,
    endpoint: Endpoint,
    fault: Fault,
    rank_label: i64,
) -> Option<Response> {
    match fault {
        Fault::None => None,
        Fault::Status(code) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let message = format!(
                "simulated fault: worker {} answers {}",
                state.config.id,
                status.as_u16()
            );
            Some(error_response(
                state,
                endpoint,
                rank_label,
                &ApiError::new(status, message),
            ))
        }
        Fault::Hang => {
            state.stopped().await;
            Some(close_connection())
        }
        Fault::Close => Some(close_connection()),
        Fault::Oversized(bytes) => Some(oversized(state, rank_label, bytes)),
        Fault::Truncated => Some(truncated(state, rank_label)),
        Fault::KvPadding(_) | Fault::Gzip | Fault::GzipAlways | Fault::Hostile => None,
    }
}

/// A 200 JSON object of `bytes` bytes: `{"sim_padding":"xxx..."}`.
fn oversized(state: &SimState, rank_label: i64, bytes: usize) -> Response {
    let padding = "x".repeat(bytes.saturating_sub(r#"{"sim_padding":""}"#.len()));
    json_response(
        state,
        rank_label,
        StatusCode::OK,
        &json!({ "sim_padding": padding }),
    )
}

const TRUNCATION_PAUSE: Duration = Duration::from_millis(50);

/// A 200 that promises twice the body it sends, then drops the connection.
fn truncated(state: &SimState, rank_label: i64) -> Response {
    let half = Bytes::from_static(br#"{"id":"cmpl-truncated","choices":[{"text":"#);
    let promised = half.len() * 2;
    // The break comes after the first part is on the wire, headers included.
    let broken = futures_util::stream::once(async {
        tokio::time::sleep(TRUNCATION_PAUSE).await;
        Err::<Bytes, _>(std::io::Error::other("truncated by the simulator"))
    });
    let chunks = futures_util::stream::iter([Ok(half)]).chain(broken);
    let mut response = Response::new(Body::from_stream(chunks));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(promised));
    add_identity_headers(headers, state.config.id, rank_label);
    response
}

fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.to_ascii_lowercase().contains("gzip"))
}

/// `response` with its body gzip-compressed and `content-encoding: gzip`.
async fn gzipped(response: Response) -> Response {
    use std::io::Write;
    let (mut parts, body) = response.into_parts();
    let Ok(plain) = axum::body::to_bytes(body, usize::MAX).await else {
        return close_connection();
    };
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let compressed = encoder.write_all(&plain).and_then(|()| encoder.finish());
    let Ok(compressed) = compressed else {
        return close_connection();
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts
        .headers
        .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    Response::from_parts(parts, Body::from(compressed))
}

/// An error in `endpoint`'s shape, with the `sim` object and identity headers.
pub(crate) fn error_response(
    state: &SimState,
    endpoint: Endpoint,
    rank_label: i64,
    error: &ApiError,
) -> Response {
    let mut body = error.body_for(endpoint);
    if let Some(object) = body.as_object_mut() {
        let sim = sim_object(
            state.config.id,
            state.config.role.as_str(),
            rank_label,
            None,
            0,
        );
        object.insert("sim".into(), sim);
    }
    json_response(state, rank_label, error.status, &body)
}

pub(crate) fn json_response(
    state: &SimState,
    rank_label: i64,
    status: StatusCode,
    body: &Value,
) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    add_identity_headers(response.headers_mut(), state.config.id, rank_label);
    response
}

pub(crate) fn add_identity_headers(headers: &mut HeaderMap, worker_id: u64, rank_label: i64) {
    headers.insert(WORKER_ID_HEADER, HeaderValue::from(worker_id));
    headers.insert(DP_RANK_RESPONSE_HEADER, HeaderValue::from(rank_label));
}

/// What the KV transfer part of a request decided.
#[derive(Debug, Default)]
struct KvPlan {
    /// The prefill worker whose KV was loaded.
    kv_from: Option<u64>,
    /// `kv_transfer_params` of the response (a prefill hop's handle for decode).
    response_params: Value,
    /// For loaded KV, the prompt tokens the answer reports cached: the prefill's prefix-cache
    /// hits named in `remote_prefill_cached_tokens`, as vLLM reports them; without it the
    /// whole loaded prompt, as older vLLM did (every loaded block counted as a hit).
    loaded_cached_tokens: Option<u64>,
}

async fn generate(
    state: &SimState,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &Value,
    rank: u32,
    mut in_flight: InFlight,
    kv_padding: usize,
) -> Result<Response, ApiError> {
    let model = body.get("model").and_then(Value::as_str);
    if !state.config.serves(model) {
        return Err(ApiError::model_not_found(model.unwrap_or_default()));
    }
    let mut request = GenerationRequest::parse(endpoint, body)?;
    if state.config.served_models.is_some() {
        // KV is computed for the weights of one model (a base model or one of its adapters):
        // a decode hop only loads what was prefilled for the model it names.
        request.prompt_hash = super::kv::prompt_hash(&json!([model, request.prompt_hash]));
    }
    let conversation = responses::continue_conversation(state, &mut request)?;
    let plan = plan_kv(state, &request, rank, kv_padding).await?;
    let first_token_delay = match plan.kv_from {
        Some(_) => Duration::ZERO,
        None => prefill_latency(state, headers),
    };
    let prompt = request.prompt(body);
    let loaded = plan.kv_from.is_some();
    let mut prefilled = prefill(state, prompt, &request, loaded, &mut in_flight).await;
    if let Some(cached) = plan.loaded_cached_tokens {
        prefilled.cached = cached;
    }
    let generation = build_generation(state, &request, body, headers, rank, plan, prefilled);
    bump(
        &state.counters.generated_tokens,
        u64::from(generation.tokens),
    );
    // What a Responses request that stores its answer keeps, for `previous_response_id`.
    let stored = (endpoint == Endpoint::Responses && request.store).then(|| {
        let mut conversation = conversation;
        conversation.push(Value::String(generated_text(generation.tokens)));
        conversation
    });
    let latency = first_token_delay + state.config.token_latency.saturating_mul(generation.tokens);
    if request.background {
        let conversation = stored.unwrap_or_default();
        let queued =
            responses::start_background(state, generation, conversation, latency, in_flight);
        return Ok(json_response(
            state,
            i64::from(rank),
            StatusCode::OK,
            &queued,
        ));
    }
    if request.stream {
        let on_done = stored.map(|conversation| {
            let store = state.responses.clone();
            let finished = responses::finished_response(&generation);
            Box::new(move || store.insert(finished, conversation)) as OnDone
        });
        Ok(stream_response(
            state,
            rank,
            &generation,
            first_token_delay,
            in_flight,
            on_done,
        ))
    } else {
        sleep_unless_zero(latency).await;
        state.engine.stall().await;
        let answer = generation.full_response();
        if let Some(conversation) = stored {
            state.responses.insert(answer.clone(), conversation);
        }
        Ok(json_response(
            state,
            i64::from(rank),
            StatusCode::OK,
            &answer,
        ))
    }
}

fn prefill_latency(state: &SimState, headers: &HeaderMap) -> Duration {
    headers
        .get(PREFILL_LATENCY_HEADER)
        .and_then(|value| value.to_str().ok()?.parse().ok())
        .map_or(state.config.prefill_latency, Duration::from_millis)
}

/// What a request's prompt cost this worker.
#[derive(Debug, Clone, Copy, Default)]
struct Prefilled {
    /// Tokens found in the worker's prefix cache.
    cached: u64,
    /// Tokens the worker computed.
    computed: u64,
}

/// The prompt's part of the request: loaded from a prefill worker (the KV arrives, nothing
/// is computed), or prefilled here, the tokens its prefix cache lacks computed on the
/// engine. Either way the worker's cache holds the prompt afterwards. The request runs
/// from its turn on the engine on (at once when nothing is computed).
async fn prefill(
    state: &SimState,
    prompt: &Value,
    request: &GenerationRequest,
    loaded: bool,
    in_flight: &mut InFlight,
) -> Prefilled {
    let Some(cache) = &state.cache else {
        in_flight.run(0);
        return Prefilled::default();
    };
    let blocks = PromptBlocks::of(prompt);
    let held = blocks.hashes.len();
    if loaded {
        in_flight.run(held);
        cache.store(&blocks.hashes);
        return Prefilled::default();
    }
    let cached =
        PromptBlocks::tokens_in(cache.cached_blocks(&blocks.hashes)).min(request.prompt_tokens);
    let computed = request.prompt_tokens - cached;
    let work = state
        .config
        .prefill_per_token
        .saturating_mul(u32::try_from(computed).unwrap_or(u32::MAX));
    state.engine.compute(work, || in_flight.run(held)).await;
    cache.store(&blocks.hashes);
    bump(&state.counters.cached_prompt_tokens, cached);
    bump(&state.counters.computed_prompt_tokens, computed);
    Prefilled { cached, computed }
}

/// `kv_padding`: bytes more in a prefill hop's `kv_transfer_params` ([`Fault::KvPadding`]).
async fn plan_kv(
    state: &SimState,
    request: &GenerationRequest,
    rank: u32,
    kv_padding: usize,
) -> Result<KvPlan, ApiError> {
    let id = state.config.id;
    match (state.config.role, &request.kv) {
        (_, KvRequest::Absent) => Ok(KvPlan::default()),
        (SimRole::Aggregated, _) => Err(ApiError::bad_request(format!(
            "aggregated worker {id} does not take part in KV transfer: kv_transfer_params must not be sent to it"
        ))),
        (SimRole::Prefill, KvRequest::RemoteDecode) => produce_kv(state, request, rank, kv_padding),
        (SimRole::Prefill, KvRequest::RemotePrefill(_)) => Err(ApiError::bad_request(format!(
            "prefill worker {id} only produces KV: kv_transfer_params with do_remote_prefill=true belong on a decode worker"
        ))),
        (SimRole::Prefill, KvRequest::Invalid(reason)) => Err(ApiError::bad_request(format!(
            "prefill worker {id}: invalid kv_transfer_params: {reason} (a prefill hop sets do_remote_decode=true)"
        ))),
        (SimRole::Decode, KvRequest::RemotePrefill(remote)) => {
            load_kv(state, request, remote).await
        }
        (SimRole::Decode, KvRequest::RemoteDecode) => Err(ApiError::bad_request(format!(
            "decode worker {id} got a prefill hop (kv_transfer_params.do_remote_decode=true): it belongs on a prefill worker"
        ))),
        (SimRole::Decode, KvRequest::Invalid(reason)) => Err(ApiError::bad_request(format!(
            "{KV_MISMATCH}: {reason} (decode worker {id})"
        ))),
    }
}

/// A prefill hop must be length-capped to one token and not streamed, else a real
/// prefill would waste work (and free its KV blocks before decode reads them).
fn check_prefill_hop(request: &GenerationRequest) -> Result<(), ApiError> {
    if request.stream {
        return Err(ApiError::bad_request(
            "prefill hop (kv_transfer_params.do_remote_decode=true) must not stream: send stream=false",
        ));
    }
    let over_limit = request.limits_present.iter().find(|(_, value)| *value != 1);
    if let Some((field, value)) = over_limit {
        return Err(ApiError::bad_request(format!(
            "prefill hop (kv_transfer_params.do_remote_decode=true) must be capped to 1 token, but `{field}` is {value}: a real prefill would waste work generating tokens"
        )));
    }
    if request.max_tokens != 1 {
        let field = match request.endpoint {
            Endpoint::Responses => "max_output_tokens",
            Endpoint::Generate => "sampling_params.max_tokens",
            _ => "max_tokens",
        };
        return Err(ApiError::bad_request(format!(
            "prefill hop (kv_transfer_params.do_remote_decode=true) must set {field} to 1 (it would generate {} tokens)",
            request.max_tokens
        )));
    }
    if request.store {
        return Err(ApiError::bad_request(
            "prefill hop (kv_transfer_params.do_remote_decode=true) must set store=false: the prefill worker would keep a response the client never sees (store defaults to true)",
        ));
    }
    Ok(())
}

fn produce_kv(
    state: &SimState,
    request: &GenerationRequest,
    rank: u32,
    padding: usize,
) -> Result<KvPlan, ApiError> {
    check_prefill_hop(request)?;
    let (sequence, request_id) = state.fresh_id("kv");
    let engine_id = format!("sim-{}-{rank}", state.config.id);
    let block_count = request.prompt_tokens.div_ceil(16).clamp(1, 8);
    let block_ids: Vec<u64> = (0..block_count).map(|block| sequence * 8 + block).collect();
    state.kv.insert(KvEntry {
        request_id: request_id.clone(),
        prompt_hash: request.prompt_hash.clone(),
        worker_id: state.config.id,
        dp_rank: rank,
        engine_id: engine_id.clone(),
        prompt_tokens: request.prompt_tokens,
    });
    bump(&state.counters.kv_produced, 1);
    let mut response_params = json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_engine_id": engine_id,
        "remote_block_ids": block_ids,
        "remote_request_id": request_id,
        "remote_host": state.advertised.ip().to_string(),
        "remote_port": state.advertised.port(),
        "tp_size": 1,
    });
    if let Some(params) = response_params.as_object_mut().filter(|_| padding > 0) {
        params.insert("sim_padding".into(), json!("x".repeat(padding)));
    }
    Ok(KvPlan {
        kv_from: None,
        response_params,
        loaded_cached_tokens: None,
    })
}

async fn load_kv(
    state: &SimState,
    request: &GenerationRequest,
    remote: &RemotePrefill,
) -> Result<KvPlan, ApiError> {
    let location = format!("{}:{}", remote.host, remote.port);
    let fetched = fetch_remote_kv(&state.http, &remote.host, remote.port, &remote.request_id).await;
    let entry = match fetched {
        Ok(Some(entry)) => entry,
        Ok(None) => {
            return Err(ApiError::bad_request(format!(
                "{KV_MISMATCH}: the prefill worker at {location} has no KV for remote_request_id {:?} (never produced, expired or already consumed)",
                remote.request_id
            )));
        }
        Err(error) => {
            return Err(ApiError::bad_request(format!(
                "{KV_MISMATCH}: could not fetch KV {:?} from the prefill worker at {location}: {error:#}",
                remote.request_id
            )));
        }
    };
    verify_kv_entry(&entry, request, remote)?;
    bump(&state.counters.kv_loaded, 1);
    log::debug!(
        "sim worker {}: loaded KV {} from worker {}",
        state.config.id,
        entry.request_id,
        entry.worker_id
    );
    Ok(KvPlan {
        kv_from: Some(entry.worker_id),
        response_params: Value::Null,
        loaded_cached_tokens: Some(remote.cached_tokens.unwrap_or(request.prompt_tokens)),
    })
}

fn verify_kv_entry(
    entry: &KvEntry,
    request: &GenerationRequest,
    remote: &RemotePrefill,
) -> Result<(), ApiError> {
    if let Some(engine_id) = &remote.engine_id
        && *engine_id != entry.engine_id
    {
        return Err(ApiError::bad_request(format!(
            "{KV_MISMATCH}: remote_engine_id {engine_id:?} differs from {:?}, the engine that computed KV {:?}",
            entry.engine_id, entry.request_id
        )));
    }
    if entry.prompt_hash != request.prompt_hash {
        return Err(ApiError::bad_request(format!(
            "{KV_MISMATCH}: the prompt differs from the one prefilled by worker {} (KV {:?})",
            entry.worker_id, entry.request_id
        )));
    }
    Ok(())
}

fn build_generation(
    state: &SimState,
    request: &GenerationRequest,
    body: &Value,
    headers: &HeaderMap,
    rank: u32,
    plan: KvPlan,
    prefilled: Prefilled,
) -> Generation {
    let role = state.config.role.as_str();
    let mut sim = sim_object(
        state.config.id,
        role,
        i64::from(rank),
        plan.kv_from,
        request.prompt_tokens,
    );
    if let (Some(sim), Some(_)) = (sim.as_object_mut(), &state.cache) {
        sim.insert("cached_tokens".into(), prefilled.cached.into());
        sim.insert("computed_tokens".into(), prefilled.computed.into());
    }
    let echo = match request.endpoint {
        Endpoint::Responses => responses::echo_fields(body, request.max_tokens),
        Endpoint::Generate => json!({"text_output": request.text_output}),
        _ => Value::Null,
    };
    let item_id = match request.endpoint {
        Endpoint::Responses => format!("msg_{}", fresh_suffix(state)),
        _ => String::new(),
    };
    let mut kv_transfer_params = plan.response_params;
    if let Some(params) = kv_transfer_params.as_object_mut() {
        // vLLM's prefill names its prefix-cache hits for decode to report.
        params.insert(
            "remote_prefill_cached_tokens".into(),
            prefilled.cached.into(),
        );
    }
    Generation {
        endpoint: request.endpoint,
        id: response_id(state, request, headers),
        created: unix_seconds(),
        model: answered_model(state, body),
        tokens: request.max_tokens,
        prompt_tokens: request.prompt_tokens,
        include_usage: request.include_usage,
        cached_tokens: prefilled.cached,
        sim,
        kv_transfer_params,
        echo,
        item_id,
    }
}

/// The `model` of the answer: vLLM repeats the name the request used (an adapter's, say);
/// the configured name when the worker does not check models.
fn answered_model(state: &SimState, body: &Value) -> String {
    let requested = body.get("model").and_then(Value::as_str);
    match (&state.config.served_models, requested) {
        (Some(_), Some(model)) if !model.is_empty() => model.to_owned(),
        _ => state.config.model.clone(),
    }
}

/// The response id, as vLLM forms it: `<prefix><x-request-id>` (`cmpl-`, `chatcmpl-`,
/// `generate-tokens-`, whose body `request_id` stands in for the header); a Responses id
/// is the body's `request_id` (`resp_<x-request-id>` without one, where vLLM draws a
/// random `resp_<uuid>`). A fresh id without either.
fn response_id(state: &SimState, request: &GenerationRequest, headers: &HeaderMap) -> String {
    let prefix = request.endpoint.id_prefix();
    let header = headers
        .get(REQUEST_ID_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|value| !value.is_empty());
    let (first, second) = match request.endpoint {
        Endpoint::Responses => (request.request_id.as_deref(), header.map(|id| (prefix, id))),
        Endpoint::Generate => (
            None,
            header
                .or(request.request_id.as_deref())
                .map(|id| (prefix, id)),
        ),
        _ => (None, header.map(|id| (prefix, id))),
    };
    match (first, second) {
        (Some(id), _) => id.to_string(),
        (None, Some((prefix, id))) => format!("{prefix}{id}"),
        (None, None) => format!("{prefix}{}", fresh_suffix(state)),
    }
}

/// A fresh unique id without a kind prefix (`sim<worker>-<epoch>-<n>`).
pub(crate) fn fresh_suffix(state: &SimState) -> String {
    state.fresh_id("sim").1.split_off(4)
}

async fn sleep_unless_zero(duration: Duration) {
    if !duration.is_zero() {
        tokio::time::sleep(duration).await;
    }
}

/// The events of `generation`'s stream with their delays: the opening events at once,
/// one frame per token (each after `token_latency`, the first after the prefill too), then
/// the closing events.
fn sse_events(
    generation: &Generation,
    first_token_delay: Duration,
    token_latency: Duration,
) -> Vec<(Duration, String)> {
    let frames = generation.stream_frames();
    let head = frames.head.into_iter().map(|event| (Duration::ZERO, event));
    let tokens = frames.tokens.into_iter().enumerate().map(|(index, event)| {
        let delay = if index == 0 {
            first_token_delay + token_latency
        } else {
            token_latency
        };
        (delay, event)
    });
    let tail = frames.tail.into_iter().map(|event| (Duration::ZERO, event));
    head.chain(tokens).chain(tail).collect()
}

/// Runs once the last event of a stream is produced (not when the client goes away).
pub(crate) type OnDone = Box<dyn FnOnce() + Send>;

/// The answer streamed: each token after its delay and after any prefill holding the
/// engine; the request counts as in flight until its last chunk.
fn stream_response(
    state: &SimState,
    rank: u32,
    generation: &Generation,
    first_token_delay: Duration,
    in_flight: InFlight,
    on_done: Option<OnDone>,
) -> Response {
    let events = sse_events(generation, first_token_delay, state.config.token_latency);
    let last = events.len().saturating_sub(1);
    let engine: std::sync::Arc<Engine> = state.engine.clone();
    let mut done = Some((in_flight, on_done));
    let events = events.into_iter().enumerate().map(move |(index, event)| {
        (
            event,
            engine.clone(),
            (index == last).then(|| done.take()).flatten(),
        )
    });
    let stream =
        futures_util::stream::iter(events).then(|((delay, event), engine, done)| async move {
            sleep_unless_zero(delay).await;
            if !delay.is_zero() {
                engine.stall().await;
            }
            if let Some((in_flight, on_done)) = done {
                if let Some(on_done) = on_done {
                    on_done();
                }
                drop(in_flight);
            }
            Ok::<Bytes, Infallible>(Bytes::from(event))
        });
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    add_identity_headers(headers, state.config.id, i64::from(rank));
    response
}

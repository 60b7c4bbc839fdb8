//! The simulator's HTTP routes.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::completion::{
    DP_RANK_RESPONSE_HEADER, WORKER_ID_HEADER, add_identity_headers, handle_completion,
    handle_side_request,
};
use super::config::{Fault, MetricsFault};
use super::load::EngineLoadOverride;
use super::messages::count_tokens_response;
use super::metrics;
use super::openai::{ApiError, Endpoint, anthropic_input_tokens};
use super::responses;
use super::state::SimState;

const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

type SharedState = State<Arc<SimState>>;

/// Body of `POST /sim/fault` and answer of `GET /sim/fault`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultRequest {
    pub fault: Fault,
}

/// Body of `POST /sim/metrics-fault` and answer of `GET /sim/metrics-fault`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricsFaultRequest {
    pub fault: MetricsFault,
}

pub(crate) fn router(state: Arc<SimState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/metrics", get(serve_metrics))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/responses", post(create_response))
        .route("/v1/responses/{id}", get(retrieve_response))
        .route("/v1/responses/{id}/cancel", post(cancel_response))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/inference/v1/generate", post(generate_tokens))
        .route("/sim/info", get(info))
        .route("/sim/requests", get(list_requests).delete(clear_requests))
        .route("/sim/fault", get(get_fault).post(set_fault))
        .route(
            "/sim/metrics-fault",
            get(get_metrics_fault).post(set_metrics_fault),
        )
        .route(
            "/sim/engine-load",
            post(set_engine_load).delete(clear_engine_load),
        )
        .route("/sim/kv/{id}", get(take_kv))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            identity_headers,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Adds `x-sim-worker-id` / `x-sim-dp-rank` to responses that lack them (non-completion
/// paths report the rank named by `X-data-parallel-rank` when valid, else 0).
async fn identity_headers(State(state): SharedState, request: Request, next: Next) -> Response {
    let rank = state.header_rank_or_zero(request.headers());
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    if !headers.contains_key(WORKER_ID_HEADER) || !headers.contains_key(DP_RANK_RESPONSE_HEADER) {
        add_identity_headers(headers, state.config.id, i64::from(rank));
    }
    response
}

/// 200; under a `Status` fault that status with an empty body, as vLLM's `/health` answers
/// once its engine is dead.
async fn health(State(state): SharedState) -> StatusCode {
    match state.fault() {
        Fault::Status(code) => {
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        }
        _ => StatusCode::OK,
    }
}

fn json_ok(body: &Value) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}

fn json_error(error: &ApiError) -> Response {
    let headers = [(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    )];
    (error.status, headers, error.body().to_string()).into_response()
}

async fn models(State(state): SharedState) -> Response {
    let config = &state.config;
    let names = config
        .served_models
        .clone()
        .unwrap_or_else(|| vec![config.model.clone()]);
    let data: Vec<Value> = names
        .iter()
        .map(|name| {
            json!({
                "id": name,
                "object": "model",
                "created": super::state::unix_seconds(),
                "owned_by": "pinroute-sim",
                "root": config.model,
                "max_model_len": super::openai::MAX_MODEL_LEN,
            })
        })
        .collect();
    json_ok(&json!({"object": "list", "data": data}))
}

async fn completions(State(state): SharedState, headers: HeaderMap, body: Bytes) -> Response {
    handle_completion(&state, Endpoint::Completions, &headers, &body).await
}

async fn chat_completions(State(state): SharedState, headers: HeaderMap, body: Bytes) -> Response {
    handle_completion(&state, Endpoint::Chat, &headers, &body).await
}

async fn create_response(State(state): SharedState, headers: HeaderMap, body: Bytes) -> Response {
    handle_completion(&state, Endpoint::Responses, &headers, &body).await
}

/// `GET /v1/responses/{id}`: a response this worker stored (404 in vLLM's shape).
async fn retrieve_response(
    State(state): SharedState,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let path = format!("/v1/responses/{id}");
    handle_side_request(
        &state,
        Endpoint::Responses,
        &path,
        &headers,
        Value::Null,
        |_| {
            state
                .responses
                .get(&id)
                .ok_or_else(|| responses::not_found(&id))
        },
    )
    .await
}

/// `POST /v1/responses/{id}/cancel`: cancels a background response still running.
async fn cancel_response(
    State(state): SharedState,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/v1/responses/{id}/cancel");
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    handle_side_request(&state, Endpoint::Responses, &path, &headers, body, |_| {
        state.responses.cancel(&id)
    })
    .await
}

async fn messages(State(state): SharedState, headers: HeaderMap, body: Bytes) -> Response {
    handle_completion(&state, Endpoint::Messages, &headers, &body).await
}

/// `POST /v1/messages/count_tokens`: the prompt tokens `/v1/messages` would count.
async fn count_tokens(State(state): SharedState, headers: HeaderMap, body: Bytes) -> Response {
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let path = "/v1/messages/count_tokens";
    handle_side_request(&state, Endpoint::Messages, path, &headers, body, |body| {
        anthropic_input_tokens(body).map(count_tokens_response)
    })
    .await
}

async fn generate_tokens(State(state): SharedState, headers: HeaderMap, body: Bytes) -> Response {
    handle_completion(&state, Endpoint::Generate, &headers, &body).await
}

async fn info(State(state): SharedState) -> Response {
    let config = &state.config;
    json_ok(&json!({
        "id": config.id,
        "role": config.role,
        "dp_size": config.dp_size,
        "model": config.model,
        "address": state.advertised.to_string(),
        "token_latency_ms": config.token_latency.as_secs_f64() * 1000.0,
        "prefill_latency_ms": config.prefill_latency.as_secs_f64() * 1000.0,
        "backlog": config.backlog,
    }))
}

async fn list_requests(State(state): SharedState) -> Response {
    match serde_json::to_value(state.requests()) {
        Ok(requests) => json_ok(&requests),
        Err(error) => json_error(&ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            error.to_string(),
        )),
    }
}

async fn clear_requests(State(state): SharedState) -> StatusCode {
    state.clear_requests();
    StatusCode::NO_CONTENT
}

async fn get_fault(State(state): SharedState) -> Response {
    json_ok(&json!(FaultRequest {
        fault: state.fault()
    }))
}

async fn set_fault(State(state): SharedState, body: Bytes) -> Response {
    match serde_json::from_slice::<FaultRequest>(&body) {
        Ok(request) => {
            state.set_fault(request.fault);
            json_ok(&json!(request))
        }
        Err(error) => json_error(&ApiError::bad_request(format!(
            "expected {{\"fault\": \"none\" | \"hang\" | \"close\" | {{\"status\": 500}}}}: {error}"
        ))),
    }
}

async fn take_kv(State(state): SharedState, Path(id): Path<String>) -> Response {
    match state.kv.take(&id) {
        Some(entry) => match serde_json::to_value(entry) {
            Ok(entry) => json_ok(&entry),
            Err(error) => json_error(&ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                error.to_string(),
            )),
        },
        None => json_error(&ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "worker {} has no KV entry {id:?} (never produced, expired or already taken)",
                state.config.id
            ),
        )),
    }
}

async fn get_metrics_fault(State(state): SharedState) -> Response {
    json_ok(&json!(MetricsFaultRequest {
        fault: state.metrics_fault()
    }))
}

async fn set_metrics_fault(State(state): SharedState, body: Bytes) -> Response {
    match serde_json::from_slice::<MetricsFaultRequest>(&body) {
        Ok(request) => {
            state.set_metrics_fault(request.fault);
            json_ok(&json!(request))
        }
        Err(error) => json_error(&ApiError::bad_request(format!(
            "expected {{\"fault\": \"none\" | \"garbage\" | \"huge\" | \"hang\" | {{\"status\": 500}}}}: {error}"
        ))),
    }
}

async fn set_engine_load(State(state): SharedState, body: Bytes) -> Response {
    let update = match serde_json::from_slice::<EngineLoadOverride>(&body) {
        Ok(update) => update,
        Err(error) => {
            return json_error(&ApiError::bad_request(format!(
                "expected {{\"waiting\": 0, \"running\": 0, \"kv_cache_usage\": 0.0, \"rank\": 0 (optional)}}: {error}"
            )));
        }
    };
    match state.load.set_override(update) {
        Ok(()) => json_ok(&json!(update)),
        Err(message) => json_error(&ApiError::bad_request(message)),
    }
}

async fn clear_engine_load(State(state): SharedState) -> StatusCode {
    state.load.clear_overrides();
    StatusCode::NO_CONTENT
}

async fn serve_metrics(State(state): SharedState) -> Response {
    metrics::answer(&state).await
}

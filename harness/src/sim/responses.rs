//! The Responses API (`/v1/responses`) as vLLM serves it with
//! `VLLM_ENABLE_RESPONSES_API_STORE=1`: the response object, its SSE events, and the
//! responses a worker stores (`GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`,
//! `previous_response_id`, `background`).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Map, Value, json};

use super::openai::{
    ApiError, Endpoint, Generation, GenerationRequest, Prompt, StreamFrames, generated_text,
    sse_named, token_text,
};
use super::state::{InFlight, SimState, lock};

/// Responses a worker keeps (vLLM keeps every one; the simulator forgets the oldest).
pub(crate) const STORE_CAPACITY: usize = 10_000;

/// The status of a finished response. The simulated model always stops at its length
/// limit (`finish_reason: "length"`), which vLLM reports as `incomplete`, with
/// `incomplete_details.reason: "max_output_tokens"`.
pub(crate) const FINISHED_STATUS: &str = "incomplete";

/// A stored response: its body, and the conversation it ends (prompt items, then the
/// output text), which a request naming it in `previous_response_id` continues.
#[derive(Debug, Clone)]
struct StoredResponse {
    body: Value,
    conversation: Vec<Value>,
}

#[derive(Default)]
struct StoreInner {
    entries: HashMap<String, StoredResponse>,
    order: VecDeque<String>,
}

/// The responses of one worker, by id.
pub(crate) struct ResponseStore {
    capacity: usize,
    inner: Mutex<StoreInner>,
}

impl ResponseStore {
    pub(crate) fn new() -> Self {
        Self::with_capacity(STORE_CAPACITY)
    }

    pub(crate) fn with_capacity(capacity: usize) -> Self {
        ResponseStore {
            capacity: capacity.max(1),
            inner: Mutex::new(StoreInner::default()),
        }
    }

    /// Keeps `body` under its `id`, replacing a response with the same id.
    pub(crate) fn insert(&self, body: Value, conversation: Vec<Value>) {
        let Some(id) = body.get("id").and_then(Value::as_str).map(str::to_string) else {
            return;
        };
        let mut inner = lock(&self.inner);
        if !inner.entries.contains_key(&id) {
            while inner.entries.len() >= self.capacity {
                let Some(oldest) = inner.order.pop_front() else {
                    break;
                };
                inner.entries.remove(&oldest);
            }
            inner.order.push_back(id.clone());
        }
        inner
            .entries
            .insert(id, StoredResponse { body, conversation });
    }

    /// Stores a background response's final state, unless it was cancelled meanwhile
    /// (vLLM leaves a cancelled response as it is).
    fn finish(&self, body: Value, conversation: Vec<Value>) {
        let id = body.get("id").and_then(Value::as_str).unwrap_or_default();
        let cancelled = lock(&self.inner)
            .entries
            .get(id)
            .is_some_and(|stored| stored.body.get("status") == Some(&json!("cancelled")));
        if !cancelled {
            self.insert(body, conversation);
        }
    }

    pub(crate) fn get(&self, id: &str) -> Option<Value> {
        lock(&self.inner)
            .entries
            .get(id)
            .map(|stored| stored.body.clone())
    }

    fn conversation(&self, id: &str) -> Option<Vec<Value>> {
        lock(&self.inner)
            .entries
            .get(id)
            .map(|stored| stored.conversation.clone())
    }

    pub(crate) fn len(&self) -> usize {
        lock(&self.inner).entries.len()
    }

    /// vLLM's cancel: a queued or in-progress (background) response becomes `cancelled`
    /// and is answered; any other is refused with 400.
    pub(crate) fn cancel(&self, id: &str) -> Result<Value, ApiError> {
        let mut inner = lock(&self.inner);
        let Some(stored) = inner.entries.get_mut(id) else {
            return Err(not_found(id));
        };
        let status = stored.body.get("status").and_then(Value::as_str);
        if !matches!(status, Some("queued" | "in_progress")) {
            return Err(ApiError::invalid_request(
                StatusCode::BAD_REQUEST,
                "response_id",
                "Cannot cancel a synchronous response.",
            ));
        }
        if let Some(body) = stored.body.as_object_mut() {
            body.insert("status".into(), json!("cancelled"));
        }
        Ok(stored.body.clone())
    }
}

/// vLLM's answer for a response id the worker does not hold.
pub(crate) fn not_found(id: &str) -> ApiError {
    ApiError::invalid_request(
        StatusCode::NOT_FOUND,
        "response_id",
        format!("Response with id '{id}' not found."),
    )
}

/// The conversation a Responses request extends: with `previous_response_id`, the stored
/// conversation of that response (404 when this worker does not hold it) followed by this
/// request's prompt, which becomes its prompt. Empty for the other APIs.
pub(crate) fn continue_conversation(
    state: &SimState,
    request: &mut GenerationRequest,
) -> Result<Vec<Value>, ApiError> {
    let Prompt::Built(Value::Array(items)) = &request.prompt else {
        return Ok(Vec::new());
    };
    if request.endpoint != Endpoint::Responses {
        return Ok(Vec::new());
    }
    let Some(previous) = &request.previous_response_id else {
        return Ok(items.clone());
    };
    let Some(mut conversation) = state.responses.conversation(previous) else {
        return Err(not_found(previous));
    };
    conversation.extend(items.iter().cloned());
    request.set_built_prompt(Value::Array(conversation.clone()));
    Ok(conversation)
}

/// The request fields a response object repeats, with vLLM's defaults (`tool_choice` is
/// `none` without tools; `max_output_tokens` is the effective limit).
pub(crate) fn echo_fields(body: &Value, max_output_tokens: u32) -> Value {
    let field = |name: &str| body.get(name).cloned().unwrap_or(Value::Null);
    let or = |name: &str, default: Value| match body.get(name) {
        None | Some(Value::Null) => default,
        Some(value) => value.clone(),
    };
    let tools = or("tools", json!([]));
    let no_tools = tools.as_array().is_none_or(Vec::is_empty);
    let tool_choice = match body.get("tool_choice") {
        None | Some(Value::Null) if no_tools => json!("none"),
        Some(Value::String(choice)) if no_tools && (choice == "auto" || choice == "none") => {
            json!("none")
        }
        None | Some(Value::Null) => json!("auto"),
        Some(choice) => choice.clone(),
    };
    json!({
        "instructions": field("instructions"),
        "metadata": field("metadata"),
        "parallel_tool_calls": or("parallel_tool_calls", json!(true)),
        "temperature": or("temperature", json!(1.0)),
        "tool_choice": tool_choice,
        "tools": tools,
        "top_p": or("top_p", json!(1.0)),
        "background": or("background", json!(false)),
        "max_output_tokens": max_output_tokens,
        "max_tool_calls": field("max_tool_calls"),
        "previous_response_id": field("previous_response_id"),
        "prompt": null,
        "reasoning": field("reasoning"),
        "service_tier": or("service_tier", json!("auto")),
        "text": field("text"),
        "top_logprobs": null,
        "truncation": or("truncation", json!("disabled")),
        "user": field("user"),
        "presence_penalty": or("presence_penalty", json!(0.0)),
        "frequency_penalty": or("frequency_penalty", json!(0.0)),
    })
}

/// The output message item, finished.
fn message_item(generation: &Generation) -> Value {
    json!({
        "id": generation.item_id,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [output_text(generation, Value::Null)],
    })
}

fn output_text(generation: &Generation, logprobs: Value) -> Value {
    json!({
        "type": "output_text",
        "text": generated_text(generation.tokens),
        "annotations": [],
        "logprobs": logprobs,
    })
}

fn usage(generation: &Generation) -> Value {
    let output = u64::from(generation.tokens);
    json!({
        "input_tokens": generation.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": generation.cached_tokens,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": output,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": generation.prompt_tokens + output,
    })
}

/// vLLM's `ResponsesResponse` in `status`: finished ones carry the output, usage and
/// `kv_transfer_params` (top level, as vLLM returns it); `sim` when asked for.
fn response_object(generation: &Generation, status: &str, finished: bool, sim: bool) -> Value {
    let mut body = match &generation.echo {
        Value::Object(echo) => echo.clone(),
        _ => Map::new(),
    };
    let (output, usage, incomplete, kv) = if finished {
        (
            json!([message_item(generation)]),
            usage(generation),
            json!({"reason": "max_output_tokens"}),
            generation.kv_transfer_params.clone(),
        )
    } else {
        (json!([]), Value::Null, Value::Null, Value::Null)
    };
    for (key, value) in [
        ("id", json!(generation.id)),
        ("created_at", json!(generation.created)),
        ("object", json!("response")),
        ("model", json!(generation.model)),
        ("status", json!(status)),
        ("incomplete_details", incomplete),
        ("output", output),
        ("usage", usage),
        ("kv_transfer_params", kv),
        ("ec_transfer_params", Value::Null),
        ("input_messages", Value::Null),
        ("output_messages", Value::Null),
    ] {
        body.insert(key.into(), value);
    }
    if sim {
        body.insert("sim".into(), generation.sim.clone());
    }
    Value::Object(body)
}

/// The finished response: the non-streaming answer and what the worker stores.
pub(crate) fn finished_response(generation: &Generation) -> Value {
    response_object(generation, FINISHED_STATUS, true, true)
}

/// vLLM's event sequence: `response.created`, `response.in_progress`,
/// `response.output_item.added`, `response.content_part.added`, one
/// `response.output_text.delta` per token, `response.output_text.done`,
/// `response.content_part.done`, `response.output_item.done`, `response.completed` (whose
/// `response` is the finished response, `sim` included), numbered by `sequence_number`.
pub(crate) fn stream_frames(generation: &Generation) -> StreamFrames {
    let mut sequence = 0u64;
    let mut event = |kind: &str, mut fields: Value| {
        if let Some(fields) = fields.as_object_mut() {
            fields.insert("type".into(), json!(kind));
            fields.insert("sequence_number".into(), json!(sequence));
        }
        sequence += 1;
        sse_named(kind, &fields)
    };
    let item_id = &generation.item_id;
    let started = response_object(generation, "in_progress", false, false);
    let head = vec![
        event("response.created", json!({"response": started})),
        event("response.in_progress", json!({"response": started})),
        event(
            "response.output_item.added",
            json!({"output_index": 0, "item": {
                "id": item_id, "type": "message", "role": "assistant", "content": [],
                "status": "in_progress"}}),
        ),
        event(
            "response.content_part.added",
            json!({"output_index": 0, "item_id": item_id, "content_index": 0,
                   "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
        ),
    ];
    let tokens = (0..generation.tokens)
        .map(|index| {
            event(
                "response.output_text.delta",
                json!({"output_index": 0, "item_id": item_id, "content_index": 0,
                       "delta": token_text(index), "logprobs": []}),
            )
        })
        .collect();
    let text = generated_text(generation.tokens);
    let tail = vec![
        event(
            "response.output_text.done",
            json!({"output_index": 0, "item_id": item_id, "content_index": 0,
                   "text": text, "logprobs": []}),
        ),
        event(
            "response.content_part.done",
            json!({"output_index": 0, "item_id": item_id, "content_index": 0,
                   "part": output_text(generation, Value::Null)}),
        ),
        event(
            "response.output_item.done",
            json!({"output_index": 0, "item": message_item(generation)}),
        ),
        event(
            "response.completed",
            json!({"response": finished_response(generation)}),
        ),
    ];
    StreamFrames { head, tokens, tail }
}

/// A background request: stores and returns the `queued` response at once, and stores
/// the finished one after `latency` (unless cancelled by then). `conversation` ends with
/// the output, which a response continuing the queued one does not see yet.
pub(crate) fn start_background(
    state: &SimState,
    generation: Generation,
    conversation: Vec<Value>,
    latency: Duration,
    in_flight: InFlight,
) -> Value {
    let queued = response_object(&generation, "queued", false, true);
    let mut asked = conversation.clone();
    asked.pop();
    state.responses.insert(queued.clone(), asked);
    let store = state.responses.clone();
    let engine = state.engine.clone();
    let finished = finished_response(&generation);
    tokio::spawn(async move {
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        engine.stall().await;
        store.finish(finished, conversation);
        drop(in_flight);
    });
    queued
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn response(id: &str, status: &str) -> Value {
        json!({"id": id, "status": status})
    }

    #[test]
    fn only_background_responses_in_flight_can_be_cancelled() {
        let store = ResponseStore::new();
        store.insert(response("a", "queued"), vec![]);
        store.insert(response("b", FINISHED_STATUS), vec![]);
        assert_eq!(store.cancel("a").unwrap()["status"], "cancelled");
        let refused = store.cancel("b").unwrap_err();
        assert_eq!(refused.status, StatusCode::BAD_REQUEST);
        assert_eq!(refused.message, "Cannot cancel a synchronous response.");
        assert_eq!(
            store.cancel("a").unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(store.cancel("c").unwrap_err().status, StatusCode::NOT_FOUND);
        store.finish(response("a", FINISHED_STATUS), vec![]);
        assert_eq!(
            store.get("a").unwrap()["status"],
            "cancelled",
            "cancel sticks"
        );
    }

    #[test]
    fn the_oldest_response_is_forgotten_at_capacity() {
        let store = ResponseStore::with_capacity(2);
        store.insert(response("a", "x"), vec![json!("a")]);
        store.insert(response("b", "x"), vec![]);
        store.insert(response("a", "y"), vec![]);
        assert_eq!(store.len(), 2, "a replaced, not added");
        store.insert(response("c", "x"), vec![]);
        assert!(store.get("a").is_none());
        assert_eq!(store.get("b").unwrap()["status"], "x");
        assert!(store.get("c").is_some());
    }

    #[test]
    fn tool_choice_is_none_without_tools() {
        let echo = echo_fields(&json!({"input": "x"}), 16);
        assert_eq!(echo["tool_choice"], "none");
        assert_eq!(echo["tools"], json!([]));
        assert_eq!(echo["max_output_tokens"], 16);
        assert_eq!(echo["parallel_tool_calls"], true);
        let tools = json!({"tools": [{"type": "function", "name": "f"}]});
        assert_eq!(echo_fields(&tools, 1)["tool_choice"], "auto");
    }
}

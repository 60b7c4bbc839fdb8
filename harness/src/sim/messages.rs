//! Anthropic's Messages API (`/v1/messages`) as vLLM's `entrypoints/anthropic` answers
//! it: vLLM runs the request as a chat completion and translates the answer, so the id is
//! the chat completion's (`chatcmpl-<x-request-id>`), `kv_transfer_params` is a top-level
//! member of the message (absent when null: vLLM drops null fields), and stream events
//! follow Anthropic's SSE.

use serde_json::{Map, Value, json};

use super::openai::{Generation, StreamFrames, generated_text, sse_named, token_text};

/// vLLM's `AnthropicUsage` from the chat usage: `input_tokens` excludes the tokens read
/// from the prefix cache, which `cache_read_input_tokens` counts.
fn usage(generation: &Generation) -> Value {
    json!({
        "input_tokens": generation.prompt_tokens.saturating_sub(generation.cached_tokens),
        "output_tokens": generation.tokens,
        "cache_read_input_tokens": generation.cached_tokens,
    })
}

/// The non-streaming message (`stop_reason: "max_tokens"`: the simulated model stops at
/// its limit), with `kv_transfer_params` when there are any, and `sim`.
pub(crate) fn full_response(generation: &Generation) -> Value {
    let mut body = Map::new();
    body.insert("id".into(), json!(generation.id));
    body.insert("type".into(), json!("message"));
    body.insert("role".into(), json!("assistant"));
    body.insert(
        "content".into(),
        json!([{"type": "text", "text": generated_text(generation.tokens)}]),
    );
    body.insert("model".into(), json!(generation.model));
    body.insert("stop_reason".into(), json!("max_tokens"));
    body.insert("usage".into(), usage(generation));
    if !generation.kv_transfer_params.is_null() {
        body.insert(
            "kv_transfer_params".into(),
            generation.kv_transfer_params.clone(),
        );
    }
    body.insert("sim".into(), generation.sim.clone());
    Value::Object(body)
}

/// `message_start`, `content_block_start` (text) and the first `content_block_delta`
/// with the first token (vLLM starts the message on the first chat chunk), one
/// `content_block_delta` (`text_delta`) per further token, then `content_block_stop`,
/// `message_delta` (`stop_reason`, usage) and `message_stop`, which carries `sim`.
pub(crate) fn stream_frames(generation: &Generation) -> StreamFrames {
    let start = json!({"type": "message_start", "message": {
        "id": generation.id, "type": "message", "role": "assistant", "content": [],
        "model": generation.model, "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": generation.prompt_tokens, "output_tokens": 0}}});
    let block_start = json!({"type": "content_block_start",
                             "content_block": {"type": "text", "text": ""}, "index": 0});
    let tokens = (0..generation.tokens)
        .map(|index| {
            let delta = json!({"type": "content_block_delta",
                               "delta": {"type": "text_delta", "text": token_text(index)},
                               "index": 0});
            let delta = sse_named("content_block_delta", &delta);
            if index == 0 {
                format!(
                    "{}{}{delta}",
                    sse_named("message_start", &start),
                    sse_named("content_block_start", &block_start)
                )
            } else {
                delta
            }
        })
        .collect();
    let stop = json!({"type": "message_stop", "sim": generation.sim});
    let tail = vec![
        sse_named(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        ),
        sse_named(
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": "max_tokens", "stop_sequence": null},
                    "usage": usage(generation)}),
        ),
        sse_named("message_stop", &stop),
    ];
    StreamFrames {
        head: Vec::new(),
        tokens,
        tail,
    }
}

/// `/v1/messages/count_tokens`: `{"input_tokens", "context_management"}`.
pub(crate) fn count_tokens_response(input_tokens: u64) -> Value {
    json!({
        "input_tokens": input_tokens,
        "context_management": {"original_input_tokens": input_tokens},
    })
}

//! vLLM's token-in/token-out API (`/inference/v1/generate`, in vLLM 0.32's
//! `entrypoints/scale_out/token_in_token_out`, served with `--enable-scale-out` or
//! `--tokens-only`): the prompt is `token_ids`, the answer's choices carry the generated
//! `token_ids` (the simulated token `i` has id `i`), and `kv_transfer_params` is a
//! top-level member of the non-streaming answer (streamed chunks have none).

use serde_json::{Map, Value, json};

use super::openai::{Generation, StreamFrames, generated_text, sse_data, token_text};

fn output_mode(generation: &Generation) -> &'static str {
    if text_output(generation) {
        "text"
    } else {
        "tokens"
    }
}

fn text_output(generation: &Generation) -> bool {
    generation.echo.get("text_output") == Some(&Value::Bool(true))
}

/// A choice: `token_ids`, and `text` in `output_mode: "text"`.
fn choice(generation: &Generation, token_ids: Vec<u32>, text: String, finish: Value) -> Value {
    let mut choice = json!({
        "index": 0,
        "finish_reason": finish,
        "stop_reason": null,
        "token_ids": token_ids,
        "routed_experts": null,
        "sampling_mask": null,
        "weight_versions": null,
        "logprobs": null,
    });
    if let (Some(fields), true) = (choice.as_object_mut(), text_output(generation)) {
        fields.insert("text".into(), json!(text));
    }
    choice
}

/// `GenerateTokensResponse` (`GenerateTextResponse` in text mode), with `sim`.
pub(crate) fn full_response(generation: &Generation) -> Value {
    let choice = choice(
        generation,
        (0..generation.tokens).collect(),
        generated_text(generation.tokens),
        json!("length"),
    );
    let mut body = Map::new();
    for (key, value) in [
        ("request_id", json!(generation.id)),
        ("model", json!(generation.model)),
        ("created", json!(generation.created)),
        ("usage", generation.usage()),
        ("prompt_logprobs", Value::Null),
        ("prompt_token_id_logprobs", Value::Null),
        ("prompt_token_ids", Value::Null),
        ("mm_placeholders", Value::Null),
        ("metrics", Value::Null),
        ("kv_transfer_params", generation.kv_transfer_params.clone()),
        ("ec_transfer_params", Value::Null),
        ("output_mode", json!(output_mode(generation))),
        ("choices", json!([choice])),
        ("sim", generation.sim.clone()),
    ] {
        body.insert(key.into(), value);
    }
    Value::Object(body)
}

/// One `data:` chunk per token (the last with `finish_reason: "length"` and `sim`), the
/// usage chunk when `stream_options.include_usage`, then `data: [DONE]`.
pub(crate) fn stream_frames(generation: &Generation) -> StreamFrames {
    let last = generation.tokens.saturating_sub(1);
    let tokens = (0..generation.tokens)
        .map(|index| {
            let finish = if index == last {
                json!("length")
            } else {
                Value::Null
            };
            let mut chunk = json!({
                "request_id": generation.id,
                "usage": null,
                "output_mode": output_mode(generation),
                "choices": [choice(generation, vec![index], token_text(index), finish)],
            });
            if let (Some(fields), true) = (chunk.as_object_mut(), index == last) {
                fields.insert("sim".into(), generation.sim.clone());
            }
            sse_data(&chunk.to_string())
        })
        .collect();
    let mut tail = Vec::new();
    if generation.include_usage {
        let usage = json!({
            "request_id": generation.id,
            "usage": generation.usage(),
            "output_mode": output_mode(generation),
            "choices": [],
        });
        tail.push(sse_data(&usage.to_string()));
    }
    tail.push(sse_data("[DONE]"));
    StreamFrames {
        head: Vec::new(),
        tokens,
        tail,
    }
}

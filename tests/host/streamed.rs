//! One streamed completion from its headers to the stream's end, played as Envoy and the
//! bench's sim workers play it: a prompt of a given size, the prefill hop answered with
//! `kv_transfer_params`, the decode answer in 8 tokens and `[DONE]`. The ABI cost test counts
//! its crossings; `pinroute-lab bench` counts the filter's instructions in it.

use anyhow::{Result, bail, ensure};

use crate::Host;
use crate::types::Action;

/// What the prefill worker answers: the KV it kept, for the decode hop.
pub const PREFILL_ANSWER: &str = r#"{"id": "cmpl-1", "choices": [{"text": "x"}], "kv_transfer_params": {"remote_engine_id": "e-101", "remote_block_ids": [1, 2]}}"#;
/// Streamed chunks of the decode answer (8 tokens and `[DONE]`, as the bench's sims send).
pub const CHUNKS: usize = 9;

/// A completion request's headers with `extra` ones, pseudo-headers first, as Envoy hands
/// them over.
pub fn completion_headers(extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut headers: Vec<(String, String)> = [
        (":method", "POST"),
        (":path", "/v1/completions"),
        (":authority", "gateway"),
        ("content-type", "application/json"),
        ("x-request-id", "req-1"),
    ]
    .iter()
    .chain(extra)
    .map(|(n, v)| (n.to_string(), v.to_string()))
    .collect();
    headers.sort_by_key(|(n, _)| !n.starts_with(':'));
    headers
}

/// A streamed completion's body of about `prompt_bytes` bytes.
pub fn body(prompt_bytes: usize) -> String {
    let head = r#"{"model": "m", "max_tokens": 8, "stream": true, "prompt": ""#;
    let tail = r#""}"#;
    let words = "a ".repeat(prompt_bytes.saturating_sub(head.len() + tail.len()) / 2);
    format!("{head}{words}{tail}")
}

/// Sends one streamed completion with `pins` through the filter, answers its prefill hop
/// and streams the decode answer back, ending the stream.
pub fn complete(host: &mut Host, pins: &[(&str, &str)], body: &str) -> Result<()> {
    let ctx = host.new_http_stream()?;
    let action = host.request_headers(ctx, &completion_headers(pins), false)?;
    ensure!(
        action == Action::Pause,
        "the filter did not wait for the body"
    );
    host.request_body(ctx, body.as_bytes(), true)?;
    let calls = host.take_http_calls();
    let [call] = calls.as_slice() else {
        bail!("{} prefill hops, not one", calls.len());
    };
    host.http_call_response(call.token, &[(":status", "200")], PREFILL_ANSWER.as_bytes())?;
    ensure!(
        host.stream(ctx)?.request_forwarded,
        "the decode hop was not forwarded"
    );
    host.response_headers(
        ctx,
        &[(":status", "200"), ("content-type", "text/event-stream")],
        false,
    )?;
    for chunk in 0..CHUNKS {
        let data = format!("data: {{\"choices\": [{{\"text\": \"t{chunk}\"}}]}}\n\n");
        host.response_body(ctx, data.as_bytes(), chunk + 1 == CHUNKS)?;
    }
    host.done(ctx)?;
    if let Some(failure) = host.failure() {
        bail!("the VM failed: {failure}");
    }
    Ok(())
}

/// Requests before the counted ones: the VM's heap has grown to what a request needs (a
/// growth is reported to the memory gauge, one host call, not a cost of every request).
pub const WARM_UP_REQUESTS: usize = 3;

/// The wasm instructions the filter executes for one unpinned streamed completion of
/// `prompt_bytes`, the mean of `requests` after [`WARM_UP_REQUESTS`].
pub fn instructions_per_request(
    host: &mut Host,
    prompt_bytes: usize,
    requests: u64,
) -> Result<u64> {
    ensure!(requests > 0, "no request to count");
    let body = body(prompt_bytes);
    for _ in 0..WARM_UP_REQUESTS {
        complete(host, &[], &body)?;
    }
    let before = host.instructions();
    for _ in 0..requests {
        complete(host, &[], &body)?;
    }
    Ok((host.instructions() - before) / requests)
}

//! Usage that adds up through the real pair (`docs/semantics.md` §4, "Usage"): the client's
//! `usage` counts the prompt once, and its `cached_tokens` are the prefill engine's
//! prefix-cache hits — vLLM's prefill names them in the KV transfer parameters it returns,
//! its decode reports them when the gateway hands those parameters over unchanged — not
//! the tokens decode loaded (the whole prompt, which peers report: vllm-router #193).

use std::time::Instant;

use pinroute_harness::vllm::counter_total;
use serde_json::{Value, json};

use crate::Gateway;
use crate::client::{complete, completion};
use crate::handoff::PATIENCE;
use crate::scenarios::fresh_prompt;

const PREFIX_HITS: &str = "vllm:prefix_cache_hits_total";
const MAX_TOKENS: u32 = 4;

async fn prefill_hits(gateway: &Gateway) -> f64 {
    let metrics = gateway.pair.prefill().metrics().await.unwrap();
    counter_total(&metrics, PREFIX_HITS)
}

/// The prefill engine's hits since `before`, once its counter has moved (it publishes them
/// a moment after the answer).
async fn prefill_hits_since(gateway: &Gateway, before: f64) -> u64 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = prefill_hits(gateway).await;
        if now > before || Instant::now() >= deadline {
            return (now - before) as u64;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

fn cached_tokens(usage: &Value) -> Option<u64> {
    usage["prompt_tokens_details"]["cached_tokens"].as_u64()
}

pub async fn usage_adds_up(gateway: &Gateway) {
    let (prompt, tokens) = fresh_prompt(gateway, "usage").await;
    let body = completion(gateway, &prompt, MAX_TOKENS);
    let first = complete(gateway, &[], &body).await;
    first.assert_ok("usage, first");
    assert!(first.worker("prefill").is_some(), "took both hops");
    let usage = &first.json()["usage"];
    assert_eq!(
        (usage["prompt_tokens"].as_u64(), cached_tokens(usage)),
        (Some(tokens), Some(0)),
        "a new prompt: counted once, nothing found in the prefill's cache: {usage}"
    );
    assert_eq!(usage["total_tokens"], tokens + u64::from(MAX_TOKENS));

    let before = prefill_hits(gateway).await;
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let again = complete(gateway, &[], &streamed).await;
    again.assert_ok("usage, streamed");
    let usage = again.streamed_usage();
    let hits = prefill_hits_since(gateway, before).await;
    assert!(
        hits > 0 && hits < tokens,
        "the prefill found the prompt's whole blocks: {hits}"
    );
    assert_eq!(
        (usage["prompt_tokens"].as_u64(), cached_tokens(&usage)),
        (Some(tokens), Some(hits)),
        "the prefill's hits, not decode's loaded tokens: {usage}"
    );
}

//! Usage that adds up through the two hops (`docs/semantics.md` §4, "Usage"): the client's
//! `usage` counts the prompt once, and its `cached_tokens` are the prefill worker's
//! prefix-cache hits, which vLLM's prefill names in the KV transfer parameters
//! (`remote_prefill_cached_tokens`) and its decode reports. A gateway that rebuilt or
//! trimmed those parameters would leave decode counting every loaded token as cached (the
//! sims do, as vLLM before the field did).

use std::time::Duration;

use pinroute_harness::sim::{SimConfig, SimRole};
use pinroute_harness::stack::StackSpec;
use serde_json::json;

use crate::client::post;
use crate::{Deployment, start, wasm};

const PROMPT: &str = "Usage through two hops: the prefill worker computes the prompt, the decode \
                      worker loads its blocks and generates, and the client is billed for the \
                      prompt once, with the tokens the prefill found in its cache as cached.";

/// One prefill and one decode worker, both with a prefix cache.
async fn cached_pair() -> Deployment {
    let cached = |id, role| {
        SimConfig::new(id, role)
            .with_cache_blocks(1000)
            .with_token_latency(Duration::from_millis(1))
    };
    let workers = vec![cached(101, SimRole::Prefill), cached(201, SimRole::Decode)];
    start(StackSpec::new(workers, wasm())).await
}

/// The prefill worker's prefix-cache hits so far, in tokens.
fn prefill_hits(deployment: &Deployment) -> u64 {
    deployment.worker(101).unwrap().prompt_tokens().0
}

#[tokio::test]
async fn cached_tokens_are_the_prefill_workers_hits_streamed_and_not() {
    let deployment = cached_pair().await;
    let completion = json!({"model": "sim-model", "prompt": PROMPT, "max_tokens": 3});
    let first = post(&deployment, "/v1/completions", &[], &completion).await;
    first.assert_ok("first");
    assert_eq!(first.worker("prefill"), Some(101), "took both hops");
    let usage = &first.json()["usage"];
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"], 0,
        "a new prompt: the prefill found nothing, whatever decode loaded: {usage}"
    );
    assert_eq!(usage["total_tokens"], prompt_tokens + 3, "{usage}");

    let hits_before = prefill_hits(&deployment);
    let mut chat = json!({"model": "sim-model", "max_tokens": 3, "stream": true,
                          "stream_options": {"include_usage": true},
                          "messages": [{"role": "user", "content": PROMPT}]});
    let streamed = post(&deployment, "/v1/chat/completions", &[], &chat).await;
    streamed.assert_ok("streamed");
    let hits = prefill_hits(&deployment) - hits_before;
    let usage = streamed.streamed_usage();
    assert!(
        hits > 0,
        "the prefill found the prompt's blocks in its cache"
    );
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"], hits,
        "{usage}"
    );
    assert!(
        usage["prompt_tokens"].as_u64().unwrap() > hits,
        "not every prompt token counted as cached: {usage}"
    );

    chat["stream"] = json!(false);
    chat.as_object_mut().unwrap().remove("stream_options");
    let hits_before = prefill_hits(&deployment);
    let again = post(&deployment, "/v1/chat/completions", &[], &chat).await;
    let usage = &again.json()["usage"];
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"],
        prefill_hits(&deployment) - hits_before,
        "{usage}"
    );
}

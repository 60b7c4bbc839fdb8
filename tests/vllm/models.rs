//! Models and LoRA adapters behind one gateway (issue 23), on real engines: a NIXL pair whose
//! engines both serve the tiny model and its LoRA adapter (`--enable-lora --lora-modules
//! pinroute-tiny-lora=DIR`), each registry entry naming both in `models`.
//!
//! Each request must reach engines serving its model, and the engines say which model ran:
//!
//! - each engine's `/v1/models` lists the adapter with the model as its parent, and an engine
//!   answers 200 only for a model it serves (404 `NotFoundError` otherwise, shown below); the
//!   prefill hop's answer, as its tap recorded it, names the requested model;
//! - decode's `vllm:lora_requests_info` gauge stamps the time (unix seconds) of the last step it
//!   ran with the adapter (label `running_lora_adapters`): after the adapter's request it is
//!   later than the request was sent, after the base model's it is not. (The prefill engine's
//!   stamp is no witness: its one-token requests finish within the step the stamp is taken
//!   after.)
//! - decode continues the KV the prefill engine computed: its greedy text equals what the
//!   decode engine answers alone for that model (a `cache_salt` keeps that reference from
//!   sharing the pair's cached blocks), and the control shows that KV computed for the base
//!   model, continued with the adapter, answers otherwise. So the prefill hop ran the model the
//!   request named too.
//!
//! A model no engine serves is the gateway's 404 `model_not_found`, which no engine sees.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pinroute_harness::vllm::{
    DECODE_ID, PREFILL_ID, TINY_ADAPTER_NAME, TINY_MODEL_NAME, VllmServer, counter_where,
};
use serde_json::{Value, json};

use crate::Gateway;
use crate::client::{Reply, complete, post};
use crate::handoff::{PATIENCE, assert_handoff, evidence, nixl_pull_proof, raw_kv_transfer_params};
use crate::scenarios::{ScenarioFn, fresh_prompt, run_scenarios};
use crate::tap::Exchange;

const MAX_TOKENS: u32 = 8;
/// Decode's gauge of the adapters its steps ran, valued with the time of the last such step.
const LORA_INFO_GAUGE: &str = "vllm:lora_requests_info";
/// vLLM's per-path HTTP request counter (prometheus-fastapi-instrumentator).
const HTTP_REQUESTS_COUNTER: &str = "http_requests_total";
const NO_SUCH_MODEL: &str = "no-such-model";

pub async fn run_all(gateway: &Gateway) {
    assert_eq!(
        gateway.pair.served_models(),
        [TINY_MODEL_NAME, TINY_ADAPTER_NAME],
        "the pair was started without the adapter"
    );
    let scenarios: &[(&str, ScenarioFn)] = &[
        ("each engine serves the model and the adapter", |g| {
            Box::pin(engines_list_both(g))
        }),
        ("the model and the adapter each take two hops", |g| {
            Box::pin(each_model_takes_two_hops(g))
        }),
        (
            "the model's KV continued with the adapter answers otherwise (control)",
            |g| Box::pin(kv_of_another_model_control(g)),
        ),
        (
            "a model no engine serves is the gateway's 404, reaching no engine",
            |g| Box::pin(unknown_model(g)),
        ),
    ];
    run_scenarios(gateway, "models", scenarios).await;
}

/// A greedy completion of `prompt` by `model`, with the generated token ids.
fn completion_for(model: &str, prompt: &str, max_tokens: u32) -> Value {
    json!({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
           "ignore_eos": true, "return_token_ids": true})
}

/// The generated text and token ids of a completion answer.
fn generated(answer: &Value) -> (String, Value) {
    let choice = &answer["choices"][0];
    let text = choice["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"));
    (text.to_owned(), choice["token_ids"].clone())
}

/// What the decode engine alone answers `model` for `prompt`: one hop, computed from scratch
/// (the salt keeps the prompt's cached blocks, and the KV the pair moved, out of it).
async fn decode_alone(gateway: &Gateway, model: &str, prompt: &str) -> (String, Value) {
    let mut body = completion_for(model, prompt, MAX_TOKENS);
    body["cache_salt"] = json!("pinroute-models-reference");
    let reply = post(
        gateway,
        gateway.pair.decode().url("/v1/completions"),
        &[],
        &body,
    )
    .await;
    reply.assert_ok("the decode engine alone");
    assert_eq!(reply.json()["model"], model, "{}", reply.text);
    generated(&reply.json())
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The time decode last ran a step with the adapter (0 when never).
async fn decode_adapter_stamp(gateway: &Gateway) -> f64 {
    let label = format!("running_lora_adapters=\"{TINY_ADAPTER_NAME}\"");
    let metrics = gateway.pair.decode().metrics().await.unwrap();
    counter_where(&metrics, LORA_INFO_GAUGE, &label)
}

async fn model_ids(http: &reqwest::Client, url: String) -> Value {
    let reply = http.get(url).send().await.unwrap();
    assert_eq!(reply.status(), 200);
    reply.json().await.unwrap()
}

/// Both engines list the adapter, child of the model; the gateway lists the registry's models.
async fn engines_list_both(gateway: &Gateway) {
    for server in [gateway.pair.prefill(), gateway.pair.decode()] {
        let models = model_ids(&gateway.http, server.url("/v1/models")).await;
        let ids: Vec<&str> = models["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["id"].as_str())
            .collect();
        assert_eq!(
            ids,
            [TINY_MODEL_NAME, TINY_ADAPTER_NAME],
            "{}: {models}",
            server.name()
        );
        assert_eq!(models["data"][1]["parent"], TINY_MODEL_NAME, "{models}");
    }
    let listed = model_ids(&gateway.http, gateway.envoy.url("/v1/models")).await;
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, [TINY_MODEL_NAME, TINY_ADAPTER_NAME], "{listed}");
    assert_eq!(
        listed["data"][0]["owned_by"], "pinroute",
        "the gateway's own list: {listed}"
    );
    gateway.prefill_tap.take();
    gateway.decode_tap.take();
}

/// The one inference exchange `exchanges` hold.
fn inference(exchanges: Vec<Exchange>, hop: &str) -> Exchange {
    let mut inference: Vec<Exchange> = exchanges
        .into_iter()
        .filter(|e| e.path.starts_with("/v1/"))
        .collect();
    assert_eq!(inference.len(), 1, "{hop}: {inference:?}");
    inference.pop().unwrap()
}

fn body_model(body: &[u8]) -> Value {
    serde_json::from_slice::<Value>(body).unwrap()["model"].clone()
}

/// One unpinned completion of `model` through the gateway: both hops on the pair, each hop's
/// engine answering for `model`, decode pulling the prefill's KV over NIXL, and the text the
/// decode engine alone gives. Returns the text and token ids.
async fn two_hops_for(gateway: &Gateway, model: &str) -> (String, Value) {
    let tag = format!("models {model}");
    let (prompt, tokens) = fresh_prompt(gateway, &tag).await;
    let alone = decode_alone(gateway, model, &prompt).await;
    let before = evidence(gateway).await;
    let stamp_before = decode_adapter_stamp(gateway).await;
    let sent = unix_now();
    let reply = complete(gateway, &[], &completion_for(model, &prompt, MAX_TOKENS)).await;
    reply.assert_ok(&tag);
    assert_eq!(
        (reply.worker("prefill"), reply.worker("decode")),
        (Some(PREFILL_ID), Some(DECODE_ID)),
        "{tag}"
    );
    let answer = reply.json();
    assert_eq!(answer["model"], model, "{tag}: {}", reply.text);
    assert_eq!(answer["usage"]["prompt_tokens"], tokens, "{tag}");
    assert_eq!(answer["usage"]["completion_tokens"], MAX_TOKENS, "{tag}");
    let prefill = inference(gateway.prefill_tap.peek(), "prefill");
    assert_eq!(
        (prefill.status, body_model(&prefill.response_body)),
        (200, json!(model)),
        "{tag}: the prefill engine answered for another model"
    );
    let decode = inference(gateway.decode_tap.peek(), "decode");
    assert_eq!(body_model(&decode.request_body), json!(model), "{tag}");
    assert_handoff(gateway, &before, tokens, MAX_TOKENS.into(), &tag).await;
    let two_hops = generated(&answer);
    assert_eq!(
        two_hops, alone,
        "{tag}: decode continuing the prefill's KV answers otherwise than it does alone"
    );
    assert_adapter_stamp(gateway, model, stamp_before, sent).await;
    two_hops
}

/// Decode stamped a step with the adapter after `sent` exactly when `model` is the adapter.
async fn assert_adapter_stamp(gateway: &Gateway, model: &str, before: f64, sent: f64) {
    let deadline = Instant::now() + PATIENCE;
    if model == TINY_ADAPTER_NAME {
        loop {
            let stamp = decode_adapter_stamp(gateway).await;
            if stamp >= sent {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "decode never ran the adapter after {sent}: {LORA_INFO_GAUGE} stamps {stamp}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    // The engine stamps its steps as it reports them: give a stray one time to show.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stamp = decode_adapter_stamp(gateway).await;
    assert!(
        stamp == before && stamp < sent,
        "decode ran the adapter for a request of {model}: {LORA_INFO_GAUGE} stamps {stamp} \
         (before {before}, request sent at {sent})"
    );
}

/// The base model first (no adapter step may show while it runs), then the adapter; their
/// greedy texts differ.
async fn each_model_takes_two_hops(gateway: &Gateway) {
    let base = two_hops_for(gateway, TINY_MODEL_NAME).await;
    let adapter = two_hops_for(gateway, TINY_ADAPTER_NAME).await;
    assert!(
        !adapter.0.trim().is_empty(),
        "the adapter's text is empty: {adapter:?}"
    );
    // One prompt for both: the prompts above differ by their tags.
    let (prompt, _) = fresh_prompt(gateway, "models same prompt").await;
    let base_same = decode_alone(gateway, TINY_MODEL_NAME, &prompt).await;
    let adapter_same = decode_alone(gateway, TINY_ADAPTER_NAME, &prompt).await;
    assert_ne!(
        base_same, adapter_same,
        "the adapter changes nothing: the suite could not tell the models apart"
    );
    assert_ne!(base.1, adapter.1, "{base:?} {adapter:?}");
    eprintln!(
        "vllm suite (models): two hops each; one prompt alone on decode: the model {:?}, \
         the adapter {:?}",
        base_same.0, adapter_same.0
    );
}

/// The equality of text above proves which model the prefill hop ran only if decode's answer
/// depends on it: the prefill hop for the base model, straight to prefill, then the decode hop
/// for the adapter with its `kv_transfer_params`. Decode pulls the blocks over NIXL (vLLM does
/// not check the model KV was computed for) and answers otherwise than the adapter alone.
async fn kv_of_another_model_control(gateway: &Gateway) {
    let (prompt, tokens) = fresh_prompt(gateway, "models crossed").await;
    let alone = decode_alone(gateway, TINY_ADAPTER_NAME, &prompt).await;
    let mut prefill_hop = completion_for(TINY_MODEL_NAME, &prompt, 1);
    prefill_hop["kv_transfer_params"] = json!({"do_remote_decode": true, "do_remote_prefill": false,
        "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null});
    let before = evidence(gateway).await;
    let prefilled = post(
        gateway,
        gateway.pair.prefill().url("/v1/completions"),
        &[],
        &prefill_hop,
    )
    .await;
    prefilled.assert_ok("the base model's prefill hop");
    let named = raw_kv_transfer_params(prefilled.text.as_bytes())
        .unwrap()
        .expect("the prefill engine named no blocks");
    let mut decode_hop = completion_for(TINY_ADAPTER_NAME, &prompt, MAX_TOKENS);
    decode_hop["kv_transfer_params"] = serde_json::from_str(&named).unwrap();
    let crossed = post(
        gateway,
        gateway.pair.decode().url("/v1/completions"),
        &[],
        &decode_hop,
    )
    .await;
    crossed.assert_ok("the adapter's decode hop on the base model's KV");
    nixl_pull_proof(
        gateway,
        &before,
        &named,
        tokens,
        MAX_TOKENS.into(),
        PATIENCE,
    )
    .await
    .unwrap_or_else(|e| panic!("the crossed hand-off: {e}"));
    assert_ne!(
        generated(&crossed.json()),
        alone,
        "decode answered the same on the base model's KV: text equality proves nothing"
    );
}

/// Requests the engines' completion paths counted so far.
async fn engine_requests(server: &VllmServer) -> f64 {
    let metrics = server.metrics().await.unwrap();
    ["/v1/completions", "/v1/chat/completions"]
        .iter()
        .map(|path| {
            counter_where(
                &metrics,
                HTTP_REQUESTS_COUNTER,
                &format!("handler=\"{path}\""),
            )
        })
        .sum()
}

/// vLLM answers a model it does not serve with its own 404; through the gateway the answer is
/// `model_not_found`, and neither engine sees the request (taps, HTTP and token counters).
async fn unknown_model(gateway: &Gateway) {
    let (prompt, _) = fresh_prompt(gateway, "models unknown").await;
    let completion = completion_for(NO_SUCH_MODEL, &prompt, MAX_TOKENS);
    let direct = post(
        gateway,
        gateway.pair.decode().url("/v1/completions"),
        &[],
        &completion,
    )
    .await;
    assert_eq!(direct.status, 404, "{}", direct.text);
    assert_eq!(
        direct.json()["error"]["type"],
        "NotFoundError",
        "{}",
        direct.text
    );
    let chat = json!({"model": NO_SUCH_MODEL, "messages": [{"role": "user", "content": prompt}],
                      "max_completion_tokens": MAX_TOKENS});
    let before = evidence(gateway).await;
    let requests = (
        engine_requests(gateway.pair.prefill()).await,
        engine_requests(gateway.pair.decode()).await,
    );
    assert!(
        requests.0 > 0.0 && requests.1 > 0.0,
        "no {HTTP_REQUESTS_COUNTER} of the requests so far: {requests:?}"
    );
    let refused: [(&str, Reply); 3] = [
        ("completions", complete(gateway, &[], &completion).await),
        (
            "completions pinned",
            complete(
                gateway,
                &[("x-dynamo-worker-instance-id", "201")],
                &completion,
            )
            .await,
        ),
        (
            "chat",
            post(
                gateway,
                gateway.envoy.url("/v1/chat/completions"),
                &[],
                &chat,
            )
            .await,
        ),
    ];
    for (what, reply) in refused {
        let message = reply.error(404, "model_not_found");
        assert!(message.contains(NO_SUCH_MODEL), "{what}: {message}");
        assert_eq!(
            (reply.worker("prefill"), reply.worker("decode")),
            (None, None),
            "{what}"
        );
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (prefill_seen, decode_seen) = (gateway.prefill_tap.take(), gateway.decode_tap.take());
    assert!(
        prefill_seen.is_empty() && decode_seen.is_empty(),
        "a request for {NO_SUCH_MODEL} reached an engine: {prefill_seen:?} {decode_seen:?}"
    );
    assert_eq!(
        evidence(gateway).await.since(&before),
        Default::default(),
        "an engine computed something"
    );
    assert_eq!(
        (
            engine_requests(gateway.pair.prefill()).await,
            engine_requests(gateway.pair.decode()).await,
        ),
        requests,
        "an engine counted a request"
    );
}

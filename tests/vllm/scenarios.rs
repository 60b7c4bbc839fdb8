//! The scenarios, in the order they run against the one pair.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use pinroute_harness::vllm::{Connector, DECODE_ID, KvEvidence, PREFILL_ID, expected_kv_tokens};
use serde_json::{Value, json};

use crate::Gateway;
use crate::client::{Reply, complete, completion, post, token_count};
use crate::handoff::{
    assert_evidence, assert_handoff, evidence, example_handoff, nixl_pull_proof,
    raw_kv_transfer_params,
};
use crate::sdk::run_sdk_script;

/// Filler for prompts: long enough for ≥ 70 tokens (shorter prompts can crash the CPU engine,
/// see docs/real-engines.md), and at least two 32-token KV blocks to hand over.
const FILLER: &str = "the quick brown fox jumps over the lazy dog while a prefill worker computes \
                      the KV cache of the prompt and a decode worker generates the tokens";
const MAX_TOKENS: u32 = 8;
const PREFILL: &str = "101";
const DECODE: &str = "201";

pub async fn run_all(gateway: &Gateway) {
    let scenarios: &[(&str, ScenarioFn)] = match gateway.connector {
        Connector::Example => &[
            ("decode without a prefill hop loads no KV (control)", |g| {
                Box::pin(control_no_prefill_hop(g))
            }),
            ("decode pin only (the original Dynamo bug)", |g| {
                Box::pin(decode_pin_only(g))
            }),
            ("prefill pin only", |g| Box::pin(prefill_pin_only(g))),
            ("both pins with ranks", |g| Box::pin(both_pins(g))),
            ("body pins", |g| Box::pin(body_pins(g))),
            ("chat completions take two hops", |g| {
                Box::pin(chat_two_hops(g))
            }),
            ("streaming", |g| Box::pin(streaming(g))),
            ("a client's kv_transfer_params are dropped", |g| {
                Box::pin(client_kv_transfer_params_dropped(g))
            }),
            ("bad pins are typed errors that reach no engine", |g| {
                Box::pin(bad_pins(g))
            }),
            ("other paths go to decode", |g| Box::pin(other_paths(g))),
            ("the client's X-Request-Id reaches the engines", |g| {
                Box::pin(client_request_id_reaches_the_engines(g))
            }),
            ("behind an endpoint picker (llm-d's protocol)", |g| {
                Box::pin(behind_a_picker(g))
            }),
        ],
        // About two seconds a request on 2 cores: the scenarios where the hand-off differs.
        Connector::Nixl => &[
            ("decode pin only (the original Dynamo bug)", |g| {
                Box::pin(decode_pin_only(g))
            }),
            ("prefill pin only", |g| Box::pin(prefill_pin_only(g))),
            ("both pins with ranks", |g| Box::pin(both_pins(g))),
            ("streaming", |g| Box::pin(streaming(g))),
            ("chat completions take two hops", |g| {
                Box::pin(chat_two_hops(g))
            }),
            ("a client's kv_transfer_params are dropped", |g| {
                Box::pin(client_kv_transfer_params_dropped(g))
            }),
            ("behind an endpoint picker (llm-d's protocol)", |g| {
                Box::pin(behind_a_picker(g))
            }),
            ("the Responses API takes two hops; its follow-up one", |g| {
                Box::pin(responses_two_hops(g))
            }),
            ("Anthropic's Messages API takes two hops", |g| {
                Box::pin(messages_two_hops(g))
            }),
            (
                "usage counts the prompt once, cached tokens the prefill's hits",
                |g| Box::pin(crate::usage::usage_adds_up(g)),
            ),
            ("one trace across the gateway and both engines", |g| {
                Box::pin(crate::traces::one_trace_across_the_gateway_and_both_engines(g))
            }),
            ("the token-in, token-out generate API takes two hops", |g| {
                Box::pin(generate_two_hops(g))
            }),
            ("the OpenAI and Anthropic SDKs take two hops", |g| {
                Box::pin(sdks_two_hops(g))
            }),
            // Last: the prefill's unread blocks stay leased (30 s) and would then expire.
            (
                "decode without the prefill's kv_transfer_params recomputes (control)",
                |g| Box::pin(nixl_control_without_params(g)),
            ),
        ],
    };
    run_scenarios(gateway, gateway.connector.as_str(), scenarios).await;
}

/// Runs each scenario in turn, the pair checked alive after each, timed under `suite`.
pub async fn run_scenarios(gateway: &Gateway, suite: &str, scenarios: &[(&str, ScenarioFn)]) {
    for (name, scenario) in scenarios {
        let started = Instant::now();
        scenario(gateway).await;
        gateway
            .pair
            .ensure_running()
            .unwrap_or_else(|e| panic!("after {name:?}: {e:#}"));
        eprintln!(
            "vllm suite ({suite}): ok   {name} ({:.1?})",
            started.elapsed()
        );
    }
}

pub type Scenario<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
pub type ScenarioFn = for<'a> fn(&'a Gateway) -> Scenario<'a>;
/// Pin headers, the error code they must produce, words its message must contain.
type BadPin<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a [&'a str]);

/// A prompt no earlier request used (so no prefix cache has it), of at least 70 tokens, whose KV
/// ExampleConnector can hand over; and its token count.
pub async fn fresh_prompt(gateway: &Gateway, tag: &str) -> (String, u64) {
    let mut prompt = format!("[{tag}] {FILLER}, and {FILLER}.");
    loop {
        let tokens = token_count(gateway, &prompt).await;
        if tokens >= 70 && expected_kv_tokens(tokens) > 0 {
            return (prompt, tokens);
        }
        prompt.push_str(" ok");
    }
}

/// A completion that took both hops, on the expected workers, with decode's text.
fn assert_two_hops(reply: &Reply, what: &str) -> u64 {
    reply.assert_ok(what);
    assert_eq!(
        (reply.worker("prefill"), reply.worker("decode")),
        (Some(PREFILL_ID), Some(DECODE_ID)),
        "{what}"
    );
    let body = reply.json();
    let text = body["choices"][0]["text"].as_str().unwrap();
    assert!(!text.is_empty(), "{what}: empty completion");
    assert_eq!(
        body["usage"]["completion_tokens"], MAX_TOKENS,
        "{what}: {}",
        reply.text
    );
    body["usage"]["prompt_tokens"].as_u64().unwrap()
}

async fn two_hop_completion(
    gateway: &Gateway,
    tag: &str,
    headers: &[(&str, &str)],
    edit: impl FnOnce(&mut Value),
) {
    let (prompt, tokens) = fresh_prompt(gateway, tag).await;
    let mut body = completion(gateway, &prompt, MAX_TOKENS);
    edit(&mut body);
    let before = evidence(gateway).await;
    let reply = complete(gateway, headers, &body).await;
    let prompt_tokens = assert_two_hops(&reply, tag);
    assert_eq!(prompt_tokens, tokens, "{tag}");
    assert_handoff(gateway, &before, tokens, MAX_TOKENS.into(), tag).await;
}

/// The counters prove a hand-off only if a request that skips the prefill hop moves nothing:
/// straight to decode, a fresh prompt is computed there and nothing is loaded.
async fn control_no_prefill_hop(gateway: &Gateway) {
    let (prompt, tokens) = fresh_prompt(gateway, "control").await;
    let before = evidence(gateway).await;
    let url = gateway.pair.decode().url("/v1/completions");
    post(gateway, url, &[], &completion(gateway, &prompt, MAX_TOKENS))
        .await
        .assert_ok("direct to decode");
    let expected = KvEvidence {
        decode_generation_tokens: MAX_TOKENS.into(),
        decode_prompt_tokens: tokens as f64,
        decode_computed_tokens: tokens as f64,
        stored_prompts: 1, // decode, as ExampleConnector does for any prompt it computed
        ..KvEvidence::default()
    };
    assert_evidence(gateway, &before, &expected, "a request straight to decode").await;
}

/// The NIXL proof holds only for a real pull: the prefill hop is sent (straight to prefill, as
/// the gateway sends it) and names its blocks, then decode gets the same request without the
/// prefill's `kv_transfer_params`. Decode computes the prompt itself, nothing is transferred, and
/// the proof that accepts every two-hop request above must reject this one.
async fn nixl_control_without_params(gateway: &Gateway) {
    let (prompt, tokens) = fresh_prompt(gateway, "nixl-control").await;
    let mut prefill_hop = completion(gateway, &prompt, 1);
    prefill_hop["kv_transfer_params"] = json!({"do_remote_decode": true, "do_remote_prefill": false,
        "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null});
    let before = evidence(gateway).await;
    let url = gateway.pair.prefill().url("/v1/completions");
    let prefilled = post(gateway, url, &[], &prefill_hop).await;
    prefilled.assert_ok("prefill hop");
    let named = raw_kv_transfer_params(prefilled.text.as_bytes())
        .unwrap()
        .expect("the prefill engine named no blocks");
    let url = gateway.pair.decode().url("/v1/completions");
    post(gateway, url, &[], &completion(gateway, &prompt, MAX_TOKENS))
        .await
        .assert_ok("straight to decode, without kv_transfer_params");
    let recomputed = KvEvidence {
        prefill_prompt_tokens: tokens as f64,
        prefill_generation_tokens: 1.0,
        decode_generation_tokens: MAX_TOKENS.into(),
        decode_prompt_tokens: tokens as f64,
        decode_computed_tokens: tokens as f64,
        ..KvEvidence::default()
    };
    assert_evidence(gateway, &before, &recomputed, "decode without the params").await;
    let proof = nixl_pull_proof(
        gateway,
        &before,
        &named,
        tokens,
        MAX_TOKENS.into(),
        Duration::from_secs(2),
    )
    .await;
    assert!(
        proof.is_err(),
        "the NIXL proof accepted a request decode computed itself"
    );
}

async fn decode_pin_only(gateway: &Gateway) {
    two_hop_completion(
        gateway,
        "decode-pin",
        &[("x-dynamo-worker-instance-id", DECODE)],
        |_| {},
    )
    .await;
}

/// `docs/semantics.md` §4: the client's `X-Request-Id` is the one both hops carry (vLLM names its
/// answer `cmpl-<X-Request-Id>`).
async fn client_request_id_reaches_the_engines(gateway: &Gateway) {
    let headers = [
        ("x-dynamo-worker-instance-id", DECODE),
        ("x-request-id", "pinroute-vllm-request-id"),
    ];
    let (prompt, _) = fresh_prompt(gateway, "request-id").await;
    let reply = complete(gateway, &headers, &completion(gateway, &prompt, MAX_TOKENS)).await;
    assert_two_hops(&reply, "request id");
    let id = reply.json()["id"].as_str().unwrap().to_owned();
    assert!(
        id.contains("pinroute-vllm-request-id"),
        "the client's X-Request-Id was replaced: decode answered {id}"
    );
}

/// `docs/semantics.md` §9: the picker names both engines by address, pinroute performs the two
/// hops, the KV is handed over, and the picker hears which endpoint served.
async fn behind_a_picker(gateway: &Gateway) {
    let decode = gateway.decode_tap.address().to_string();
    let prefill = gateway.prefill_tap.address().to_string();
    let plan = json!({"set": {"x-gateway-destination-endpoint": decode,
                              "x-prefiller-host-port": prefill}})
    .to_string();
    let (prompt, tokens) = fresh_prompt(gateway, "picker").await;
    gateway.picker.clear();
    let before = evidence(gateway).await;
    let url = gateway.behind_picker.url("/v1/completions");
    let headers = [("x-stand-in-picker", plan.as_str())];
    let reply = post(
        gateway,
        url,
        &headers,
        &completion(gateway, &prompt, MAX_TOKENS),
    )
    .await;
    assert_eq!(assert_two_hops(&reply, "behind a picker"), tokens);
    assert_handoff(
        gateway,
        &before,
        tokens,
        MAX_TOKENS.into(),
        "behind a picker",
    )
    .await;
    let seen = gateway.picker.seen();
    let served = seen.last().map(|s| s.served.clone()).unwrap_or_default();
    let served = |key: &str| {
        served
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        served("x-gateway-destination-endpoint-served"),
        Some(decode)
    );
    assert_eq!(served("x-pinroute-prefill-endpoint-served"), Some(prefill));
}

async fn prefill_pin_only(gateway: &Gateway) {
    two_hop_completion(
        gateway,
        "prefill-pin",
        &[("x-dynamo-prefill-instance-id", PREFILL)],
        |_| {},
    )
    .await;
}

async fn both_pins(gateway: &Gateway) {
    let headers = [
        ("x-dynamo-prefill-instance-id", PREFILL),
        ("x-dynamo-prefill-dp-rank", "0"),
        ("x-dynamo-worker-instance-id", DECODE),
        ("x-dynamo-dp-rank", "0"),
    ];
    two_hop_completion(gateway, "both-pins", &headers, |_| {}).await;
}

async fn body_pins(gateway: &Gateway) {
    let pins = json!({"prefill_worker_id": 101, "decode_worker_id": 201, "dp_rank": 0});
    two_hop_completion(gateway, "body-pins", &[], |body| body["nvext"] = pins).await;
}

async fn chat_two_hops(gateway: &Gateway) {
    let (content, _) = fresh_prompt(gateway, "chat").await;
    let body = json!({"model": gateway.pair.served_model_name(), "messages": [{"role": "user", "content": content}],
                      "max_completion_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": true});
    let before = evidence(gateway).await;
    let reply = post(
        gateway,
        gateway.envoy.url("/v1/chat/completions"),
        &[("x-dynamo-worker-instance-id", DECODE)],
        &body,
    )
    .await;
    reply.assert_ok("chat");
    assert_eq!(
        (reply.worker("prefill"), reply.worker("decode")),
        (Some(PREFILL_ID), Some(DECODE_ID))
    );
    let answer = reply.json();
    assert!(
        !answer["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .is_empty(),
        "{}",
        reply.text
    );
    let tokens = answer["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(tokens >= 70, "{tokens}");
    if gateway.connector == Connector::Nixl {
        assert_handoff(gateway, &before, tokens, MAX_TOKENS.into(), "chat").await;
        return;
    }
    let mut expected = example_handoff(tokens, MAX_TOKENS.into());
    if expected_kv_tokens(tokens) == 0 {
        // The chat template made a prompt ExampleConnector cannot hand over (n - 1 block-aligned).
        (
            expected.decode_hit_lines,
            expected.decode_inject_lines,
            expected.stored_prompts,
        ) = (0, 0, 2);
    }
    assert_evidence(gateway, &before, &expected, "chat").await;
}

async fn streaming(gateway: &Gateway) {
    let (prompt, tokens) = fresh_prompt(gateway, "stream").await;
    let mut body = completion(gateway, &prompt, MAX_TOKENS);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let before = evidence(gateway).await;
    let reply = complete(gateway, &[("x-dynamo-worker-instance-id", DECODE)], &body).await;
    reply.assert_ok("stream");
    assert!(
        reply
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream"),
        "{:?}",
        reply.headers
    );
    assert_eq!(reply.worker("prefill"), Some(PREFILL_ID));
    let events: Vec<&str> = reply
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{}", reply.text);
    let chunks: Vec<Value> = events
        .iter()
        .filter(|e| **e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert!(!text.is_empty(), "{}", reply.text);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        (
            usage["prompt_tokens"].as_u64(),
            usage["completion_tokens"].as_u64()
        ),
        (Some(tokens), Some(MAX_TOKENS.into()))
    );
    // The detokenizer may hold back a token that ends inside a UTF-8 sequence: chunks ≤ tokens.
    let text_chunks = chunks
        .iter()
        .filter(|c| c["choices"][0]["text"].is_string())
        .count();
    assert!(
        (2..=MAX_TOKENS as usize).contains(&text_chunks),
        "not streamed token by token: {}",
        reply.text
    );
    assert_handoff(gateway, &before, tokens, MAX_TOKENS.into(), "stream").await;
}

/// vLLM refuses a non-object `kv_transfer_params` (400): through the gateway the same body
/// succeeds, so neither hop received the client's copy. A NIXL-shaped object naming another host
/// changes nothing either: the KV still comes from the prefill instance.
async fn client_kv_transfer_params_dropped(gateway: &Gateway) {
    let (prompt, _) = fresh_prompt(gateway, "kv-probe").await;
    let mut probe = completion(gateway, &prompt, MAX_TOKENS);
    probe["kv_transfer_params"] = json!("from-the-client");
    let url = gateway.pair.decode().url("/v1/completions");
    let direct = post(gateway, url, &[], &probe).await;
    assert_eq!(
        direct.status, 400,
        "vLLM must refuse the probe itself: {}",
        direct.text
    );
    two_hop_completion(
        gateway,
        "kv-string",
        &[("x-dynamo-worker-instance-id", DECODE)],
        |body| {
            body["kv_transfer_params"] = json!("from-the-client");
        },
    )
    .await;
    let forged = json!({"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": "forged",
                        "remote_block_ids": [0, 1], "remote_host": "10.1.2.3", "remote_port": 5600});
    two_hop_completion(
        gateway,
        "kv-object",
        &[("x-dynamo-worker-instance-id", DECODE)],
        |body| {
            body["kv_transfer_params"] = forged;
        },
    )
    .await;
}

async fn bad_pins(gateway: &Gateway) {
    let cases: &[BadPin<'_>] = &[
        (
            &[("x-dynamo-worker-instance-id", "999")],
            "unknown_worker",
            &["999", "decode hop"],
        ),
        (
            &[("x-dynamo-prefill-instance-id", "999")],
            "unknown_worker",
            &["999", "prefill hop"],
        ),
        (
            &[("x-dynamo-worker-instance-id", PREFILL)],
            "wrong_worker_role",
            &["101", "decode hop"],
        ),
        (
            &[("x-dynamo-prefill-instance-id", DECODE)],
            "wrong_worker_role",
            &["201", "prefill hop"],
        ),
        (
            &[
                ("x-dynamo-worker-instance-id", DECODE),
                ("x-dynamo-dp-rank", "1"),
            ],
            "dp_rank_out_of_range",
            &["201", "[0, 1)"],
        ),
        (
            &[
                ("x-dynamo-prefill-instance-id", PREFILL),
                ("x-dynamo-prefill-dp-rank", "1"),
            ],
            "dp_rank_out_of_range",
            &["101", "prefill hop"],
        ),
        (
            &[("x-dynamo-worker-instance-id", "abc")],
            "invalid_header",
            &["x-dynamo-worker-instance-id"],
        ),
        (
            &[("x-dynamo-prefill-dp-rank", "-1")],
            "invalid_header",
            &["x-dynamo-prefill-dp-rank"],
        ),
    ];
    let (prompt, _) = fresh_prompt(gateway, "bad-pins").await;
    let body = completion(gateway, &prompt, MAX_TOKENS);
    let before = evidence(gateway).await;
    for (headers, code, words) in cases {
        let message = complete(gateway, headers, &body).await.error(400, code);
        for word in *words {
            assert!(
                message.contains(word),
                "{headers:?}: {message:?} lacks {word:?}"
            );
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        evidence(gateway).await.since(&before),
        KvEvidence::default(),
        "a refused request reached an engine"
    );
}

async fn other_paths(gateway: &Gateway) {
    let reply = gateway
        .http
        .get(gateway.envoy.url("/v1/models"))
        .header("x-dynamo-worker-instance-id", DECODE)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    assert_eq!(
        reply.headers().get("x-pinroute-decode-worker").unwrap(),
        DECODE
    );
    assert!(reply.headers().get("x-pinroute-prefill-worker").is_none());
    let models: Value = reply.json().await.unwrap();
    assert_eq!(models["data"][0]["id"], gateway.pair.served_model_name());
    let health = gateway
        .http
        .get(gateway.envoy.url("/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

/// The Responses API's two hops: prefill's KV is what decode loads, the answer is the decode
/// engine's, and its id names the decode worker, which a follow-up then reaches in one hop.
async fn responses_two_hops(gateway: &Gateway) {
    let (prompt, _) = fresh_prompt(gateway, "responses").await;
    let body = json!({"model": gateway.pair.served_model_name(), "input": prompt,
                      "max_output_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": true});
    let answer = generation_two_hops(gateway, "/v1/responses", &body, "responses").await;
    let id = answer["id"].as_str().unwrap();
    assert!(id.starts_with(&format!("resp_w{DECODE}_")), "{answer}");
    let follow_up = json!({"model": gateway.pair.served_model_name(), "input": "and then?",
                           "previous_response_id": id, "max_output_tokens": 2});
    let reply = post(gateway, gateway.envoy.url("/v1/responses"), &[], &follow_up).await;
    reply.assert_ok("a follow-up");
    assert_eq!(
        (reply.worker("prefill"), reply.worker("decode")),
        (None, Some(DECODE_ID)),
        "one hop, to the engine that stored {id}"
    );
    assert_eq!(reply.json()["previous_response_id"], id);
    let read = gateway
        .http
        .get(gateway.envoy.url(&format!("/v1/responses/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200);
    let stored: Value = read.json().await.unwrap();
    assert_eq!(stored["id"], id);
    // What the follow-up and the read sent must not be mistaken for the next hand-off.
    gateway.prefill_tap.take();
    gateway.decode_tap.take();
}

/// Anthropic's Messages API: two hops, the prefill engine's thinking-budget check skipped.
async fn messages_two_hops(gateway: &Gateway) {
    let (prompt, _) = fresh_prompt(gateway, "messages").await;
    let body = json!({"model": gateway.pair.served_model_name(), "max_tokens": MAX_TOKENS,
                      "temperature": 0, "messages": [{"role": "user", "content": prompt}]});
    let answer = generation_two_hops(gateway, "/v1/messages", &body, "messages").await;
    assert_eq!(answer["type"], "message", "{answer}");
}

/// vLLM's token-in, token-out API: the limits inside `sampling_params`.
async fn generate_two_hops(gateway: &Gateway) {
    let (prompt, tokens) = fresh_prompt(gateway, "generate").await;
    let body = json!({"model": gateway.pair.served_model_name(), "prompt": prompt});
    let tokenized = post(gateway, gateway.pair.decode().url("/tokenize"), &[], &body).await;
    let token_ids = tokenized.json()["tokens"].clone();
    assert_eq!(token_ids.as_array().map(Vec::len), Some(tokens as usize));
    let body = json!({"model": gateway.pair.served_model_name(), "token_ids": token_ids,
                      "sampling_params": {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": true}});
    let answer = generation_two_hops(gateway, "/inference/v1/generate", &body, "generate").await;
    let generated = answer["choices"][0]["token_ids"].as_array().map(Vec::len);
    assert_eq!(generated, Some(MAX_TOKENS as usize), "{answer}");
}

/// One request on `path` through both hops, pinned to the pair, whose decode engine took the
/// prefill engine's KV: the answer.
async fn generation_two_hops(gateway: &Gateway, path: &str, body: &Value, what: &str) -> Value {
    let before = evidence(gateway).await;
    let reply = post(
        gateway,
        gateway.envoy.url(path),
        &[("x-dynamo-worker-instance-id", DECODE)],
        body,
    )
    .await;
    reply.assert_ok(what);
    assert_eq!(
        (reply.worker("prefill"), reply.worker("decode")),
        (Some(PREFILL_ID), Some(DECODE_ID)),
        "{what}: {}",
        reply.text
    );
    let answer = reply.json();
    let usage = &answer["usage"];
    let tokens = usage["input_tokens"]
        .as_u64()
        .or(usage["prompt_tokens"].as_u64());
    let generated = usage["output_tokens"]
        .as_u64()
        .or(usage["completion_tokens"].as_u64());
    let (Some(tokens), Some(generated)) = (tokens, generated) else {
        panic!("{what}: no usage in {answer}");
    };
    assert!(tokens >= 70, "{what}: {tokens} prompt tokens");
    assert_handoff(gateway, &before, tokens, generated, what).await;
    answer
}

const SDK_SCRIPT: &str = "tests/vllm/sdk_clients.py";

/// The official OpenAI and Anthropic SDKs, as users run them: the Responses and Messages
/// APIs, streamed and not, each through both hops, and the decode engine pulled each one's KV.
async fn sdks_two_hops(gateway: &Gateway) {
    let (prompt, _) = fresh_prompt(gateway, "sdk").await;
    let before = evidence(gateway).await;
    let model = gateway.pair.served_model_name().to_string();
    let seen = run_sdk_script(SDK_SCRIPT, vec![gateway.envoy.url(""), model, prompt]).await;
    for call in ["response", "response_stream", "message", "message_stream"] {
        let hops = (
            &seen[call]["status"],
            &seen[call]["prefill"],
            &seen[call]["decode"],
        );
        assert_eq!(
            hops,
            (&json!(200), &json!(PREFILL), &json!(DECODE)),
            "{call}: {seen}"
        );
    }
    for call in ["response", "message"] {
        assert!(
            seen[call]["text"].as_str().is_some_and(|t| !t.is_empty()),
            "{seen}"
        );
    }
    assert_eq!(
        seen["response_stream"]["last"], "response.completed",
        "{seen}"
    );
    assert_eq!(seen["message_stream"]["last"], "message_stop", "{seen}");
    for stream in ["response_stream", "message_stream"] {
        assert!(
            seen[stream]["deltas"].as_u64() >= Some(2),
            "{stream}: {seen}"
        );
    }
    if gateway.connector == Connector::Nixl {
        // The engines' counters trail the answers by up to a few seconds.
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut moved = evidence(gateway).await.since(&before);
        while moved.decode_nixl_transfers < 4.0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(250)).await;
            moved = evidence(gateway).await.since(&before);
        }
        assert_eq!(
            (moved.decode_nixl_transfers, moved.decode_nixl_failures),
            (4.0, 0.0),
            "decode pulled each request's KV: {moved:?}"
        );
        assert!(moved.decode_external_kv_tokens >= 4.0 * 64.0, "{moved:?}");
    }
    gateway.prefill_tap.take();
    gateway.decode_tap.take();
}

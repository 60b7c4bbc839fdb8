//! End-to-end tests of the simulator over real HTTP on 127.0.0.1.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use super::{EngineLoadOverride, Fault, MetricsFault, SimClient, SimConfig, SimRole, SimWorker};

const PROMPT: &str = "the quick brown fox jumps over the lazy dog";

async fn start(id: u64, role: SimRole, dp_size: u32) -> SimWorker {
    let config = SimConfig::new(id, role)
        .with_dp_size(dp_size)
        .with_token_latency(Duration::from_millis(1));
    SimWorker::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    text: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {}", self.text))
    }

    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
    }

    fn error_message(&self) -> String {
        self.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

async fn send(request: reqwest::RequestBuilder) -> Reply {
    let response = request.send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    Reply {
        status,
        headers,
        text,
    }
}

async fn post(worker: &SimWorker, path: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
    let mut request = client().post(format!("{}{path}", worker.url())).json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    send(request).await
}

/// `post`, answered 200: the answer's JSON.
async fn post_ok(worker: &SimWorker, path: &str, headers: &[(&str, &str)], body: &Value) -> Value {
    let reply = post(worker, path, headers, body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    reply.json()
}

async fn get(worker: &SimWorker, path: &str) -> Reply {
    send(client().get(format!("{}{path}", worker.url()))).await
}

fn prefill_hop_params() -> Value {
    json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
           "remote_block_ids": null, "remote_host": null, "remote_port": null})
}

fn prefill_hop(prompt: &str) -> Value {
    json!({"model": "sim-model", "prompt": prompt, "max_tokens": 1, "stream": false,
           "kv_transfer_params": prefill_hop_params()})
}

/// Runs a prefill hop on `prefill` and returns the `kv_transfer_params` it answered.
async fn prefill_kv(prefill: &SimWorker, prompt: &str) -> Value {
    let reply = post(
        prefill,
        "/v1/completions",
        &[("x-request-id", "r1")],
        &prefill_hop(prompt),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    reply.json()["kv_transfer_params"].clone()
}

fn sse_payloads(text: &str) -> Vec<String> {
    assert!(
        text.ends_with("\n\n"),
        "stream does not end with a blank line: {text:?}"
    );
    text.split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {event:?}"))
                .to_string()
        })
        .collect()
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("metric {name} missing:\n{text}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn prefill_then_decode_loads_the_kv() {
    let prefill = start(101, SimRole::Prefill, 1).await;
    let decode = start(201, SimRole::Decode, 1).await;

    let reply = post(
        &prefill,
        "/v1/completions",
        &[("x-request-id", "r1")],
        &prefill_hop(PROMPT),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.header("x-sim-worker-id"), "101");
    assert_eq!(reply.header("x-sim-dp-rank"), "0");
    let body = reply.json();
    assert_eq!(body["id"], "cmpl-r1");
    assert_eq!(body["choices"][0]["text"], "tok0");
    assert_eq!(body["usage"]["completion_tokens"], 1);
    assert_eq!(
        body["sim"],
        json!({"worker_id": 101, "role": "prefill", "dp_rank": 0, "kv_from": null, "prompt_tokens": 9})
    );
    let kv = body["kv_transfer_params"].clone();
    assert_eq!(kv["do_remote_prefill"], true);
    assert_eq!(kv["do_remote_decode"], false);
    assert_eq!(kv["remote_engine_id"], "sim-101-0");
    assert_eq!(kv["remote_host"], "127.0.0.1");
    assert_eq!(kv["remote_port"], prefill.addr().port());
    assert_eq!(kv["tp_size"], 1);
    assert!(!kv["remote_block_ids"].as_array().unwrap().is_empty());
    assert!(kv["remote_request_id"].is_string());
    assert_eq!(prefill.pending_kv(), 1);

    let decode_body = json!({"prompt": PROMPT, "max_tokens": 4, "kv_transfer_params": kv});
    let body = post_ok(
        &decode,
        "/v1/completions",
        &[("x-request-id", "r1")],
        &decode_body,
    )
    .await;
    assert_eq!(body["choices"][0]["text"], "tok0 tok1 tok2 tok3");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["sim"]["worker_id"], 201);
    assert_eq!(body["sim"]["kv_from"], 101);
    assert_eq!(body["kv_transfer_params"], Value::Null);
    assert_eq!(prefill.pending_kv(), 0);

    let replay = post(&decode, "/v1/completions", &[], &decode_body).await;
    assert_eq!(replay.status, StatusCode::BAD_REQUEST);
    assert!(
        replay.error_message().contains("do not match any prefill"),
        "{}",
        replay.text
    );

    let prefill_metrics = get(&prefill, "/metrics").await.text;
    let decode_metrics = get(&decode, "/metrics").await.text;
    assert_eq!(metric(&prefill_metrics, "sim_kv_produced_total"), 1);
    assert_eq!(metric(&decode_metrics, "sim_kv_loaded_total"), 1);
    assert_eq!(metric(&decode_metrics, "sim_requests_total"), 2);
    prefill.stop().await;
    decode.stop().await;
}

#[tokio::test]
async fn chat_decode_streams_after_remote_prefill() {
    let prefill = start(102, SimRole::Prefill, 1).await;
    let decode = start(202, SimRole::Decode, 1).await;
    let messages = json!([{"role": "user", "content": PROMPT}]);
    let hop = json!({"messages": messages, "max_tokens": 1, "max_completion_tokens": 1, "stream": false,
                     "kv_transfer_params": prefill_hop_params()});
    let body = post_ok(
        &prefill,
        "/v1/chat/completions",
        &[("x-request-id", "c1")],
        &hop,
    )
    .await;
    assert_eq!(body["id"], "chatcmpl-c1");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["content"], "tok0");

    let decode_body = json!({"messages": messages, "max_completion_tokens": 3, "stream": true,
                             "kv_transfer_params": body["kv_transfer_params"]});
    let reply = post(&decode, "/v1/chat/completions", &[], &decode_body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.header("content-type"), "text/event-stream");
    let payloads = sse_payloads(&reply.text);
    assert_eq!(payloads.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    assert_eq!(chunks.len(), 4);
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "tok0 tok1 tok2");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    let last = &chunks[3];
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["sim"]["kv_from"], 102);
    assert_eq!(last["sim"]["role"], "decode");
}

#[tokio::test]
async fn forged_or_misrouted_kv_transfer_params_are_rejected() {
    let prefill = start(103, SimRole::Prefill, 1).await;
    let decode = start(203, SimRole::Decode, 1).await;
    let aggregated = start(303, SimRole::Aggregated, 1).await;
    let port = prefill.addr().port();
    let forged = [
        json!({"do_remote_prefill": false, "remote_request_id": "x"}),
        json!("garbage"),
        json!({"do_remote_prefill": true, "remote_host": "127.0.0.1", "remote_port": port,
               "remote_request_id": "never-produced", "remote_engine_id": "sim-103-0"}),
        json!({"do_remote_prefill": true, "remote_host": "127.0.0.1", "remote_port": port}),
    ];
    for params in forged {
        let body = json!({"prompt": PROMPT, "kv_transfer_params": params});
        let reply = post(&decode, "/v1/completions", &[], &body).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{params}: {}",
            reply.text
        );
        assert!(
            reply
                .error_message()
                .contains("kv_transfer_params do not match any prefill"),
            "{}",
            reply.text
        );
        assert_eq!(reply.json()["error"]["type"], "BadRequestError");
        assert_eq!(reply.header("x-sim-worker-id"), "203");
    }

    // A real handle sent to the wrong places.
    let kv = prefill_kv(&prefill, PROMPT).await;
    let body = json!({"prompt": PROMPT, "kv_transfer_params": kv});
    let reply = post(&aggregated, "/v1/completions", &[], &body).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    assert!(
        reply.error_message().contains("aggregated worker 303"),
        "{}",
        reply.text
    );
    let reply = post(&prefill, "/v1/completions", &[], &body).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    let reply = post(&decode, "/v1/completions", &[], &prefill_hop(PROMPT)).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    assert!(
        reply.error_message().contains("prefill hop"),
        "{}",
        reply.text
    );

    // A handle naming a worker that is gone.
    let stopped = start(104, SimRole::Prefill, 1).await;
    let kv = prefill_kv(&stopped, PROMPT).await;
    stopped.stop().await;
    let reply = post(
        &decode,
        "/v1/completions",
        &[],
        &json!({"prompt": PROMPT, "kv_transfer_params": kv}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    assert!(
        reply.error_message().contains("could not fetch KV"),
        "{}",
        reply.text
    );
}

#[tokio::test]
async fn prompt_or_engine_mismatch_is_rejected() {
    let prefill = start(105, SimRole::Prefill, 1).await;
    let decode = start(205, SimRole::Decode, 1).await;
    let kv = prefill_kv(&prefill, PROMPT).await;
    let body = json!({"prompt": "a different prompt entirely", "kv_transfer_params": kv});
    let reply = post(&decode, "/v1/completions", &[], &body).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    let message = reply.error_message();
    assert!(
        message.contains("kv_transfer_params do not match any prefill"),
        "{message}"
    );
    assert!(
        message.contains("prompt differs") && message.contains("105"),
        "{message}"
    );

    let mut kv = prefill_kv(&prefill, PROMPT).await;
    kv["remote_engine_id"] = json!("sim-999-0");
    let reply = post(
        &decode,
        "/v1/completions",
        &[],
        &json!({"prompt": PROMPT, "kv_transfer_params": kv}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    assert!(
        reply.error_message().contains("remote_engine_id"),
        "{}",
        reply.text
    );
}

#[tokio::test]
async fn prefill_hop_must_be_capped_and_not_streamed() {
    let prefill = start(106, SimRole::Prefill, 1).await;
    let mut uncapped = prefill_hop(PROMPT);
    uncapped["max_tokens"] = json!(16);
    let mut absent = prefill_hop(PROMPT);
    absent.as_object_mut().unwrap().remove("max_tokens");
    let mut streamed = prefill_hop(PROMPT);
    streamed["stream"] = json!(true);
    let chat = json!({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1,
                      "max_completion_tokens": 5, "kv_transfer_params": prefill_hop_params()});
    let cases = [
        ("/v1/completions", uncapped, "max_tokens"),
        ("/v1/completions", absent, "max_tokens"),
        ("/v1/completions", streamed, "stream"),
        ("/v1/chat/completions", chat, "max_completion_tokens"),
    ];
    for (path, body, expected) in cases {
        let reply = post(&prefill, path, &[], &body).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{body}: {}",
            reply.text
        );
        let message = reply.error_message();
        assert!(
            message.contains("prefill hop") && message.contains(expected),
            "{message}"
        );
    }
    assert_eq!(prefill.pending_kv(), 0);
    // Without kv_transfer_params a prefill worker is an ordinary server.
    let reply = post(
        &prefill,
        "/v1/completions",
        &[],
        &json!({"prompt": PROMPT, "max_tokens": 2}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.json()["kv_transfer_params"], Value::Null);
}

#[tokio::test]
async fn dp_rank_header_selects_the_rank() {
    let decode = start(207, SimRole::Decode, 2).await;
    let body = json!({"prompt": PROMPT, "max_tokens": 2});

    let reply = post(
        &decode,
        "/v1/completions",
        &[("X-data-parallel-rank", "1")],
        &body,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.header("x-sim-dp-rank"), "1");
    assert_eq!(reply.json()["sim"]["dp_rank"], 1);

    for bad in ["2", "-1", "4294967296"] {
        let reply = post(
            &decode,
            "/v1/completions",
            &[("X-data-parallel-rank", bad)],
            &body,
        )
        .await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{bad}: {}",
            reply.text
        );
        assert!(
            reply.error_message().contains("out of range [0, 2)"),
            "{}",
            reply.text
        );
        assert_eq!(reply.json()["error"]["code"], 400);
        assert_eq!(reply.header("x-sim-dp-rank"), bad);
    }

    let reply = post(
        &decode,
        "/v1/completions",
        &[("X-data-parallel-rank", "abc")],
        &body,
    )
    .await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "non-numeric rank must be ignored: {}",
        reply.text
    );

    let mut ranks = Vec::new();
    for _ in 0..4 {
        let reply = post(&decode, "/v1/completions", &[], &body).await;
        ranks.push(reply.header("x-sim-dp-rank").to_string());
    }
    assert_eq!(
        ranks.iter().filter(|rank| *rank == "0").count(),
        2,
        "{ranks:?}"
    );
    assert_eq!(
        ranks.iter().filter(|rank| *rank == "1").count(),
        2,
        "{ranks:?}"
    );
    assert_ne!(ranks[0], ranks[1], "{ranks:?}");

    let recorded = decode.requests();
    assert_eq!(recorded[0].header("x-data-parallel-rank"), Some("1"));
    let metrics = get(&decode, "/metrics").await.text;
    assert!(
        metrics.contains("sim_dp_rank_requests_total{dp_rank=\"1\"} 3"),
        "{metrics}"
    );

    let prefill = start(107, SimRole::Prefill, 2).await;
    let reply = post(
        &prefill,
        "/v1/completions",
        &[("x-data-parallel-rank", "1")],
        &prefill_hop(PROMPT),
    )
    .await;
    assert_eq!(
        reply.json()["kv_transfer_params"]["remote_engine_id"],
        "sim-107-1"
    );
}

#[tokio::test]
async fn completion_stream_is_openai_sse_ending_in_done() {
    let worker = start(308, SimRole::Aggregated, 1).await;
    let body = json!({"prompt": PROMPT, "max_tokens": 5, "stream": true, "stream_options": {"include_usage": true}});
    let reply = post(&worker, "/v1/completions", &[("x-request-id", "s1")], &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.header("content-type"), "text/event-stream");
    assert_eq!(reply.header("x-sim-worker-id"), "308");
    let payloads = sse_payloads(&reply.text);
    assert_eq!(payloads.len(), 5 + 1 + 1 + 1, "{payloads:?}");
    assert_eq!(payloads.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = payloads[..7]
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    for chunk in &chunks[..5] {
        assert_eq!(chunk["id"], "cmpl-s1");
        assert_eq!(chunk["object"], "text_completion");
        assert_eq!(chunk["choices"][0]["finish_reason"], Value::Null);
        assert!(chunk.get("sim").is_none());
    }
    let text: String = chunks[..5]
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "tok0 tok1 tok2 tok3 tok4");
    assert_eq!(chunks[5]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[5]["sim"]["worker_id"], 308);
    assert_eq!(chunks[5]["sim"]["kv_from"], Value::Null);
    assert_eq!(chunks[6]["choices"], json!([]));
    assert_eq!(chunks[6]["usage"]["completion_tokens"], 5);
}

#[tokio::test]
async fn token_latency_paces_generation() {
    let config =
        SimConfig::new(309, SimRole::Aggregated).with_token_latency(Duration::from_millis(20));
    let worker = SimWorker::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let started = Instant::now();
    let reply = post(
        &worker,
        "/v1/completions",
        &[],
        &json!({"prompt": "x", "max_tokens": 5}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn invalid_bodies_get_openai_errors() {
    let worker = start(310, SimRole::Aggregated, 1).await;
    let reply = send(
        client()
            .post(format!("{}/v1/completions", worker.url()))
            .body("not json"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let body = reply.json();
    assert_eq!(body["error"]["type"], "BadRequestError");
    assert_eq!(body["error"]["code"], 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("JSON object")
    );
    assert_eq!(reply.header("x-sim-worker-id"), "310");
    assert_eq!(reply.header("x-sim-dp-rank"), "0");
    let reply = post(&worker, "/v1/chat/completions", &[], &json!([1, 2])).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let recorded = worker.requests();
    assert_eq!(recorded.len(), 2);
    assert_eq!(recorded[0].body, Value::Null);
    assert_eq!(recorded[1].path, "/v1/chat/completions");
    assert_eq!(recorded[1].body, json!([1, 2]));
}

#[tokio::test]
async fn requests_are_recorded_and_served_over_http() {
    let worker = start(311, SimRole::Aggregated, 1).await;
    let control = SimClient::new(worker.addr()).unwrap();
    assert_eq!(get(&worker, "/health").await.status, StatusCode::OK);
    let models = get(&worker, "/v1/models").await.json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "sim-model");
    assert_eq!(models["data"][0]["owned_by"], "pinroute-sim");
    let body = json!({"prompt": PROMPT, "max_tokens": 1});
    post(
        &worker,
        "/v1/completions",
        &[("X-Request-Id", "rec-1"), ("X-Custom", "Value")],
        &body,
    )
    .await;

    let local = worker.requests();
    assert_eq!(
        local.len(),
        1,
        "only completion paths are recorded: {local:?}"
    );
    assert_eq!(local[0].path, "/v1/completions");
    assert_eq!(local[0].body, body);
    assert!(
        local[0]
            .headers
            .contains(&("x-request-id".to_string(), "rec-1".to_string()))
    );
    assert_eq!(local[0].header("X-CUSTOM"), Some("Value"));
    assert_eq!(control.requests().await.unwrap(), local);

    control.clear_requests().await.unwrap();
    assert!(worker.requests().is_empty());
    post(&worker, "/v1/completions", &[], &body).await;
    worker.clear_requests();
    assert!(control.requests().await.unwrap().is_empty());
    let info = control.info().await.unwrap();
    assert_eq!(
        (info["id"].as_u64(), info["role"].as_str()),
        (Some(311), Some("aggregated"))
    );
}

#[tokio::test]
async fn status_fault_answers_a_json_error() {
    let worker = start(312, SimRole::Decode, 1).await;
    let body = json!({"prompt": PROMPT});
    worker.set_fault(Fault::Status(503));
    let reply = post(&worker, "/v1/completions", &[], &body).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["error"]["code"], 503);
    assert_eq!(reply.header("x-sim-worker-id"), "312");
    assert_eq!(
        worker.requests().len(),
        1,
        "faulted requests are still recorded"
    );

    let control = SimClient::new(worker.addr()).unwrap();
    control.set_fault(Fault::None).await.unwrap();
    assert_eq!(worker.fault(), Fault::None);
    assert_eq!(
        post(&worker, "/v1/completions", &[], &body).await.status,
        StatusCode::OK
    );

    let raw = send(
        client()
            .post(format!("{}/sim/fault", worker.url()))
            .body(r#"{"fault":{"status":500}}"#),
    )
    .await;
    assert_eq!(raw.status, StatusCode::OK, "{}", raw.text);
    assert_eq!(control.fault().await.unwrap(), Fault::Status(500));
    assert_eq!(
        post(
            &worker,
            "/v1/chat/completions",
            &[],
            &json!({"messages": []})
        )
        .await
        .status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    let raw = send(
        client()
            .post(format!("{}/sim/fault", worker.url()))
            .body(r#"{"fault":"explode"}"#),
    )
    .await;
    assert_eq!(raw.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        worker.fault(),
        Fault::Status(500),
        "an invalid fault request changes nothing"
    );
}

#[tokio::test]
async fn hang_fault_never_answers_and_stop_still_returns() {
    let worker = start(313, SimRole::Aggregated, 1).await;
    worker.set_fault(Fault::Hang);
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let url = format!("{}/v1/completions", worker.url());
    let pending = tokio::spawn(
        client()
            .post(url.clone())
            .json(&json!({"prompt": "x"}))
            .send(),
    );
    let error = impatient
        .post(url)
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap_err();
    assert!(error.is_timeout(), "{error:?}");
    assert_eq!(worker.requests().len(), 2);

    let started = Instant::now();
    worker.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "stop took {:?}",
        started.elapsed()
    );
    let outcome = pending.await.unwrap();
    assert!(
        outcome.is_err(),
        "a hung request must not get an answer: {outcome:?}"
    );
}

#[tokio::test]
async fn close_fault_drops_the_connection() {
    let worker = start(314, SimRole::Aggregated, 1).await;
    worker.set_fault(Fault::Close);
    let started = Instant::now();
    let error = client()
        .post(format!("{}/v1/completions", worker.url()))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap_err();
    assert!(!error.is_timeout(), "{error:?}");
    assert!(
        error.status().is_none(),
        "no HTTP answer expected: {error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(worker.requests().len(), 1);
    worker.set_fault(Fault::None);
    let reply = post(&worker, "/v1/completions", &[], &json!({"prompt": "x"})).await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn stop_frees_the_port() {
    let worker = start(315, SimRole::Aggregated, 1).await;
    let addr = worker.addr();
    assert_eq!(get(&worker, "/health").await.status, StatusCode::OK);
    worker.stop().await;
    let listener = tokio::net::TcpListener::bind(addr).await;
    assert!(listener.is_ok(), "port {addr} still taken: {listener:?}");
}

#[tokio::test]
async fn invalid_config_is_refused() {
    let config = SimConfig::new(316, SimRole::Decode).with_dp_size(0);
    assert!(
        SimWorker::start(config, "127.0.0.1:0".parse().unwrap())
            .await
            .is_err()
    );
    assert_eq!("Prefill".parse::<SimRole>().unwrap(), SimRole::Prefill);
    assert_eq!(SimRole::Aggregated.to_string(), "aggregated");
    assert!("leader".parse::<SimRole>().is_err());
}

async fn start_cached(id: u64, role: SimRole) -> SimWorker {
    let config = SimConfig::new(id, role)
        .with_token_latency(Duration::from_millis(1))
        .with_cache_blocks(1000);
    SimWorker::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// `words` words of a system prompt, then the question.
fn long_prompt(words: usize, question: &str) -> String {
    format!("{} {question}", "rule ".repeat(words))
}

#[tokio::test]
async fn a_prefix_cache_serves_the_shared_beginning_of_prompts() {
    let prefill = start_cached(120, SimRole::Prefill).await;
    let first = post(
        &prefill,
        "/v1/completions",
        &[],
        &prefill_hop(&long_prompt(100, "one")),
    )
    .await;
    let sim = &first.json()["sim"];
    assert_eq!(
        (
            sim["cached_tokens"].as_u64(),
            sim["computed_tokens"].as_u64()
        ),
        (Some(0), Some(101))
    );
    let second = post(
        &prefill,
        "/v1/completions",
        &[],
        &prefill_hop(&long_prompt(100, "two")),
    )
    .await;
    let body = second.json();
    assert_eq!(
        body["sim"]["cached_tokens"], 96,
        "the six whole blocks of the shared rules"
    );
    assert_eq!(body["sim"]["computed_tokens"], 5);
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 96);
    assert_eq!(prefill.prompt_tokens(), (96, 106));
    let metrics = get(&prefill, "/metrics").await.text;
    assert_eq!(metric(&metrics, "sim_prompt_tokens_cached_total"), 96);
    assert_eq!(metric(&metrics, "sim_prompt_tokens_computed_total"), 106);
    let other = super::PromptBlocks::of(&json!(long_prompt(100, "three")));
    assert_eq!(prefill.cached_blocks(&other), 6);
    assert_eq!(prefill.in_flight(), 0);
}

#[tokio::test]
async fn a_decode_worker_caches_the_kv_it_loads_and_the_prompts_it_prefills() {
    let prefill = start_cached(121, SimRole::Prefill).await;
    let decode = start_cached(221, SimRole::Decode).await;
    let history = long_prompt(60, "first");
    let kv = prefill_kv(&prefill, &history).await;
    let loaded = post(
        &decode,
        "/v1/completions",
        &[],
        &json!({"prompt": history, "max_tokens": 2, "kv_transfer_params": kv}),
    )
    .await;
    assert_eq!(
        loaded.json()["sim"]["computed_tokens"],
        0,
        "the KV came from prefill"
    );
    assert_eq!(decode.prompt_tokens(), (0, 0));
    let next_turn = format!("{history} answer then second question");
    let local = post(
        &decode,
        "/v1/completions",
        &[],
        &json!({"prompt": next_turn, "max_tokens": 2}),
    )
    .await;
    let sim = &local.json()["sim"];
    assert_eq!(sim["kv_from"], Value::Null);
    assert_eq!(sim["cached_tokens"], 48, "the loaded prompt's whole blocks");
    assert_eq!(sim["computed_tokens"], 61 + 4 - 48);
    let uncached = start(222, SimRole::Decode, 1).await;
    let plain = post(
        &uncached,
        "/v1/completions",
        &[],
        &json!({"prompt": next_turn, "max_tokens": 2}),
    )
    .await;
    let plain = plain.json();
    assert_eq!(
        plain["sim"].get("cached_tokens"),
        None,
        "no cache: not reported"
    );
    assert_eq!(plain["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        uncached.cached_blocks(&super::PromptBlocks::of(&json!(next_turn))),
        0
    );
}

#[tokio::test]
async fn a_hostile_worker_gives_each_request_the_next_bad_answer() {
    let worker = start(314, SimRole::Prefill, 1).await;
    worker.set_fault(Fault::Hostile);
    let url = format!("{}/v1/completions", worker.url());
    let hop = prefill_hop(PROMPT);
    let padded = post(&worker, "/v1/completions", &[], &hop).await;
    let padding = &padded.json()["kv_transfer_params"]["sim_padding"];
    assert_eq!(padding.as_str().map(str::len), Some(2 << 20));
    let oversized = post(&worker, "/v1/completions", &[], &hop).await;
    assert_eq!(
        (oversized.status, oversized.text.len()),
        (StatusCode::OK, 2 << 20)
    );
    let truncated = client().post(&url).json(&hop).send().await.unwrap();
    assert_eq!(truncated.status(), StatusCode::OK);
    assert!(truncated.bytes().await.is_err(), "the body breaks off");
    let compressed = post(&worker, "/v1/completions", &[], &hop).await;
    assert_eq!(compressed.header("content-encoding"), "gzip", "unasked");
    let again = post(&worker, "/v1/completions", &[], &hop).await;
    assert!(
        again.json()["kv_transfer_params"]["sim_padding"].is_string(),
        "the cycle restarts"
    );
}

#[tokio::test]
async fn a_gzip_worker_compresses_only_when_asked() {
    let worker = start(315, SimRole::Prefill, 1).await;
    worker.set_fault(Fault::Gzip);
    let hop = prefill_hop(PROMPT);
    let plain = post(
        &worker,
        "/v1/completions",
        &[("accept-encoding", "identity")],
        &hop,
    )
    .await;
    assert_eq!(plain.header("content-encoding"), "");
    assert!(plain.json()["kv_transfer_params"].is_object());
    let asked = post(
        &worker,
        "/v1/completions",
        &[("accept-encoding", "gzip, br")],
        &hop,
    )
    .await;
    assert_eq!(asked.header("content-encoding"), "gzip");
}

/// `(event, data)` of each event of a stream of named SSE events.
fn named_events(text: &str) -> Vec<(String, Value)> {
    assert!(text.ends_with("\n\n"), "{text:?}");
    text.split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            let (name, data) = event
                .strip_prefix("event: ")
                .and_then(|rest| rest.split_once("\ndata: "))
                .unwrap_or_else(|| panic!("not a named event: {event:?}"));
            let data: Value = serde_json::from_str(data).unwrap();
            assert_eq!(data["type"], name, "event name and type differ: {event}");
            (name.to_string(), data)
        })
        .collect()
}

fn responses_hop(input: &Value) -> Value {
    json!({"model": "sim-model", "instructions": "be brief", "input": input,
           "max_output_tokens": 1, "stream": false, "store": false,
           "kv_transfer_params": prefill_hop_params()})
}

fn conversation() -> Value {
    json!([{"role": "user", "content": PROMPT}])
}

#[tokio::test]
async fn responses_prefill_then_decode_loads_the_kv() {
    let prefill = start(130, SimRole::Prefill, 1).await;
    let decode = start(230, SimRole::Decode, 1).await;
    let body = post_ok(
        &prefill,
        "/v1/responses",
        &[("x-request-id", "r1")],
        &responses_hop(&conversation()),
    )
    .await;
    assert_eq!(body["id"], "resp_r1");
    assert_eq!(body["object"], "response");
    assert_eq!(body["status"], "incomplete", "stopped by max_output_tokens");
    assert_eq!(body["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(body["max_output_tokens"], 1);
    assert_eq!(body["output"][0]["content"][0]["text"], "tok0");
    assert_eq!(
        body["usage"]["input_tokens"],
        2 + 1 + 9,
        "instructions, then the input's role and content"
    );
    assert_eq!(body["usage"]["output_tokens"], 1);
    let kv = body["kv_transfer_params"].clone();
    assert_eq!(kv["do_remote_prefill"], true, "top-level, as vLLM answers");
    assert_eq!(kv["remote_engine_id"], "sim-130-0");
    assert_eq!(prefill.pending_kv(), 1);
    assert_eq!(
        prefill.stored_responses(),
        0,
        "a prefill hop stores nothing"
    );

    let mismatched = json!({"instructions": "be verbose", "input": conversation(),
                            "max_output_tokens": 3, "kv_transfer_params": kv});
    let reply = post(&decode, "/v1/responses", &[], &mismatched).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    assert!(
        reply.error_message().contains("prompt differs"),
        "{}",
        reply.text
    );

    let kv = prefill_kv_of(&prefill, "/v1/responses", &responses_hop(&conversation())).await;
    let decode_body = json!({"instructions": "be brief", "input": conversation(),
                             "max_output_tokens": 3, "kv_transfer_params": kv});
    let body = post_ok(
        &decode,
        "/v1/responses",
        &[("x-request-id", "r1")],
        &decode_body,
    )
    .await;
    assert_eq!(body["id"], "resp_r1");
    assert_eq!(body["output"][0]["content"][0]["text"], "tok0 tok1 tok2");
    assert_eq!(body["output"][0]["type"], "message");
    assert_eq!(body["output"][0]["status"], "completed");
    assert_eq!(body["sim"]["kv_from"], 130);
    assert_eq!(body["kv_transfer_params"], Value::Null);
    assert_eq!(decode.stored_responses(), 1, "store defaults to true");
    assert_eq!(prefill.pending_kv(), 0);
}

/// Runs a prefill hop on `path` and returns the `kv_transfer_params` it answered.
async fn prefill_kv_of(prefill: &SimWorker, path: &str, hop: &Value) -> Value {
    let reply = post(prefill, path, &[], hop).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let kv = reply.json()["kv_transfer_params"].clone();
    assert!(kv.is_object(), "{}", reply.text);
    kv
}

#[tokio::test]
async fn responses_prefill_hop_must_be_capped_unstreamed_and_unstored() {
    let prefill = start(131, SimRole::Prefill, 1).await;
    let hop = responses_hop(&json!(PROMPT));
    let with = |field: &str, value: Value| {
        let mut body = hop.clone();
        body[field] = value;
        body
    };
    let mut absent = hop.clone();
    absent.as_object_mut().unwrap().remove("max_output_tokens");
    let mut stored = hop.clone();
    stored.as_object_mut().unwrap().remove("store");
    let cases = [
        (with("stream", json!(true)), "stream"),
        (with("max_output_tokens", json!(5)), "max_output_tokens"),
        (absent, "max_output_tokens"),
        (with("store", json!(true)), "store=false"),
        (stored, "store=false"),
    ];
    for (body, expected) in cases {
        let reply = post(&prefill, "/v1/responses", &[], &body).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{body}: {}",
            reply.text
        );
        let message = reply.error_message();
        assert!(
            message.contains("prefill hop") && message.contains(expected),
            "{message}"
        );
        assert_eq!(reply.json()["error"]["type"], "BadRequestError");
    }
    assert_eq!(prefill.pending_kv(), 0);
    assert_eq!(prefill.requests().len(), 5, "refused hops are recorded");
}

#[tokio::test]
async fn responses_stream_as_vllm_emits_them_and_are_stored_when_done() {
    let worker = start(330, SimRole::Aggregated, 1).await;
    let body = json!({"input": PROMPT, "max_output_tokens": 3, "stream": true});
    let reply = post(&worker, "/v1/responses", &[("x-request-id", "s1")], &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.header("content-type"), "text/event-stream");
    let events = named_events(&reply.text);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (sequence, (_, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], sequence as u64);
    }
    let created = &events[0].1["response"];
    assert_eq!(
        (created["id"].as_str(), created["status"].as_str()),
        (Some("resp_s1"), Some("in_progress"))
    );
    assert_eq!(created["output"], json!([]));
    assert!(created.get("sim").is_none());
    let item_id = events[2].1["item"]["id"].as_str().unwrap();
    assert!(item_id.starts_with("msg_"), "{item_id}");
    let deltas: String = events[4..7]
        .iter()
        .map(|(_, data)| {
            assert_eq!(data["item_id"], item_id);
            data["delta"].as_str().unwrap()
        })
        .collect();
    assert_eq!(deltas, "tok0 tok1 tok2");
    assert_eq!(events[7].1["text"], "tok0 tok1 tok2");
    assert_eq!(events[9].1["item"]["content"][0]["text"], "tok0 tok1 tok2");
    let completed = &events[10].1["response"];
    assert_eq!(completed["status"], "incomplete");
    assert_eq!(completed["usage"]["output_tokens"], 3);
    assert_eq!(completed["output"][0]["id"], item_id);
    assert_eq!(completed["sim"]["worker_id"], 330);

    let stored = get(&worker, "/v1/responses/resp_s1").await;
    assert_eq!(stored.status, StatusCode::OK, "{}", stored.text);
    assert_eq!(stored.json(), *completed);
}

#[tokio::test]
async fn stored_responses_are_retrieved_cancelled_and_continued_per_worker() {
    let worker = start(331, SimRole::Aggregated, 1).await;
    let other = start(332, SimRole::Aggregated, 1).await;
    let first = json!({"input": PROMPT, "max_output_tokens": 2});
    let reply = post(&worker, "/v1/responses", &[("x-request-id", "t1")], &first).await;
    let answer = reply.json();
    assert_eq!(answer["id"], "resp_t1");

    let stored = get(&worker, "/v1/responses/resp_t1").await;
    assert_eq!(stored.status, StatusCode::OK);
    assert_eq!(stored.json(), answer);
    assert_eq!(stored.header("x-sim-worker-id"), "331");
    let missing = get(&other, "/v1/responses/resp_t1").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(
        missing.json()["error"],
        json!({"message": "Response with id 'resp_t1' not found.", "type": "invalid_request_error",
               "param": "response_id", "code": 404})
    );

    let cancel = post(&worker, "/v1/responses/resp_t1/cancel", &[], &json!({})).await;
    assert_eq!(cancel.status, StatusCode::BAD_REQUEST, "{}", cancel.text);
    assert_eq!(
        cancel.json()["error"]["message"],
        "Cannot cancel a synchronous response."
    );
    assert_eq!(cancel.json()["error"]["type"], "invalid_request_error");
    let cancel = post(&other, "/v1/responses/resp_t1/cancel", &[], &json!({})).await;
    assert_eq!(cancel.status, StatusCode::NOT_FOUND);

    let follow_up = json!({"input": "and then?", "previous_response_id": "resp_t1",
                           "request_id": "resp_follow", "max_output_tokens": 2});
    let body = post_ok(
        &worker,
        "/v1/responses",
        &[("x-request-id", "t2")],
        &follow_up,
    )
    .await;
    assert_eq!(body["id"], "resp_follow", "the body's request_id wins");
    assert_eq!(body["previous_response_id"], "resp_t1");
    assert_eq!(
        body["usage"]["input_tokens"],
        9 + 2 + 2,
        "the first prompt, its answer, then the new input"
    );
    let reply = post(&other, "/v1/responses", &[], &follow_up).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.text);
    assert_eq!(
        reply.error_message(),
        "Response with id 'resp_t1' not found."
    );

    let unstored = json!({"input": PROMPT, "store": false, "request_id": "resp_gone"});
    post(&worker, "/v1/responses", &[], &unstored).await;
    assert_eq!(
        get(&worker, "/v1/responses/resp_gone").await.status,
        StatusCode::NOT_FOUND
    );

    let paths: Vec<String> = worker.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        [
            "/v1/responses",
            "/v1/responses/resp_t1",
            "/v1/responses/resp_t1/cancel",
            "/v1/responses",
            "/v1/responses",
            "/v1/responses/resp_gone",
        ]
    );
    let other_paths: Vec<String> = other.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(
        other_paths,
        [
            "/v1/responses/resp_t1",
            "/v1/responses/resp_t1/cancel",
            "/v1/responses"
        ]
    );
}

#[tokio::test]
async fn a_continued_conversation_needs_the_previous_response_on_both_hops() {
    let prefill = start(133, SimRole::Prefill, 1).await;
    let decode = start(233, SimRole::Decode, 1).await;
    let first = json!({"input": PROMPT, "max_output_tokens": 2, "request_id": "resp_c1"});
    assert_eq!(
        post(&decode, "/v1/responses", &[], &first).await.status,
        StatusCode::OK
    );
    let mut hop = responses_hop(&json!("and then?"));
    hop["previous_response_id"] = json!("resp_c1");
    let reply = post(&prefill, "/v1/responses", &[], &hop).await;
    assert_eq!(
        reply.status,
        StatusCode::NOT_FOUND,
        "vLLM renders the prompt from the stored response: {}",
        reply.text
    );
    assert_eq!(prefill.pending_kv(), 0);
}

#[tokio::test]
async fn background_responses_finish_later_unless_cancelled() {
    let config =
        SimConfig::new(334, SimRole::Aggregated).with_token_latency(Duration::from_millis(40));
    let worker = SimWorker::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let body = json!({"input": PROMPT, "max_output_tokens": 3, "background": true,
                      "request_id": "resp_bg1"});
    let started = Instant::now();
    let reply = post(&worker, "/v1/responses", &[], &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "answered at once"
    );
    let queued = reply.json();
    assert_eq!(
        (queued["id"].as_str(), queued["status"].as_str()),
        (Some("resp_bg1"), Some("queued"))
    );
    assert_eq!(queued["background"], true);
    assert_eq!(queued["output"], json!([]));
    assert_eq!(queued["usage"], Value::Null);
    assert_eq!(
        get(&worker, "/v1/responses/resp_bg1").await.json()["status"],
        "queued"
    );
    assert_eq!(worker.in_flight(), 1, "still generating");

    let mut finished = Value::Null;
    for _ in 0..100 {
        finished = get(&worker, "/v1/responses/resp_bg1").await.json();
        if finished["status"] != "queued" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(finished["status"], "incomplete", "{finished}");
    assert_eq!(
        finished["output"][0]["content"][0]["text"],
        "tok0 tok1 tok2"
    );
    assert_eq!(finished["background"], true);
    assert_eq!(worker.in_flight(), 0);
    let cancel = post(&worker, "/v1/responses/resp_bg1/cancel", &[], &json!({})).await;
    assert_eq!(
        cancel.status,
        StatusCode::BAD_REQUEST,
        "finished: {}",
        cancel.text
    );

    let mut second = body.clone();
    second["request_id"] = json!("resp_bg2");
    post(&worker, "/v1/responses", &[], &second).await;
    let cancel = post(&worker, "/v1/responses/resp_bg2/cancel", &[], &json!({})).await;
    assert_eq!(cancel.status, StatusCode::OK, "{}", cancel.text);
    assert_eq!(cancel.json()["status"], "cancelled");
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        get(&worker, "/v1/responses/resp_bg2").await.json()["status"],
        "cancelled",
        "the generation finishing later does not undo the cancel"
    );

    let unstored = json!({"input": PROMPT, "background": true, "store": false});
    let reply = post(&worker, "/v1/responses", &[], &unstored).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    assert_eq!(reply.json()["error"]["type"], "BadRequestError");
    assert_eq!(reply.json()["error"]["param"], "background");
    assert!(
        reply
            .error_message()
            .contains("only be used when `store` is true"),
        "{}",
        reply.text
    );
}

fn messages_hop(system: &str) -> Value {
    json!({"model": "sim-model", "system": system, "messages": conversation(),
           "max_tokens": 1, "stream": false, "kv_transfer_params": prefill_hop_params()})
}

#[tokio::test]
async fn messages_prefill_then_decode_loads_the_kv() {
    let prefill = start(140, SimRole::Prefill, 1).await;
    let decode = start(240, SimRole::Decode, 1).await;
    let body = post_ok(
        &prefill,
        "/v1/messages",
        &[("x-request-id", "m1")],
        &messages_hop("be brief"),
    )
    .await;
    assert_eq!(
        body["id"], "chatcmpl-m1",
        "vLLM answers its chat completion's id"
    );
    assert_eq!(body["type"], "message");
    assert_eq!(body["role"], "assistant");
    assert_eq!(body["content"], json!([{"type": "text", "text": "tok0"}]));
    assert_eq!(body["stop_reason"], "max_tokens");
    assert!(
        body.get("stop_sequence").is_none(),
        "vLLM drops null fields"
    );
    assert_eq!(
        body["usage"],
        json!({"input_tokens": 12, "output_tokens": 1, "cache_read_input_tokens": 0})
    );
    let kv = body["kv_transfer_params"].clone();
    assert_eq!(kv["remote_engine_id"], "sim-140-0", "top-level: {body}");

    let mut mismatched = messages_hop("be verbose");
    mismatched["kv_transfer_params"] = kv;
    mismatched["max_tokens"] = json!(3);
    let reply = post(&decode, "/v1/messages", &[], &mismatched).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    let error = reply.json();
    assert_eq!(error["type"], "error", "Anthropic's shape: {error}");
    assert_eq!(error["error"]["type"], "BadRequestError");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("prompt differs"),
        "{error}"
    );
    assert_eq!(error["sim"]["worker_id"], 240);

    let kv = prefill_kv_of(&prefill, "/v1/messages", &messages_hop("be brief")).await;
    let mut decode_body = messages_hop("be brief");
    decode_body["kv_transfer_params"] = kv;
    decode_body["max_tokens"] = json!(3);
    let body = post_ok(
        &decode,
        "/v1/messages",
        &[("x-request-id", "m1")],
        &decode_body,
    )
    .await;
    assert_eq!(body["content"][0]["text"], "tok0 tok1 tok2");
    assert_eq!(body["sim"]["kv_from"], 140);
    assert!(body.get("kv_transfer_params").is_none(), "{body}");
}

#[tokio::test]
async fn messages_prefill_hop_checks_and_errors_take_vllm_shapes() {
    let prefill = start(141, SimRole::Prefill, 1).await;
    let mut uncapped = messages_hop("s");
    uncapped["max_tokens"] = json!(16);
    let mut streamed = messages_hop("s");
    streamed["stream"] = json!(true);
    for (body, expected) in [(uncapped, "max_tokens"), (streamed, "stream")] {
        let reply = post(&prefill, "/v1/messages", &[], &body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
        let error = reply.json();
        assert_eq!(error["type"], "error");
        assert_eq!(error["error"]["type"], "BadRequestError");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("prefill hop") && message.contains(expected),
            "{message}"
        );
    }

    // Request validation is vLLM's app-wide handler: OpenAI's shape.
    let mut missing = messages_hop("s");
    missing.as_object_mut().unwrap().remove("max_tokens");
    let mut zero = messages_hop("s");
    zero["max_tokens"] = json!(0);
    let mut no_model = messages_hop("s");
    no_model.as_object_mut().unwrap().remove("model");
    for (body, param) in [
        (missing, "body.max_tokens"),
        (zero, "body.max_tokens"),
        (no_model, "body.model"),
    ] {
        let reply = post(&prefill, "/v1/messages", &[], &body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
        let error = &reply.json()["error"];
        assert_eq!(error["type"], "Bad Request", "{error}");
        assert_eq!(error["param"], param);
        assert_eq!(error["code"], 400);
    }
    assert_eq!(prefill.pending_kv(), 0);

    prefill.set_fault(Fault::Status(503));
    let reply = post(&prefill, "/v1/messages", &[], &messages_hop("s")).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["type"], "error");
    assert_eq!(reply.json()["error"]["type"], "ServiceUnavailableError");
    let reply = post(
        &prefill,
        "/v1/messages",
        &[("x-data-parallel-rank", "3")],
        &messages_hop("s"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    prefill.set_fault(Fault::None);
    let reply = post(
        &prefill,
        "/v1/messages",
        &[("x-data-parallel-rank", "3")],
        &messages_hop("s"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(
        reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("out of range"),
        "{}",
        reply.text
    );
}

#[tokio::test]
async fn messages_stream_anthropic_events() {
    let worker = start(340, SimRole::Aggregated, 1).await;
    let body = json!({"model": "m", "messages": conversation(), "max_tokens": 3, "stream": true});
    let reply = post(&worker, "/v1/messages", &[("x-request-id", "ms")], &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.header("content-type"), "text/event-stream");
    let events = named_events(&reply.text);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    let message = &events[0].1["message"];
    assert_eq!(message["id"], "chatcmpl-ms");
    assert_eq!(message["content"], json!([]));
    assert_eq!(
        message["usage"],
        json!({"input_tokens": 10, "output_tokens": 0})
    );
    assert_eq!(
        events[1].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    let text: String = events[2..5]
        .iter()
        .map(|(_, data)| {
            assert_eq!(data["delta"]["type"], "text_delta");
            assert_eq!(data["index"], 0);
            data["delta"]["text"].as_str().unwrap()
        })
        .collect();
    assert_eq!(text, "tok0 tok1 tok2");
    assert_eq!(events[5].1["index"], 0);
    assert_eq!(
        events[6].1["delta"],
        json!({"stop_reason": "max_tokens", "stop_sequence": null})
    );
    assert_eq!(events[6].1["usage"]["output_tokens"], 3);
    assert_eq!(events[7].1["sim"]["worker_id"], 340);
}

#[tokio::test]
async fn count_tokens_counts_what_messages_would_prefill() {
    let worker = start(341, SimRole::Aggregated, 1).await;
    let body = json!({"model": "m", "system": "be brief", "messages": conversation()});
    let reply = post(&worker, "/v1/messages/count_tokens", &[], &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(
        reply.json(),
        json!({"input_tokens": 12, "context_management": {"original_input_tokens": 12}})
    );
    let mut message = body.clone();
    message["max_tokens"] = json!(1);
    let answer = post(&worker, "/v1/messages", &[], &message).await.json();
    assert_eq!(answer["usage"]["input_tokens"], 12);

    let reply = post(
        &worker,
        "/v1/messages/count_tokens",
        &[],
        &json!({"model": "m"}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["error"]["param"], "body.messages");
    let recorded = worker.requests();
    assert_eq!(recorded.len(), 3);
    assert_eq!(recorded[0].path, "/v1/messages/count_tokens");
    assert_eq!(recorded[0].body, body);
    assert_eq!(recorded[1].path, "/v1/messages");
}

fn prompt_ids() -> Value {
    json!((100..120).collect::<Vec<u32>>())
}

fn generate_hop(token_ids: &Value) -> Value {
    json!({"token_ids": token_ids, "sampling_params": {"max_tokens": 1, "temperature": 0.0},
           "stream": false, "kv_transfer_params": prefill_hop_params()})
}

#[tokio::test]
async fn generate_prefill_then_decode_loads_the_kv() {
    let prefill = start(150, SimRole::Prefill, 1).await;
    let decode = start(250, SimRole::Decode, 1).await;
    let body = post_ok(
        &prefill,
        "/inference/v1/generate",
        &[("x-request-id", "g1")],
        &generate_hop(&prompt_ids()),
    )
    .await;
    assert_eq!(body["request_id"], "generate-tokens-g1");
    assert_eq!(body["output_mode"], "tokens");
    assert_eq!(body["choices"][0]["token_ids"], json!([0]));
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert!(body["choices"][0].get("text").is_none());
    assert_eq!(body["usage"]["prompt_tokens"], 20);
    let kv = body["kv_transfer_params"].clone();
    assert_eq!(kv["remote_engine_id"], "sim-150-0", "top-level: {body}");

    let other_ids = json!((200..220).collect::<Vec<u32>>());
    let mismatched = json!({"token_ids": other_ids, "sampling_params": {"max_tokens": 4},
                            "kv_transfer_params": kv});
    let reply = post(&decode, "/inference/v1/generate", &[], &mismatched).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    assert!(
        reply.error_message().contains("prompt differs"),
        "{}",
        reply.text
    );

    let kv = prefill_kv_of(
        &prefill,
        "/inference/v1/generate",
        &generate_hop(&prompt_ids()),
    )
    .await;
    let decode_body = json!({"token_ids": prompt_ids(), "sampling_params": {"max_tokens": 4},
                             "request_id": "from-body", "kv_transfer_params": kv});
    let body = post_ok(&decode, "/inference/v1/generate", &[], &decode_body).await;
    assert_eq!(body["request_id"], "generate-tokens-from-body");
    assert_eq!(body["choices"][0]["token_ids"], json!([0, 1, 2, 3]));
    assert_eq!(body["usage"]["completion_tokens"], 4);
    assert_eq!(body["sim"]["kv_from"], 150);
    assert_eq!(body["kv_transfer_params"], Value::Null);
}

#[tokio::test]
async fn generate_prefill_hop_checks_and_validation() {
    let prefill = start(151, SimRole::Prefill, 1).await;
    let hop = generate_hop(&prompt_ids());
    let mut uncapped = hop.clone();
    uncapped["sampling_params"] = json!({"temperature": 0.0});
    let mut streamed = hop.clone();
    streamed["stream"] = json!(true);
    for (body, expected) in [
        (uncapped, "sampling_params.max_tokens"),
        (streamed, "stream"),
    ] {
        let reply = post(&prefill, "/inference/v1/generate", &[], &body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
        let message = reply.error_message();
        assert!(
            message.contains("prefill hop") && message.contains(expected),
            "{message}"
        );
    }
    let invalid = [
        (json!({"token_ids": [1, 2]}), "body.sampling_params"),
        (json!({"sampling_params": {}}), "body.token_ids"),
        (
            json!({"token_ids": [], "sampling_params": {}}),
            "body.token_ids",
        ),
        (
            json!({"token_ids": [1, -2], "sampling_params": {}}),
            "body.token_ids",
        ),
        (
            json!({"token_ids": [1], "sampling_params": {}, "output_mode": "logits"}),
            "body.output_mode",
        ),
    ];
    for (body, param) in invalid {
        let reply = post(&prefill, "/inference/v1/generate", &[], &body).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{body}: {}",
            reply.text
        );
        assert_eq!(reply.json()["error"]["param"], param, "{}", reply.text);
        assert_eq!(reply.json()["error"]["type"], "Bad Request");
    }
    let too_few = json!({"token_ids": [1], "sampling_params": {"max_tokens": 2, "min_tokens": 3}});
    let reply = post(&prefill, "/inference/v1/generate", &[], &too_few).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    assert_eq!(prefill.pending_kv(), 0);
}

#[tokio::test]
async fn generate_streams_one_chunk_per_token() {
    let worker = start(350, SimRole::Aggregated, 1).await;
    let body = json!({"token_ids": prompt_ids(), "sampling_params": {"max_tokens": 3},
                      "stream": true, "stream_options": {"include_usage": true},
                      "output_mode": "text"});
    let reply = post(
        &worker,
        "/inference/v1/generate",
        &[("x-request-id", "gs")],
        &body,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.header("content-type"), "text/event-stream");
    let payloads = sse_payloads(&reply.text);
    assert_eq!(payloads.len(), 3 + 1 + 1, "{payloads:?}");
    assert_eq!(payloads[4], "[DONE]");
    let chunks: Vec<Value> = payloads[..4]
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    for (index, chunk) in chunks[..3].iter().enumerate() {
        assert_eq!(chunk["request_id"], "generate-tokens-gs");
        assert_eq!(chunk["output_mode"], "text");
        assert_eq!(chunk["choices"][0]["token_ids"], json!([index]));
        assert!(chunk.get("kv_transfer_params").is_none());
    }
    let text: String = chunks[..3]
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "tok0 tok1 tok2");
    assert_eq!(chunks[1]["choices"][0]["finish_reason"], Value::Null);
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[2]["sim"]["worker_id"], 350);
    assert_eq!(chunks[3]["choices"], json!([]));
    assert_eq!(chunks[3]["usage"]["completion_tokens"], 3);
    assert_eq!(chunks[3]["usage"]["prompt_tokens"], 20);
}

async fn start_serving(id: u64, role: SimRole, models: &[&str]) -> SimWorker {
    let config = SimConfig::new(id, role)
        .with_token_latency(Duration::from_millis(1))
        .with_served_models(models);
    SimWorker::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_worker_serving_named_models_refuses_others_as_vllm_does() {
    let worker = start_serving(321, SimRole::Aggregated, &["base", "base-lora"]).await;
    let ids: Vec<Value> = get(&worker, "/v1/models").await.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(ids, [json!("base"), json!("base-lora")]);
    let answer = post_ok(
        &worker,
        "/v1/completions",
        &[],
        &json!({"model": "base-lora", "prompt": PROMPT, "max_tokens": 2}),
    )
    .await;
    assert_eq!(answer["model"], "base-lora", "the name the request used");
    let refused = post(
        &worker,
        "/v1/chat/completions",
        &[],
        &json!({"model": "other", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    assert_eq!(refused.json()["error"]["type"], "NotFoundError");
    assert_eq!(refused.error_message(), "The model `other` does not exist.");
}

#[tokio::test]
async fn kv_prefilled_for_one_model_is_not_loaded_for_another() {
    let prefill = start_serving(322, SimRole::Prefill, &["base", "base-lora"]).await;
    let decode = start_serving(323, SimRole::Decode, &["base", "base-lora"]).await;
    let mut hop = prefill_hop(PROMPT);
    hop["model"] = json!("base");
    let kv = post_ok(&prefill, "/v1/completions", &[], &hop).await["kv_transfer_params"].clone();
    let decode_hop = json!({"model": "base-lora", "prompt": PROMPT, "max_tokens": 2,
                            "kv_transfer_params": kv});
    let refused = post(&decode, "/v1/completions", &[], &decode_hop).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(
        refused.error_message().contains("the prompt differs"),
        "{}",
        refused.text
    );
}

async fn start_config(config: SimConfig) -> SimWorker {
    SimWorker::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// The value of a vLLM gauge's sample for the engine of `rank`.
fn vllm_gauge(text: &str, name: &str, rank: u32) -> f64 {
    let labels = format!("{name}{{engine=\"{rank}\",model_name=");
    text.lines()
        .find_map(|line| line.strip_prefix(&labels)?.rsplit_once("} "))
        .unwrap_or_else(|| panic!("no {name} for rank {rank}:\n{text}"))
        .1
        .parse()
        .unwrap()
}

/// `(waiting, running)` as the worker publishes them for `rank`.
async fn engine_queue(worker: &SimWorker, rank: u32) -> (f64, f64) {
    let text = get(worker, "/metrics").await.text;
    (
        vllm_gauge(&text, "vllm:num_requests_waiting", rank),
        vllm_gauge(&text, "vllm:num_requests_running", rank),
    )
}

/// Polls `/metrics` until `rank` publishes `(waiting, running)`.
async fn wait_for_queue(worker: &SimWorker, rank: u32, expected: (f64, f64)) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let queue = engine_queue(worker, rank).await;
        if queue == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "rank {rank} publishes (waiting, running) {queue:?}, not {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A streamed completion on `rank`, answered up to its headers.
async fn open_stream(worker: &SimWorker, rank: u32, tokens: u32) -> reqwest::Response {
    let response = client()
        .post(format!("{}/v1/completions", worker.url()))
        .header("x-data-parallel-rank", rank.to_string())
        .json(&json!({"prompt": PROMPT, "max_tokens": tokens, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response
}

#[tokio::test]
async fn vllm_load_gauges_are_published_per_rank() {
    let config = SimConfig::new(350, SimRole::Aggregated)
        .with_dp_size(2)
        .with_served_models(&["org/served", "adapter"])
        .with_cache_blocks(8)
        .with_token_latency(Duration::from_millis(1));
    let worker = start_config(config).await;
    let idle = get(&worker, "/metrics").await.text;
    assert_eq!(metric(&idle, "sim_requests_total"), 0, "sim metrics kept");
    let expected = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="org/served"} 0.0
vllm:num_requests_running{engine="1",model_name="org/served"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="org/served"} 0.0
vllm:num_requests_waiting{engine="1",model_name="org/served"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="org/served"} 0.0
vllm:kv_cache_usage_perc{engine="1",model_name="org/served"} 0.0
"#;
    assert!(idle.ends_with(expected), "{idle}");

    let two_blocks = long_prompt(31, "why");
    let body =
        json!({"model": "adapter", "prompt": two_blocks, "max_tokens": 2000, "stream": true});
    let stream = client()
        .post(format!("{}/v1/completions", worker.url()))
        .header("x-data-parallel-rank", "1")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let used = get(&worker, "/metrics").await.text;
    assert_eq!(
        vllm_gauge(&used, "vllm:kv_cache_usage_perc", 0),
        0.0,
        "{used}"
    );
    assert!(
        used.contains("vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"org/served\"} 0.25\n"),
        "its 2 blocks of 8, on its rank, while it runs:\n{used}"
    );
    drop(stream);
    wait_for_queue(&worker, 1, (0.0, 0.0)).await;
    let after = get(&worker, "/metrics").await.text;
    assert_eq!(
        vllm_gauge(&after, "vllm:kv_cache_usage_perc", 1),
        0.0,
        "cached blocks no request holds are free, as vLLM counts them"
    );
}

#[tokio::test]
async fn requests_beyond_a_ranks_batch_wait_while_it_runs() {
    let config = SimConfig::new(351, SimRole::Aggregated).with_max_num_seqs(1);
    two_of_three_prefills_wait(config).await;
}

#[tokio::test]
async fn prefills_beyond_one_steps_tokens_wait_while_it_runs() {
    let config = SimConfig::new(354, SimRole::Aggregated).with_max_num_batched_tokens(100);
    two_of_three_prefills_wait(config).await;
}

/// Three prefills of ~400 ms sent at once to rank 0 of `config`: one runs, two wait.
async fn two_of_three_prefills_wait(config: SimConfig) {
    let config = config
        .with_dp_size(2)
        .with_cache_blocks(1000)
        .with_prefill_per_token(Duration::from_millis(2))
        .with_token_latency(Duration::from_millis(1));
    let worker = start_config(config).await;
    let url = format!("{}/v1/completions", worker.url());
    let requests: Vec<_> = (0..3)
        .map(|i| {
            // ~400 ms of compute each, none sharing a block with another.
            let body = json!({"prompt": format!("{i} {}", long_prompt(200, "q")), "max_tokens": 2});
            let request = client()
                .post(url.clone())
                .header("x-data-parallel-rank", "0")
                .json(&body);
            tokio::spawn(request.send())
        })
        .collect();
    wait_for_queue(&worker, 0, (2.0, 1.0)).await;
    assert_eq!(engine_queue(&worker, 1).await, (0.0, 0.0), "another rank");
    for request in requests {
        assert_eq!(request.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert_eq!(engine_queue(&worker, 0).await, (0.0, 0.0));
}

#[tokio::test]
async fn a_stream_runs_until_its_end_and_a_cancelled_one_leaves_the_counts() {
    let config = SimConfig::new(352, SimRole::Aggregated)
        .with_dp_size(2)
        .with_token_latency(Duration::from_millis(30));
    let worker = start_config(config).await;
    let stream = open_stream(&worker, 1, 10).await;
    wait_for_queue(&worker, 1, (0.0, 1.0)).await;
    assert_eq!(engine_queue(&worker, 0).await, (0.0, 0.0));
    let text = stream.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(engine_queue(&worker, 1).await, (0.0, 0.0), "done");

    let cancelled = open_stream(&worker, 1, 100).await;
    wait_for_queue(&worker, 1, (0.0, 1.0)).await;
    drop(cancelled);
    wait_for_queue(&worker, 1, (0.0, 0.0)).await;
    assert_eq!(worker.in_flight(), 0);
}

#[tokio::test]
async fn engine_load_overrides_add_to_the_real_counts() {
    let worker = start_config(
        SimConfig::new(353, SimRole::Aggregated)
            .with_dp_size(2)
            .with_token_latency(Duration::from_millis(30)),
    )
    .await;
    let control = SimClient::new(worker.addr()).unwrap();
    let on_rank_1 = EngineLoadOverride {
        waiting: 5,
        running: 2,
        kv_cache_usage: 0.5,
        rank: Some(1),
    };
    control.set_engine_load(on_rank_1).await.unwrap();
    let text = get(&worker, "/metrics").await.text;
    assert_eq!(vllm_gauge(&text, "vllm:kv_cache_usage_perc", 1), 0.5);
    assert_eq!(vllm_gauge(&text, "vllm:kv_cache_usage_perc", 0), 0.0);
    assert_eq!(engine_queue(&worker, 1).await, (5.0, 2.0));
    assert_eq!(engine_queue(&worker, 0).await, (0.0, 0.0));

    let stream = open_stream(&worker, 1, 100).await;
    wait_for_queue(&worker, 1, (5.0, 3.0)).await;

    let everywhere = json!({"waiting": 1, "running": 0, "kv_cache_usage": 0.125});
    let reply = post(&worker, "/sim/engine-load", &[], &everywhere).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.json(), everywhere);
    assert_eq!(engine_queue(&worker, 0).await, (1.0, 0.0));
    assert_eq!(engine_queue(&worker, 1).await, (1.0, 1.0), "replaced");
    let text = get(&worker, "/metrics").await.text;
    assert_eq!(vllm_gauge(&text, "vllm:kv_cache_usage_perc", 0), 0.125);

    let unknown_rank = json!({"waiting": 1, "running": 0, "kv_cache_usage": 0.0, "rank": 2});
    let reply = post(&worker, "/sim/engine-load", &[], &unknown_rank).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    assert!(reply.error_message().contains("rank 2 is out of range"));
    let incomplete = post(&worker, "/sim/engine-load", &[], &json!({"waiting": 1})).await;
    assert_eq!(incomplete.status, StatusCode::BAD_REQUEST);
    assert!(
        worker
            .set_engine_load(EngineLoadOverride {
                rank: Some(7),
                ..on_rank_1
            })
            .is_err()
    );

    control.clear_engine_load().await.unwrap();
    assert_eq!(engine_queue(&worker, 0).await, (0.0, 0.0));
    assert_eq!(
        engine_queue(&worker, 1).await,
        (0.0, 1.0),
        "the real stream"
    );
    let text = get(&worker, "/metrics").await.text;
    assert_eq!(vllm_gauge(&text, "vllm:kv_cache_usage_perc", 1), 0.0);
    drop(stream);
}

#[tokio::test]
async fn metrics_faults_fail_only_the_metrics() {
    let worker = start(354, SimRole::Aggregated, 1).await;
    let control = SimClient::new(worker.addr()).unwrap();
    let completion = json!({"prompt": PROMPT, "max_tokens": 2});

    control
        .set_metrics_fault(MetricsFault::Garbage)
        .await
        .unwrap();
    assert_eq!(
        control.metrics_fault().await.unwrap(),
        MetricsFault::Garbage
    );
    let response = client()
        .get(format!("{}/metrics", worker.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let garbage = response.bytes().await.unwrap();
    assert!(std::str::from_utf8(&garbage).is_err(), "invalid UTF-8");
    let lines: Vec<&[u8]> = garbage.split(|byte| *byte == b'\n').collect();
    let has_line = |line: &str| lines.contains(&line.as_bytes());
    assert!(has_line(r#"vllm:num_requests_waiting{engine="0"} NaN"#));
    assert!(has_line(
        r#"vllm:num_requests_waiting{engine="99999999999"} 1e308"#
    ));
    assert!(has_line(
        r#"vllm:kv_cache_usage_perc{engine="0",model_name="sim-model"}"#
    ));
    assert!(
        lines.iter().any(|line| line.len() > 10 << 10),
        "a 10 KB label"
    );
    post_ok(&worker, "/v1/completions", &[], &completion).await;

    worker.set_metrics_fault(MetricsFault::Status(500));
    let reply = get(&worker, "/sim/metrics-fault").await;
    assert_eq!(reply.json(), json!({"fault": {"status": 500}}));
    assert_eq!(
        get(&worker, "/metrics").await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(get(&worker, "/health").await.status, StatusCode::OK);

    let reply = post(
        &worker,
        "/sim/metrics-fault",
        &[],
        &json!({"fault": "hang"}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(worker.metrics_fault(), MetricsFault::Hang);
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let error = impatient
        .get(format!("{}/metrics", worker.url()))
        .send()
        .await
        .unwrap_err();
    assert!(error.is_timeout(), "{error:?}");
    post_ok(&worker, "/v1/completions", &[], &completion).await;

    let refused = post(
        &worker,
        "/sim/metrics-fault",
        &[],
        &json!({"fault": "slow"}),
    )
    .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    control.set_metrics_fault(MetricsFault::None).await.unwrap();
    assert_eq!(engine_queue(&worker, 0).await, (0.0, 0.0));
    assert_eq!(worker.fault(), Fault::None, "the other faults untouched");
}

#[tokio::test]
async fn a_huge_metrics_fault_streams_over_100_mb_of_samples() {
    let worker = start(355, SimRole::Aggregated, 1).await;
    worker.set_metrics_fault(MetricsFault::Huge);
    let mut response = client()
        .get(format!("{}/metrics", worker.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let length = response.content_length().unwrap();
    assert!(length >= 100 << 20, "{length} bytes");
    let mut head = Vec::new();
    while head.len() < 1 << 20 {
        let chunk = response.chunk().await.unwrap().expect("more body");
        head.extend_from_slice(&chunk);
    }
    drop(response);
    let line = "vllm:num_requests_waiting{engine=\"0\",model_name=\"sim-model\"} 1.0";
    let text = String::from_utf8(head).unwrap();
    let (whole, _partial) = text.rsplit_once('\n').unwrap();
    assert!(
        whole.lines().all(|sample| sample == line),
        "{}",
        &whole[..200]
    );
    worker.stop().await;
}

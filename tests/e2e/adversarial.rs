//! The holes an adversarial review found, each through the real Envoy with the worker
//! behaviour that triggers it (`docs/security.md`).

use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::client::{Reply, complete, post, prompt, send};
use crate::{Deployment, disaggregated, nothing_reached_a_worker};

const PIN_201: [(&str, &str); 1] = [("x-dynamo-worker-instance-id", "201")];

#[tokio::test]
async fn no_decode_answer_confirms_a_guess_of_the_prefills_kv_locators() {
    let deployment = disaggregated().await;
    let mut answers = Vec::new();
    for guess in ["127.0.0.1", "127.0.0.9"] {
        let mut body = prompt();
        body["stream"] = json!(true);
        body["stream_options"] = json!({ "include_usage": guess });
        let reply = complete(&deployment, &PIN_201, &body).await;
        assert!(!reply.text.contains(guess), "{}", reply.text);
        reply.error(400, "decode_refused");
        answers.push((reply.status, reply.text));
    }
    assert_eq!(
        answers[0], answers[1],
        "a right and a wrong guess look the same"
    );
}

#[tokio::test]
async fn steering_fields_nested_in_a_completion_never_reach_a_worker() {
    let deployment = disaggregated().await;
    let forged = json!({"remote_host": "10.9.9.9", "remote_port": 1, "do_remote_prefill": true});
    for (member, value) in [
        ("vllm_xargs", json!({ "kv_transfer_params": forged })),
        ("nvext", json!({ "kv_transfer_params": forged })),
        ("ec_transfer_params", json!({})),
        ("vllm_xargs", json!({ "ec_transfer_params": {} })),
    ] {
        let mut body = prompt();
        body[member] = value;
        let reply = complete(&deployment, &PIN_201, &body).await;
        reply.error(400, "invalid_field");
    }
    assert!(nothing_reached_a_worker(&deployment));
}

#[tokio::test]
async fn idle_uploads_pinned_to_one_worker_do_not_steer_unpinned_traffic() {
    let deployment = disaggregated().await;
    let mut idle = Vec::new();
    for _ in 0..40 {
        let mut tcp = tokio::net::TcpStream::connect(deployment.envoy.listen())
            .await
            .unwrap();
        let head = "POST /tokenize HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
                    content-length: 1000\r\nx-dynamo-worker-instance-id: 201\r\n\r\n{\"a\":";
        tcp.write_all(head.as_bytes()).await.unwrap();
        idle.push(tcp);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut served_by_201 = 0;
    for _ in 0..20 {
        let reply = complete(&deployment, &[], &prompt()).await;
        reply.assert_ok("an unpinned request");
        served_by_201 += usize::from(reply.worker("decode") == Some(201));
    }
    assert!(served_by_201 >= 4, "201 served {served_by_201} of 20");
    drop(idle);
}

#[tokio::test]
async fn a_completion_takes_post_only_and_nothing_else_makes_a_prefill() {
    let deployment = disaggregated().await;
    for method in ["GET", "PUT", "DELETE", "PATCH"] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let reply = send(
            &deployment,
            method,
            "/v1/completions",
            &[],
            Some("{}".into()),
        )
        .await;
        reply.error(405, "method_not_allowed");
        assert_eq!(reply.header("allow"), Some("POST"));
    }
    assert!(nothing_reached_a_worker(&deployment));
}

#[tokio::test]
async fn the_engines_control_surface_answers_404() {
    let deployment = disaggregated().await;
    for path in [
        "/reset_prefix_cache",
        "/sleep",
        "/%77ake_up",
        "/collective_rpc",
    ] {
        let reply = send(&deployment, reqwest::Method::POST, path, &PIN_201, None).await;
        reply.error(404, "unknown_path");
    }
    assert!(nothing_reached_a_worker(&deployment));
    let models = send(&deployment, reqwest::Method::GET, "/v1/models", &[], None).await;
    models.assert_ok("the inference surface");
}

#[tokio::test]
async fn an_oversized_body_on_another_path_is_a_typed_413() {
    let deployment = disaggregated().await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let big = format!("[{}1]", "1,".repeat(4_500_000));
    for content_type in ["application/octet-stream", "application/json"] {
        let announced = client
            .post(deployment.url("/v1/embeddings"))
            .header("content-type", content_type)
            .body(big.clone())
            .send()
            .await
            .unwrap();
        let announced = crate::client::Reply::read(announced).await;
        announced.error(413, "body_too_large");
    }
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big
        .as_bytes()
        .chunks(1 << 16)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let streamed = client
        .post(deployment.url("/tokenize"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    let streamed = crate::client::Reply::read(streamed).await;
    streamed.error(413, "body_too_large");
}

#[tokio::test]
async fn large_json_bodies_on_another_path_cost_no_parsed_copy() {
    let deployment = disaggregated().await;
    let rss = || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", deployment.envoy.pid()));
        let line = status.unwrap_or_default();
        let kib = line
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
        kib.unwrap_or(0) / 1024
    };
    let before = rss();
    let array = format!("[{}1]", "1,".repeat(3_900_000));
    let sends = (0..4).map(|_| {
        send(
            &deployment,
            reqwest::Method::POST,
            "/tokenize",
            &[],
            Some(array.clone()),
        )
    });
    for reply in futures_util::future::join_all(sends).await {
        assert_ne!(reply.status, 413, "{}", reply.text);
    }
    let grown = rss().saturating_sub(before);
    assert!(
        grown < 200,
        "Envoy grew by {grown} MiB for four 8 MiB arrays"
    );
}

#[tokio::test]
async fn no_content_header_of_the_client_reaches_the_prefill_worker() {
    let deployment = disaggregated().await;
    let headers = [
        ("content-language", "fr"),
        ("content-md5", "Q2hlY2sgSW50ZWdyaXR5IQ=="),
    ];
    complete(&deployment, &headers, &prompt())
        .await
        .assert_ok("the request");
    let prefill: Vec<_> = [101, 102]
        .iter()
        .flat_map(|id| deployment.worker(*id).unwrap().requests())
        .collect();
    assert_eq!(prefill.len(), 1);
    for name in ["content-language", "content-md5"] {
        assert_eq!(prefill[0].header(name), None, "{name}");
    }
}

/// A long chat whose next turn continues it, as a client resends a conversation.
fn conversation(turns: usize) -> serde_json::Value {
    let mut messages = vec![json!({"role": "system", "content": "Answer briefly. ".repeat(120)})];
    for turn in 0..turns {
        messages.push(json!({"role": "user", "content": format!("question {turn}")}));
        messages.push(json!({"role": "assistant", "content": format!("answer {turn}")}));
    }
    messages.push(json!({"role": "user", "content": format!("question {turns}")}));
    json!({"model": "sim-model", "messages": messages, "max_tokens": 3})
}

async fn chat(
    deployment: &Deployment,
    headers: &[(&str, &str)],
    body: &serde_json::Value,
) -> Reply {
    post(deployment, "/v1/chat/completions", headers, body).await
}

#[tokio::test]
async fn one_clients_pin_never_places_another_clients_next_turn() {
    let deployment = disaggregated().await;
    let unpinned = chat(&deployment, &[], &conversation(1)).await;
    unpinned.assert_ok("an unpinned first turn");
    let chosen = unpinned.worker("decode").unwrap();
    let other = if chosen == 201 { 202 } else { 201 };
    let fresh = disaggregated().await;
    let pinned_elsewhere = [("x-dynamo-worker-instance-id", other.to_string())];
    let pinned_elsewhere: Vec<(&str, &str)> = pinned_elsewhere
        .iter()
        .map(|(n, v)| (*n, v.as_str()))
        .collect();
    chat(&fresh, &pinned_elsewhere, &conversation(1))
        .await
        .assert_ok("the attacker's pinned first turn");
    let next = chat(&fresh, &[], &conversation(2)).await;
    next.assert_ok("another client's next turn");
    assert_eq!(
        next.worker("decode"),
        Some(chosen),
        "placed by its prompt alone"
    );
    assert_eq!(
        crate::stat(&fresh, "wasmcustom.pinroute.placement.decode.remembered").await,
        0
    );
}

#[tokio::test]
async fn worker_ids_can_be_kept_from_clients() {
    let mut spec = crate::disaggregated_spec();
    spec.settings = json!({"worker_id_headers": false});
    let deployment = crate::start(spec).await;
    let reply = complete(&deployment, &PIN_201, &prompt()).await;
    reply.assert_ok("a served request");
    assert_eq!(reply.worker("decode"), None);
    assert_eq!(reply.worker("prefill"), None);
    deployment
        .worker(101)
        .unwrap()
        .set_fault(pinroute_harness::sim::Fault::Status(400));
    let pinned = [("x-dynamo-prefill-instance-id", "101")];
    let refused = complete(&deployment, &pinned, &prompt()).await;
    assert_eq!(refused.status, 400);
    assert!(
        refused.text.contains("simulated fault"),
        "the worker's own answer: {}",
        refused.text
    );
    assert_eq!(refused.worker("prefill"), None);
}

#[tokio::test]
async fn a_completion_path_reaches_the_decode_worker_in_its_plain_spelling() {
    let deployment = disaggregated().await;
    for path in [
        "/v1/completions/",
        "/v1/./completions",
        "/v1/completions%2F",
        "/v1/completions/?trace=1",
    ] {
        let reply = send(
            &deployment,
            reqwest::Method::POST,
            path,
            &PIN_201,
            Some(prompt().to_string()),
        )
        .await;
        reply.assert_ok(path);
        // The sim routes exactly as vLLM does: only the plain path finds the handler.
        let decoded = deployment.worker(201).unwrap().requests();
        assert_eq!(decoded.last().unwrap().path, "/v1/completions", "{path}");
    }
    let prefilled = [101, 102]
        .iter()
        .map(|id| deployment.worker(*id).unwrap().requests().len())
        .sum::<usize>();
    assert_eq!(prefilled, 4, "each prefill was used by its decode hop");
}

#[tokio::test]
async fn a_body_of_many_tiny_members_is_refused_before_it_costs_the_filter() {
    let deployment = disaggregated().await;
    let memory = || crate::stat(&deployment, "wasmcustom.pinroute.vm.memory_bytes");
    complete(&deployment, &PIN_201, &prompt())
        .await
        .assert_ok("a warm-up");
    let before = memory().await;
    let members: Vec<String> = (0..600_000).map(|i| format!(r#""{i:x}":1"#)).collect();
    let body = format!("{{{}}}", members.join(","));
    assert!(body.len() < 8 << 20);
    for _ in 0..4 {
        let reply = send(
            &deployment,
            reqwest::Method::POST,
            "/v1/completions",
            &[],
            Some(body.clone()),
        )
        .await;
        let message = reply.error(400, "invalid_body");
        assert!(message.contains("more than 256 members"), "{message}");
    }
    complete(&deployment, &PIN_201, &prompt())
        .await
        .assert_ok("after");
    let grown = memory().await.saturating_sub(before);
    assert!(
        grown < 24 << 20,
        "the VMs grew by {grown} bytes for four 8 MB bodies"
    );
}

#[tokio::test]
async fn a_forged_request_id_stays_one_field_of_one_access_log_line() {
    let deployment = disaggregated().await;
    let forged = "forged\" 200 - upstream=10.9.9.9:80 note=FAKE";
    let headers = [PIN_201[0], ("x-request-id", forged)];
    complete(&deployment, &headers, &prompt())
        .await
        .assert_ok("the request");
    let entry = crate::access_log::entry(&deployment, forged).await;
    assert_ne!(entry["upstream"], "10.9.9.9:80");
    assert_eq!(entry.get("note"), None);
    assert_eq!(entry["decode_worker"], "201");
}

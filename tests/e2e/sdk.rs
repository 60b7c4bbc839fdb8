//! The OpenAI and Anthropic Python SDKs, as users run them, against the gateway over HTTPS
//! with a locally made CA (`docs/deploy.md` §2.8): TLS to the client, an API key, mutual TLS
//! to both workers; completions, chat, the Responses API (a stored response followed up and
//! read back on its worker) and Anthropic's Messages API each get their answers, their typed
//! errors, and their streams.

use pinroute_harness::certs::Usage;
use pinroute_harness::envoy::{ApiKey, ApiKeys, Callers, DEFAULT_IDENTITY_HEADER, ListenerTls};
use serde_json::Value;

use crate::sdk_script::run_sdk_script;
use crate::start;
use crate::tls::{pki, worker_tls_spec};

const SCRIPT: &str = "tests/e2e/sdk/sdks_over_https.py";
const KEY: &str = "sk-sdk-0123456789";

#[tokio::test]
async fn the_openai_and_anthropic_sdks_get_answers_errors_and_streams_over_https() {
    let pki = pki();
    let ca = pki.ca.cert_path();
    let listener = pki
        .ca
        .issue("listener", &["localhost"], Usage::Server)
        .unwrap();
    let mut spec = worker_tls_spec(&pki, &pki.worker, Some(&ca));
    spec.edge.tls = Some(ListenerTls {
        cert: listener.cert,
        key: listener.key,
        client_ca: None,
    });
    spec.edge.callers = Some(Callers::ApiKeys(ApiKeys {
        keys: vec![ApiKey {
            client: "sdk".into(),
            key: KEY.into(),
        }],
        identity_header: DEFAULT_IDENTITY_HEADER.into(),
    }));
    let deployment = start(spec).await;
    let gateway = format!("https://localhost:{}", deployment.envoy.listen().port());
    let args = vec![gateway, ca.display().to_string(), KEY.to_owned()];
    let seen = run_sdk_script(SCRIPT, args).await;
    let completion = &seen["completion"];
    assert_eq!(completion["status"], 200, "{seen}");
    assert!(completion["prefill"].is_string(), "two hops: {seen}");
    assert!(completion["decode"].is_string(), "{seen}");
    assert!(!completion["text"].as_str().unwrap().is_empty(), "{seen}");
    assert!(
        seen["chat_stream"]["chunks"].as_u64().unwrap() >= 2,
        "{seen}"
    );
    assert_eq!(seen["bad_pin"]["status"], 400, "{seen}");
    assert_eq!(seen["bad_pin"]["code"], "unknown_worker", "{seen}");
    assert_eq!(seen["unlisted_key"]["status"], 401, "{seen}");
    assert_eq!(seen["unlisted_key"]["code"], "invalid_api_key", "{seen}");
    let handshakes: u64 = deployment.fronts.iter().map(|(_, f)| f.handshakes()).sum();
    assert!(handshakes >= 2, "both hops over mutual TLS: {handshakes}");
    assert_responses(&seen);
    assert_messages(&seen);
}

/// The Responses API: two hops, a follow-up and a read on the worker that stored the
/// response, the SDK's typed stream, and a typed 404 for an id no worker of the gateway made.
fn assert_responses(seen: &Value) {
    let response = &seen["response"];
    assert_eq!(response["status"], 200, "{seen}");
    assert!(response["prefill"].is_string(), "two hops: {seen}");
    assert_eq!(response["text"], "tok0 tok1 tok2 tok3", "{seen}");
    let id = response["id"].as_str().unwrap();
    assert!(
        id.starts_with(&format!("resp_w{}_", response["decode"].as_str().unwrap())),
        "{seen}"
    );
    for follow in ["follow_up", "retrieved"] {
        assert_eq!(
            seen[follow]["decode"], response["decode"],
            "{follow} on the worker that stored it: {seen}"
        );
        assert!(
            seen[follow]["prefill"].is_null(),
            "{follow} takes one hop: {seen}"
        );
    }
    assert_eq!(seen["follow_up"]["previous"], id, "{seen}");
    assert_eq!(seen["retrieved"]["id"], id, "{seen}");
    assert_eq!(seen["retrieved"]["text"], response["text"], "{seen}");
    let events: Vec<&str> = seen["response_stream"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(events.first(), Some(&"response.created"), "{seen}");
    assert_eq!(events.last(), Some(&"response.completed"), "{seen}");
    let deltas = events
        .iter()
        .filter(|e| **e == "response.output_text.delta")
        .count();
    assert_eq!(deltas, 3, "{seen}");
    assert_eq!(seen["unknown_previous"]["status"], 404, "{seen}");
    assert_eq!(
        seen["unknown_previous"]["code"], "response_not_found",
        "{seen}"
    );
}

/// Anthropic's Messages API: two hops pinned through `extra_headers`, a stream the SDK
/// assembles, token counts, and errors the SDK raises as Anthropic's.
fn assert_messages(seen: &Value) {
    let message = &seen["message"];
    assert_eq!(message["status"], 200, "{seen}");
    assert_eq!(message["decode"], "201", "the pin held: {seen}");
    assert!(message["prefill"].is_string(), "two hops: {seen}");
    assert_eq!(message["text"], "tok0 tok1 tok2 tok3", "{seen}");
    assert_eq!(message["stop_reason"], "max_tokens", "{seen}");
    assert_eq!(
        seen["message_stream"]["text"], "tok0 tok1 tok2 tok3",
        "{seen}"
    );
    assert!(
        seen["count_tokens"]["input_tokens"].as_u64().unwrap() > 0,
        "{seen}"
    );
    let bad_pin = &seen["message_bad_pin"];
    assert_eq!(
        (&bad_pin["status"], &bad_pin["type"], &bad_pin["code"]),
        (
            &Value::from(400),
            &Value::from("invalid_request_error"),
            &Value::from("unknown_worker")
        ),
        "{seen}"
    );
    assert_eq!(seen["message_unlisted_key"]["status"], 401, "{seen}");
}

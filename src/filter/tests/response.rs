//! The routed hop's answer: typed errors, passive health, withheld decode refusals; other paths.

use super::*;
use crate::policy::health::HealthTable;

/// A decode-pinned completion whose prefill answered with `KV`: routed to decode 202.
fn routed(pins: &[(&str, &str)]) -> Request {
    let mut request = Request::completion(REGISTRY, pins, PROMPT);
    let call = request.prefill_call();
    request.answer(
        &call,
        Some(200),
        &format!(r#"{{"kv_transfer_params": {KV}}}"#),
    );
    request
}

const CONNECT_FAILURE: &str = "upstream_reset_before_response_started{connection_failure}";

#[test]
fn a_decode_connection_failure_becomes_a_typed_error_and_counts_against_the_worker() {
    let mut request = routed(&[]);
    request.host.state().code_details = Some(CONNECT_FAILURE.into());
    let body = "upstream connect error or disconnect/reset before headers";
    assert_eq!(request.respond(503, Some(body)), Flow::Continue);
    let header = |name| request.host.response_header(name);
    assert_eq!(header(":status").as_deref(), Some("502"));
    assert_eq!(
        header("x-pinroute-error-code").as_deref(),
        Some("upstream_failed")
    );
    assert_eq!(header("x-pinroute-decode-worker").as_deref(), Some("201"));
    let answer: serde_json::Value = serde_json::from_str(&request.response_body()).unwrap();
    assert_eq!(answer["error"]["code"], "upstream_failed");
    assert_eq!(request.host.metric("pinroute.workers.connect_failed"), 1);
    assert_eq!(
        request.host.metric("pinroute.workers.marked_unhealthy"),
        0,
        "one failure is no evidence yet"
    );
    assert_eq!(request.host.metric("pinroute.decode.failed"), 1);
    assert_eq!(request.host.metric("pinroute.errors.upstream_failed"), 1);
}

#[test]
fn a_workers_own_5xx_fails_the_request_but_not_the_worker() {
    let mut request = routed(&[("x-dynamo-worker-instance-id", "202")]);
    request.host.state().code_details = Some("via_upstream".into());
    request.respond(500, Some("engine error"));
    let code = request.host.response_header("x-pinroute-error-code");
    assert_eq!(code.as_deref(), Some("pinned_worker_failed"));
    assert_eq!(request.host.metric("pinroute.workers.marked_unhealthy"), 0);
}

#[test]
fn a_failed_answer_without_a_body_is_answered_whole() {
    let mut request = routed(&[("x-dynamo-worker-instance-id", "202")]);
    request.host.state().code_details = Some(CONNECT_FAILURE.into());
    assert_eq!(request.respond(503, None), Flow::Pause);
    let sent = request.host.take_sent();
    assert_eq!((sent.len(), sent[0].status), (1, 502));
    assert_eq!(sent[0].json()["error"]["code"], "pinned_worker_failed");
    assert_eq!(
        request.respond(502, None),
        Flow::Continue,
        "the local reply passes"
    );
    assert!(request.host.take_sent().is_empty());
    request.end();
    assert_eq!(request.outstanding(202), 0);
}

#[test]
fn a_decode_4xx_to_a_hop_carrying_kv_is_withheld_whatever_it_echoes() {
    let answer = |echo: &str| {
        let mut request = routed(&[]);
        request.respond(400, Some(echo));
        let headers = request.host.state().response_headers.clone();
        (headers, request.response_body())
    };
    let right_guess = answer(r#"{"error": "bad stream_options: 10.0.0.11 p5600 engine-101"}"#);
    let wrong_guess = answer(r#"{"error": "bad stream_options: 10.0.0.12 p5601 engine-102"}"#);
    assert_eq!(right_guess, wrong_guess, "no answer may confirm a guess");
    let (headers, body) = right_guess;
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "decode_refused");
    assert!(!body.to_string().contains("10.0.0.11"));
    let header = |name: &str| headers.get(name).map(<[u8]>::to_vec);
    assert_eq!(header(":status"), Some(b"400".to_vec()));
    assert_eq!(header("content-length"), None);
}

#[test]
fn a_4xx_to_a_hop_without_kv_passes_as_it_is() {
    let mut request = Request::completion(REGISTRY, &[], PROMPT);
    let call = request.prefill_call();
    request.answer(&call, Some(200), r#"{"kv_transfer_params": null}"#);
    let refusal = r#"{"error": "max_tokens must be positive"}"#;
    request.respond(400, Some(refusal));
    assert_eq!(request.response_body(), refusal);
    assert_eq!(request.host.response_header("x-pinroute-error-code"), None);
}

#[test]
fn the_worker_envoy_retried_on_serves_and_the_refusing_one_has_a_failure_counted() {
    let mut request = routed(&[]);
    let pool = request.host.request_header("x-pinroute-pool");
    assert_eq!(pool.as_deref(), Some("10.0.0.21:8000,10.0.0.22:8000"));
    request.host.state().upstream_address = Some("10.0.0.22:8000".into());
    request.respond(200, Some("{}"));
    let served = request.host.response_header("x-pinroute-decode-worker");
    assert_eq!(served.as_deref(), Some("202"));
    assert_eq!(request.host.metric("pinroute.workers.connect_failed"), 1);
    assert_eq!(health(&request.host).failures(201), 1);
    assert_eq!(health(&request.host).failures(202), 0);
}

fn health(host: &FakeHost) -> HealthTable {
    HealthTable::decode(&host.shared(HEALTH_KEY).unwrap_or_default())
}

const HEALTH_KEY: &str = "pinroute.health.v3";

/// An unpinned completion on `host`, routed to decode 201 first, answered 200 by `served`.
fn served_by(host: &FakeHost, served: &str) {
    let mut request = Request::completion_on(host.clone(), REGISTRY, &[], PROMPT);
    let call = request.prefill_call();
    request.answer(&call, Some(200), r#"{"kv_transfer_params": null}"#);
    let pool = request.host.request_header("x-pinroute-pool");
    assert_eq!(pool.as_deref(), Some("10.0.0.21:8000,10.0.0.22:8000"));
    request.host.state().upstream_address = Some(served.into());
    request.respond(200, Some("{}"));
    request.end();
}

#[test]
fn a_served_hop_writes_health_data_only_to_clear_a_count() {
    let host = FakeHost::default();
    served_by(&host, "10.0.0.21:8000");
    assert_eq!(
        host.shared(HEALTH_KEY),
        None,
        "a success with no count costs no shared-data write"
    );
    served_by(&host, "10.0.0.22:8000");
    assert_eq!(health(&host).failures(201), 1, "201 refused, 202 served");
    served_by(&host, "10.0.0.21:8000");
    assert_eq!(health(&host).failures(201), 0, "201's answer clears it");
    assert!(health(&host).is_empty(), "nothing left to remember");
}

#[test]
fn another_paths_json_body_is_checked_before_any_load_is_counted() {
    let headers = [
        (":method", "POST"),
        (":path", "/tokenize"),
        ("content-type", "application/json"),
    ];
    let mut request = Request::new(REGISTRY, &headers);
    assert_eq!(request.headers(false), Flow::Pause);
    assert_eq!(
        request.outstanding(201),
        0,
        "no load while the body arrives"
    );
    assert_eq!(request.body(r#"{"prompt": "hi"}"#), Flow::Continue);
    assert_eq!(request.outstanding(201), 1);
    let upstream = request.host.request_header("x-pinroute-upstream");
    assert_eq!(upstream.as_deref(), Some("10.0.0.21:8000"));

    let mut forged = Request::new(REGISTRY, &headers);
    forged.headers(false);
    forged.body(r#"{"nested": {"kv_transfer_params": {}}}"#);
    let sent = forged.host.take_sent();
    assert_eq!(
        (sent[0].status, sent[0].json()["error"]["code"].clone()),
        (400, "invalid_field".into())
    );
    assert_eq!(forged.outstanding(201), 0);
}

#[test]
fn another_path_without_a_body_is_routed_at_once() {
    let headers = [(":method", "GET"), (":path", "/v1/models")];
    let mut request = Request::new(REGISTRY, &headers);
    assert_eq!(request.headers(true), Flow::Continue);
    assert_eq!(request.outstanding(201), 1);
    assert!(request.host.take_calls().is_empty(), "no prefill hop");
    request.end();
    assert_eq!(request.outstanding(201), 0);
}

#[test]
fn a_hop_envoy_could_not_retry_elsewhere_is_served_by_its_worker() {
    let mut request = routed(&[("x-dynamo-worker-instance-id", "202")]);
    assert_eq!(request.host.request_header("x-pinroute-pool"), None);
    assert_eq!(request.host.request_header("x-data-parallel-rank"), None);
    request.host.state().upstream_address = Some("10.0.0.21:8000".into());
    request.respond(200, Some("{}"));
    let served = request.host.response_header("x-pinroute-decode-worker");
    assert_eq!(
        served.as_deref(),
        Some("202"),
        "no pool: the address is not even read"
    );
}

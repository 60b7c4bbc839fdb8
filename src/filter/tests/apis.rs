//! The generation APIs beyond completions (`docs/semantics.md` §1, §4, §6): each one's prefill
//! body, the Responses API's stored state, and errors in each client's shape.

use serde_json::{Value, json};

use super::*;
use crate::policy::responses::{response_id, stored_on};

fn on(path: &'static str) -> [(&'static str, &'static str); 1] {
    [(":path", path)]
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

/// A request on `path` served through both hops: its prefill call's body, and the decode body.
fn two_hops(path: &'static str, body: &str) -> (Call, Value) {
    let mut request = Request::completion(REGISTRY, &on(path), body);
    let call = request.prefill_call();
    assert_eq!(call.header(":path"), Some(path));
    request.answer(
        &call,
        Some(200),
        &format!(r#"{{"kv_transfer_params": {KV}}}"#),
    );
    let decode = json_of(request.request_body().as_bytes());
    assert_eq!(decode["kv_transfer_params"], json_of(KV.as_bytes()));
    (call, decode)
}

#[test]
fn each_api_takes_two_hops_with_its_own_one_token_prefill() {
    let (call, decode) = two_hops(
        "/v1/messages",
        r#"{"model": "m", "system": "s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 700, "stream": true}"#,
    );
    let prefill = json_of(&call.body);
    assert_eq!(
        (&prefill["max_tokens"], &prefill["stream"]),
        (&json!(1), &json!(false))
    );
    assert_eq!(
        (&decode["max_tokens"], &decode["stream"]),
        (&json!(700), &json!(true))
    );

    let (call, decode) = two_hops(
        "/inference/v1/generate",
        r#"{"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 50, "min_tokens": 5}, "stream": true}"#,
    );
    let prefill = json_of(&call.body);
    assert_eq!(prefill["sampling_params"], json!({"max_tokens": 1}));
    assert_eq!(prefill["stream"], false);
    assert_eq!(
        decode["sampling_params"],
        json!({"max_tokens": 50, "min_tokens": 5})
    );

    let (call, decode) = two_hops(
        "/v1/responses",
        r#"{"model": "m", "input": "hi", "max_output_tokens": 90, "stream": true}"#,
    );
    let prefill = json_of(&call.body);
    assert_eq!(
        (
            &prefill["max_output_tokens"],
            &prefill["store"],
            &prefill["stream"]
        ),
        (&json!(1), &json!(false), &json!(false))
    );
    assert!(
        prefill.get("request_id").is_none(),
        "the prefill worker stores nothing"
    );
    let id = decode["request_id"].as_str().unwrap();
    assert_eq!(
        stored_on(id),
        Some(201),
        "{id}: the decode worker routed to"
    );
    assert_eq!(decode["max_output_tokens"], 90);
}

#[test]
fn a_stored_responses_decode_hop_is_not_offered_to_other_workers() {
    let mut request = Request::completion(REGISTRY, &on("/v1/responses"), r#"{"input": "hi"}"#);
    let call = request.prefill_call();
    request.answer(&call, Some(200), r#"{"kv_transfer_params": null}"#);
    assert_eq!(
        request.host.request_header("x-pinroute-pool").as_deref(),
        Some("10.0.0.21:8000"),
        "Envoy may dial the worker again, but no other"
    );
    let mut unstored = Request::completion(
        REGISTRY,
        &on("/v1/responses"),
        r#"{"input": "hi", "store": false}"#,
    );
    let call = unstored.prefill_call();
    unstored.answer(&call, Some(200), r#"{"kv_transfer_params": null}"#);
    assert!(
        json_of(unstored.request_body().as_bytes())
            .get("request_id")
            .is_none()
    );
}

#[test]
fn a_follow_up_takes_one_hop_to_the_worker_that_stored_its_previous_response() {
    let body = format!(
        r#"{{"input": "and then?", "previous_response_id": "{}"}}"#,
        response_id(202, 42)
    );
    let headers = [
        on("/v1/responses").as_slice(),
        &[("x-dynamo-session-id", "s")],
        COMPLETION_HEADERS,
    ]
    .concat();
    let mut request = Request::new(REGISTRY, &headers);
    assert_eq!(request.headers(false), Flow::Pause);
    assert_eq!(request.body(&body), Flow::Continue, "no prefill hop");
    assert!(request.host.take_calls().is_empty());
    assert_eq!(
        request
            .host
            .request_header("x-pinroute-upstream")
            .as_deref(),
        Some("10.0.0.22:8000")
    );
    assert_eq!(request.host.metric("pinroute.prefill.local_stateful"), 1);
    let decode = json_of(request.request_body().as_bytes());
    assert_eq!(stored_on(decode["request_id"].as_str().unwrap()), Some(202));
}

#[test]
fn a_background_response_takes_one_hop() {
    let body = r#"{"input": "hi", "background": true}"#;
    let mut request = Request::new(
        REGISTRY,
        &[on("/v1/responses").as_slice(), COMPLETION_HEADERS].concat(),
    );
    assert_eq!(request.headers(false), Flow::Pause);
    assert_eq!(request.body(body), Flow::Continue);
    assert!(request.host.take_calls().is_empty());
}

#[test]
fn a_stored_response_is_read_and_cancelled_on_its_worker() {
    let id = response_id(202, 7);
    for (method, path) in [
        (
            "GET",
            format!("/v1/responses/{id}?stream=true&starting_after=3"),
        ),
        ("POST", format!("/v1//responses/{id}/cancel")),
    ] {
        let headers = [(":method", method), (":path", path.as_str())];
        let mut request = Request::new(REGISTRY, &headers);
        assert_eq!(request.headers(true), Flow::Continue, "{path}");
        assert_eq!(
            request
                .host
                .request_header("x-pinroute-upstream")
                .as_deref(),
            Some("10.0.0.22:8000"),
            "{path}"
        );
        let sent_path = request.host.request_header(":path").unwrap();
        assert!(!sent_path.contains("//"), "{sent_path}");
        assert_eq!(
            sent_path.contains("?stream=true&starting_after=3"),
            method == "GET"
        );
    }
}

#[test]
fn a_response_no_worker_stored_is_404_and_a_wrong_method_405() {
    let unknown = Request::new(
        REGISTRY,
        &[(":method", "GET"), (":path", "/v1/responses/resp_abc")],
    );
    let sent = answered(unknown);
    assert_eq!(
        (sent.status, sent.json()["error"]["code"].clone()),
        (404, json!("response_not_found"))
    );
    let gone = format!("/v1/responses/{}", response_id(999, 1));
    let sent = answered(Request::new(
        REGISTRY,
        &[(":method", "GET"), (":path", gone.as_str())],
    ));
    assert_eq!(sent.status, 404);
    let cancel = format!("/v1/responses/{}/cancel", response_id(201, 1));
    let sent = answered(Request::new(
        REGISTRY,
        &[(":method", "GET"), (":path", cancel.as_str())],
    ));
    assert_eq!((sent.status, sent.header("allow")), (405, Some("POST")));
    let follow_up = r#"{"input": "x", "previous_response_id": "resp_elsewhere"}"#;
    let mut request = Request::new(
        REGISTRY,
        &[on("/v1/responses").as_slice(), COMPLETION_HEADERS].concat(),
    );
    assert_eq!(request.headers(false), Flow::Pause);
    request.body(follow_up);
    let sent = request.host.take_sent();
    assert_eq!(sent[0].status, 404);
    assert!(request.host.take_calls().is_empty());
}

fn answered(mut request: Request) -> fake_host::Sent {
    request.headers(true);
    assert!(request.host.take_calls().is_empty());
    assert_eq!(request.host.request_header("x-pinroute-upstream"), None);
    let mut sent = request.host.take_sent();
    assert_eq!(sent.len(), 1);
    sent.remove(0)
}

#[test]
fn anthropic_clients_get_anthropic_errors() {
    let headers = [
        on("/v1/messages").as_slice(),
        &[("x-dynamo-worker-instance-id", "999")],
        COMPLETION_HEADERS,
    ]
    .concat();
    let mut request = Request::new(REGISTRY, &headers);
    request.headers(false);
    request.body(r#"{"messages": [], "max_tokens": 5}"#);
    let sent = request.host.take_sent().remove(0);
    assert_eq!(sent.status, 400);
    assert_eq!(sent.json()["type"], "error");
    assert_eq!(sent.json()["error"]["type"], "invalid_request_error");
    assert_eq!(sent.json()["error"]["code"], "unknown_worker");
    assert_eq!(sent.header("x-pinroute-error-code"), Some("unknown_worker"));
    let sent = answered(Request::new(
        REGISTRY,
        &[(":method", "GET"), (":path", "/v1/messages")],
    ));
    assert_eq!(
        (sent.status, &sent.json()["error"]["type"]),
        (405, &json!("invalid_request_error"))
    );
    let sent = answered(Request::new(
        REGISTRY,
        &[(":method", "GET"), (":path", "/v1/responses/x/y")],
    ));
    assert_eq!(
        sent.json()["error"]["code"],
        "unknown_path",
        "OpenAI's shape elsewhere"
    );
}

#[test]
fn a_client_never_names_the_response_id_nor_caps_generate_out_of_reach() {
    for (path, body, field) in [
        (
            "/v1/responses",
            r#"{"input": "x", "request_id": "resp_mine"}"#,
            "request_id",
        ),
        (
            "/inference/v1/generate",
            r#"{"token_ids": [1], "sampling_params": [64]}"#,
            "sampling_params",
        ),
        (
            "/inference/v1/generate",
            r#"{"token_ids": [1], "sampling_params": {"extra_args": {"kv_transfer_params": {}}}}"#,
            "kv_transfer_params",
        ),
    ] {
        let headers = [[(":path", path)].as_slice(), COMPLETION_HEADERS].concat();
        let mut request = Request::new(REGISTRY, &headers);
        request.headers(false);
        request.body(body);
        assert!(request.host.take_calls().is_empty(), "{body}");
        let sent = request.host.take_sent().remove(0);
        assert_eq!(sent.status, 400, "{body}");
        assert!(
            sent.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains(field),
            "{body}"
        );
    }
}

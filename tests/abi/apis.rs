//! The Responses and Messages APIs as the ABI shows them (`docs/semantics.md` §4, §6).

use pinroute_tests::{Action, Host};
use serde_json::json;

use crate::{REGISTRY, host, json};

fn send(host: &mut Host, path: &str, extra: &[(&str, &str)], body: &str) -> u32 {
    let ctx = host.new_http_stream().unwrap();
    let headers: Vec<(&str, &str)> = [
        (":method", "POST"),
        (":path", path),
        (":authority", "gateway"),
        ("content-type", "application/json"),
        ("x-request-id", "req-1"),
    ]
    .into_iter()
    .chain(extra.iter().copied())
    .collect();
    assert_eq!(
        host.request_headers(ctx, &headers, false).unwrap(),
        Action::Pause
    );
    host.request_body(ctx, body.as_bytes(), true).unwrap();
    ctx
}

#[test]
fn a_response_is_prefilled_storing_nothing_and_made_by_the_worker_its_id_names() {
    let mut host = host(REGISTRY);
    let ctx = send(
        &mut host,
        "/v1/responses",
        &[("x-dynamo-worker-instance-id", "201")],
        r#"{"model": "m", "input": "hello", "max_output_tokens": 9, "stream": true}"#,
    );
    let calls = host.take_http_calls();
    let prefill = json(&calls[0].body);
    assert_eq!(calls[0].headers.get_str(":path"), Some("/v1/responses"));
    assert_eq!(
        (
            &prefill["max_output_tokens"],
            &prefill["store"],
            &prefill["stream"]
        ),
        (&json!(1), &json!(false), &json!(false))
    );
    host.http_call_response(
        calls[0].token,
        &[(":status", "200")],
        br#"{"id": "resp_p", "kv_transfer_params": {"remote_engine_id": "e"}}"#,
    )
    .unwrap();
    let decode = json(&host.stream(ctx).unwrap().request_body());
    let id = decode["request_id"].as_str().unwrap();
    assert!(
        id.starts_with("resp_w201_") && id.len() == "resp_w201_".len() + 32,
        "{id}"
    );
    assert_eq!(
        decode["kv_transfer_params"],
        json!({"remote_engine_id": "e"})
    );
    assert_eq!(decode["max_output_tokens"], 9);

    let read = host.new_http_stream().unwrap();
    let path = format!("/v1/responses/{id}");
    let headers = [
        (":method", "GET"),
        (":path", path.as_str()),
        (":authority", "g"),
    ];
    assert_eq!(
        host.request_headers(read, &headers, true).unwrap(),
        Action::Continue
    );
    assert_eq!(
        host.stream(read)
            .unwrap()
            .request_header("x-pinroute-upstream"),
        Some("10.0.0.21:8000")
    );
}

#[test]
fn a_messages_client_reads_an_anthropic_error() {
    let mut host = host(REGISTRY);
    let ctx = send(
        &mut host,
        "/v1/messages",
        &[("x-dynamo-worker-instance-id", "101")],
        r#"{"model": "m", "messages": [], "max_tokens": 4}"#,
    );
    assert!(host.take_http_calls().is_empty());
    let reply = host.stream(ctx).unwrap().local_reply.clone().unwrap();
    assert_eq!(reply.status, 400);
    assert_eq!(
        json(&reply.body),
        json!({"type": "error", "error": {
            "type": "invalid_request_error", "code": "wrong_worker_role",
            "message": "decode hop: pinned worker 101 is a prefill worker, not a decode worker"}})
    );
}

//! The two-hop flow, errors and passive health as the ABI shows them.

use pinroute_tests::Action;
use serde_json::json;

use crate::{PROMPT, REGISTRY, completion_headers, host, json, send_completion};

const PREFILL_ANSWER: &str = r#"{"id": "cmpl-1", "choices": [{"text": "x"}], "kv_transfer_params": {"remote_engine_id": "e-101", "remote_block_ids": [1, 2]}}"#;

#[test]
fn a_decode_pin_gets_a_free_prefill_hop_then_the_decode_rewrite() {
    let mut host = host(REGISTRY);
    let forged = [
        ("x-dynamo-worker-instance-id", "202"),
        ("x-data-parallel-rank", "1"),
        ("x-envoy-original-dst-host", "6.6.6.6:80"),
        ("x-pinroute-upstream", "6.6.6.6:80"),
        ("authorization", "Bearer k"),
    ];
    let ctx = send_completion(&mut host, &forged, PROMPT);

    let calls = host.take_http_calls();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(call.upstream, "pinroute_prefill");
    let prefill_address = call
        .headers
        .get_str("x-envoy-original-dst-host")
        .unwrap()
        .to_string();
    assert!(
        ["10.0.0.11:8000", "10.0.0.12:8000"].contains(&prefill_address.as_str()),
        "{prefill_address}"
    );
    assert_eq!(call.headers.get_str(":path"), Some("/v1/completions"));
    assert_eq!(call.headers.get_str("x-request-id"), Some("req-1"));
    assert_eq!(
        call.headers.get_str("authorization"),
        Some("Bearer k"),
        "client credentials reach the prefill worker"
    );
    assert_eq!(
        call.headers.get_str("x-data-parallel-rank"),
        None,
        "the decode rank must not reach prefill"
    );
    assert_eq!(call.timeout_ms, 30_000);
    let prefill_body = json(&call.body);
    assert_eq!(
        (
            prefill_body["stream"].clone(),
            prefill_body["max_tokens"].clone()
        ),
        (json!(false), json!(1))
    );
    assert_eq!(prefill_body["kv_transfer_params"]["do_remote_decode"], true);
    assert!(
        host.stream(ctx).unwrap().request_paused(),
        "decode waits for prefill"
    );

    host.http_call_response(call.token, &[(":status", "200")], PREFILL_ANSWER.as_bytes())
        .unwrap();
    let stream = host.stream(ctx).unwrap();
    assert!(stream.request_resumed && stream.request_forwarded);
    assert_eq!(
        stream.request_header("x-pinroute-upstream"),
        Some("10.0.0.22:8000")
    );
    assert_eq!(
        stream.request_header("x-pinroute-pool"),
        None,
        "a pinned hop is never retried elsewhere"
    );
    assert_eq!(stream.request_header("x-data-parallel-rank"), Some("1"));
    assert_eq!(stream.request_header("x-envoy-original-dst-host"), None);
    assert_eq!(stream.request_header("x-dynamo-worker-instance-id"), None);
    let decode_body = stream.request_body();
    assert_eq!(
        stream.request_header("content-length"),
        Some(decode_body.len().to_string().as_str())
    );
    assert_eq!(
        json(&decode_body),
        json!({"model": "m", "prompt": "hello", "max_tokens": 7, "stream": true,
               "kv_transfer_params": {"remote_engine_id": "e-101", "remote_block_ids": [1, 2]}})
    );

    host.response_headers(
        ctx,
        &[(":status", "200"), ("content-type", "text/event-stream")],
        false,
    )
    .unwrap();
    let stream = host.stream(ctx).unwrap();
    assert_eq!(
        stream.response_header("x-pinroute-decode-worker"),
        Some("202")
    );
    let prefill_id = if prefill_address.starts_with("10.0.0.11") {
        "101"
    } else {
        "102"
    };
    assert_eq!(
        stream.response_header("x-pinroute-prefill-worker"),
        Some(prefill_id)
    );
    assert_eq!(host.counter("pinroute.prefill.ok"), Some(1));
    assert_eq!(host.counter("pinroute.pins.decode_worker"), Some(1));
    assert_eq!(host.counter("pinroute.pins.decode_rank"), Some(1));
    assert_eq!(
        host.histogram("pinroute.prefill.latency_ms")
            .map(|v| v.len()),
        Some(1)
    );
}

#[test]
fn a_bad_pin_is_answered_locally_with_a_typed_error() {
    let mut host = host(REGISTRY);
    let ctx = send_completion(&mut host, &[("x-dynamo-worker-instance-id", "101")], PROMPT);
    assert!(host.take_http_calls().is_empty());
    let reply = host.stream(ctx).unwrap().local_reply.clone().unwrap();
    assert_eq!(reply.status, 400);
    assert_eq!(
        reply.headers.get_str("x-pinroute-error-code"),
        Some("wrong_worker_role")
    );
    let body = json(&reply.body);
    assert_eq!(body["error"]["code"], "wrong_worker_role");
    assert_eq!(
        body["error"]["message"],
        "decode hop: pinned worker 101 is a prefill worker, not a decode worker"
    );
    assert_eq!(host.counter("pinroute.errors.wrong_worker_role"), Some(1));
}

#[test]
fn a_malformed_pin_header_is_refused_before_the_body() {
    let mut host = host(REGISTRY);
    let ctx = host.new_http_stream().unwrap();
    let headers = crate::completion_headers(&[("x-dynamo-dp-rank", "one")]);
    host.request_headers(ctx, &headers, false).unwrap();
    let reply = host.stream(ctx).unwrap().local_reply.clone().unwrap();
    assert_eq!(reply.status, 400);
    assert!(
        json(&reply.body)["error"]["message"]
            .as_str()
            .unwrap()
            .contains("x-dynamo-dp-rank")
    );
}

#[test]
fn a_failed_unpinned_prefill_is_retried_elsewhere_then_falls_back_to_one_hop() {
    let mut host = host(REGISTRY);
    let ctx = send_completion(&mut host, &[], PROMPT);
    let first = host.take_http_calls().remove(0);
    host.http_call_refused(first.token).unwrap();
    let second = host.take_http_calls().remove(0);
    assert_ne!(
        first.headers.get_str("x-envoy-original-dst-host"),
        second.headers.get_str("x-envoy-original-dst-host"),
        "the retry goes to the other prefill worker"
    );
    host.http_call_response(
        second.token,
        &[(":status", "503")],
        b"upstream connect error or disconnect/reset before headers. reset reason: connection failure",
    )
    .unwrap();
    assert!(host.take_http_calls().is_empty(), "prefill_retries is 1");
    let stream = host.stream(ctx).unwrap();
    assert!(stream.request_forwarded, "aggregated fallback");
    let pool = stream.request_header("x-pinroute-pool").unwrap();
    let first = stream.request_header("x-pinroute-upstream").unwrap();
    assert!(
        pool.starts_with(first)
            && pool.contains("10.0.0.21:8000")
            && pool.contains("10.0.0.22:8000"),
        "{pool}"
    );
    assert!(
        json(&stream.request_body())
            .get("kv_transfer_params")
            .is_none()
    );
    assert_eq!(host.counter("pinroute.prefill.retried"), Some(1));
    assert_eq!(
        host.counter("pinroute.prefill.aggregated_fallback"),
        Some(1)
    );
    assert_eq!(host.counter("pinroute.workers.connect_failed"), Some(2));
    assert_eq!(
        host.counter("pinroute.workers.marked_unhealthy"),
        Some(0),
        "one failure each is no evidence yet"
    );
}

/// Sends a completion pinned to prefill worker `id` and fails its prefill connection.
fn fail_pinned_prefill(host: &mut pinroute_tests::Host, id: &str) {
    let ctx = send_completion(host, &[("x-dynamo-prefill-instance-id", id)], PROMPT);
    let call = host.take_http_calls().remove(0);
    host.http_call_refused(call.token).unwrap();
    let reply = host.stream(ctx).unwrap().local_reply.clone().unwrap();
    assert_eq!(json(&reply.body)["error"]["code"], "pinned_worker_failed");
}

/// Whether a completion pinned to prefill worker `id` is dispatched to it.
fn pinned_prefill_is_tried(host: &mut pinroute_tests::Host, id: &str) -> bool {
    let ctx = send_completion(host, &[("x-dynamo-prefill-instance-id", id)], PROMPT);
    let calls = host.take_http_calls();
    match host.stream(ctx).unwrap().local_reply.clone() {
        None => calls.len() == 1,
        Some(reply) => {
            assert_eq!(json(&reply.body)["error"]["code"], "worker_unavailable");
            false
        }
    }
}

#[test]
fn a_worker_failing_three_times_in_a_row_is_unavailable_to_pins_and_skipped_until_its_period_ends()
{
    let mut host = host(REGISTRY);
    for _ in 0..2 {
        fail_pinned_prefill(&mut host, "101");
    }
    assert!(
        pinned_prefill_is_tried(&mut host, "101"),
        "two failures leave it in service"
    );
    fail_pinned_prefill(&mut host, "101");
    assert_eq!(host.counter("pinroute.workers.marked_unhealthy"), Some(1));

    let ctx = send_completion(
        &mut host,
        &[("x-dynamo-prefill-instance-id", "101")],
        PROMPT,
    );
    let reply = host.stream(ctx).unwrap().local_reply.clone().unwrap();
    assert_eq!(reply.status, 503);
    assert_eq!(json(&reply.body)["error"]["code"], "worker_unavailable");
    assert_eq!(reply.headers.get_str("retry-after"), Some("10"));

    for _ in 0..4 {
        send_completion(&mut host, &[], PROMPT);
        let call = host.take_http_calls().remove(0);
        assert_eq!(
            call.headers.get_str("x-envoy-original-dst-host"),
            Some("10.0.0.12:8000"),
            "101 is skipped"
        );
    }

    host.advance_time(std::time::Duration::from_secs(11));
    let ctx = send_completion(
        &mut host,
        &[("x-dynamo-prefill-instance-id", "101")],
        PROMPT,
    );
    assert!(
        host.stream(ctx).unwrap().local_reply.is_none(),
        "101 is back in service"
    );
    assert_eq!(host.take_http_calls().len(), 1);
}

#[test]
fn a_success_between_failures_starts_the_count_again() {
    let mut host = host(REGISTRY);
    for _ in 0..2 {
        fail_pinned_prefill(&mut host, "101");
    }
    let ctx = send_completion(
        &mut host,
        &[("x-dynamo-prefill-instance-id", "101")],
        PROMPT,
    );
    let call = host.take_http_calls().remove(0);
    host.http_call_response(call.token, &[(":status", "200")], PREFILL_ANSWER.as_bytes())
        .unwrap();
    assert!(host.stream(ctx).unwrap().request_forwarded);
    for _ in 0..2 {
        fail_pinned_prefill(&mut host, "101");
    }
    assert!(
        pinned_prefill_is_tried(&mut host, "101"),
        "four failures, but never three in a row"
    );
    assert_eq!(host.counter("pinroute.workers.marked_unhealthy"), Some(0));
}

#[test]
fn a_pool_whose_workers_all_failed_is_still_used_in_panic_mode() {
    let mut host = host(REGISTRY);
    for id in ["101", "102"] {
        for _ in 0..3 {
            fail_pinned_prefill(&mut host, id);
        }
    }
    assert_eq!(host.counter("pinroute.workers.marked_unhealthy"), Some(2));
    let ctx = send_completion(&mut host, &[], PROMPT);
    let calls = host.take_http_calls();
    assert_eq!(
        calls.len(),
        1,
        "a prefill worker is tried rather than none (aggregated fallback)"
    );
    assert!(host.stream(ctx).unwrap().request_paused());
    assert_eq!(host.counter("pinroute.workers.panic_prefill"), Some(1));
    assert!(
        pinned_prefill_is_tried(&mut host, "101"),
        "a pin to a worker panic mode uses is tried"
    );
    assert_eq!(host.counter("pinroute.workers.panic_prefill"), Some(2));
}

#[test]
fn a_failed_decode_response_becomes_a_typed_error() {
    let mut host = host(REGISTRY);
    let ctx = send_completion(&mut host, &[("x-dynamo-worker-instance-id", "201")], PROMPT);
    let call = host.take_http_calls().remove(0);
    host.http_call_response(call.token, &[(":status", "200")], PREFILL_ANSWER.as_bytes())
        .unwrap();
    host.set_property(
        &["response", "code_details"],
        b"upstream_reset_before_response_started{connection_failure}",
    );
    let action = host
        .response_headers(ctx, &[(":status", "503"), ("content-length", "91")], false)
        .unwrap();
    assert_eq!(action, Action::Continue);
    host.response_body(ctx, b"upstream connect error or disconnect/reset before headers. reset reason: connection failure", true).unwrap();
    let stream = host.stream(ctx).unwrap();
    assert_eq!(stream.response_header(":status"), Some("502"));
    assert_eq!(
        stream.response_header("x-pinroute-error-code"),
        Some("pinned_worker_failed")
    );
    let body = json(&stream.response_body());
    assert_eq!(
        body["error"]["message"],
        "decode hop: pinned worker 201 failed: the connection failed"
    );
    assert_eq!(host.counter("pinroute.decode.failed"), Some(1));
}

#[test]
fn other_paths_are_routed_at_once_without_reading_the_body() {
    let mut host = host(REGISTRY);
    let ctx = host.new_http_stream().unwrap();
    let headers = [
        (":method", "GET"),
        (":path", "/v1/models?x=1"),
        (":authority", "gateway"),
        ("x-dynamo-worker-instance-id", "201"),
    ];
    assert_eq!(
        host.request_headers(ctx, &headers, true).unwrap(),
        Action::Continue
    );
    assert!(host.take_http_calls().is_empty());
    assert_eq!(
        host.stream(ctx)
            .unwrap()
            .request_header("x-pinroute-upstream"),
        Some("10.0.0.21:8000")
    );
}

#[test]
fn an_invalid_configuration_is_refused_at_load() {
    let options = pinroute_tests::HostOptions {
        allow_on_headers_stop_iteration: true,
        ..Default::default()
    };
    let error =
        pinroute_tests::Host::with_options(&crate::wasm(), r#"{"workers": [{"id": 1}]}"#, options)
            .err()
            .expect("on_configure refuses it");
    assert!(format!("{error:#}").contains("configur"), "{error:#}");
}

#[test]
fn an_escaped_completion_path_takes_the_two_hop_flow_and_loses_the_clients_kv() {
    let mut host = host(REGISTRY);
    let ctx = host.new_http_stream().unwrap();
    let mut headers = completion_headers(&[]);
    headers
        .iter_mut()
        .filter(|(n, _)| n == ":path")
        .for_each(|(_, v)| *v = "/v1/%63ompletions?a=1".into());
    assert_eq!(
        host.request_headers(ctx, &headers, false).unwrap(),
        Action::Pause,
        "the body is read"
    );
    let body = r#"{"prompt": "x", "kv_transfer_params": {"do_remote_prefill": true, "remote_host": "6.6.6.6"}}"#;
    host.request_body(ctx, body.as_bytes(), true).unwrap();
    let calls = host.take_http_calls();
    assert_eq!(calls.len(), 1, "the prefill hop was taken");
    assert_eq!(calls[0].headers.get_str(":path"), Some("/v1/completions"));
    host.http_call_response(
        calls[0].token,
        &[(":status", "200")],
        PREFILL_ANSWER.as_bytes(),
    )
    .unwrap();
    let decode = json(&host.stream(ctx).unwrap().request_body());
    assert_eq!(
        decode["kv_transfer_params"],
        json!({"remote_engine_id": "e-101", "remote_block_ids": [1, 2]})
    );
}

#[test]
fn a_decode_4xx_to_a_hop_carrying_kv_is_withheld_as_a_typed_error() {
    let mut host = host(REGISTRY);
    let ctx = send_completion(&mut host, &[("x-dynamo-worker-instance-id", "202")], PROMPT);
    let call = host.take_http_calls().remove(0);
    let answer = r#"{"choices": [], "kv_transfer_params": {"remote_engine_id": "engine-7f3a", "remote_host": "10.9.8.7", "remote_port": 5600, "remote_block_ids": [1]}}"#;
    host.http_call_response(call.token, &[(":status", "200")], answer.as_bytes())
        .unwrap();
    host.response_headers(
        ctx,
        &[
            (":status", "400"),
            ("content-type", "application/json"),
            ("content-length", "99"),
        ],
        false,
    )
    .unwrap();
    assert_eq!(
        host.stream(ctx).unwrap().response_header("content-length"),
        None
    );
    let echo = r#"{"error": {"message": "bad input {'remote_host': '10.9.8.7', 'remote_port': 5600, 'remote_engine_id': 'engine-7f3a'}"}}"#;
    let (head, tail) = echo.split_at(40);
    assert_eq!(
        host.response_body(ctx, head.as_bytes(), false).unwrap(),
        Action::Pause
    );
    assert_eq!(
        host.response_body(ctx, tail.as_bytes(), true).unwrap(),
        Action::Continue
    );
    let stream = host.stream(ctx).unwrap();
    let sent = json(&stream.response_body_sent);
    assert_eq!(sent["error"]["code"], "decode_refused");
    assert!(!sent.to_string().contains("10.9.8.7"), "{sent}");
    assert_eq!(stream.response_header(":status"), Some("400"));
    assert_eq!(
        stream.response_header("x-pinroute-error-code"),
        Some("decode_refused")
    );
}

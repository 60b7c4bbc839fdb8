//! What is admitted: paths, methods, sizes; what the prefill hop carries of the headers.

use super::*;

fn refused(config: &str, headers: &[(&str, &str)]) -> fake_host::Sent {
    let mut request = Request::new(config, headers);
    assert_eq!(request.headers(false), Flow::Pause);
    assert!(
        request.host.take_calls().is_empty(),
        "no hop for a refused request"
    );
    assert_eq!(request.outstanding(201), 0);
    let mut sent = request.host.take_sent();
    assert_eq!(sent.len(), 1);
    sent.remove(0)
}

#[test]
fn the_engines_control_surface_is_not_routed() {
    for path in [
        "/reset_prefix_cache",
        "/%73leep",
        "/v1/models/../collective_rpc",
        "/metrics",
    ] {
        let sent = refused(REGISTRY, &[(":method", "POST"), (":path", path)]);
        assert_eq!(sent.status, 404, "{path}");
        assert_eq!(sent.json()["error"]["code"], "unknown_path");
    }
}

#[test]
fn an_operator_can_route_more_paths() {
    let config = config_with(r#""routed_paths": ["/metrics", "/inference/*"]"#);
    for path in ["/metrics", "/inference/v1/abort_requests"] {
        let mut request = Request::new(&config, &[(":method", "GET"), (":path", path)]);
        assert_eq!(request.headers(true), Flow::Continue, "{path}");
    }
    let sent = refused(&config, &[(":method", "GET"), (":path", "/v1/models")]);
    assert_eq!(sent.status, 404, "the list replaces the default one");
}

#[test]
fn a_completion_takes_post_only() {
    for method in ["GET", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"] {
        let headers = [(":method", method), (":path", "/v1/chat/completions")];
        let sent = refused(REGISTRY, &headers);
        assert_eq!(sent.status, 405, "{method}");
        assert_eq!(sent.json()["error"]["code"], "method_not_allowed");
        assert_eq!(sent.header("allow"), Some("POST"));
    }
}

#[test]
fn a_body_announced_over_the_limit_is_refused_on_every_path() {
    let config = config_with(r#""max_body_bytes": 1000"#);
    for path in ["/v1/completions", "/tokenize", "/v1/embeddings"] {
        let headers = [
            (":method", "POST"),
            (":path", path),
            ("content-type", "application/octet-stream"),
            ("content-length", "1001"),
        ];
        let sent = refused(&config, &headers);
        assert_eq!(
            (sent.status, sent.json()["error"]["code"].clone()),
            (413, "body_too_large".into())
        );
    }
}

#[test]
fn no_content_header_of_the_client_reaches_the_prefill_hop() {
    let headers = [
        ("content-encoding", "gzip"),
        ("content-language", "fr"),
        ("content-md5", "x"),
        ("traceparent", "00-1-2-01"),
    ];
    let request = Request::completion(REGISTRY, &headers, PROMPT);
    let call = request.prefill_call();
    for name in ["content-encoding", "content-language", "content-md5"] {
        assert_eq!(call.header(name), None, "{name}");
    }
    assert_eq!(call.header("content-type"), Some("application/json"));
    assert_eq!(call.header("traceparent"), Some("00-1-2-01"));
}

#[test]
fn the_prefill_hop_names_envoys_request_span_as_its_parent() {
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let headers = [
        ("x-pinroute-trace", &*format!("{trace}/b7ad6b7169203331")),
        ("traceparent", &*format!("00-{trace}-00f067aa0ba902b7-00")),
        ("tracestate", "vendor=1"),
    ];
    let request = Request::completion(REGISTRY, &headers, PROMPT);
    assert_eq!(request.host.request_header("x-pinroute-trace"), None);
    let call = request.prefill_call();
    assert_eq!(
        call.header("traceparent"),
        Some(&*format!("00-{trace}-b7ad6b7169203331-00")),
        "Envoy's span, the client's sampled flag"
    );
    assert_eq!(call.header("tracestate"), Some("vendor=1"));
    assert_eq!(call.header("x-pinroute-trace"), None);
}

const CALLER_RULES: &str =
    r#""callers": {"may_pin": ["ops"], "may_use_sessions": ["ops", "chat"]}"#;

#[test]
fn a_caller_not_allowed_to_pin_is_refused_before_anything_is_dialled() {
    let config = config_with(CALLER_RULES);
    for (caller, path) in [
        (None, "/v1/completions"),
        (Some("chat"), "/v1/completions"),
        (Some("chat"), "/v1/embeddings"),
    ] {
        let mut headers = vec![
            (":method", "POST"),
            (":path", path),
            ("x-dynamo-worker-instance-id", "201"),
        ];
        headers.extend(caller.map(|c| ("x-client-id", c)));
        let sent = refused(&config, &headers);
        assert_eq!(sent.status, 403, "{caller:?} {path}");
        assert_eq!(sent.json()["error"]["code"], "pin_not_allowed");
    }
}

#[test]
fn a_pin_in_the_body_is_held_to_the_same_rule() {
    let config = config_with(CALLER_RULES);
    let body = r#"{"model": "m", "prompt": "hi", "nvext": {"decode_worker_id": 201}}"#;
    let mut request = Request::completion(&config, &[("x-client-id", "chat")], body);
    assert!(request.host.take_calls().is_empty(), "no prefill hop");
    let sent = request.host.take_sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status, 403);
    assert_eq!(sent[0].json()["error"]["code"], "pin_not_allowed");
    request.end();
}

#[test]
fn a_listed_caller_pins_and_an_unlisted_one_may_still_go_unpinned() {
    let config = config_with(CALLER_RULES);
    let pinned = Request::completion(
        &config,
        &[
            ("x-client-id", "ops"),
            ("x-dynamo-prefill-instance-id", "102"),
        ],
        PROMPT,
    );
    let call = pinned.prefill_call();
    assert_eq!(
        call.header("x-envoy-original-dst-host"),
        Some("10.0.0.12:8000")
    );
    let unpinned = Request::completion(&config, &[("x-client-id", "chat")], PROMPT);
    unpinned.prefill_call();
}

#[test]
fn only_listed_callers_name_a_session() {
    let config = config_with(CALLER_RULES);
    let session = ("x-dynamo-session-id", "s-1");
    let headers = [COMPLETION_HEADERS, &[session, ("x-client-id", "bench")]].concat();
    let sent = refused(&config, &headers);
    assert_eq!(sent.status, 403);
    assert_eq!(sent.json()["error"]["code"], "session_not_allowed");
    let allowed = Request::completion(&config, &[session, ("x-client-id", "chat")], PROMPT);
    allowed.prefill_call();
}

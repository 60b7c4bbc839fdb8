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
    for path in ["/metrics", "/inference/v1/generate"] {
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

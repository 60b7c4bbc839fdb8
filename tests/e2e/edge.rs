//! What the listener does before the filter (`docs/deploy.md` §2.4, §2.6,
//! `docs/semantics.md` §6): request timeouts, CORS, header names with underscores, and
//! Envoy's own answers as OpenAI-shaped JSON.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{Reply, complete, prompt, send};
use crate::{Deployment, disaggregated, disaggregated_spec, nothing_reached_a_worker, start};

/// How long a test waits for an answer Envoy must give by itself.
const ANSWER_GUARD: Duration = Duration::from_secs(30);
const ORIGIN: &str = "https://chat.example";

/// Sends `bytes` on a connection of its own, keeps it open, and reads the answer until
/// Envoy closes the connection (it does after each of the errors sent this way).
async fn raw(deployment: &Deployment, bytes: &[u8]) -> Reply {
    let mut tcp = tokio::net::TcpStream::connect(deployment.envoy.listen())
        .await
        .unwrap();
    tcp.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(ANSWER_GUARD, tcp.read_to_end(&mut answer))
        .await
        .expect("Envoy answered and closed the connection")
        .unwrap();
    parse(&String::from_utf8(answer).unwrap())
}

/// An HTTP/1.1 answer with a `content-length` body.
fn parse(answer: &str) -> Reply {
    let (head, body) = answer.split_once("\r\n\r\n").expect("a whole answer");
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap();
    let mut headers = HeaderMap::new();
    for line in lines {
        let (name, value) = line.split_once(':').unwrap();
        headers.append(
            HeaderName::from_bytes(name.trim().as_bytes()).unwrap(),
            HeaderValue::from_str(value.trim()).unwrap(),
        );
    }
    Reply {
        status: status.parse().unwrap(),
        headers,
        text: body.to_owned(),
    }
}

fn request_head(path: &str, length: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
         content-length: {length}\r\n\r\n"
    )
}

#[tokio::test]
async fn a_request_that_stalls_gets_a_typed_408() {
    let mut spec = disaggregated_spec();
    // The request timeout includes the prefill budget: keep both short.
    spec.settings = serde_json::json!({ "prefill_timeout_ms": 500, "prefill_retries": 0 });
    spec.edge.request_timeout = Duration::from_secs(1);
    spec.edge.request_headers_timeout = Duration::from_secs(1);
    let deployment = start(spec).await;
    // A completion body, and another path's JSON body: the filter holds both until whole.
    for path in ["/v1/completions", "/tokenize"] {
        let head = request_head(path, 1000);
        let reply = raw(&deployment, format!("{head}{{\"model\":").as_bytes()).await;
        let message = reply.error(408, "request_timeout");
        assert!(message.contains("request_overall_timeout"), "{message}");
    }
    let headers_cut = raw(
        &deployment,
        b"POST /v1/completions HTTP/1.1\r\nhost: gw\r\n",
    )
    .await;
    let message = headers_cut.error(408, "request_timeout");
    assert!(message.contains("request_header_timeout"), "{message}");
    complete(&deployment, &[], &prompt())
        .await
        .assert_ok("a request sent at once");
}

#[tokio::test]
async fn a_browser_preflight_is_answered_by_the_gateway_and_reaches_no_worker() {
    let deployment = disaggregated().await;
    let preflight = [
        ("origin", ORIGIN),
        ("access-control-request-method", "POST"),
        (
            "access-control-request-headers",
            "content-type, x-dynamo-worker-instance-id",
        ),
    ];
    let reply = send(
        &deployment,
        reqwest::Method::OPTIONS,
        "/v1/chat/completions",
        &preflight,
        None,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    assert_eq!(reply.header("access-control-allow-origin"), Some(ORIGIN));
    let methods = reply.header("access-control-allow-methods").unwrap();
    assert!(methods.contains("POST"), "{methods}");
    let allowed = reply.header("access-control-allow-headers").unwrap();
    for name in [
        "authorization",
        "content-type",
        "x-request-id",
        "x-dynamo-worker-instance-id",
        "x-dynamo-prefill-dp-rank",
        "x-data-parallel-rank",
        "x-dynamo-session-id",
    ] {
        assert!(allowed.contains(name), "{name} not in {allowed}");
    }
    assert!(nothing_reached_a_worker(&deployment));

    let plain = send(
        &deployment,
        reqwest::Method::OPTIONS,
        "/v1/chat/completions",
        &[],
        None,
    )
    .await;
    plain.error(405, "method_not_allowed");

    let from_a_page = complete(&deployment, &[("origin", ORIGIN)], &prompt()).await;
    from_a_page.assert_ok("a completion from a page");
    assert_eq!(
        from_a_page.header("access-control-allow-origin"),
        Some(ORIGIN)
    );
    let exposed = from_a_page.header("access-control-expose-headers").unwrap();
    for name in ["x-pinroute-decode-worker", "x-pinroute-error-code"] {
        assert!(exposed.contains(name), "{name} not in {exposed}");
    }
    let refused = send(
        &deployment,
        reqwest::Method::GET,
        "/reset_prefix_cache",
        &[("origin", ORIGIN)],
        None,
    )
    .await;
    refused.error(404, "unknown_path");
    assert_eq!(
        refused.header("access-control-allow-origin"),
        Some(ORIGIN),
        "a page can read the gateway's errors"
    );
}

#[tokio::test]
async fn cors_allows_only_the_configured_origins_or_none() {
    let mut spec = disaggregated_spec();
    spec.edge.cors_origins = vec![ORIGIN.to_owned()];
    let listed = start(spec).await;
    let mut spec = disaggregated_spec();
    spec.edge.cors_origins = Vec::new();
    let off = start(spec).await;
    let preflight = |origin| {
        [
            ("origin", origin),
            ("access-control-request-method", "POST"),
        ]
    };
    let path = "/v1/completions";
    let options = reqwest::Method::OPTIONS;
    let allowed = send(&listed, options.clone(), path, &preflight(ORIGIN), None).await;
    assert_eq!(allowed.header("access-control-allow-origin"), Some(ORIGIN));
    let other = send(
        &listed,
        options.clone(),
        path,
        &preflight("https://evil.example"),
        None,
    )
    .await;
    assert_eq!(other.status, 200, "answered, not passed on: {}", other.text);
    assert_eq!(other.header("access-control-allow-origin"), None);
    assert!(nothing_reached_a_worker(&listed));
    let without_cors = send(&off, options, path, &preflight(ORIGIN), None).await;
    without_cors.error(405, "method_not_allowed");
    assert_eq!(without_cors.header("access-control-allow-origin"), None);
}

#[tokio::test]
async fn header_names_with_underscores_are_refused_as_json() {
    let deployment = disaggregated().await;
    for name in ["x_pinroute_upstream", "x_data_parallel_rank"] {
        let value = if name == "x_pinroute_upstream" {
            "127.0.0.1:1"
        } else {
            "1"
        };
        let pinned = [("x-dynamo-worker-instance-id", "202"), (name, value)];
        let reply = complete(&deployment, &pinned, &prompt()).await;
        let message = reply.error(400, "underscore_in_header");
        assert!(message.contains("underscore"), "{message}");
    }
    assert!(nothing_reached_a_worker(&deployment));
}

#[tokio::test]
async fn envoys_own_answers_are_openai_shaped_json() {
    let deployment = disaggregated().await;
    let cases: [(&[u8], u16, &str); 3] = [
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "bad_request"),
        (b"GET /v1/models HTTP/1.0\r\n\r\n", 426, "request_refused"),
        (
            b"GET /v1/models HTTP/1.1\r\nhost: gw\r\nx-dynamo-session-id: \xff\x01\r\n\r\n",
            400,
            "bad_request",
        ),
    ];
    for (request, status, code) in cases {
        raw(&deployment, request).await.error(status, code);
    }
    let big = format!(
        "GET /v1/models HTTP/1.1\r\nhost: gw\r\nx-filler: {}\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    raw(&deployment, big.as_bytes())
        .await
        .error(431, "headers_too_large");
    assert!(nothing_reached_a_worker(&deployment));
}

//! The stand-in picker behind Envoy with the rendered picker bootstrap and the stub filter:
//! what the picker sees, what it sets, what it answers, and the served report it gets back.
//! The stub filter does nothing, so the test upstream plays the filter's part on the
//! response: it sets the two served headers a picker-mode filter sets.

#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use pinroute::policy::picker::{PREFILL_SERVED_HEADER, SERVED_HEADER};
use serde_json::{Value, json};
use tempfile::NamedTempFile;

use super::*;
use crate::envoy::test_support::{DISAGGREGATED_REGISTRY, envoy, options, stub_wasm, with_picker};
use crate::envoy::{BootstrapOptions, Envoy, render_bootstrap};

const PREFILL_SERVED: &str = "10.1.2.3:8000";

/// An upstream that answers every request with the request headers it got (a JSON
/// object) and the served headers the pinroute filter would add.
async fn start_upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let answer = move |headers: HeaderMap| async move {
        let seen: serde_json::Map<String, Value> = headers
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_str().unwrap_or("").into()))
            .collect();
        let served = [
            (SERVED_HEADER, address.to_string()),
            (PREFILL_SERVED_HEADER, PREFILL_SERVED.to_owned()),
        ];
        (served, Value::Object(seen).to_string())
    };
    let app = axum::Router::new().fallback(answer);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

/// Envoy in picker mode with the stub filter (kept alive with it).
async fn start_envoy(picker: &StandInPicker, work_dir: &std::path::Path) -> (Envoy, NamedTempFile) {
    let wasm = stub_wasm();
    let config = with_picker(DISAGGREGATED_REGISTRY, "gie", &picker.address().to_string());
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let opts = BootstrapOptions {
        listen: any,
        admin: any,
        ..options(&config, wasm.path())
    };
    let yaml = render_bootstrap(&opts).unwrap();
    (Envoy::start(&envoy(), &yaml, work_dir).await.unwrap(), wasm)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

#[tokio::test]
async fn the_picker_sees_no_forged_choice_sets_its_own_and_hears_what_served() {
    let picker = StandInPicker::start().await.unwrap();
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (envoy, _wasm) = start_envoy(&picker, dir.path()).await;
    // The picker chooses the upstream, and (standing in for the stub filter) steers Envoy's
    // decode cluster to it.
    let plan = json!({"set": {
        "x-gateway-destination-endpoint": upstream.to_string(),
        "x-pinroute-upstream": upstream.to_string(),
    }});
    let response = client()
        .post(envoy.url("/v1/completions"))
        .header("x-gateway-destination-endpoint", "10.6.6.6:80")
        .header("x-prefiller-host-port", "10.6.6.6:81")
        .header("x-dynamo-routing-mode", "aggregated")
        .header(PLAN_HEADER, plan.to_string())
        .header("x-request-id", "picked-1")
        .body(r#"{"prompt": "hello"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{}", envoy.log_tail());
    for internal in [SERVED_HEADER, PREFILL_SERVED_HEADER] {
        assert!(response.headers().get(internal).is_none(), "{internal}");
    }
    let at_upstream: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(
        at_upstream["x-gateway-destination-endpoint"],
        upstream.to_string()
    );
    for absent in [
        PLAN_HEADER,
        "x-prefiller-host-port",
        "x-dynamo-routing-mode",
    ] {
        assert!(at_upstream.get(absent).is_none(), "{absent}: {at_upstream}");
    }

    let seen = picker.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let request = &seen[0];
    assert_eq!(request.header("x-request-id"), Some("picked-1"));
    assert!(request.header(PLAN_HEADER).is_some());
    for forged in [
        "x-gateway-destination-endpoint",
        "x-prefiller-host-port",
        "x-dynamo-routing-mode",
    ] {
        assert_eq!(request.header(forged), None, "{forged}: {request:?}");
    }
    assert_eq!(
        find(&request.response_headers, ":status"),
        Some("200"),
        "{request:?}"
    );
    assert_eq!(find(&request.response_headers, SERVED_HEADER), None);
    assert_eq!(
        request.served(SERVED_HEADER),
        Some(upstream.to_string().as_str())
    );
    assert_eq!(request.served(PREFILL_SERVED_HEADER), Some(PREFILL_SERVED));

    let logged = access_log_entry(&envoy, "picked-1").await;
    assert_eq!(logged["served_endpoint"], upstream.to_string());
    assert_eq!(logged["prefill_endpoint"], PREFILL_SERVED);
}

#[tokio::test]
async fn the_pickers_own_answer_reaches_the_client() {
    let picker = StandInPicker::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (envoy, _wasm) = start_envoy(&picker, dir.path()).await;
    for (plan, status) in [
        (json!({"status": 429, "body": "queue full"}), 429),
        (json!({"status": 503, "body": "no endpoint"}), 503),
        (json!({"sett": {}}), 500),
    ] {
        let response = client()
            .post(envoy.url("/v1/completions"))
            .header(PLAN_HEADER, plan.to_string())
            .header("x-request-id", format!("refused-{status}"))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status, "{plan}");
    }
    assert_eq!(picker.seen().len(), 3);
    // Nothing served these: the access log's served fields are null.
    let logged = access_log_entry(&envoy, "refused-429").await;
    assert!(logged["served_endpoint"].is_null(), "{logged}");
    assert!(logged["prefill_endpoint"].is_null(), "{logged}");
    picker.clear();
    assert!(picker.seen().is_empty());
}

/// The access log's line for `request_id` (Envoy writes the log out every 10 s).
async fn access_log_entry(envoy: &Envoy, request_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(envoy.access_log_path()).unwrap_or_default();
        let entry = log
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .find(|entry| entry["request_id"] == request_id);
        if let Some(entry) = entry {
            return entry;
        }
        assert!(Instant::now() < deadline, "no {request_id} in {log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

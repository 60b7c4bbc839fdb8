//! The access log through the real Envoy, for both builds (`docs/metrics.md`, "The access
//! log"): one JSON line a request, with what the filter decided for each hop.

use serde_json::Value;

use crate::Deployment;
use crate::client::{complete, prompt};
use crate::disaggregated;

/// The access log's line of the request `request_id`.
pub async fn entry(deployment: &Deployment, request_id: &str) -> Value {
    deployment.envoy.access_log_entry(request_id).await.unwrap()
}

#[tokio::test]
async fn each_hop_is_logged_with_its_worker_rank_and_choice() {
    let deployment = disaggregated().await;
    let pinned = [
        ("x-request-id", "log-pinned"),
        ("x-dynamo-prefill-instance-id", "102"),
        ("x-dynamo-prefill-dp-rank", "1"),
        ("x-dynamo-worker-instance-id", "201"),
    ];
    complete(&deployment, &pinned, &prompt())
        .await
        .assert_ok("the pinned request");
    complete(&deployment, &[("x-request-id", "log-unpinned")], &prompt())
        .await
        .assert_ok("the unpinned request");
    let pinned = entry(&deployment, "log-pinned").await;
    assert_eq!(pinned["model"], "sim-model", "{pinned}");
    assert_eq!(pinned["prefill_worker"], "102", "{pinned}");
    assert_eq!(pinned["prefill_rank"], "1", "{pinned}");
    assert_eq!(pinned["prefill_choice"], "pin", "{pinned}");
    assert_eq!(pinned["decode_worker"], "201", "{pinned}");
    assert_eq!(pinned["decode_choice"], "pin", "{pinned}");
    assert_eq!(pinned["status"], 200, "{pinned}");
    assert_eq!(pinned["error_code"], Value::Null, "{pinned}");
    let prefill_ms: f64 = pinned["prefill_ms"].as_str().unwrap().parse().unwrap();
    assert!(prefill_ms > 0.0, "{pinned}");
    assert!(
        pinned["decode_first_byte_ms"].as_u64().is_some(),
        "{pinned}"
    );
    let unpinned = entry(&deployment, "log-unpinned").await;
    assert_eq!(unpinned["prefill_choice"], "load", "{unpinned}");
    assert_eq!(unpinned["decode_choice"], "load", "{unpinned}");
    let prefill = unpinned["prefill_worker"].as_str().unwrap_or_default();
    assert!(["101", "102"].contains(&prefill), "{unpinned}");
    let decode = unpinned["decode_worker"].as_str().unwrap_or_default();
    assert!(["201", "202"].contains(&decode), "{unpinned}");
}

#[tokio::test]
async fn a_refused_request_is_logged_with_its_code_and_no_worker() {
    let deployment = disaggregated().await;
    let headers = [
        ("x-request-id", "log-refused"),
        ("x-dynamo-worker-instance-id", "999"),
    ];
    // A client's model that tries to end the line and start another.
    let model = "m\"}\n{\"request_id\":\"log-forged\"";
    let mut body = prompt();
    body["model"] = Value::from(model);
    let reply = complete(&deployment, &headers, &body).await;
    assert!(reply.status >= 400, "{}", reply.text);
    let code = reply.header("x-pinroute-error-code").unwrap();
    let refused = entry(&deployment, "log-refused").await;
    assert_eq!(refused["error_code"], code, "{refused}");
    assert_eq!(refused["decode_worker"], Value::Null, "{refused}");
    assert_eq!(refused["prefill_worker"], Value::Null, "{refused}");
    assert_eq!(refused["model"], model, "one field, escaped: {refused}");
    let log = std::fs::read_to_string(deployment.envoy.access_log_path()).unwrap();
    assert!(!log.contains("\"request_id\":\"log-forged\""), "{log}");
}

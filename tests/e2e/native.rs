//! The same request path as a native Envoy dynamic module (`libpinroute.so`, built from the
//! same `src/` with `cargo build -p pinroute --profile dynamic-module --features
//! dynamic-module`): both hops, pins, a typed error, streaming, counters, through a real Envoy.
//!
//! Needs the module (`PINROUTE_NATIVE_MODULE`, else the default target path).

use std::path::PathBuf;

use pinroute_harness::envoy::native::default_module_path;
use pinroute_harness::sim::SimRole;
use pinroute_harness::stack::StackSpec;
use serde_json::json;

use crate::client::{complete, prompt};
use crate::{Deployment, start, stat, worker};

pub fn native_module() -> PathBuf {
    let path =
        std::env::var_os("PINROUTE_NATIVE_MODULE").map_or_else(default_module_path, PathBuf::from);
    assert!(
        path.exists(),
        "{} is missing: cargo build -p pinroute --profile dynamic-module --features dynamic-module",
        path.display()
    );
    path
}

/// `crate::disaggregated_spec`'s workers (prefill 101, 102; decode 201, 202, 203 draining)
/// behind the native module in place of the wasm filter (no `.wasm` needed).
fn disaggregated_native_spec() -> StackSpec {
    let workers = vec![
        worker(101, SimRole::Prefill, 1),
        worker(102, SimRole::Prefill, 2),
        worker(201, SimRole::Decode, 1),
        worker(202, SimRole::Decode, 2),
        worker(203, SimRole::Decode, 1),
    ];
    let module = native_module();
    let mut spec = StackSpec::new(workers, module.clone());
    spec.native_module = Some(module);
    spec.draining = vec![203];
    spec
}

async fn disaggregated_native() -> Deployment {
    start(disaggregated_native_spec()).await
}

#[tokio::test]
async fn an_unpinned_completion_takes_both_hops_and_decode_loads_the_prefills_kv() {
    let deployment = disaggregated_native().await;
    for _ in 0..3 {
        let reply = complete(&deployment, &[], &prompt()).await;
        reply.assert_ok("the request");
        let prefill = reply.worker("prefill").unwrap();
        let decode = reply.worker("decode").unwrap();
        assert!([101, 102].contains(&prefill), "{prefill}");
        assert!([201, 202].contains(&decode), "{decode}");
        let body = reply.json();
        assert_eq!(body["sim"]["worker_id"], decode);
        assert_eq!(
            body["sim"]["kv_from"], prefill,
            "decode did not load the prefill's KV"
        );
    }
}

#[tokio::test]
async fn pins_choose_both_workers_and_ranks() {
    let deployment = disaggregated_native().await;
    let headers = [
        ("x-dynamo-prefill-instance-id", "102"),
        ("x-dynamo-prefill-dp-rank", "0"),
        ("x-dynamo-worker-instance-id", "202"),
        ("x-dynamo-dp-rank", "1"),
    ];
    let reply = complete(&deployment, &headers, &prompt()).await;
    reply.assert_ok("the request");
    assert_eq!(
        (reply.worker("prefill"), reply.worker("decode")),
        (Some(102), Some(202))
    );
    assert_eq!(reply.number("x-sim-dp-rank"), Some(1));
    assert_eq!(reply.json()["sim"]["kv_from"], 102);
    let prefill = deployment.worker(102).unwrap().requests();
    assert_eq!(prefill.len(), 1, "{prefill:?}");
    let prefill = prefill.into_iter().next().unwrap();
    assert_eq!(prefill.header("x-data-parallel-rank"), Some("0"));
    assert_eq!(prefill.body["max_tokens"], 1);
    let decode = deployment.worker(202).unwrap().requests();
    assert_eq!(decode.len(), 1, "{decode:?}");
    let decode = decode.into_iter().next().unwrap();
    assert_eq!(decode.header("x-data-parallel-rank"), Some("1"));
    assert_eq!(decode.body["kv_transfer_params"]["do_remote_prefill"], true);
    assert_eq!(
        decode.header("x-request-id"),
        prefill.header("x-request-id"),
        "both hops carry the same X-Request-Id"
    );
}

#[tokio::test]
async fn typed_errors_are_answered_by_the_module() {
    let deployment = disaggregated_native().await;
    let reply = complete(
        &deployment,
        &[("x-dynamo-worker-instance-id", "999")],
        &prompt(),
    )
    .await;
    let message = reply.error(400, "unknown_worker");
    assert!(message.contains("999"), "{message}");
    let reply = complete(
        &deployment,
        &[("x-dynamo-worker-instance-id", "203")],
        &prompt(),
    )
    .await;
    reply.error(503, "worker_unavailable");
    assert_eq!(reply.header("retry-after"), Some("5"));
    assert!(deployment.workers.iter().all(|w| w.requests().is_empty()));
}

#[tokio::test]
async fn streaming_flows_back_as_server_sent_events() {
    let deployment = disaggregated_native().await;
    let mut body = prompt();
    body["stream"] = json!(true);
    let reply = complete(
        &deployment,
        &[("x-dynamo-worker-instance-id", "202")],
        &body,
    )
    .await;
    reply.assert_ok("the request");
    assert!(
        reply
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events: Vec<&str> = reply
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    assert!(events.len() >= 6, "{events:?}");
    assert_eq!(reply.worker("decode"), Some(202));
}

#[tokio::test]
async fn the_modules_counters_keep_the_wasm_filters_names() {
    let deployment = disaggregated_native().await;
    complete(&deployment, &[], &prompt())
        .await
        .assert_ok("the request");
    complete(
        &deployment,
        &[("x-dynamo-worker-instance-id", "999")],
        &prompt(),
    )
    .await
    .error(400, "unknown_worker");
    assert_eq!(stat(&deployment, "wasmcustom.pinroute.prefill.ok").await, 1);
    assert_eq!(
        stat(&deployment, "wasmcustom.pinroute.decode.routed").await,
        1
    );
    assert_eq!(
        stat(&deployment, "wasmcustom.pinroute.errors.unknown_worker").await,
        1
    );
}

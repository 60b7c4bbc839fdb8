//! A prefill worker that misbehaves (`docs/security.md`, "A worker's answer is bounded"):
//! answers of any size or shape fail their own request at most, never Envoy, the VM, or the
//! worker's place in service for other clients.

use pinroute_harness::sim::Fault;
use serde_json::json;

use crate::client::{Reply, complete, prompt};
use crate::{Deployment, disaggregated, stat, vm_failure_stats};

const PIN_PREFILL_101: [(&str, &str); 1] = [("x-dynamo-prefill-instance-id", "101")];
const PIN_BOTH: [(&str, &str); 2] = [
    ("x-dynamo-prefill-instance-id", "101"),
    ("x-dynamo-worker-instance-id", "201"),
];

/// A completion whose body is `bytes` long, just as a client may send under `max_body_bytes`.
fn body_of(bytes: usize) -> serde_json::Value {
    let mut body = prompt();
    let around = body.to_string().len() + r#","pad":"""#.len();
    body["pad"] = json!("x".repeat(bytes - around));
    assert_eq!(body.to_string().len(), bytes);
    body
}

/// Envoy still serves, and no VM failed or was replaced since `before`.
async fn envoy_is_unharmed(deployment: &Deployment, before: &[u64]) {
    complete(deployment, &[], &prompt())
        .await
        .assert_ok("a request after the hostile answers");
    assert_eq!(
        &vm_failure_stats(deployment).await,
        before,
        "no VM failed or was replaced"
    );
}

#[tokio::test]
async fn no_size_of_kv_transfer_params_can_take_envoy_down() {
    let deployment = disaggregated().await;
    let before = vm_failure_stats(&deployment).await;
    let hostile = deployment.worker(101).unwrap();
    // Under the bound, with the largest body a client may send: spliced and served.
    hostile.set_fault(Fault::KvPadding(1_000_000));
    let reply = complete(&deployment, &PIN_BOTH, &body_of(8_388_000)).await;
    reply.assert_ok("8 MB with 1 MB of kv_transfer_params");
    let decoded = deployment.worker(201).unwrap().requests();
    let carried = &decoded.last().unwrap().body["kv_transfer_params"]["sim_padding"];
    assert_eq!(carried.as_str().map(str::len), Some(1_000_000));
    // Over it: the hop fails, typed, for this request only.
    for padding in [1_100_000, 20 << 20] {
        hostile.set_fault(Fault::KvPadding(padding));
        let pinned = complete(&deployment, &PIN_BOTH, &body_of(8_388_000)).await;
        let message = pinned.error(502, "pinned_worker_failed");
        assert!(message.contains("over the gateway's limit"), "{message}");
        let unpinned = complete(&deployment, &[], &body_of(8_388_000)).await;
        unpinned.assert_ok("an unpinned request goes on without the hostile worker's KV");
    }
    hostile.set_fault(Fault::None);
    envoy_is_unharmed(&deployment, &before).await;
}

#[tokio::test]
async fn broken_or_oversized_prefill_answers_take_no_worker_out_of_service() {
    let deployment = disaggregated().await;
    let before = vm_failure_stats(&deployment).await;
    let hostile = deployment.worker(101).unwrap();
    for fault in [Fault::Oversized(40 << 20), Fault::Truncated] {
        hostile.set_fault(fault);
        for _ in 0..4 {
            let reply = complete(&deployment, &PIN_PREFILL_101, &prompt()).await;
            reply.error(502, "pinned_worker_failed");
        }
    }
    assert_eq!(
        stat(&deployment, "wasmcustom.pinroute.workers.marked_unhealthy").await,
        0
    );
    hostile.set_fault(Fault::None);
    complete(&deployment, &PIN_PREFILL_101, &prompt())
        .await
        .assert_ok("the worker serves its pins again at once");
    envoy_is_unharmed(&deployment, &before).await;
}

#[tokio::test]
async fn the_prefill_hop_asks_for_no_more_than_the_kv() {
    let deployment = disaggregated().await;
    let mut body = prompt();
    for (field, value) in [
        ("echo", json!(true)),
        ("logprobs", json!(5)),
        ("prompt_logprobs", json!(5)),
        ("n", json!(2)),
        ("best_of", json!(2)),
    ] {
        body[field] = value;
    }
    complete(&deployment, &PIN_BOTH, &body)
        .await
        .assert_ok("the request");
    let prefill = &deployment.worker(101).unwrap().requests()[0].body;
    let decode = &deployment.worker(201).unwrap().requests()[0].body;
    for field in ["echo", "logprobs", "prompt_logprobs", "n", "best_of"] {
        assert_eq!(prefill.get(field), None, "{field} on the prefill hop");
        assert_eq!(decode[field], body[field], "{field} on the decode hop");
    }
}

#[tokio::test]
async fn a_clients_accept_encoding_never_reaches_the_filters_own_call() {
    let deployment = disaggregated().await;
    deployment.worker(101).unwrap().set_fault(Fault::Gzip);
    let asks_gzip = [PIN_BOTH.as_slice(), &[("accept-encoding", "gzip")]].concat();
    let reply: Reply = complete(&deployment, &asks_gzip, &prompt()).await;
    reply.assert_ok("a pinned request asking for gzip");
    assert_eq!(reply.worker("prefill"), Some(101));
    let prefill = &deployment.worker(101).unwrap().requests()[0];
    assert_eq!(prefill.header("accept-encoding"), Some("identity"));
    let decode = &deployment.worker(201).unwrap().requests()[0];
    assert_eq!(
        decode.header("accept-encoding"),
        Some("gzip"),
        "the client's own hop"
    );
}

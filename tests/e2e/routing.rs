//! Pins resolved per hop, the two-hop flow, fallbacks, streaming.

use pinroute_harness::sim::{RecordedRequest, SimRole};
use pinroute_harness::stack::StackSpec;
use serde_json::{Value, json};

use crate::client::{complete, prompt, send};
use crate::{Deployment, disaggregated, start, wasm, worker};

fn only_request(deployment: &Deployment, id: u64) -> RecordedRequest {
    let requests = deployment.worker(id).unwrap().requests();
    assert_eq!(requests.len(), 1, "worker {id} got {requests:?}");
    requests.into_iter().next().unwrap()
}

fn assert_untouched(deployment: &Deployment, ids: &[u64]) {
    for id in ids {
        assert!(
            deployment.worker(*id).unwrap().requests().is_empty(),
            "worker {id} was reached"
        );
    }
}

/// The prefill hop as `docs/semantics.md` §4 describes it.
fn assert_prefill_hop(request: &RecordedRequest, original: &Value) {
    let body = &request.body;
    assert_eq!(body["stream"], false);
    assert_eq!(body["max_tokens"], 1);
    assert_eq!(
        body["kv_transfer_params"],
        json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
               "remote_block_ids": null, "remote_host": null, "remote_port": null})
    );
    assert_eq!(body["prompt"], original["prompt"]);
    assert!(body.get("stream_options").is_none());
}

#[tokio::test]
async fn a_decode_pin_alone_is_served_with_prefill_chosen_freely() {
    // The original Dynamo bug: this request failed with 500 on the prefill hop.
    let deployment = disaggregated().await;
    for _ in 0..4 {
        deployment.clear_requests();
        let reply = complete(
            &deployment,
            &[("x-dynamo-worker-instance-id", "201")],
            &prompt(),
        )
        .await;
        reply.assert_ok("the request");
        assert_eq!(reply.worker("decode"), Some(201));
        let prefill = reply.worker("prefill").unwrap();
        assert!([101, 102].contains(&prefill), "{prefill}");
        let body = reply.json();
        assert_eq!(body["sim"]["worker_id"], 201);
        assert_eq!(
            body["sim"]["kv_from"], prefill,
            "decode did not load the prefill's KV"
        );
        let prefill_request = only_request(&deployment, prefill);
        assert_prefill_hop(&prefill_request, &prompt());
        assert_eq!(prefill_request.header("x-data-parallel-rank"), None);
        let decode_request = only_request(&deployment, 201);
        assert_eq!(decode_request.header("x-data-parallel-rank"), Some("0"));
        assert_eq!(decode_request.body["max_tokens"], 5);
        assert_eq!(
            decode_request.body["kv_transfer_params"]["do_remote_prefill"],
            true
        );
        assert_eq!(
            decode_request.header("x-request-id"),
            prefill_request.header("x-request-id"),
            "both hops carry the same X-Request-Id"
        );
        assert!(
            decode_request
                .header("x-dynamo-worker-instance-id")
                .is_none()
        );
    }
}

#[tokio::test]
async fn a_prefill_pin_with_its_rank_leaves_decode_free() {
    let deployment = disaggregated().await;
    let headers = [
        ("x-dynamo-prefill-instance-id", "102"),
        ("x-dynamo-prefill-dp-rank", "1"),
    ];
    let reply = complete(&deployment, &headers, &prompt()).await;
    reply.assert_ok("the request");
    assert_eq!(reply.worker("prefill"), Some(102));
    let decode = reply.worker("decode").unwrap();
    assert!(
        [201, 202].contains(&decode),
        "{decode}: the draining 203 must never be chosen"
    );
    let prefill_request = only_request(&deployment, 102);
    assert_eq!(prefill_request.header("x-data-parallel-rank"), Some("1"));
    assert_eq!(reply.json()["sim"]["kv_from"], 102);
    assert_untouched(&deployment, &[101, 203]);
}

#[tokio::test]
async fn both_pins_with_both_ranks() {
    let deployment = disaggregated().await;
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
    assert_eq!(
        only_request(&deployment, 102).header("x-data-parallel-rank"),
        Some("0")
    );
    assert_eq!(
        only_request(&deployment, 202).header("x-data-parallel-rank"),
        Some("1")
    );
}

#[tokio::test]
async fn the_decode_rank_never_reaches_the_prefill_worker() {
    let deployment = disaggregated().await;
    for rank_header in ["x-dynamo-dp-rank", "x-dp-rank", "x-data-parallel-rank"] {
        deployment.clear_requests();
        let headers = [
            ("x-dynamo-worker-instance-id", "202"),
            (rank_header, "1"),
            ("x-dynamo-prefill-instance-id", "102"),
        ];
        let reply = complete(&deployment, &headers, &prompt()).await;
        assert_eq!(reply.status, 200, "{rank_header}: {}", reply.text);
        let prefill_request = only_request(&deployment, 102);
        assert_eq!(
            prefill_request.header("x-data-parallel-rank"),
            None,
            "{rank_header} leaked to prefill"
        );
        assert_eq!(prefill_request.header(rank_header), None);
        assert_eq!(
            only_request(&deployment, 202).header("x-data-parallel-rank"),
            Some("1")
        );
        assert_eq!(reply.number("x-sim-dp-rank"), Some(1));
    }
}

#[tokio::test]
async fn body_pins_work_and_a_header_beats_the_body() {
    let deployment = disaggregated().await;
    let mut body = prompt();
    body["nvext"] = json!({"backend_instance_id": 202, "dp_rank": 1, "prefill_worker_id": 101});
    let reply = complete(&deployment, &[], &body).await;
    reply.assert_ok("the request");
    assert_eq!(
        (reply.worker("prefill"), reply.worker("decode")),
        (Some(101), Some(202))
    );
    assert_eq!(reply.number("x-sim-dp-rank"), Some(1));
    let forwarded = only_request(&deployment, 202).body;
    assert_eq!(
        forwarded["nvext"], body["nvext"],
        "the decode hop gets the client's nvext"
    );
    let prefilled = only_request(&deployment, 101).body;
    assert_eq!(
        prefilled["nvext"],
        json!({"prefill_worker_id": 101}),
        "decode pins never reach prefill"
    );

    body["nvext"] = json!({"decode_worker_id": 202});
    let reply = complete(
        &deployment,
        &[("x-dynamo-worker-instance-id", "201")],
        &body,
    )
    .await;
    reply.assert_ok("the request");
    assert_eq!(reply.worker("decode"), Some(201));
}

#[tokio::test]
async fn a_clients_kv_transfer_params_are_dropped() {
    let deployment = disaggregated().await;
    let mut body = prompt();
    body["kv_transfer_params"] = json!({"do_remote_prefill": true, "remote_host": "10.1.2.3", "remote_port": 5555, "remote_request_id": "x"});
    let reply = complete(
        &deployment,
        &[("x-dynamo-worker-instance-id", "201")],
        &body,
    )
    .await;
    reply.assert_ok("the request");
    let prefill = reply.worker("prefill").unwrap();
    assert_prefill_hop(&only_request(&deployment, prefill), &body);
    let decode_params = &only_request(&deployment, 201).body["kv_transfer_params"];
    assert_ne!(decode_params["remote_host"], "10.1.2.3");
    assert_eq!(reply.json()["sim"]["kv_from"], prefill);
}

#[tokio::test]
async fn an_escaped_or_doubled_completion_path_gets_the_same_two_hops() {
    let deployment = disaggregated().await;
    let mut body = prompt();
    body["kv_transfer_params"] =
        json!({"do_remote_prefill": true, "remote_host": "10.1.2.3", "remote_port": 5555});
    for path in ["/v1/%63ompletions", "//v1//completions"] {
        let pin = [("x-dynamo-worker-instance-id", "201")];
        let reply = send(
            &deployment,
            reqwest::Method::POST,
            path,
            &pin,
            Some(body.to_string()),
        )
        .await;
        reply.assert_ok(path);
        let prefill = reply
            .worker("prefill")
            .unwrap_or_else(|| panic!("{path}: no prefill hop"));
        assert_eq!(
            reply.json()["sim"]["kv_from"],
            prefill,
            "{path}: decode used the prefill's KV"
        );
    }
}

#[tokio::test]
async fn streaming_flows_back_as_server_sent_events() {
    let deployment = disaggregated().await;
    let mut body = prompt();
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
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
    let decode_request = only_request(&deployment, 202);
    assert_eq!(decode_request.body["stream"], true);
    assert_eq!(
        decode_request.body["stream_options"],
        json!({"include_usage": true})
    );
    let prefill = reply.worker("prefill").unwrap();
    assert_prefill_hop(&only_request(&deployment, prefill), &body);
}

#[tokio::test]
async fn chat_completions_take_two_hops_too() {
    let deployment = disaggregated().await;
    let body = json!({"model": "sim-model", "messages": [{"role": "user", "content": "hello there"}], "max_completion_tokens": 4});
    let reply = send(
        &deployment,
        reqwest::Method::POST,
        "/v1/chat/completions",
        &[("x-dynamo-worker-instance-id", "201")],
        Some(body.to_string()),
    )
    .await;
    reply.assert_ok("the request");
    let prefill = reply.worker("prefill").unwrap();
    let prefill_body = only_request(&deployment, prefill).body;
    assert_eq!(
        (
            prefill_body["max_completion_tokens"].clone(),
            prefill_body["max_tokens"].clone()
        ),
        (json!(1), json!(1))
    );
    assert_eq!(
        only_request(&deployment, 201).body["max_completion_tokens"],
        4
    );
}

#[tokio::test]
async fn other_paths_go_to_a_decode_worker_without_a_prefill_hop() {
    let deployment = disaggregated().await;
    let reply = send(
        &deployment,
        reqwest::Method::GET,
        "/v1/models",
        &[("x-dynamo-worker-instance-id", "202")],
        None,
    )
    .await;
    reply.assert_ok("the request");
    assert_eq!(reply.worker("decode"), Some(202));
    assert_eq!(reply.header("x-pinroute-prefill-worker"), None);
    assert_eq!(reply.json()["data"][0]["id"], "sim-model");
    let health = send(&deployment, reqwest::Method::GET, "/health", &[], None).await;
    assert_eq!(health.status, 200);
    assert!([201, 202].contains(&health.worker("decode").unwrap()));
}

#[tokio::test]
async fn an_aggregated_deployment_takes_one_hop() {
    let workers = vec![
        worker(301, SimRole::Aggregated, 2),
        worker(302, SimRole::Aggregated, 1),
    ];
    let deployment = start(StackSpec::new(workers, wasm())).await;
    let headers = [
        ("x-dynamo-worker-instance-id", "301"),
        ("x-dynamo-dp-rank", "1"),
    ];
    let mut body = prompt();
    body["kv_transfer_params"] = json!({"do_remote_prefill": true});
    let reply = complete(&deployment, &headers, &body).await;
    reply.assert_ok("the request");
    assert_eq!(reply.worker("decode"), Some(301));
    assert_eq!(reply.header("x-pinroute-prefill-worker"), None);
    assert_eq!(reply.number("x-sim-dp-rank"), Some(1));
    let request = only_request(&deployment, 301);
    assert!(request.body.get("kv_transfer_params").is_none());
    assert_eq!(request.body["max_tokens"], 5);
    let unpinned = complete(&deployment, &[], &prompt()).await;
    unpinned.assert_ok("the request");
}

#[tokio::test]
async fn an_unpinned_request_survives_a_dead_prefill_worker_and_falls_back_when_none_is_left() {
    let workers = vec![
        worker(101, SimRole::Prefill, 1),
        worker(201, SimRole::Decode, 1),
    ];
    let mut spec = StackSpec::new(workers, wasm());
    spec.dead = vec![(109, SimRole::Prefill, 1)];
    let deployment = start(spec).await;
    for _ in 0..4 {
        let reply = complete(&deployment, &[], &prompt()).await;
        reply.assert_ok("the request");
        assert_eq!(
            reply.worker("prefill"),
            Some(101),
            "the live prefill worker served"
        );
        assert_eq!(reply.json()["sim"]["kv_from"], 101);
    }

    let only_dead = vec![worker(201, SimRole::Decode, 1)];
    let mut spec = StackSpec::new(only_dead, wasm());
    spec.dead = vec![(108, SimRole::Prefill, 1), (109, SimRole::Prefill, 1)];
    let deployment = start(spec).await;
    let reply = complete(&deployment, &[], &prompt()).await;
    reply.assert_ok("the request");
    assert_eq!(
        reply.header("x-pinroute-prefill-worker"),
        None,
        "no prefill hop served"
    );
    assert_eq!(
        reply.json()["sim"]["kv_from"],
        Value::Null,
        "decode prefilled itself"
    );
    assert!(
        only_request(&deployment, 201)
            .body
            .get("kv_transfer_params")
            .is_none()
    );
}

#[tokio::test]
async fn an_unpinned_decode_hop_whose_worker_refuses_connections_is_served_by_another() {
    let workers = vec![
        worker(101, SimRole::Prefill, 1),
        worker(201, SimRole::Decode, 1),
    ];
    let mut spec = StackSpec::new(workers, wasm());
    spec.dead = vec![(208, SimRole::Decode, 1), (209, SimRole::Decode, 1)];
    let deployment = start(spec).await;
    for _ in 0..6 {
        let reply = complete(&deployment, &[], &prompt()).await;
        reply.assert_ok("the request");
        assert_eq!(
            reply.worker("decode"),
            Some(201),
            "the live worker is named"
        );
        let health = send(&deployment, reqwest::Method::GET, "/health", &[], None).await;
        health.assert_ok("the request");
    }
    let failed = deployment
        .envoy
        .stat("wasmcustom.pinroute.workers.connect_failed")
        .await
        .unwrap()
        .unwrap_or(0);
    assert!(
        failed >= 1,
        "the refused connections count against the dead workers"
    );
}

#[tokio::test]
async fn a_clients_request_id_reaches_both_hops_unchanged() {
    let deployment = disaggregated().await;
    let reply = complete(
        &deployment,
        &[
            ("x-request-id", "client-id-42"),
            ("x-dynamo-worker-instance-id", "201"),
        ],
        &prompt(),
    )
    .await;
    reply.assert_ok("the request");
    assert_eq!(reply.json()["id"], "cmpl-client-id-42");
    let prefill = reply.worker("prefill").unwrap();
    assert_eq!(
        only_request(&deployment, prefill).header("x-request-id"),
        Some("client-id-42")
    );
    assert_eq!(
        only_request(&deployment, 201).header("x-request-id"),
        Some("client-id-42")
    );
}

//! Picker mode (`docs/semantics.md` §9): Envoy's real `ext_proc` filter calls the harness's
//! stand-in picker before pinroute; the picker's choices decide the hops they name.

use std::net::SocketAddr;

use pinroute_harness::picker::SeenRequest;
use pinroute_harness::sim::{SimRole, SimWorker};
use pinroute_harness::stack::{PickerSpec, refusing_address};
use serde_json::{Value, json};

use crate::client::{Reply, complete, prompt};
use crate::{Deployment, disaggregated_spec, start, worker};

const DESTINATION: &str = "x-gateway-destination-endpoint";
const PREFILLER: &str = "x-prefiller-host-port";
const SERVED: &str = "x-gateway-destination-endpoint-served";
const PREFILL_SERVED: &str = "x-pinroute-prefill-endpoint-served";
const PLAN: &str = "x-stand-in-picker";

async fn behind_picker(protocol: &str, allow: &[&str]) -> Deployment {
    let mut spec = disaggregated_spec();
    spec.picker = Some(PickerSpec {
        protocol: protocol.into(),
        allow: allow.iter().map(|a| a.to_string()).collect(),
    });
    start(spec).await
}

fn address(deployment: &Deployment, id: u64) -> String {
    deployment.worker(id).unwrap().addr().to_string()
}

/// The stand-in picker's instruction: set these request headers.
fn sets(headers: &[(&str, &str)]) -> String {
    let set: serde_json::Map<String, Value> = headers
        .iter()
        .map(|(n, v)| (n.to_string(), json!(v)))
        .collect();
    json!({ "set": set }).to_string()
}

async fn picked(deployment: &Deployment, plan: &str, extra: &[(&str, &str)]) -> Reply {
    let mut headers = vec![(PLAN, plan)];
    headers.extend_from_slice(extra);
    complete(deployment, &headers, &prompt()).await
}

fn seen(deployment: &Deployment) -> SeenRequest {
    let seen = deployment.picker.as_ref().unwrap().seen();
    assert_eq!(seen.len(), 1, "the picker saw {} requests", seen.len());
    seen.into_iter().next().unwrap()
}

fn value<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn clear(deployment: &Deployment) {
    deployment.clear_requests();
    deployment.picker.as_ref().unwrap().clear();
}

#[tokio::test]
async fn the_picker_chooses_both_hops_and_hears_which_endpoints_served() {
    let deployment = behind_picker("llm-d", &["registry"]).await;
    let (prefill, decode) = (address(&deployment, 102), address(&deployment, 202));
    let plan = sets(&[(DESTINATION, &decode), (PREFILLER, &prefill)]);
    for _ in 0..3 {
        clear(&deployment);
        let reply = picked(&deployment, &plan, &[]).await;
        reply.assert_ok("a request the picker placed");
        assert_eq!(
            (reply.worker("prefill"), reply.worker("decode")),
            (Some(102), Some(202))
        );
        assert_eq!(
            reply.json()["sim"]["kv_from"],
            102,
            "decode loaded the picked prefill's KV"
        );
        assert_eq!(
            reply.header(SERVED),
            None,
            "no internal address reaches the client"
        );
        assert_eq!(reply.header(PREFILL_SERVED), None);
        let report = seen(&deployment);
        assert_eq!(value(&report.served, SERVED), Some(decode.as_str()));
        assert_eq!(
            value(&report.served, PREFILL_SERVED),
            Some(prefill.as_str())
        );
        let decode_request = deployment.worker(202).unwrap().requests();
        assert_eq!(decode_request.len(), 1);
        assert_eq!(
            decode_request[0].header(DESTINATION),
            None,
            "picker headers stay in Envoy"
        );
        assert_eq!(decode_request[0].header(PREFILLER), None);
    }
    let hops = [("prefill", 102), ("decode", 202)].map(|(hop, id)| {
        let request = deployment.worker(id).unwrap().requests().remove(0);
        json!({"hop": hop, "path": request.path, "headers": request.headers, "body": request.body})
    });
    // The two hops as pinroute sends them behind llm-d's scheduler (`--nocapture` shows them).
    println!("{}", serde_json::to_string_pretty(&hops).unwrap());
    let [prefill_hop, decode_hop] = hops;
    assert_eq!(prefill_hop["body"]["stream"], false);
    assert_eq!(prefill_hop["body"]["max_tokens"], 1);
    assert_eq!(
        decode_hop["body"]["kv_transfer_params"]["do_remote_prefill"],
        true
    );
}

#[tokio::test]
async fn forged_client_copies_of_picker_headers_never_reach_the_picker_nor_choose() {
    let deployment = behind_picker("llm-d", &["registry"]).await;
    let (forged_decode, forged_prefill) = (address(&deployment, 201), address(&deployment, 101));
    let forged = [
        (DESTINATION, forged_decode.as_str()),
        (PREFILLER, forged_prefill.as_str()),
        (
            "x-gateway-destination-endpoint-subset",
            forged_decode.as_str(),
        ),
        ("x-dynamo-routing-mode", "aggregated"),
    ];
    // The picker names the decode hop only; the forged prefill must not choose either.
    let plan = sets(&[(DESTINATION, &address(&deployment, 202))]);
    for _ in 0..4 {
        clear(&deployment);
        let reply = picked(&deployment, &plan, &forged).await;
        reply.assert_ok("a request with forged picker headers");
        assert_eq!(reply.worker("decode"), Some(202));
        let report = seen(&deployment);
        for (name, _) in forged {
            assert_eq!(
                value(&report.headers, name),
                None,
                "the picker saw a client's {name}"
            );
        }
        assert!(
            reply.worker("prefill").is_some(),
            "not one hop: the forged routing mode was obeyed"
        );
    }
    assert!(deployment.worker(201).unwrap().requests().is_empty());
}

#[tokio::test]
async fn endpoints_outside_the_allowlist_and_malformed_ones_are_invalid_epp_metadata() {
    let deployment = behind_picker("llm-d", &["registry"]).await;
    let outside = refusing_address().unwrap().to_string();
    let prefill_as_decode = address(&deployment, 101);
    let cases = [
        (
            DESTINATION,
            outside.as_str(),
            "entry 1 is outside the allowlist",
        ),
        (
            DESTINATION,
            prefill_as_decode.as_str(),
            "entry 1 is prefill worker 101, not a decode worker",
        ),
        (PREFILLER, "prefill-0.llm:8000", "entry 1 is not ip:port"),
        (DESTINATION, "", "entry 1 is empty"),
    ];
    for (header, value, reason) in cases {
        clear(&deployment);
        let reply = picked(&deployment, &sets(&[(header, value)]), &[]).await;
        let message = reply.error(502, "invalid_epp_metadata");
        assert!(
            message.contains(header) && message.contains(reason),
            "{message}"
        );
        for id in [101, 102, 201, 202] {
            assert!(
                deployment.worker(id).unwrap().requests().is_empty(),
                "{header}={value:?} reached worker {id}"
            );
        }
    }
}

#[tokio::test]
async fn the_next_endpoint_serves_when_the_first_refuses_its_connection() {
    let mut spec = disaggregated_spec();
    spec.dead = vec![(204, SimRole::Decode, 1)];
    spec.picker = Some(PickerSpec {
        protocol: "gie".into(),
        allow: vec!["registry".into(), "127.0.0.0/8".into()],
    });
    let deployment = start(spec).await;
    let dead_member = deployment.plugin_config["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == 204)
        .unwrap()["address"]
        .as_str()
        .unwrap()
        .to_string();
    let dead_unlisted = refusing_address().unwrap().to_string();
    let serving = address(&deployment, 201);
    // A pool member refused: Envoy retries it on the next, and the picker hears who served.
    let list = format!("{dead_member},{serving}");
    let reply = picked(&deployment, &sets(&[(DESTINATION, &list)]), &[]).await;
    reply.assert_ok("a fallback after a refused pool member");
    assert_eq!(reply.worker("decode"), Some(201));
    assert_eq!(
        value(&seen(&deployment).served, SERVED),
        Some(serving.as_str())
    );
    // An address only the range allows: the filter sends the request on itself and relays the
    // answer, which skips the filters before it: no served report, and no address leaks.
    clear(&deployment);
    let list = format!("{dead_unlisted},{serving}");
    let reply = picked(&deployment, &sets(&[(DESTINATION, &list)]), &[]).await;
    reply.assert_ok("a fallback after a refused unlisted endpoint");
    assert_eq!(reply.worker("decode"), Some(201));
    assert_eq!(reply.header("x-pinroute-relayed"), Some("decode"));
    assert_eq!(
        (reply.header(SERVED), reply.header(PREFILL_SERVED)),
        (None, None)
    );
    assert!(seen(&deployment).served.is_empty());
}

#[tokio::test]
async fn a_worker_in_an_allowed_range_serves_though_the_registry_does_not_list_it() {
    let deployment = behind_picker("llm-d", &["10.0.0.0/8", "127.0.0.0/8"]).await;
    let unlisted = SimWorker::start(
        worker(299, SimRole::Decode, 4),
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .unwrap();
    let decode = unlisted.addr().to_string();
    let plan = sets(&[
        (DESTINATION, &decode),
        (PREFILLER, &address(&deployment, 101)),
    ]);
    let reply = picked(&deployment, &plan, &[("x-dynamo-dp-rank", "3")]).await;
    reply.assert_ok("an unlisted decode worker");
    assert_eq!(reply.json()["sim"]["worker_id"], 299);
    assert_eq!(reply.json()["sim"]["kv_from"], 101);
    let request = unlisted.requests();
    assert_eq!(
        request[0].header("x-data-parallel-rank"),
        Some("3"),
        "the rank is passed on unchecked"
    );
    assert_eq!(
        value(&seen(&deployment).served, SERVED),
        Some(decode.as_str())
    );
}

#[tokio::test]
async fn dynamo_routing_mode_and_its_single_prefill_endpoint() {
    let deployment = behind_picker("dynamo", &["registry"]).await;
    let decode = address(&deployment, 201);
    let aggregated = sets(&[
        (DESTINATION, &decode),
        ("x-dynamo-routing-mode", "aggregated"),
    ]);
    let reply = picked(&deployment, &aggregated, &[]).await;
    reply.assert_ok("one hop by the picker's routing mode");
    assert_eq!(
        (reply.worker("prefill"), reply.worker("decode")),
        (None, Some(201))
    );
    for id in [101, 102] {
        assert!(deployment.worker(id).unwrap().requests().is_empty());
    }
    let two = format!(
        "{},{}",
        address(&deployment, 101),
        address(&deployment, 102)
    );
    let reply = picked(&deployment, &sets(&[(PREFILLER, &two)]), &[]).await;
    let message = reply.error(502, "invalid_epp_metadata");
    assert!(message.contains("exactly one"), "{message}");
    // Dynamo's worker-id headers are pins (§3), whatever the picker's endpoints say.
    let pinned = sets(&[
        ("x-dynamo-worker-instance-id", "202"),
        (DESTINATION, &decode),
    ]);
    let reply = picked(&deployment, &pinned, &[]).await;
    reply.assert_ok("a pin from Dynamo's EPP");
    assert_eq!(reply.worker("decode"), Some(202));
}

#[tokio::test]
async fn the_pickers_own_refusal_reaches_the_client_and_no_worker() {
    let deployment = behind_picker("gie", &["registry"]).await;
    for status in [503, 429] {
        clear(&deployment);
        let plan = json!({"status": status, "body": "no endpoint"}).to_string();
        let reply = picked(&deployment, &plan, &[]).await;
        assert_eq!(reply.status, status, "{}", reply.text);
        for id in [101, 102, 201, 202] {
            assert!(deployment.worker(id).unwrap().requests().is_empty());
        }
    }
}

#[tokio::test]
async fn what_the_picker_leaves_open_pinroute_chooses() {
    let deployment = behind_picker("gie", &["registry"]).await;
    let reply = complete(&deployment, &[], &prompt()).await;
    reply.assert_ok("no picker header at all");
    assert!([201, 202].contains(&reply.worker("decode").unwrap()));
    assert!([101, 102].contains(&reply.worker("prefill").unwrap()));
    let report = seen(&deployment);
    let served = value(&report.served, SERVED).unwrap();
    assert_eq!(
        served,
        address(&deployment, reply.worker("decode").unwrap())
    );
}

//! The generation APIs beyond completions through Envoy (`docs/semantics.md` §1, §4, §6): each
//! takes two hops whose KV the decode worker loads, streams as it comes, keeps its stored
//! responses on their worker, and answers errors in its clients' shape — from hostile workers
//! too.

use pinroute_harness::sim::{Fault, RecordedRequest};
use reqwest::Method;
use serde_json::{Value, json};

use crate::client::{Reply, post, send};
use crate::{Deployment, disaggregated};

const PROMPT: &str = "The quick brown fox jumps over the lazy dog";

/// The requests `worker` got on `path`.
fn on_path(deployment: &Deployment, worker: u64, path: &str) -> Vec<RecordedRequest> {
    let requests = deployment.worker(worker).unwrap().requests();
    requests.into_iter().filter(|r| r.path == path).collect()
}

/// Each API's body, and where its answer's text and the sim's record sit.
fn requests() -> Vec<(&'static str, Value)> {
    vec![
        (
            "/v1/responses",
            json!({"model": "sim-model", "input": PROMPT, "max_output_tokens": 5}),
        ),
        (
            "/v1/messages",
            json!({"model": "sim-model", "system": "be brief", "max_tokens": 5,
                   "messages": [{"role": "user", "content": PROMPT}]}),
        ),
        (
            "/inference/v1/generate",
            json!({"model": "sim-model", "token_ids": [11, 12, 13, 14, 15, 16, 17, 18],
                   "sampling_params": {"max_tokens": 5, "min_tokens": 2}}),
        ),
    ]
}

#[tokio::test]
async fn every_api_takes_two_hops_and_its_decode_loads_the_prefills_kv() {
    let deployment = disaggregated().await;
    for (path, body) in requests() {
        let reply = post(&deployment, path, &[], &body).await;
        reply.assert_ok(path);
        let prefill = reply
            .worker("prefill")
            .unwrap_or_else(|| panic!("{path}: {}", reply.text));
        let decode = reply.worker("decode").unwrap();
        assert_eq!(
            reply.json()["sim"]["kv_from"],
            prefill,
            "{path}: {}",
            reply.text
        );
        let prefill_hop = on_path(&deployment, prefill, path);
        assert_eq!(prefill_hop.len(), 1, "{path}");
        let sent = &prefill_hop[0].body;
        assert_eq!(sent["stream"], false, "{path}");
        assert_eq!(
            sent["kv_transfer_params"]["do_remote_decode"], true,
            "{path}"
        );
        let decode_hop = &on_path(&deployment, decode, path)[0].body;
        eprintln!(
            "{path}\n  prefill hop to {prefill}: {sent}\n  decode hop to {decode}: {decode_hop}"
        );
        assert_eq!(
            decode_hop["kv_transfer_params"]["do_remote_prefill"], true,
            "{path}"
        );
        match path {
            "/v1/responses" => {
                assert_eq!(
                    (&sent["max_output_tokens"], &sent["store"]),
                    (&json!(1), &json!(false))
                );
                let id = reply.json()["id"].as_str().unwrap().to_string();
                assert!(id.starts_with(&format!("resp_w{decode}_")), "{id}");
            }
            "/v1/messages" => assert_eq!(sent["max_tokens"], 1),
            _ => {
                assert_eq!(sent["sampling_params"], json!({"max_tokens": 1}));
                assert_eq!(decode_hop["sampling_params"], body["sampling_params"]);
            }
        }
        deployment.clear_requests();
    }
}

#[tokio::test]
async fn streamed_answers_pass_through_event_by_event() {
    let deployment = disaggregated().await;
    for (path, mut body, last) in [
        (
            requests()[0].0,
            requests()[0].1.clone(),
            "event: response.completed",
        ),
        (
            requests()[1].0,
            requests()[1].1.clone(),
            "event: message_stop",
        ),
    ] {
        body["stream"] = json!(true);
        let reply = post(
            &deployment,
            path,
            &[("x-dynamo-worker-instance-id", "202")],
            &body,
        )
        .await;
        reply.assert_ok(path);
        assert!(
            reply
                .header("content-type")
                .unwrap()
                .starts_with("text/event-stream"),
            "{path}"
        );
        let events: Vec<&str> = reply
            .text
            .lines()
            .filter(|l| l.starts_with("event: "))
            .collect();
        assert_eq!(events.last(), Some(&last), "{path}: {}", reply.text);
        assert!(events.len() >= 5 + 4, "{path}: {events:?}");
        assert!(reply.worker("prefill").is_some(), "{path}: two hops");
        assert_eq!(on_path(&deployment, 202, path)[0].body["stream"], true);
    }
}

#[tokio::test]
async fn a_stored_response_is_followed_up_read_and_cancelled_on_its_worker() {
    let deployment = disaggregated().await;
    let (path, body) = requests().remove(0);
    let first = post(&deployment, path, &[], &body).await;
    first.assert_ok("the first response");
    let decode = first.worker("decode").unwrap();
    let id = first.json()["id"].as_str().unwrap().to_string();
    deployment.clear_requests();

    for _ in 0..4 {
        let follow_up =
            json!({"model": "sim-model", "input": "and then?", "previous_response_id": id});
        let reply = post(&deployment, path, &[], &follow_up).await;
        reply.assert_ok("a follow-up");
        assert_eq!(
            reply.worker("decode"),
            Some(decode),
            "on the worker holding {id}"
        );
        assert_eq!(reply.worker("prefill"), None, "one hop");
        assert_eq!(reply.json()["previous_response_id"], id.as_str());
    }
    assert!(
        [101, 102]
            .iter()
            .all(|p| deployment.worker(*p).unwrap().requests().is_empty()),
        "no prefill hop for a follow-up"
    );

    let read = send(
        &deployment,
        Method::GET,
        &format!("/v1/responses/{id}"),
        &[],
        None,
    )
    .await;
    read.assert_ok("the stored response");
    assert_eq!(
        (read.worker("decode"), &read.json()["id"]),
        (Some(decode), &json!(id))
    );
    let cancel = send(
        &deployment,
        Method::POST,
        &format!("/v1/responses/{id}/cancel"),
        &[],
        None,
    )
    .await;
    assert_eq!(cancel.worker("decode"), Some(decode), "{}", cancel.text);
    assert_eq!(
        cancel.status, 400,
        "a finished response is not cancelled: {}",
        cancel.text
    );

    // A background response: one hop, answered at once, finished on the worker its id names.
    deployment.clear_requests();
    let background = json!({"model": "sim-model", "input": PROMPT, "background": true});
    let queued = post(&deployment, path, &[], &background).await;
    queued.assert_ok("a background response");
    assert_eq!(queued.worker("prefill"), None, "one hop: {}", queued.text);
    assert_eq!(queued.json()["status"], "queued", "{}", queued.text);
    let holder = queued.worker("decode").unwrap();
    let background_id = queued.json()["id"].as_str().unwrap().to_string();
    assert!(
        background_id.starts_with(&format!("resp_w{holder}_")),
        "{background_id}"
    );
    assert!(
        [101, 102]
            .iter()
            .all(|p| deployment.worker(*p).unwrap().requests().is_empty()),
        "no prefill hop for a background response"
    );
    let done = format!("/v1/responses/{background_id}");
    let mut finished = None;
    for _ in 0..50 {
        let read = send(&deployment, Method::GET, &done, &[], None).await;
        read.assert_ok("the background response");
        assert_eq!(read.worker("decode"), Some(holder));
        if !["queued", "in_progress"].contains(&read.json()["status"].as_str().unwrap_or("")) {
            finished = Some(read.json());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let finished = finished.expect("the background response finished");
    let text = &finished["output"][0]["content"][0]["text"];
    assert!(
        text.as_str().is_some_and(|t| t.starts_with("tok0 tok1")),
        "{finished}"
    );

    let elsewhere = send(
        &deployment,
        Method::GET,
        "/v1/responses/resp_123",
        &[],
        None,
    )
    .await;
    elsewhere.error(404, "response_not_found");
    let pinned_away = post(
        &deployment,
        path,
        &[(
            "x-dynamo-worker-instance-id",
            if decode == 201 { "202" } else { "201" },
        )],
        &json!({"input": "x", "previous_response_id": id}),
    )
    .await;
    pinned_away.error(400, "invalid_field");
    let own_id = post(
        &deployment,
        path,
        &[],
        &json!({"input": "x", "request_id": "resp_mine"}),
    )
    .await;
    own_id.error(400, "invalid_field");
}

#[tokio::test]
async fn messages_errors_are_anthropics_from_the_filter_and_for_hostile_workers() {
    let deployment = disaggregated().await;
    let (path, body) = requests().remove(1);
    let reply = post(
        &deployment,
        path,
        &[("x-dynamo-worker-instance-id", "999")],
        &body,
    )
    .await;
    assert_anthropic_error(&reply, 400, "invalid_request_error", "unknown_worker");

    // A decode worker that refuses a hop carrying the prefill's KV: its answer is withheld,
    // in the client's shape; one that fails is a typed 502, Anthropic's `api_error`.
    for (fault, status, kind, code) in [
        (
            Fault::Status(400),
            400,
            "invalid_request_error",
            "decode_refused",
        ),
        (Fault::Close, 502, "api_error", "pinned_worker_failed"),
    ] {
        deployment.worker(201).unwrap().set_fault(fault);
        let pin = [("x-dynamo-worker-instance-id", "201")];
        let reply = post(&deployment, path, &pin, &body).await;
        assert_anthropic_error(&reply, status, kind, code);
        assert!(!reply.text.contains("remote_host"), "{}", reply.text);
    }
    deployment.worker(201).unwrap().set_fault(Fault::None);

    // Every prefill worker answers garbage: the decode worker prefills itself.
    for prefill in [101, 102] {
        deployment
            .worker(prefill)
            .unwrap()
            .set_fault(Fault::Hostile);
    }
    for _ in 0..6 {
        let reply = post(&deployment, path, &[], &body).await;
        reply.assert_ok("a hostile prefill pool");
        assert_eq!(reply.json()["type"], "message", "{}", reply.text);
    }
}

fn assert_anthropic_error(reply: &Reply, status: u16, kind: &str, code: &str) {
    assert_eq!(reply.status, status, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["type"], "error", "{}", reply.text);
    assert_eq!(
        (&body["error"]["type"], &body["error"]["code"]),
        (&json!(kind), &json!(code)),
        "{}",
        reply.text
    );
    assert_eq!(reply.header("x-pinroute-error-code"), Some(code));
}

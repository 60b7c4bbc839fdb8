//! Every error of `docs/semantics.md` §3 and §6, through the real Envoy.

use pinroute_harness::sim::{Fault, SimConfig, SimRole};
use pinroute_harness::stack::StackSpec;
use serde_json::json;

use crate::client::{complete, prompt, send};
use crate::{Deployment, disaggregated, disaggregated_spec, start, wasm, worker};

#[tokio::test]
async fn bad_pins_are_typed_400s_naming_worker_hop_and_reason() {
    let deployment = disaggregated().await;
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a [&'a str]);
    let cases: &[Case] = &[
        (
            &[("x-dynamo-worker-instance-id", "999")],
            "unknown_worker",
            &["999", "decode hop", "unknown"],
        ),
        (
            &[("x-dynamo-prefill-instance-id", "999")],
            "unknown_worker",
            &["999", "prefill hop"],
        ),
        (
            &[("x-dynamo-worker-instance-id", "101")],
            "wrong_worker_role",
            &["101", "decode hop", "prefill worker"],
        ),
        (
            &[("x-dynamo-prefill-instance-id", "201")],
            "wrong_worker_role",
            &["201", "prefill hop", "decode worker"],
        ),
        (
            &[
                ("x-dynamo-worker-instance-id", "202"),
                ("x-dynamo-dp-rank", "2"),
            ],
            "dp_rank_out_of_range",
            &["202", "decode hop", "[0, 2)"],
        ),
        (
            &[
                ("x-dynamo-prefill-instance-id", "101"),
                ("x-dynamo-prefill-dp-rank", "1"),
            ],
            "dp_rank_out_of_range",
            &["101", "prefill hop", "[0, 1)"],
        ),
        (
            &[("x-dynamo-dp-rank", "0")],
            "rank_without_worker",
            &["decode hop"],
        ),
        (
            &[
                ("x-dynamo-prefill-dp-rank", "0"),
                ("x-dynamo-worker-instance-id", "201"),
            ],
            "rank_without_worker",
            &["prefill hop"],
        ),
        (
            &[("x-dynamo-worker-instance-id", "abc")],
            "invalid_header",
            &["x-dynamo-worker-instance-id", "not a decimal integer"],
        ),
        (
            &[("x-dynamo-worker-instance-id", "-3")],
            "invalid_header",
            &["negative"],
        ),
        (
            &[("x-dynamo-dp-rank", "99999999999")],
            "invalid_header",
            &["x-dynamo-dp-rank", "32 bits"],
        ),
        (
            &[("x-dp-rank", "1"), ("x-data-parallel-rank", "0")],
            "invalid_header",
            &["conflicts"],
        ),
    ];
    for (headers, code, words) in cases {
        let reply = complete(&deployment, headers, &prompt()).await;
        let message = reply.error(400, code);
        for word in *words {
            assert!(
                message.contains(word),
                "{headers:?}: {message:?} lacks {word:?}"
            );
        }
    }
    for id in [101, 102, 201, 202, 203] {
        assert!(
            deployment.worker(id).unwrap().requests().is_empty(),
            "a refused request reached worker {id}"
        );
    }
}

#[tokio::test]
async fn bad_bodies_are_typed_400s() {
    let deployment = disaggregated().await;
    let cases = [
        ("not json", "invalid_body"),
        ("[1, 2]", "invalid_body"),
        (r#"{"prompt": "x", "prompt": "y"}"#, "invalid_body"),
        (
            r#"{"prompt": "x", "nvext": {"decode_worker_id": "201"}}"#,
            "invalid_field",
        ),
        (
            r#"{"prompt": "x", "nvext": {"dp_rank": -1, "decode_worker_id": 201}}"#,
            "invalid_field",
        ),
        (r#"{"prompt": "x", "nvext": 7}"#, "invalid_field"),
        (
            r#"{"prompt": "x", "nvext": {"decode_worker_id": 1e400}}"#,
            "invalid_field",
        ),
        (
            r#"{"prompt": "x", "nvext": {"decode_worker_id": 123456789012345678901234567890}}"#,
            "invalid_field",
        ),
        (
            r#"{"prompt": "x", "nvext": {"dp_rank": 4294967296, "decode_worker_id": 202}}"#,
            "invalid_field",
        ),
    ];
    for (body, code) in cases {
        let reply = send(
            &deployment,
            reqwest::Method::POST,
            "/v1/completions",
            &[],
            Some(body.to_string()),
        )
        .await;
        reply.error(400, code);
    }
    let empty = send(
        &deployment,
        reqwest::Method::POST,
        "/v1/chat/completions",
        &[],
        None,
    )
    .await;
    empty.error(400, "invalid_body");
    let deep = format!(
        r#"{{"prompt": "x", "messages": {}1{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let reply = send(
        &deployment,
        reqwest::Method::POST,
        "/v1/completions",
        &[],
        Some(deep),
    )
    .await;
    assert!(reply.error(400, "invalid_body").contains("deeper than 128"));
    for id in [101, 102, 201, 202, 203] {
        assert!(
            deployment.worker(id).unwrap().requests().is_empty(),
            "a refused body reached worker {id}"
        );
    }
}

#[tokio::test]
async fn repeated_and_non_utf8_pin_headers_are_400() {
    let deployment = disaggregated().await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let repeated = client
        .post(deployment.url("/v1/completions"))
        .header("x-dynamo-worker-instance-id", "201")
        .header("x-dynamo-worker-instance-id", "202")
        .json(&prompt());
    let reply = crate::client::Reply::read(repeated.send().await.unwrap()).await;
    assert!(
        reply
            .error(400, "invalid_header")
            .contains("repeated with different values")
    );

    let latin1 = reqwest::header::HeaderValue::from_bytes(b"20\xe91").unwrap();
    let non_utf8 = client
        .post(deployment.url("/v1/completions"))
        .header("x-dynamo-dp-rank", latin1)
        .json(&prompt());
    let reply = crate::client::Reply::read(non_utf8.send().await.unwrap()).await;
    assert!(
        reply
            .error(400, "invalid_header")
            .contains("x-dynamo-dp-rank")
    );
}

#[tokio::test]
async fn a_draining_pinned_worker_is_503_with_retry_after() {
    let deployment = disaggregated().await;
    let reply = complete(
        &deployment,
        &[("x-dynamo-worker-instance-id", "203")],
        &prompt(),
    )
    .await;
    let message = reply.error(503, "worker_unavailable");
    assert!(
        message.contains("203") && message.contains("draining"),
        "{message}"
    );
    assert_eq!(reply.header("retry-after"), Some("5"));
}

#[tokio::test]
async fn a_pinned_prefill_worker_that_fails_is_502_without_a_retry_elsewhere() {
    let mut spec = disaggregated_spec();
    spec.dead = vec![(109, SimRole::Prefill, 1)];
    let deployment = start(spec).await;
    let reply = complete(
        &deployment,
        &[("x-dynamo-prefill-instance-id", "109")],
        &prompt(),
    )
    .await;
    let message = reply.error(502, "pinned_worker_failed");
    assert!(
        message.contains("109") && message.contains("prefill hop"),
        "{message}"
    );

    deployment
        .worker(101)
        .unwrap()
        .set_fault(Fault::Status(500));
    let reply = complete(
        &deployment,
        &[("x-dynamo-prefill-instance-id", "101")],
        &prompt(),
    )
    .await;
    let message = reply.error(502, "pinned_worker_failed");
    assert!(message.contains("HTTP 500"), "{message}");
    for id in [102, 201, 202] {
        assert!(
            deployment.worker(id).unwrap().requests().is_empty(),
            "worker {id} was tried instead"
        );
    }
}

#[tokio::test]
async fn a_pinned_prefill_worker_that_hangs_is_504() {
    let mut spec = disaggregated_spec();
    spec.settings = json!({"prefill_timeout_ms": 300});
    let deployment = start(spec).await;
    deployment.worker(102).unwrap().set_fault(Fault::Hang);
    let reply = complete(
        &deployment,
        &[("x-dynamo-prefill-instance-id", "102")],
        &prompt(),
    )
    .await;
    let message = reply.error(504, "pinned_worker_failed");
    assert!(message.contains("timed out"), "{message}");
}

#[tokio::test]
async fn a_pinned_decode_worker_that_fails_is_a_typed_502() {
    let mut spec = disaggregated_spec();
    spec.dead = vec![(209, SimRole::Decode, 1)];
    let deployment = start(spec).await;
    let reply = complete(
        &deployment,
        &[("x-dynamo-worker-instance-id", "209")],
        &prompt(),
    )
    .await;
    let message = reply.error(502, "pinned_worker_failed");
    assert!(
        message.contains("209") && message.contains("decode hop"),
        "{message}"
    );

    deployment
        .worker(201)
        .unwrap()
        .set_fault(Fault::Status(500));
    let reply = complete(
        &deployment,
        &[("x-dynamo-worker-instance-id", "201")],
        &prompt(),
    )
    .await;
    let message = reply.error(502, "pinned_worker_failed");
    assert!(
        message.contains("201") && message.contains("HTTP 500"),
        "{message}"
    );
}

#[tokio::test]
async fn a_body_over_the_limit_is_413() {
    let mut spec = StackSpec::new(vec![worker(201, SimRole::Decode, 1)], wasm());
    spec.settings = json!({"max_body_bytes": 4096});
    let deployment = start(spec).await;
    let body = json!({"prompt": "x".repeat(10_000)});
    complete(&deployment, &[], &body)
        .await
        .error(413, "body_too_large");
    let small = complete(&deployment, &[], &prompt()).await;
    small.assert_ok("the request");
}

#[tokio::test]
async fn a_pinned_decode_worker_that_hangs_is_504() {
    let mut spec = disaggregated_spec();
    spec.route_timeout = std::time::Duration::from_secs(1);
    let deployment = start(spec).await;
    deployment.worker(202).unwrap().set_fault(Fault::Hang);
    let reply = complete(
        &deployment,
        &[("x-dynamo-worker-instance-id", "202")],
        &prompt(),
    )
    .await;
    let message = reply.error(504, "pinned_worker_failed");
    assert!(
        message.contains("202") && message.contains("timed out"),
        "{message}"
    );
}

#[tokio::test]
async fn no_available_worker_is_503_and_failed_prefill_without_fallback_is_502() {
    let mut spec = StackSpec::new(vec![worker(201, SimRole::Decode, 1)], wasm());
    spec.draining = vec![201];
    let deployment = start(spec).await;
    let reply = complete(&deployment, &[], &prompt()).await;
    let message = reply.error(503, "no_worker_available");
    assert!(message.contains("decode hop"), "{message}");
    assert_eq!(reply.header("retry-after"), Some("5"));

    let mut spec = StackSpec::new(vec![worker(201, SimRole::Decode, 1)], wasm());
    spec.dead = vec![(109, SimRole::Prefill, 1)];
    spec.settings = json!({"aggregated_fallback": false, "prefill_retries": 0});
    let deployment = start(spec).await;
    let reply = complete(&deployment, &[], &prompt()).await;
    let message = reply.error(502, "upstream_failed");
    assert!(
        message.contains("prefill hop") && message.contains("109"),
        "{message}"
    );
    assert!(deployment.worker(201).unwrap().requests().is_empty());
}

#[tokio::test]
async fn unpinned_prefill_faults_are_absorbed_by_retries() {
    let mut spec = disaggregated_spec();
    spec.settings = json!({"prefill_timeout_ms": 500});
    let deployment = start(spec).await;
    for fault in [Fault::Status(500), Fault::Close, Fault::Hang] {
        deployment.worker(101).unwrap().set_fault(fault);
        deployment.worker(102).unwrap().set_fault(Fault::None);
        for _ in 0..3 {
            let reply = complete(&deployment, &[], &prompt()).await;
            assert_eq!(reply.status, 200, "{fault:?}: {}", reply.text);
            assert_eq!(reply.worker("prefill"), Some(102), "{fault:?}");
        }
        // Let worker 101 recover before the next fault.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let pinned = complete(
            &deployment,
            &[("x-dynamo-prefill-instance-id", "101")],
            &prompt(),
        )
        .await;
        assert!(
            matches!(pinned.status, 502..=504),
            "{fault:?}: {}",
            pinned.text
        );
    }
}

/// The disaggregated deployment, with `worker` answering as `fault` says.
async fn with_fault(worker: u64, fault: Fault) -> Deployment {
    let deployment = disaggregated().await;
    deployment.worker(worker).unwrap().set_fault(fault);
    deployment
}

const PIN_201: [(&str, &str); 1] = [("x-dynamo-worker-instance-id", "201")];

/// A deployment whose decode worker 201 drops its connections and has just failed a pinned
/// request, which takes it out of service (`eject_after_failures: 1`: these tests are about
/// the outage, not the evidence that starts it).
async fn with_201_failed(unhealthy_period_ms: u64) -> (Deployment, Killed) {
    let mut spec = disaggregated_spec();
    spec.settings =
        json!({ "unhealthy_period_ms": unhealthy_period_ms, "eject_after_failures": 1 });
    let mut deployment = start(spec).await;
    let killed = deployment.stack.kill_worker(201).await.unwrap();
    complete(&deployment, &PIN_201, &prompt())
        .await
        .error(502, "pinned_worker_failed");
    (deployment, killed)
}

/// A killed worker's configuration and address, to restart it on.
type Killed = (SimConfig, std::net::SocketAddr);

async fn restart(deployment: &mut Deployment, (config, addr): Killed) {
    deployment.stack.restart_worker(config, addr).await.unwrap();
}

#[tokio::test]
async fn a_failed_worker_answers_503_to_pins_and_returns_by_itself() {
    let (mut deployment, killed) = with_201_failed(1500).await;
    let pin = PIN_201;
    restart(&mut deployment, killed).await;
    let reply = complete(&deployment, &pin, &prompt()).await;
    assert!(reply.error(503, "worker_unavailable").contains("unhealthy"));
    let retry_after: u64 = reply.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    for _ in 0..6 {
        let unpinned = complete(&deployment, &[], &prompt()).await;
        assert_eq!(
            unpinned.worker("decode"),
            Some(202),
            "unhealthy 201 is skipped"
        );
    }
    tokio::time::sleep(std::time::Duration::from_millis(1600)).await;
    let back = complete(&deployment, &pin, &prompt()).await;
    back.assert_ok("the request");
}

#[tokio::test]
async fn a_worker_that_drops_a_connection_it_accepted_stays_in_service() {
    let mut spec = disaggregated_spec();
    spec.settings = json!({ "unhealthy_period_ms": 60000 });
    let deployment = start(spec).await;
    deployment.worker(201).unwrap().set_fault(Fault::Close);
    complete(&deployment, &PIN_201, &prompt())
        .await
        .error(502, "pinned_worker_failed");
    deployment.worker(201).unwrap().set_fault(Fault::None);
    complete(&deployment, &PIN_201, &prompt())
        .await
        .assert_ok("a pin right after the dropped connection");
    let mut served_by_201 = 0;
    for _ in 0..6 {
        let unpinned = complete(&deployment, &[], &prompt()).await;
        served_by_201 += usize::from(unpinned.worker("decode") == Some(201));
    }
    assert!(served_by_201 > 0, "201 is still chosen unpinned");
}

#[tokio::test]
async fn a_worker_failing_again_on_its_return_is_out_twice_as_long() {
    let (mut deployment, killed) = with_201_failed(1000).await;
    let pin = PIN_201;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    complete(&deployment, &pin, &prompt())
        .await
        .error(502, "pinned_worker_failed");
    restart(&mut deployment, killed).await;
    let reply = complete(&deployment, &pin, &prompt()).await;
    reply.error(503, "worker_unavailable");
    assert_eq!(
        reply.header("retry-after"),
        Some("2"),
        "second outage: two periods"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    complete(&deployment, &pin, &prompt())
        .await
        .error(503, "worker_unavailable");
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    complete(&deployment, &pin, &prompt())
        .await
        .assert_ok("the request after two periods");
}

#[tokio::test]
async fn a_prefill_workers_4xx_reaches_the_client_and_takes_no_worker_out() {
    let deployment = with_fault(101, Fault::Status(400)).await;
    let pin = [("x-dynamo-prefill-instance-id", "101")];
    let refused = complete(&deployment, &pin, &prompt()).await;
    assert_eq!(refused.status, 400, "{}", refused.text);
    assert_eq!(
        refused.json()["error"]["message"],
        "simulated fault: worker 101 answers 400"
    );
    assert_eq!(
        refused.header("x-pinroute-error-code"),
        None,
        "the worker's answer, not pinroute's"
    );
    assert_eq!(refused.worker("prefill"), Some(101));
    deployment.worker(101).unwrap().set_fault(Fault::None);
    complete(&deployment, &pin, &prompt())
        .await
        .assert_ok("the next request pinned to 101");
}

#[tokio::test]
async fn a_decode_5xx_without_a_body_still_gets_a_json_error() {
    let deployment = with_fault(201, Fault::Status(503)).await;
    let pin = [("x-dynamo-worker-instance-id", "201")];
    let reply = send(&deployment, reqwest::Method::GET, "/health", &pin, None).await;
    let message = reply.error(502, "pinned_worker_failed");
    assert_eq!(
        message,
        "decode hop: pinned worker 201 failed: it answered HTTP 503"
    );
}

#[tokio::test]
async fn a_workers_5xx_fails_the_request_but_takes_no_worker_out() {
    let deployment = with_fault(201, Fault::Status(500)).await;
    let pin = [("x-dynamo-worker-instance-id", "201")];
    complete(&deployment, &pin, &prompt())
        .await
        .error(502, "pinned_worker_failed");
    deployment.worker(201).unwrap().set_fault(Fault::None);
    complete(&deployment, &pin, &prompt())
        .await
        .assert_ok("the next request pinned to 201");
}

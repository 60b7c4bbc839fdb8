//! Operating it: a live registry (and the retry of its workers' refused connections),
//! session affinity across replicas.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pinroute_harness::sim::SimRole;
use pinroute_harness::stack::StackSpec;
use reqwest::StatusCode;
use serde_json::json;
use tempfile::TempDir;

use crate::client::{Reply, complete, prompt};
use crate::{Deployment, start, stat, wasm, worker};

/// Sends `request` until `accept` holds for its reply (or fails after 10 s).
async fn eventually<F, Fut>(what: &str, request: F, accept: impl Fn(&Reply) -> bool) -> Reply
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Reply>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = request().await;
        if accept(&reply) {
            return reply;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: still {} {}",
            reply.status,
            reply.text
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn live_spec() -> StackSpec {
    let workers = vec![
        worker(101, SimRole::Prefill, 1),
        worker(201, SimRole::Decode, 1),
        worker(202, SimRole::Decode, 1),
    ];
    let mut spec = StackSpec::new(workers, wasm());
    spec.live_registry = Some(Duration::from_millis(200));
    spec
}

#[tokio::test]
async fn a_live_registry_adds_and_removes_workers_while_traffic_runs() {
    let mut deployment = start(live_spec()).await;
    let added = deployment
        .stack
        .add_worker(worker(203, SimRole::Decode, 2))
        .await
        .unwrap();
    let registry = deployment.registry.as_ref().unwrap();
    let pinned = |id: &'static str| {
        let deployment: &Deployment = &deployment;
        move || async move {
            complete(
                deployment,
                &[("x-dynamo-worker-instance-id", id)],
                &prompt(),
            )
            .await
        }
    };
    let before = pinned("203")().await;
    before.error(400, "unknown_worker");

    let url = deployment.url("/v1/completions");
    let traffic = tokio::spawn(async move {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let mut statuses = Vec::new();
        for _ in 0..150 {
            let response = client.post(&url).json(&prompt()).send().await.unwrap();
            statuses.push(response.status());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        statuses
    });

    let mut entries = deployment.entries(&[101, 201, 202]);
    entries.push(added);
    registry.set_workers(&entries);
    let reply = eventually("the added worker serves pins", pinned("203"), |r| {
        r.status == 200
    })
    .await;
    assert_eq!(reply.worker("decode"), Some(203));

    registry.set_workers(&deployment.entries(&[101, 202, 203]));
    eventually("the removed worker is unknown", pinned("201"), |r| {
        r.status == 400
    })
    .await
    .error(400, "unknown_worker");

    registry.set_answer(StatusCode::OK, r#"{"workers": "oops"}"#.into());
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        pinned("203")().await.status,
        200,
        "the last good registry stays"
    );
    let failed = deployment
        .envoy
        .stat("wasmcustom.pinroute.registry.refresh_failed")
        .await
        .unwrap()
        .unwrap_or(0);
    assert!(failed >= 1, "the broken registry was counted");

    let statuses = traffic.await.unwrap();
    let failures: Vec<_> = statuses.iter().filter(|s| !s.is_success()).collect();
    assert!(
        failures.is_empty(),
        "requests failed during registry changes: {failures:?}"
    );
}

#[tokio::test]
async fn a_refused_decode_worker_known_only_from_the_live_registry_is_retried_on_the_next() {
    let workers = vec![
        worker(101, SimRole::Prefill, 1),
        worker(201, SimRole::Decode, 1),
    ];
    let mut spec = StackSpec::new(workers, wasm());
    spec.live_registry = Some(Duration::from_millis(200));
    // Every refusal is retried and counted; none takes its worker out during the test.
    spec.settings = json!({ "eject_after_failures": 1000 });
    let mut deployment = start(spec).await;
    // 202 and 203 are in no static list: the pool cluster does not list them.
    let mut entries = deployment.entries(&[101]);
    for id in [202, 203] {
        let added = deployment.stack.add_worker(worker(id, SimRole::Decode, 1));
        entries.push(added.await.unwrap());
    }
    deployment.registry.as_ref().unwrap().set_workers(&entries);
    let deployment_ref: &Deployment = &deployment;
    let pinned_203 = move || async move {
        let pin = [("x-dynamo-worker-instance-id", "203")];
        complete(deployment_ref, &pin, &prompt()).await
    };
    eventually("the live registry is adopted", pinned_203, |r| {
        r.status == 200
    })
    .await;
    // Every Envoy thread adopts it within half a second.
    tokio::time::sleep(Duration::from_millis(1000)).await;

    deployment.stack.kill_worker(202).await.unwrap();
    for stream in [false, true] {
        let mut body = prompt();
        body["stream"] = json!(stream);
        for _ in 0..10 {
            let reply = complete(&deployment, &[], &body).await;
            reply.assert_ok("an unpinned request");
            assert_eq!(reply.worker("decode"), Some(203), "{}", reply.text);
            assert_eq!(reply.worker("prefill"), Some(101));
            let content_type = reply.header("content-type").unwrap();
            if stream {
                assert!(
                    content_type.starts_with("text/event-stream"),
                    "{content_type}"
                );
                assert!(
                    reply.text.trim_end().ends_with("data: [DONE]"),
                    "{}",
                    reply.text
                );
            } else {
                assert!(
                    content_type.starts_with("application/json"),
                    "{content_type}"
                );
                assert!(
                    reply.json()["choices"][0]["text"].is_string(),
                    "{}",
                    reply.text
                );
            }
        }
    }
    let retried = stat(&deployment, "wasmcustom.pinroute.decode.retried").await;
    let refused = stat(&deployment, "wasmcustom.pinroute.workers.connect_failed").await;
    assert!(retried >= 1, "202 was chosen first at least once");
    assert_eq!(retried, refused, "each refusal went on to 203");

    deployment.stack.kill_worker(203).await.unwrap();
    complete(&deployment, &[], &prompt())
        .await
        .error(502, "upstream_failed");
}

/// The workers each session lands on through one gateway.
async fn placements(url_base: &str, sessions: usize) -> HashMap<String, (u64, u64)> {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut placements = HashMap::new();
    for i in 0..sessions {
        let session = format!("conversation-{i}");
        let response = client
            .post(format!("{url_base}/v1/completions"))
            .header("x-dynamo-session-id", &session)
            .json(&prompt())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let id = |name: &str| {
            response.headers()[name]
                .to_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        };
        placements.insert(
            session,
            (
                id("x-pinroute-prefill-worker"),
                id("x-pinroute-decode-worker"),
            ),
        );
    }
    placements
}

#[tokio::test]
async fn two_replicas_send_a_session_to_the_same_workers_and_a_leaving_worker_moves_only_its_sessions()
 {
    let workers = vec![
        worker(101, SimRole::Prefill, 1),
        worker(102, SimRole::Prefill, 1),
        worker(103, SimRole::Prefill, 1),
        worker(201, SimRole::Decode, 1),
        worker(202, SimRole::Decode, 1),
        worker(203, SimRole::Decode, 1),
        worker(204, SimRole::Decode, 1),
    ];
    let mut spec = StackSpec::new(workers, wasm());
    spec.live_registry = Some(Duration::from_millis(200));
    let deployment = start(spec).await;
    let dir = TempDir::new().unwrap();
    let replica = deployment.start_replica(dir.path()).await.unwrap();

    let first = placements(&deployment.url(""), 60).await;
    let second = placements(&replica.url(""), 60).await;
    assert_eq!(first, second, "both replicas place every session alike");
    let decode_workers: std::collections::HashSet<u64> = first.values().map(|p| p.1).collect();
    assert!(
        decode_workers.len() >= 3,
        "sessions spread over the pool: {decode_workers:?}"
    );

    let leaving = 203;
    deployment
        .registry
        .as_ref()
        .unwrap()
        .set_workers(&deployment.entries(&[101, 102, 103, 201, 202, 204]));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = placements(&replica.url(""), 60).await;
    for (session, (prefill, decode)) in &first {
        let (prefill_after, decode_after) = after[session];
        assert_eq!(
            *prefill, prefill_after,
            "{session}: prefill placement moved"
        );
        if *decode == leaving {
            assert_ne!(
                decode_after, leaving,
                "{session} still on the removed worker"
            );
        } else {
            assert_eq!(
                *decode, decode_after,
                "{session} moved although its worker stayed"
            );
        }
    }
}

#[tokio::test]
async fn unpinned_requests_favour_the_decode_worker_with_fewer_requests_in_flight() {
    use pinroute_harness::sim::SimConfig;
    let workers = vec![
        worker(101, SimRole::Prefill, 1),
        SimConfig::new(201, SimRole::Decode).with_token_latency(Duration::from_millis(1)),
        SimConfig::new(202, SimRole::Decode).with_token_latency(Duration::from_millis(40)),
    ];
    let deployment = start(StackSpec::new(workers, wasm())).await;
    let url = deployment.url("/v1/completions");
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut lanes = Vec::new();
    for _ in 0..8 {
        let (client, url) = (client.clone(), url.clone());
        lanes.push(tokio::spawn(async move {
            let mut served = Vec::new();
            for _ in 0..10 {
                let response = client.post(&url).json(&prompt()).send().await.unwrap();
                assert_eq!(response.status(), 200);
                served.push(
                    response.headers()["x-pinroute-decode-worker"]
                        .to_str()
                        .unwrap()
                        .to_string(),
                );
            }
            served
        }));
    }
    let mut fast = 0;
    for lane in lanes {
        fast += lane.await.unwrap().iter().filter(|id| *id == "201").count();
    }
    println!("fast decode worker served {fast} of 80 requests (round robin would give 40)");
    assert!(
        fast >= 60,
        "the slow worker kept getting requests: fast served only {fast} of 80"
    );
}

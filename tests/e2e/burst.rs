//! Passive health (`docs/semantics.md` §5) both ways: a burst through a pool of one must not
//! turn the connections its decode worker could not accept into an outage (failure count,
//! panic mode), and a worker that really died must still be avoided.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::channel::Channel;
use pinroute::policy::headers::ERROR_CODE_HEADER;
use pinroute_harness::sim::SimRole;
use pinroute_harness::stack::StackSpec;
use tokio::task::JoinSet;

use crate::client::{complete, prompt};
use crate::{Deployment, start, stat, wasm, worker};

/// Concurrent requests of the burst.
const BURST: usize = 1024;
/// Prompt size of each.
const PROMPT_BYTES: usize = 200 * 1024;
/// The burst's bodies finish arriving over this long, the last byte of request `i` at
/// `i / BURST` of it, as a crowd of clients' uploads do: later ones are routed while the first
/// ones already meet the decode worker.
const ARRIVALS: Duration = Duration::from_secs(2);
/// Sequential requests right after the burst, every one of which must be served.
const AFTER: usize = 20;
/// Before them, the decode worker's one-slot accept queue drains the burst's last
/// connections (Envoy's, of requests already answered): a connection refused then is the
/// worker's full queue, not the gateway keeping it out (a CI run under load saw one).
const SETTLE: Duration = Duration::from_millis(500);
/// A slow prefill worker holds the burst back and releases it onto decode all at once.
const PREFILL_LATENCY: Duration = Duration::from_millis(200);
/// The decode worker's accept backlog: far fewer than the connections the burst opens.
const DECODE_BACKLOG: u32 = 1;

/// One slow prefill worker and one decode worker with a tiny accept backlog, the filter's
/// default health settings.
fn burst_spec() -> StackSpec {
    let workers = vec![
        worker(101, SimRole::Prefill, 1).with_prefill_latency(PREFILL_LATENCY),
        worker(201, SimRole::Decode, 1).with_backlog(DECODE_BACKLOG),
    ];
    StackSpec::new(workers, wasm())
}

/// A completion body of about `PROMPT_BYTES`.
fn large_body() -> Bytes {
    let prompt = "lorem ipsum ".repeat(PROMPT_BYTES / 12);
    let body = serde_json::json!({"model": "sim-model", "prompt": prompt, "max_tokens": 5});
    Bytes::from(body.to_string())
}

/// How each answer of a run came back: `200`, `503 no_worker_available`, ...
#[derive(Debug, Default)]
struct Statuses(BTreeMap<String, usize>);

impl Statuses {
    fn add(&mut self, status: String) {
        *self.0.entry(status).or_default() += 1;
    }

    fn count(&self, status: &str) -> usize {
        self.0.get(status).copied().unwrap_or(0)
    }

    /// Answers that say the pool had no worker for the request.
    fn refused(&self) -> usize {
        self.count("503 no_worker_available") + self.count("503 worker_unavailable")
    }
}

async fn send(client: reqwest::Client, url: String, body: Bytes) -> String {
    send_body(client, url, body.len(), reqwest::Body::from(body)).await
}

/// Sends `body` but its last byte at once, the last byte after `delay`.
async fn send_late(client: reqwest::Client, url: String, body: Bytes, delay: Duration) -> String {
    let (mut sender, channel) = Channel::<Bytes, std::convert::Infallible>::new(1);
    let split = body.len() - 1;
    let (head, tail) = (body.slice(..split), body.slice(split..));
    tokio::spawn(async move {
        let _ = sender.send_data(head).await;
        tokio::time::sleep(delay).await;
        let _ = sender.send_data(tail).await;
    });
    send_body(client, url, body.len(), reqwest::Body::wrap(channel)).await
}

/// `200`, or the status and pinroute error code (`503 no_worker_available`), or what failed.
async fn send_body(
    client: reqwest::Client,
    url: String,
    length: usize,
    body: reqwest::Body,
) -> String {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .header("content-length", length)
        .body(body)
        .send()
        .await;
    match response {
        Ok(response) => {
            let status = response.status().as_u16();
            match response.headers().get(ERROR_CODE_HEADER) {
                Some(code) => format!("{status} {}", code.to_str().unwrap_or("?")),
                None => status.to_string(),
            }
        }
        Err(error) => format!("transport error: {error}"),
    }
}

async fn burst(deployment: &Deployment, client: &reqwest::Client, body: &Bytes) -> Statuses {
    let mut requests = JoinSet::new();
    for i in 0..BURST {
        let url = deployment.url("/v1/completions");
        let delay = ARRIVALS.mul_f64(i as f64 / BURST as f64);
        requests.spawn(send_late(client.clone(), url, body.clone(), delay));
    }
    let mut statuses = Statuses::default();
    while let Some(status) = requests.join_next().await {
        statuses.add(status.unwrap());
    }
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_the_decode_worker_cannot_all_accept_finds_a_worker_and_leaves_no_outage() {
    let deployment = start(burst_spec()).await;
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let body = large_body();

    let during = burst(&deployment, &client, &body).await;
    tokio::time::sleep(SETTLE).await;
    let mut after = Statuses::default();
    for _ in 0..AFTER {
        let url = deployment.url("/v1/completions");
        after.add(send(client.clone(), url, body.clone()).await);
    }
    let connect_failures = stat(
        &deployment,
        "cluster.pinroute_decode_pool.upstream_cx_connect_fail",
    )
    .await;
    eprintln!(
        "burst of {BURST}: {:?}; the {AFTER} after: {:?}; decode connections failed (Envoy) {connect_failures}, \
         counted by pinroute {}, workers taken out {}, panic decisions {}",
        during.0,
        after.0,
        stat(&deployment, "wasmcustom.pinroute.workers.connect_failed").await,
        stat(&deployment, "wasmcustom.pinroute.workers.marked_unhealthy").await,
        stat(&deployment, "wasmcustom.pinroute.workers.panic_decode").await,
    );

    assert!(
        connect_failures > 0,
        "the decode worker accepted the whole burst: this test tests nothing"
    );
    assert!(
        during.refused() * 100 <= BURST,
        "more than 1% of the burst found no worker: {:?}",
        during.0
    );
    assert_eq!(
        after.count("200"),
        AFTER,
        "every request after the burst is served: {:?}",
        after.0
    );
}

/// Unpinned completions sent one after the other, by status.
async fn sequential(deployment: &Deployment, count: usize) -> Statuses {
    let mut statuses = Statuses::default();
    for _ in 0..count {
        let reply = complete(deployment, &[], &prompt()).await;
        statuses.add(reply.status.to_string());
    }
    statuses
}

#[tokio::test]
async fn a_killed_worker_is_out_of_unpinned_selection_after_its_third_refused_connection() {
    let workers = vec![
        worker(101, SimRole::Prefill, 1),
        worker(201, SimRole::Decode, 1),
        worker(202, SimRole::Decode, 1),
        worker(203, SimRole::Decode, 1),
    ];
    let mut deployment = start(StackSpec::new(workers, wasm())).await;
    deployment.stack.kill_worker(202).await.unwrap();

    let first = sequential(&deployment, 20).await;
    assert_eq!(
        first.count("200"),
        20,
        "refusals are retried: {:?}",
        first.0
    );
    assert_eq!(
        stat(&deployment, "wasmcustom.pinroute.workers.connect_failed").await,
        3,
        "tried until its third refusal"
    );
    assert_eq!(
        stat(&deployment, "wasmcustom.pinroute.workers.marked_unhealthy").await,
        1
    );
    let then = sequential(&deployment, 20).await;
    assert_eq!(then.count("200"), 20, "{:?}", then.0);
    assert_eq!(
        stat(&deployment, "wasmcustom.pinroute.workers.connect_failed").await,
        3,
        "not tried again within its outage"
    );
    assert_eq!(
        stat(&deployment, "wasmcustom.pinroute.workers.panic_decode").await,
        0,
        "two of three decode workers are healthy: no panic"
    );
}

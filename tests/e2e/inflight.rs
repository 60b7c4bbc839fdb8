//! The in-flight limit (`docs/semantics.md` §1) through Envoy: a burst of slow-prefill
//! completions over the limit, and clients that leave mid-prefill. The memory figures of
//! `docs/soak.md` come from the ignored `memory_per_request_in_flight` below.

use std::time::Duration;

use bytes::Bytes;
use pinroute_harness::sim::SimRole;
use pinroute_harness::stack::StackSpec;
use serde_json::json;
use tokio::task::JoinSet;

use crate::client::Reply;
use crate::{Deployment, start, wasm, worker};

/// One prefill worker that takes `prefill` per request, one decode worker, and the filter's
/// `max_requests_in_flight` at `limit` (0: off).
fn slow_prefill(prefill: Duration, limit: u64) -> StackSpec {
    let workers = vec![
        worker(101, SimRole::Prefill, 1).with_prefill_latency(prefill),
        worker(201, SimRole::Decode, 1),
    ];
    let mut spec = StackSpec::new(workers, wasm());
    spec.settings = json!({"max_requests_in_flight": limit});
    spec
}

fn client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .build()
        .unwrap()
}

/// A completion body whose prompt is `prompt_bytes` long.
fn body(prompt_bytes: usize) -> Bytes {
    let prompt = "lorem ipsum ".repeat(prompt_bytes / 12);
    Bytes::from(json!({"model": "sim-model", "prompt": prompt, "max_tokens": 2}).to_string())
}

async fn post(client: reqwest::Client, url: String, body: Bytes) -> reqwest::Result<Reply> {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    Ok(Reply::read(response).await)
}

/// `count` completions sent at once; their answers (or transport errors).
async fn burst(
    deployment: &Deployment,
    client: &reqwest::Client,
    count: usize,
    body: &Bytes,
) -> Vec<reqwest::Result<Reply>> {
    let mut requests = JoinSet::new();
    for _ in 0..count {
        let url = deployment.url("/v1/completions");
        requests.spawn(post(client.clone(), url, body.clone()));
    }
    requests.join_all().await
}

fn assert_overloaded(reply: &Reply) {
    reply.error(503, "overloaded");
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.worker("decode"), None, "reached no worker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_excess_of_a_burst_over_the_limit_is_refused_and_every_slot_comes_back() {
    let deployment = start(slow_prefill(Duration::from_secs(2), 4)).await;
    let client = client(Duration::from_secs(30));
    let replies = burst(&deployment, &client, 10, &body(1024)).await;

    let replies: Vec<Reply> = replies.into_iter().map(Result::unwrap).collect();
    let served = replies.iter().filter(|r| r.status == 200).count();
    for reply in replies.iter().filter(|r| r.status != 200) {
        assert_overloaded(reply);
    }
    assert_eq!(served, 4, "the limit's worth is served, the rest refused");
    let prefills = deployment.worker(101).unwrap().requests().len();
    assert_eq!(prefills, 4, "no refused request reached the prefill worker");
    let refused = stat(&deployment, "wasmcustom.pinroute.errors.overloaded").await;
    assert_eq!(refused, 6, "counted");

    let again = burst(&deployment, &client, 4, &body(1024)).await;
    for reply in again {
        reply
            .unwrap()
            .assert_ok("every slot is free after the burst");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_leave_during_their_prefill_give_their_slots_back() {
    let deployment = start(slow_prefill(Duration::from_secs(1), 4)).await;
    let impatient = client(Duration::from_millis(300));
    for reply in burst(&deployment, &impatient, 4, &body(1024)).await {
        assert!(reply.is_err_and(|e| e.is_timeout()), "the client left");
    }
    let gone = "http.pinroute.downstream_cx_destroy_remote_active_rq";
    for _ in 0..500 {
        if stat(&deployment, gone).await >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        stat(&deployment, gone).await,
        4,
        "Envoy saw the clients leave"
    );

    let client = client(Duration::from_secs(30));
    for reply in burst(&deployment, &client, 4, &body(1024)).await {
        reply
            .unwrap()
            .assert_ok("the slots of the clients that left are free");
    }
    assert_eq!(
        stat(&deployment, "wasmcustom.pinroute.errors.overloaded").await,
        0
    );
}

async fn stat(deployment: &Deployment, name: &str) -> u64 {
    deployment.envoy.stat(name).await.unwrap().unwrap_or(0)
}

/// Envoy's memory at one moment: resident (`/proc`), and tcmalloc's `allocated` and
/// `heap_size` (admin `/memory`, the values of `server.memory_allocated` and
/// `server.memory_heap_size`), in MiB.
#[derive(Debug, Default, Clone, Copy)]
struct Memory {
    rss: f64,
    allocated: f64,
    heap: f64,
}

impl Memory {
    async fn read(deployment: &Deployment) -> Memory {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", deployment.envoy.pid())).unwrap();
        let memory: serde_json::Value =
            serde_json::from_str(&deployment.envoy.admin_get("/memory").await.unwrap()).unwrap();
        let mib = |bytes: &serde_json::Value| {
            bytes.as_str().and_then(|s| s.parse::<f64>().ok()).unwrap() / 1048576.0
        };
        Memory {
            rss: status_kib(&status, "VmRSS:") / 1024.0,
            allocated: mib(&memory["allocated"]),
            heap: mib(&memory["heap_size"]),
        }
    }

    fn max(self, other: Memory) -> Memory {
        Memory {
            rss: self.rss.max(other.rss),
            allocated: self.allocated.max(other.allocated),
            heap: self.heap.max(other.heap),
        }
    }
}

fn status_kib(status: &str, key: &str) -> f64 {
    let line = status.lines().find(|l| l.starts_with(key)).unwrap();
    line[key.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Prompt size of the figures' requests.
const FIGURE_PROMPT_BYTES: usize = 256 * 1024;
/// Long enough for a whole burst to arrive while the first of it is still in its prefill.
const FIGURE_PREFILL: Duration = Duration::from_secs(5);

/// Two slow prefill workers, so that every request waiting for its prefill still has a
/// retry left and holds its prefill body in the VM (the worst case of `docs/security.md`).
fn figure_spec(limit: u64) -> StackSpec {
    let mut spec = slow_prefill(FIGURE_PREFILL, limit);
    spec.workers
        .push(worker(102, SimRole::Prefill, 1).with_prefill_latency(FIGURE_PREFILL));
    spec.worker_ports.push(0);
    spec
}

/// One row: a burst of `count` concurrent 256 KB completions with `limit`.
async fn figure_row(count: usize, limit: u64) -> String {
    let deployment = start(figure_spec(limit)).await;
    let client = client(Duration::from_secs(120));
    let before = Memory::read(&deployment).await;
    let sending = {
        let (deployment_url, client, body) = (
            deployment.url("/v1/completions"),
            client.clone(),
            body(FIGURE_PROMPT_BYTES),
        );
        tokio::spawn(async move {
            let mut requests = JoinSet::new();
            for _ in 0..count {
                requests.spawn(post(client.clone(), deployment_url.clone(), body.clone()));
            }
            requests.join_all().await
        })
    };
    let mut peak = before;
    while !sending.is_finished() {
        peak = peak.max(Memory::read(&deployment).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let replies = sending.await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = Memory::read(&deployment).await;
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", deployment.envoy.pid())).unwrap();
    let hwm = status_kib(&status, "VmHWM:") / 1024.0;
    let served = replies
        .iter()
        .filter(|r| r.as_ref().is_ok_and(|r| r.status == 200))
        .count();
    let overloaded = replies
        .iter()
        .filter(|r| {
            r.as_ref()
                .is_ok_and(|r| r.header("x-pinroute-error-code") == Some("overloaded"))
        })
        .count();
    let limit = if limit == 0 {
        "off".to_string()
    } else {
        limit.to_string()
    };
    format!(
        "| {count} | {limit} | {served} | {overloaded} | {:.0} | {hwm:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
        before.rss, peak.allocated, peak.heap, after.rss, after.allocated, after.heap
    )
}

/// The memory figures of `docs/soak.md`: Envoy's memory while bursts of slow-prefill 256 KB
/// completions wait, with and without the in-flight limit, and after them. Run with
/// `cargo test -p pinroute-tests --test e2e inflight::memory_per_request_in_flight -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (about 80 s), not a test"]
async fn memory_per_request_in_flight() {
    let limits: Vec<u64> = std::env::var("PINROUTE_FIGURE_LIMITS")
        .map(|v| v.split(',').map(|l| l.trim().parse().unwrap()).collect())
        .unwrap_or_else(|_| vec![0, pinroute::policy::config::DEFAULT_MAX_REQUESTS_IN_FLIGHT]);
    let mut rows = vec![
        "| requests | limit | 200 | 503 overloaded | RSS before | RSS peak (VmHWM) | allocated peak | heap peak | RSS after | allocated after | heap after |".to_string(),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".to_string(),
    ];
    for count in [64, 256, 1024] {
        for &limit in &limits {
            let row = figure_row(count, limit).await;
            eprintln!("{row}");
            rows.push(row);
        }
    }
    println!(
        "Envoy's memory (MiB), 2 worker threads, 256 KB prompts, 2 prefill workers taking 5 s:\n{}",
        rows.join("\n")
    );
}

/// Envoy's CPU time so far (user + system), in seconds, from `/proc/<pid>/stat`.
fn envoy_cpu_seconds(deployment: &Deployment) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", deployment.envoy.pid())).unwrap();
    let (_, after_name) = stat.rsplit_once(')').unwrap();
    let fields: Vec<u64> = after_name
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|f| f.parse().unwrap())
        .collect();
    (fields[0] + fields[1]) as f64 / 100.0
}

/// What the limit's shared count costs: Envoy's CPU per request for small completions from
/// 64 closed-loop clients, with the limit off and on. Run with
/// `cargo test -p pinroute-tests --test e2e inflight::in_flight_limit_cost -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a test"]
async fn in_flight_limit_cost() {
    const CLIENTS: usize = 64;
    const PER_CLIENT: usize = 100;
    for round in 0..2 {
        for limit in [0, pinroute::policy::config::DEFAULT_MAX_REQUESTS_IN_FLIGHT] {
            let deployment = start(slow_prefill(Duration::ZERO, limit)).await;
            let client = client(Duration::from_secs(30));
            let body = body(1024);
            let (cpu, started) = (envoy_cpu_seconds(&deployment), std::time::Instant::now());
            let mut clients = JoinSet::new();
            for _ in 0..CLIENTS {
                let (client, url, body) = (
                    client.clone(),
                    deployment.url("/v1/completions"),
                    body.clone(),
                );
                clients.spawn(async move {
                    for _ in 0..PER_CLIENT {
                        post(client.clone(), url.clone(), body.clone())
                            .await
                            .unwrap()
                            .assert_ok("served");
                    }
                });
            }
            clients.join_all().await;
            let requests = (CLIENTS * PER_CLIENT) as f64;
            let cpu_us = (envoy_cpu_seconds(&deployment) - cpu) / requests * 1e6;
            let rate = requests / started.elapsed().as_secs_f64();
            println!(
                "round {round}, limit {limit}: {rate:.0} requests/s, Envoy CPU {cpu_us:.0} µs per request"
            );
        }
    }
}

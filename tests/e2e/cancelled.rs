//! Clients that leave during the prefill hop. Envoy keeps the filter's call open until it
//! ends (here: times out) and then answers it for a request the VM has deleted; the patched
//! SDK forgot the call when the request was deleted and must ignore the answer
//! (`src/vendor/proxy-wasm/PATCHES.md`, `docs/soak.md`). The prefill worker here accepts and
//! never answers, each client leaves as soon as its prefill hop reached it; no VM may fail
//! and the VM's memory must stay flat.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pinroute_harness::envoy::vm::{VM_ACTIVE, VM_CREATED, VM_FAILURE_COUNTERS, VM_FAILURE_MARKERS};
use pinroute_harness::sim::SimRole;
use pinroute_harness::stack::StackSpec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::client::{complete, prompt};
use crate::{Deployment, start, vm_failure_stats, wasm, worker};

/// How many clients leave during their prefill hop (the warm-up's tenth included).
const CLIENTS_VAR: &str = "PINROUTE_CANCELLED_CLIENTS";
const DEFAULT_CLIENTS: u64 = 200_000;
const CONCURRENCY: u64 = 128;
/// The prefill worker that never answers, and the one that serves the normal requests.
const HOLDING: u64 = 101;
const SERVING: u64 = 102;
/// Normal requests sent at once after the warm-up and at the end.
const SERVED: usize = 16;
/// Envoy keeps an abandoned call, and its connection, open until it times out, then answers
/// it to the VM: a short timeout keeps the calls open at once (the request rate times this)
/// well below the prefill cluster's circuit breakers (4096 connections), which would
/// otherwise hold new hops back.
const PREFILL_TIMEOUT_MS: u64 = 250;
const PREFILL_TIMEOUTS: &str = "cluster.pinroute_prefill.upstream_rq_timeout";
const PREFILL_CALLS_OPEN: &str = "cluster.pinroute_prefill.upstream_rq_active";
/// A client whose prefill hop did not reach the worker by then counts as lost (and fails
/// the test); Envoy must also end every abandoned call within this time after the load.
const HOP_DEADLINE: Duration = Duration::from_secs(10);
const MEMORY_GAUGE: &str = "wasmcustom.pinroute.vm.memory_bytes";

fn clients() -> u64 {
    std::env::var(CLIENTS_VAR).map_or(DEFAULT_CLIENTS, |value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{CLIENTS_VAR}={value:?} is not a number"))
    })
}

/// A prefill worker that reads its requests and never answers. Each request carries a
/// client's number in its request id; the worker tells that client its hop arrived.
#[derive(Default)]
struct HoldingPrefill {
    accepted: AtomicU64,
    waiting: Mutex<HashMap<u64, oneshot::Sender<()>>>,
}

impl HoldingPrefill {
    async fn serve(self: Arc<Self>, listener: TcpListener) {
        while let Ok((connection, _)) = listener.accept().await {
            tokio::spawn(self.clone().hold(connection));
        }
    }

    /// Reads until Envoy closes the connection, noting every client number that arrives.
    async fn hold(self: Arc<Self>, mut connection: TcpStream) {
        let mut seen = Vec::new();
        let mut chunk = [0u8; 4096];
        while let Ok(read @ 1..) = connection.read(&mut chunk).await {
            seen.extend_from_slice(&chunk[..read]);
            while let Some((client, end)) = client_number(&seen) {
                seen.drain(..end);
                self.accepted.fetch_add(1, Ordering::Relaxed);
                if let Some(arrived) = self.waiting.lock().unwrap().remove(&client) {
                    let _ = arrived.send(());
                }
            }
        }
    }

    fn expect(&self, client: u64) -> oneshot::Receiver<()> {
        let (arrived, wait) = oneshot::channel();
        self.waiting.lock().unwrap().insert(client, arrived);
        wait
    }
}

const MARK: &[u8] = b"client-";

/// The first `client-<n>-` in `bytes`: `n` and where the mark ends.
fn client_number(bytes: &[u8]) -> Option<(u64, usize)> {
    let start = bytes.windows(MARK.len()).position(|w| w == MARK)? + MARK.len();
    let digits = bytes[start..].iter().position(|b| !b.is_ascii_digit())?;
    let end = start + digits;
    (bytes.get(end) == Some(&b'-')).then_some(())?;
    let number = std::str::from_utf8(&bytes[start..end]).ok()?.parse().ok()?;
    Some((number, end + 1))
}

/// The same prompt for every client, so that nothing the filter remembers per prompt grows.
const BODY: &str = r#"{"model": "sim-model", "prompt": "a client that leaves during its prefill", "max_tokens": 5}"#;

/// Sends a completion whose prefill hop is pinned to the holding worker, waits until the
/// hop reached it, and leaves (closes the connection without reading an answer). False if
/// the hop never arrived.
async fn leave_during_prefill(gateway: SocketAddr, prefill: &HoldingPrefill, client: u64) -> bool {
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
         x-dynamo-prefill-instance-id: {HOLDING}\r\nx-request-id: client-{client}-\r\n\
         content-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let arrived = prefill.expect(client);
    let mut connection = TcpStream::connect(gateway).await.unwrap();
    connection.write_all(request.as_bytes()).await.unwrap();
    tokio::time::timeout(HOP_DEADLINE, arrived).await.is_ok()
}

/// Clients `from..to`, `CONCURRENCY` at a time; returns how many hops never arrived.
async fn leave_in_crowds(
    deployment: &Deployment,
    prefill: &Arc<HoldingPrefill>,
    from: u64,
    to: u64,
) -> u64 {
    let gateway = deployment.envoy.listen();
    let next = Arc::new(AtomicU64::new(from));
    let mut crowd = JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (next, prefill) = (next.clone(), prefill.clone());
        crowd.spawn(async move {
            let mut lost = 0;
            loop {
                let client = next.fetch_add(1, Ordering::Relaxed);
                if client >= to {
                    return lost;
                }
                lost += u64::from(!leave_during_prefill(gateway, &prefill, client).await);
            }
        });
    }
    let mut lost = 0;
    while let Some(done) = crowd.join_next().await {
        lost += done.unwrap();
    }
    lost
}

/// Normal requests (their prefill hop on the serving worker), at once, so that each of
/// Envoy's VMs likely serves some; then the memory gauge, which their streams made the VMs
/// report.
async fn served_then_memory(deployment: &Deployment) -> u64 {
    let pin = SERVING.to_string();
    let headers = [("x-dynamo-prefill-instance-id", pin.as_str())];
    let body = prompt();
    let served = (0..SERVED).map(|_| complete(deployment, &headers, &body));
    for reply in futures_util::future::join_all(served).await {
        reply.assert_ok("a normal request among the cancelled ones");
    }
    stat(deployment, MEMORY_GAUGE).await
}

/// Waits until Envoy has ended every abandoned call; returns how many timed out (Envoy then
/// answers them to the VM, for contexts the VM has deleted).
async fn abandoned_calls_ended(deployment: &Deployment) -> u64 {
    let deadline = tokio::time::Instant::now() + HOP_DEADLINE;
    loop {
        let open = stat(deployment, PREFILL_CALLS_OPEN).await;
        if open == 0 {
            return stat(deployment, PREFILL_TIMEOUTS).await;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{open} prefill calls still open"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn stat(deployment: &Deployment, name: &str) -> u64 {
    let value = deployment.envoy.stat(name).await.unwrap();
    value.unwrap_or_else(|| panic!("Envoy has no stat {name}"))
}

/// The holding prefill worker takes the registry entry of a dead one (an address nothing
/// listened on); a serving prefill worker and a decode worker are sim workers. The sims name
/// the model they serve, so every request takes the path that routes by model (its model
/// kept, counted per model) and that path is the one held flat.
async fn deployment_with_holding_prefill() -> (Deployment, Arc<HoldingPrefill>) {
    let mut spec = StackSpec::new(
        vec![
            worker(SERVING, SimRole::Prefill, 1).with_served_models(&["sim-model"]),
            worker(201, SimRole::Decode, 1).with_served_models(&["sim-model"]),
        ],
        wasm(),
    );
    spec.dead = vec![(HOLDING, SimRole::Prefill, 1)];
    spec.settings = serde_json::json!({ "prefill_timeout_ms": PREFILL_TIMEOUT_MS });
    let deployment = start(spec).await;
    let address = deployment.plugin_config["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["id"] == HOLDING)
        .and_then(|entry| entry["address"].as_str())
        .unwrap()
        .to_string();
    let listener = TcpListener::bind(&address).await.unwrap();
    let prefill = Arc::new(HoldingPrefill::default());
    tokio::spawn(prefill.clone().serve(listener));
    (deployment, prefill)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_leaving_during_the_prefill_hop_leave_the_vm_memory_flat() {
    let (deployment, prefill) = deployment_with_holding_prefill().await;
    let clients = clients();
    let warm_up = clients / 10;
    let failures_before = vm_failure_stats(&deployment).await;

    let started = std::time::Instant::now();
    let mut lost = leave_in_crowds(&deployment, &prefill, 0, warm_up).await;
    let warm = served_then_memory(&deployment).await;
    lost += leave_in_crowds(&deployment, &prefill, warm_up, clients).await;
    let timed_out = abandoned_calls_ended(&deployment).await;
    let end = served_then_memory(&deployment).await;
    println!(
        "{clients} clients left during their prefill hop in {:.1} s ({timed_out} of their \
         calls timed out later); VM memory (sum over Envoy's VMs) after {warm_up}: {warm} \
         bytes, after {clients}: {end} bytes",
        started.elapsed().as_secs_f64()
    );
    if lost > 0 {
        eprintln!(
            "{}",
            deployment
                .envoy
                .admin_get("/stats?filter=pinroute")
                .await
                .unwrap()
        );
        eprintln!("{}", deployment.envoy.log_tail());
    }

    assert_eq!(
        vm_failure_stats(&deployment).await,
        failures_before,
        "{VM_FAILURE_COUNTERS:?}, {VM_CREATED}, {VM_ACTIVE}: no VM failed or was replaced"
    );
    let log = std::fs::read_to_string(deployment.envoy.log_path()).unwrap();
    for marker in VM_FAILURE_MARKERS {
        assert!(
            !log.contains(marker),
            "Envoy's log tells of a VM failure ({marker})"
        );
    }
    assert_eq!(
        (lost, prefill.accepted.load(Ordering::Relaxed)),
        (0, clients),
        "every client's prefill hop reached the worker"
    );
    assert!(warm > 0, "the filter reports its VM memory");
    // A leak of even the smallest allocation (8 bytes) per hop would add over 20 wasm pages
    // here. A few pages are the high-water mark of the calls pending at once (each abandoned
    // call waits for its timeout), which a burst in a run's timing can raise after the warm-up
    // (runs of the same build ended 0, 1 and 2 pages over it).
    let hops = clients - warm_up;
    assert!(
        end <= warm + HIGH_WATER_PAGES * WASM_PAGE,
        "the VM memory grew from {warm} to {end} bytes over {hops} cancelled prefill hops"
    );
}

/// What a run's timing may add to the VMs' memory after the warm-up, in pages.
const HIGH_WATER_PAGES: u64 = 4;

/// The unit a wasm VM's memory grows by.
const WASM_PAGE: u64 = 64 * 1024;

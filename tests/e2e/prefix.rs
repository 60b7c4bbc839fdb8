//! Prefix affinity and conditional disaggregation through Envoy (`docs/semantics.md` §4, §5):
//! sim workers with a prefix cache, unpinned chat requests that share long beginnings.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use pinroute::policy::registry::{Role, Worker};
use pinroute::policy::select::session_weight;
use pinroute_harness::sim::{Fault, SimRole};
use pinroute_harness::stack::StackSpec;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::client::Reply;
use crate::{Deployment, start, wasm, worker};

const PREFILL: [u64; 3] = [101, 102, 103];

/// Three prefill and two decode workers with a prefix cache, and these filter settings.
async fn cached_deployment(settings: Value) -> Deployment {
    let cached = |id, role| worker(id, role, 1).with_cache_blocks(10_000);
    let workers = vec![
        cached(101, SimRole::Prefill),
        cached(102, SimRole::Prefill),
        cached(103, SimRole::Prefill),
        cached(201, SimRole::Decode),
        cached(202, SimRole::Decode),
    ];
    let mut spec = StackSpec::new(workers, wasm());
    spec.settings = settings;
    start(spec).await
}

/// A system prompt of about 2 KB, one of many.
fn system_prompt(n: usize) -> String {
    format!("System prompt {n}: ") + &format!("rule {n} of the house, ").repeat(100)
}

/// A chat request: the system prompt, earlier exchanges, and the next question.
fn chat(system: &str, exchanges: &[(String, String)], question: &str) -> Value {
    let mut messages = vec![json!({"role": "system", "content": system})];
    for (asked, answered) in exchanges {
        messages.push(json!({"role": "user", "content": asked}));
        messages.push(json!({"role": "assistant", "content": answered}));
    }
    messages.push(json!({"role": "user", "content": question}));
    json!({"model": "sim-model", "messages": messages, "max_tokens": 3})
}

async fn post_chat(base: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut request = client
        .post(format!("{base}/v1/chat/completions"))
        .json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let reply = Reply::read(request.send().await.expect("the gateway answered")).await;
    reply.assert_ok("a chat request");
    reply
}

/// The workers each system prompt's three questions land on through one gateway.
async fn placements(base: &str, prompts: usize) -> HashMap<usize, Vec<(u64, u64)>> {
    let mut placements = HashMap::new();
    for n in 0..prompts {
        for question in ["why?", "how?", "when?"] {
            let reply = post_chat(base, &[], &chat(&system_prompt(n), &[], question)).await;
            let workers = (
                reply.worker("prefill").unwrap(),
                reply.worker("decode").unwrap(),
            );
            placements.entry(n).or_insert_with(Vec::new).push(workers);
        }
    }
    placements
}

fn prompt_tokens(deployment: &Deployment, ids: &[u64]) -> (u64, u64) {
    ids.iter()
        .map(|id| deployment.worker(*id).unwrap().prompt_tokens())
        .fold((0, 0), |(c, t), (cached, computed)| {
            (c + cached, t + computed)
        })
}

#[tokio::test]
async fn requests_sharing_a_long_beginning_meet_on_one_prefill_worker_on_every_replica() {
    let deployment = cached_deployment(json!({})).await;
    let first = placements(&deployment.url(""), 12).await;
    for (n, workers) in &first {
        let prefill: HashSet<u64> = workers.iter().map(|w| w.0).collect();
        assert_eq!(prefill.len(), 1, "system prompt {n}: {workers:?}");
    }
    let used: HashSet<u64> = first.values().map(|w| w[0].0).collect();
    assert!(used.len() >= 2, "prefixes spread over the pool: {used:?}");
    let (cached, computed) = prompt_tokens(&deployment, &PREFILL);
    assert!(
        cached > computed,
        "the second and third questions reuse the system prompt: {cached} cached, {computed} computed"
    );
    let dir = TempDir::new().unwrap();
    let replica = deployment.start_replica(dir.path()).await.unwrap();
    let second = placements(&replica.url(""), 12).await;
    assert_eq!(first, second, "a replica with no shared state agrees");
    let placed = deployment
        .envoy
        .stat("wasmcustom.pinroute.placement.prefill.affinity")
        .await
        .unwrap();
    assert_eq!(placed, Some(36));
    let prometheus = deployment.envoy.stats_prometheus().await.unwrap();
    assert!(
        prometheus.contains("pinroute_placement_prefill{choice=\"affinity\"} 36"),
        "{prometheus}"
    );
}

/// The first prefill worker a session goes to (rendezvous over the registry's ids).
fn session_prefill(session: &str) -> u64 {
    let worker = |id| Worker {
        id,
        role: Role::Prefill,
        address: "127.0.0.1:1".parse().unwrap(),
        dp_size: 1,
        draining: false,
        models: None,
        unlisted: false,
    };
    PREFILL
        .into_iter()
        .max_by_key(|id| (session_weight(session.as_bytes(), &worker(*id)), *id))
        .unwrap()
}

#[tokio::test]
async fn pins_beat_sessions_and_sessions_beat_prefix_affinity() {
    let deployment = cached_deployment(json!({})).await;
    let base = deployment.url("");
    let body = chat(&system_prompt(7), &[], "which one?");
    let by_prefix = post_chat(&base, &[], &body)
        .await
        .worker("prefill")
        .unwrap();
    let session = (0..)
        .map(|i| format!("session-{i}"))
        .find(|s| session_prefill(s) != by_prefix)
        .unwrap();
    let with_session = [("x-dynamo-session-id", session.as_str())];
    let reply = post_chat(&base, &with_session, &body).await;
    assert_eq!(reply.worker("prefill"), Some(session_prefill(&session)));
    let pinned = PREFILL
        .into_iter()
        .find(|id| *id != by_prefix && *id != session_prefill(&session))
        .unwrap()
        .to_string();
    let with_pin = [
        ("x-dynamo-session-id", session.as_str()),
        ("x-dynamo-prefill-instance-id", pinned.as_str()),
    ];
    let reply = post_chat(&base, &with_pin, &body).await;
    assert_eq!(
        reply.worker("prefill").map(|id| id.to_string()),
        Some(pinned)
    );
}

#[tokio::test]
async fn a_short_prompt_and_the_next_turn_of_a_conversation_skip_the_prefill_hop() {
    let settings = json!({"local_prefill_max_bytes": 256, "local_prefill_suffix_bytes": 1024});
    let deployment = cached_deployment(settings).await;
    let base = deployment.url("");
    let short = json!({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let reply = post_chat(&base, &[], &short).await;
    assert_eq!(
        reply.worker("prefill"),
        None,
        "decode prefilled the short prompt"
    );
    assert!(reply.json()["sim"]["computed_tokens"].as_u64().unwrap() > 0);

    let system = system_prompt(3);
    let first = post_chat(&base, &[], &chat(&system, &[], "first question")).await;
    let prefill = first
        .worker("prefill")
        .expect("the first turn takes both hops");
    let decode = first.worker("decode").unwrap();
    let answer = "tok0 tok1 tok2".to_string();
    let history = [("first question".to_string(), answer)];
    let next = post_chat(&base, &[], &chat(&system, &history, "second question")).await;
    assert_eq!(
        next.worker("prefill"),
        None,
        "the next turn skips the prefill hop"
    );
    assert_eq!(
        next.worker("decode"),
        Some(decode),
        "on the decode worker of the last turn"
    );
    let sim = &next.json()["sim"];
    let (cached, computed) = (
        sim["cached_tokens"].as_u64().unwrap(),
        sim["computed_tokens"].as_u64().unwrap(),
    );
    assert!(
        cached > 10 * computed,
        "the decode worker held all but the suffix: {cached} cached, {computed} computed"
    );
    let envoy = &deployment.envoy;
    let stat = |name: &'static str| async move {
        envoy
            .stat(&format!("wasmcustom.pinroute.prefill.{name}"))
            .await
            .unwrap()
    };
    assert_eq!(stat("local_short_prompt").await, Some(1));
    assert_eq!(stat("local_next_turn").await, Some(1));
    let far = [
        history[0].clone(),
        ("more".to_string(), "words ".repeat(400)),
    ];
    let later = post_chat(&base, &[], &chat(&system, &far, "third question")).await;
    assert_eq!(
        later.worker("prefill"),
        Some(prefill),
        "a long addition takes both hops, back on the conversation's prefill worker"
    );
}

#[tokio::test]
async fn a_busy_prefill_worker_is_passed_over_and_its_prefix_follows_one_spill_worker() {
    // Busy above the pool's mean: one request in flight makes a worker busy.
    let settings = json!({"prefill_timeout_ms": 3000, "affinity_busy_excess": 0, "affinity_busy_percent": 100});
    let deployment = cached_deployment(settings).await;
    let base = deployment.url("");
    let body = chat(&system_prompt(11), &[], "are you there?");
    let home = post_chat(&base, &[], &body)
        .await
        .worker("prefill")
        .unwrap();
    deployment.worker(home).unwrap().set_fault(Fault::Hang);
    let hanging = {
        let (base, body) = (base.clone(), body.clone());
        tokio::spawn(async move { post_chat(&base, &[], &body).await })
    };
    let home_worker = deployment.worker(home).unwrap();
    while home_worker.requests().len() < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let spills: HashSet<u64> = {
        let mut spills = HashSet::new();
        for _ in 0..3 {
            let reply = post_chat(&base, &[], &body).await;
            spills.insert(reply.worker("prefill").unwrap());
        }
        spills
    };
    assert_eq!(spills.len(), 1, "one spill worker: {spills:?}");
    assert!(!spills.contains(&home), "the busy worker was passed over");
    home_worker.set_fault(Fault::None);
    hanging.await.unwrap();
    let spilled = deployment
        .envoy
        .stat("wasmcustom.pinroute.placement.prefill.spilled")
        .await
        .unwrap();
    assert_eq!(spilled, Some(3));
}

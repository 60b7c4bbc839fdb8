//! Load as the engines report it, through Envoy (`docs/semantics.md` §5): the filter scrapes
//! the sims' vLLM gauges, passes over a worker whose engine is full, passes over a worker
//! whose engine holds more than its share for a share of the prompts growing with its load,
//! names a multi-rank worker's less loaded rank, falls back to its own counts when the
//! figures go stale, and takes no harm from a metrics page that is garbage, huge, an error
//! or never comes.

use std::time::{Duration, Instant};

use pinroute_harness::sim::{EngineLoadOverride, MetricsFault, SimRole};
use pinroute_harness::stack::StackSpec;
use serde_json::{Value, json};

use crate::client::{Reply, complete, prompt};
use crate::{Deployment, start, stat, vm_failure_stats, wasm, worker};

/// Prefill 101 and 102, decode 201 with two ranks, every one with a prefix cache, the
/// engines scraped every 100 ms and stale after 1 s, a rank with 8 waiting full.
async fn deployment() -> Deployment {
    let cached = |id, role, dp_size| worker(id, role, dp_size).with_cache_blocks(10_000);
    let workers = vec![
        cached(101, SimRole::Prefill, 1),
        cached(102, SimRole::Prefill, 1),
        cached(201, SimRole::Decode, 2),
    ];
    let mut spec = StackSpec::new(workers, wasm());
    spec.settings = json!({"engine_load": {"period_ms": 100, "timeout_ms": 100, "stale_ms": 1000, "busy_waiting": 8}});
    start(spec).await
}

/// A completion whose long prompt prefix affinity places.
fn chat() -> Value {
    let prompt = "You answer questions about the engines' load. ".repeat(60) + "How busy?";
    json!({"model": "sim-model", "max_tokens": 2, "prompt": prompt})
}

fn full() -> EngineLoadOverride {
    EngineLoadOverride {
        waiting: 20,
        running: 0,
        kv_cache_usage: 0.1,
        rank: None,
    }
}

/// Sends [`chat`] until `done` holds for its reply (within 5 s); the last reply.
async fn until(deployment: &Deployment, what: &str, done: impl Fn(&Reply) -> bool) -> Reply {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let reply = complete(deployment, &[], &chat()).await;
        reply.assert_ok(what);
        if done(&reply) {
            return reply;
        }
        assert!(Instant::now() < deadline, "{what}: not within 5 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// [`until`], then the same for the next requests once every Envoy thread has read the
/// figures on its timer.
async fn settled(deployment: &Deployment, what: &str, done: impl Fn(&Reply) -> bool) -> Reply {
    until(deployment, what, &done).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        let reply = complete(deployment, &[], &chat()).await;
        reply.assert_ok(what);
        assert!(done(&reply), "{what}: on every thread");
    }
    complete(deployment, &[], &chat()).await
}

#[tokio::test]
async fn affinity_passes_over_a_full_engine_until_its_figures_go_stale() {
    let deployment = deployment().await;
    let home = until(&deployment, "placed", |_| true)
        .await
        .worker("prefill")
        .unwrap();
    deployment
        .worker(home)
        .unwrap()
        .set_engine_load(full())
        .unwrap();
    let moved = settled(&deployment, "moved", |r| r.worker("prefill") != Some(home)).await;
    assert!(moved.worker("prefill").is_some());
    assert!(stat(&deployment, "wasmcustom.pinroute.engine.scraped").await > 0);
    assert!(stat(&deployment, "wasmcustom.pinroute.placement.prefill.spilled").await > 0);

    deployment.worker(home).unwrap().clear_engine_load();
    settled(&deployment, "back once its queue is gone", |r| {
        r.worker("prefill") == Some(home)
    })
    .await;

    deployment
        .worker(home)
        .unwrap()
        .set_engine_load(full())
        .unwrap();
    settled(&deployment, "moved again", |r| {
        r.worker("prefill") != Some(home)
    })
    .await;
    deployment
        .worker(home)
        .unwrap()
        .set_metrics_fault(MetricsFault::Status(500));
    let failed_at = Instant::now();
    until(&deployment, "back once its figures are stale", |r| {
        r.worker("prefill") == Some(home)
    })
    .await;
    assert!(
        failed_at.elapsed() >= Duration::from_millis(800),
        "its last figures held until stale: back after {:?}",
        failed_at.elapsed()
    );
    assert!(stat(&deployment, "wasmcustom.pinroute.engine.scrape_failed").await > 0);
    assert_eq!(
        stat(&deployment, "wasmcustom.pinroute.workers.marked_unhealthy").await,
        0
    );
}

#[tokio::test]
async fn an_unpinned_multi_rank_worker_is_sent_to_its_less_loaded_rank() {
    let deployment = deployment().await;
    let decode = deployment.worker(201).unwrap();
    for (loaded, expected) in [(0, 1), (1, 0)] {
        decode.clear_engine_load();
        decode
            .set_engine_load(EngineLoadOverride {
                rank: Some(loaded),
                ..full()
            })
            .unwrap();
        settled(&deployment, "the rank follows the figures", |r| {
            r.number("x-sim-dp-rank") == Some(expected)
        })
        .await;
        for _ in 0..4 {
            let reply = complete(&deployment, &[], &prompt()).await;
            reply.assert_ok("unpinned");
            assert_eq!(
                reply.number("x-sim-dp-rank"),
                Some(expected),
                "rank {loaded} is loaded"
            );
        }
    }
}

#[tokio::test]
async fn no_metrics_page_harms_envoy_or_takes_a_worker_out() {
    let deployment = deployment().await;
    let before = vm_failure_stats(&deployment).await;
    let faults = [
        (101, MetricsFault::Garbage),
        (102, MetricsFault::Huge),
        (201, MetricsFault::Hang),
    ];
    for (id, fault) in faults {
        deployment.worker(id).unwrap().set_metrics_fault(fault);
    }
    // The round in flight when the faults came ends within its timeout.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let scraped = stat(&deployment, "wasmcustom.pinroute.engine.scraped").await;
    let failed_before = stat(&deployment, "wasmcustom.pinroute.engine.scrape_failed").await;
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut served = 0;
    while Instant::now() < deadline {
        complete(&deployment, &[], &chat())
            .await
            .assert_ok("served while scrapes fail");
        served += 1;
    }
    let failed =
        stat(&deployment, "wasmcustom.pinroute.engine.scrape_failed").await - failed_before;
    assert!(
        failed >= 3 * 5,
        "every worker's scrape fails, round after round: {failed}"
    );
    assert_eq!(
        stat(&deployment, "wasmcustom.pinroute.engine.scraped").await,
        scraped
    );
    assert_eq!(
        stat(&deployment, "wasmcustom.pinroute.workers.marked_unhealthy").await,
        0
    );
    assert_eq!(
        vm_failure_stats(&deployment).await,
        before,
        "no VM failed ({served} served)"
    );
    for (id, _) in faults {
        deployment
            .worker(id)
            .unwrap()
            .set_metrics_fault(MetricsFault::None);
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while stat(&deployment, "wasmcustom.pinroute.engine.scraped").await == scraped {
        assert!(Instant::now() < deadline, "scrapes resume");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A long completion prompt of its own for each `salt`: its every block hash differs.
fn salted_chat(salt: usize) -> Value {
    let prompt = format!("Conversation {salt}. ") + &"Tell me about the engines. ".repeat(60);
    json!({"model": "sim-model", "max_tokens": 2, "prompt": prompt})
}

async fn prefill_worker_of(deployment: &Deployment, body: &Value) -> u64 {
    let reply = complete(deployment, &[], body).await;
    reply.assert_ok("placed");
    reply.worker("prefill").unwrap()
}

/// Waits until `rounds` scrape rounds have come since now and every Envoy thread has read
/// them.
async fn fresh_figures(deployment: &Deployment, rounds: u64) {
    let workers = deployment.workers.len() as u64;
    let scraped = stat(deployment, "wasmcustom.pinroute.engine.scraped").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat(deployment, "wasmcustom.pinroute.engine.scraped").await < scraped + rounds * workers
    {
        assert!(Instant::now() < deadline, "{rounds} rounds within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[tokio::test]
async fn affinity_passes_over_a_worker_whose_engine_holds_more_than_its_share_for_a_share_of_prompts()
 {
    let cached = |id, role| worker(id, role, 1).with_cache_blocks(10_000);
    let workers = vec![
        cached(101, SimRole::Prefill),
        cached(102, SimRole::Prefill),
        cached(201, SimRole::Decode),
    ];
    let mut spec = StackSpec::new(workers, wasm());
    // The bound is the pool's mean plus 8: a worker running all of `running` requests is over
    // it by (running/2 - 8), of the (running/2 + 8)/2 that take every prompt past it.
    spec.settings = json!({
        "affinity_busy_percent": 100,
        "engine_load": {"period_ms": 100, "timeout_ms": 100, "stale_ms": 1000},
    });
    let deployment = start(spec).await;
    fresh_figures(&deployment, 2).await;
    let mut prompts = Vec::new();
    for salt in 0..200 {
        let body = salted_chat(salt);
        if prefill_worker_of(&deployment, &body).await == 101 {
            prompts.push(body);
        }
        if prompts.len() == 16 {
            break;
        }
    }
    assert_eq!(prompts.len(), 16, "prompts placed on worker 101");
    let home = deployment.worker(101).unwrap();
    let mut moved_at = Vec::new();
    for running in [14, 24, 400] {
        home.set_engine_load(EngineLoadOverride {
            waiting: 0,
            running,
            kv_cache_usage: 0.1,
            rank: None,
        })
        .unwrap();
        // The share reads each worker's average over its scrapes, the newest weighing a
        // quarter: after 16 rounds it is within 1 % of the new figure.
        fresh_figures(&deployment, 16).await;
        let mut moved = Vec::new();
        for (at, body) in prompts.iter().enumerate() {
            if prefill_worker_of(&deployment, body).await != 101 {
                moved.push(at);
            }
        }
        moved_at.push(moved);
    }
    let [at_14, at_24, at_400] = &moved_at[..] else {
        unreachable!()
    };
    assert!(at_14.is_empty(), "14 running: not over 7 + 8 ({at_14:?})");
    // 24 running: 4 over the bound of 20, busy for 4/10 of the prompts.
    assert!((2..=11).contains(&at_24.len()), "{at_24:?}");
    assert!(at_24.iter().all(|p| at_400.contains(p)), "{at_400:?}");
    assert!(at_400.len() > at_24.len(), "{at_400:?}");
    assert!(stat(&deployment, "wasmcustom.pinroute.placement.prefill.spilled").await > 0);
}

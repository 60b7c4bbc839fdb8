//! Load as the engines report it, through Envoy (`docs/semantics.md` §5): the filter scrapes
//! the sims' vLLM gauges, passes over a worker whose engine is full, names a multi-rank
//! worker's less loaded rank, falls back to its own counts when the figures go stale, and
//! takes no harm from a metrics page that is garbage, huge, an error or never comes.

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

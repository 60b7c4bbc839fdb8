//! The same request path as a native Envoy dynamic module (`libpinroute.so`, built from the
//! same `src/` with `cargo build -p pinroute --profile dynamic-module --features
//! dynamic-module`), through a real Envoy: both hops, and the counters' names. The whole suite
//! runs against the module too, with `PINROUTE_E2E_FILTER=native` (`pinroute-harness test`
//! does).
//!
//! Needs the module (`PINROUTE_NATIVE_MODULE`, else the default target path).

use std::path::PathBuf;

use std::time::Duration;

use pinroute_harness::envoy::cumulative_quantile;
use pinroute_harness::envoy::native::{
    OWN_TIME_ENV, OWN_TIME_REQUEST_HISTOGRAM, OWN_TIME_STATS, default_module_path,
};
use pinroute_harness::sim::SimRole;
use pinroute_harness::stack::StackSpec;

use crate::client::{complete, prompt};
use crate::{Deployment, start, stat, worker};

pub fn native_module() -> PathBuf {
    let path =
        std::env::var_os("PINROUTE_NATIVE_MODULE").map_or_else(default_module_path, PathBuf::from);
    assert!(
        path.exists(),
        "{} is missing: cargo build -p pinroute --profile dynamic-module --features dynamic-module",
        path.display()
    );
    path
}

/// `crate::disaggregated_spec`'s workers (prefill 101, 102; decode 201, 202, 203 draining)
/// behind the native module in place of the wasm filter (no `.wasm` needed).
fn disaggregated_native_spec() -> StackSpec {
    let workers = vec![
        worker(101, SimRole::Prefill, 1),
        worker(102, SimRole::Prefill, 2),
        worker(201, SimRole::Decode, 1),
        worker(202, SimRole::Decode, 2),
        worker(203, SimRole::Decode, 1),
    ];
    let module = native_module();
    let mut spec = StackSpec::new(workers, module.clone());
    spec.native_module = Some(module);
    spec.draining = vec![203];
    spec
}

async fn disaggregated_native() -> Deployment {
    start(disaggregated_native_spec()).await
}

#[tokio::test]
async fn an_unpinned_completion_takes_both_hops_and_decode_loads_the_prefills_kv() {
    let deployment = disaggregated_native().await;
    for _ in 0..3 {
        let reply = complete(&deployment, &[], &prompt()).await;
        reply.assert_ok("the request");
        let prefill = reply.worker("prefill").unwrap();
        let decode = reply.worker("decode").unwrap();
        assert!([101, 102].contains(&prefill), "{prefill}");
        assert!([201, 202].contains(&decode), "{decode}");
        let body = reply.json();
        assert_eq!(body["sim"]["worker_id"], decode);
        assert_eq!(
            body["sim"]["kv_from"], prefill,
            "decode did not load the prefill's KV"
        );
    }
}

#[tokio::test]
async fn the_modules_counters_keep_the_wasm_filters_names() {
    let deployment = disaggregated_native().await;
    complete(&deployment, &[], &prompt())
        .await
        .assert_ok("the request");
    complete(
        &deployment,
        &[("x-dynamo-worker-instance-id", "999")],
        &prompt(),
    )
    .await
    .error(400, "unknown_worker");
    assert_eq!(stat(&deployment, "wasmcustom.pinroute.prefill.ok").await, 1);
    assert_eq!(
        stat(&deployment, "wasmcustom.pinroute.decode.routed").await,
        1
    );
    assert_eq!(
        stat(&deployment, "wasmcustom.pinroute.errors.unknown_worker").await,
        1
    );
}

#[tokio::test]
async fn asked_to_the_module_counts_its_own_time_apart_from_envoys_and_otherwise_nothing() {
    let plain = disaggregated_native().await;
    complete(&plain, &[], &prompt())
        .await
        .assert_ok("the request");
    for name in OWN_TIME_STATS {
        assert_eq!(plain.envoy.stat(name).await.unwrap(), None, "{name}");
    }

    let mut spec = disaggregated_native_spec();
    spec.envoy_env
        .push((OWN_TIME_ENV.to_owned(), "1".to_owned()));
    let timed = start(spec).await;
    let requests = 20;
    for _ in 0..requests {
        complete(&timed, &[], &prompt())
            .await
            .assert_ok("the request");
    }
    let [own, envoy, reads] = OWN_TIME_STATS;
    let (own, envoy, reads) = (
        stat(&timed, own).await,
        stat(&timed, envoy).await,
        stat(&timed, reads).await,
    );
    assert!(own > 0 && envoy > 0, "own {own} ns, Envoy's {envoy} ns");
    assert!(
        reads >= 10 * (requests - 4),
        "two reads for each hook and callback, some of the last requests' not added yet: {reads}"
    );
    // Envoy computes a histogram's quantiles when it flushes its stats (every 5 s).
    let mut median = None;
    for _ in 0..40 {
        let stats = timed.envoy.admin_get("/stats").await.unwrap();
        median = cumulative_quantile(&stats, OWN_TIME_REQUEST_HISTOGRAM, "P50");
        if median.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let median = median.expect("no request's own time recorded");
    assert!(
        median > 0.0 && median < own as f64,
        "a request's own time, {median} ns, is part of all of them, {own} ns"
    );
}

//! The same request path as a native Envoy dynamic module (`libpinroute.so`, built from the
//! same `src/` with `cargo build -p pinroute --profile dynamic-module --features
//! dynamic-module`), through a real Envoy: both hops, and the counters' names. The whole suite
//! runs against the module too, with `PINROUTE_E2E_FILTER=native` (`pinroute-harness test`
//! does).
//!
//! Needs the module (`PINROUTE_NATIVE_MODULE`, else the default target path).

use std::path::PathBuf;

use pinroute_harness::envoy::native::default_module_path;
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

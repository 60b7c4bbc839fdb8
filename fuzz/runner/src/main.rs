//! Builds pinroute's fuzz targets with libFuzzer's coverage instrumentation on stable Rust
//! (the flags `cargo fuzz build --sanitizer none` uses, without installing cargo-fuzz), then
//! runs each target for a bounded time over its seed corpus. Exits non-zero when a target
//! finds a crash or a property violation, and says how to reproduce it.
//!
//! ```text
//! cargo run --manifest-path fuzz/Cargo.toml -p pinroute-fuzz-runner -- [--seconds N] [TARGET...]
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

const TARGETS: [&str; 8] = [
    "config",
    "headers",
    "json_object",
    "metrics_page",
    "nvext",
    "resolve",
    "rewrite",
    "trace",
];
const DEFAULT_SECONDS: u32 = 25;

/// Coverage instrumentation for libFuzzer, as cargo-fuzz 0.13 sets it with `-s none`, plus
/// debug assertions and overflow checks so arithmetic overflow is a finding.
const RUSTFLAGS: &[&str] = &[
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "-Cllvm-args=-sanitizer-coverage-stack-depth",
    "-Cllvm-args=-simplifycfg-branch-fold-threshold=0",
    "--cfg=fuzzing",
    "-Cdebug-assertions",
    "-Coverflow-checks",
    "-Ccodegen-units=1",
];

struct Options {
    seconds: u32,
    targets: Vec<String>,
}

struct Outcome {
    target: String,
    passed: bool,
    runs: String,
    execs_per_sec: String,
    coverage: String,
    log: PathBuf,
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("pinroute-fuzz: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool, String> {
    let options = parse_args(std::env::args().skip(1))?;
    let fuzz_dir = fuzz_dir();
    let triple = host_triple()?;
    let target_dir =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| fuzz_dir.join("target"), PathBuf::from);
    build(&fuzz_dir, &triple, &options.targets)?;
    let bin_dir = target_dir.join(&triple).join("release");
    let mut outcomes = Vec::new();
    for target in &options.targets {
        outcomes.push(fuzz(
            &fuzz_dir,
            &target_dir,
            &bin_dir,
            target,
            options.seconds,
        )?);
    }
    print_summary(&outcomes, &bin_dir);
    Ok(outcomes.iter().all(|o| o.passed))
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut options = Options {
        seconds: DEFAULT_SECONDS,
        targets: Vec::new(),
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                let value = args.next().ok_or("--seconds needs a value")?;
                options.seconds = value
                    .parse()
                    .map_err(|_| format!("--seconds {value}: not a number"))?;
                if options.seconds == 0 {
                    return Err(
                        "--seconds must be at least 1 (libFuzzer reads 0 as no limit)".into(),
                    );
                }
            }
            "-h" | "--help" => {
                return Err(format!(
                    "usage: pinroute-fuzz [--seconds N] [{}]...",
                    TARGETS.join("|")
                ));
            }
            name if TARGETS.contains(&name) => options.targets.push(name.to_string()),
            other => {
                return Err(format!(
                    "unknown target or option {other:?}; targets: {}",
                    TARGETS.join(", ")
                ));
            }
        }
    }
    if options.targets.is_empty() {
        options.targets = TARGETS.iter().map(|t| t.to_string()).collect();
    }
    Ok(options)
}

/// `fuzz/`, the parent of this runner's package.
fn fuzz_dir() -> PathBuf {
    let runner = Path::new(env!("CARGO_MANIFEST_DIR"));
    runner.parent().unwrap_or(runner).to_path_buf()
}

fn host_triple() -> Result<String, String> {
    let output = Command::new("rustc")
        .arg("-vV")
        .output()
        .map_err(|e| format!("rustc -vV: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let host = text.lines().find_map(|line| line.strip_prefix("host: "));
    host.map(str::to_string)
        .ok_or_else(|| "rustc -vV printed no host".to_string())
}

/// Builds the targets for the host triple, so build scripts and proc-macros stay uninstrumented.
fn build(fuzz_dir: &Path, triple: &str, targets: &[String]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut flags = RUSTFLAGS.join(" ");
    if let Ok(extra) = std::env::var("RUSTFLAGS") {
        write!(flags, " {extra}").map_err(|e| e.to_string())?;
    }
    let mut command = Command::new(cargo);
    command
        .args([
            "build",
            "--release",
            "-p",
            "pinroute-fuzz",
            "--target",
            triple,
        ])
        .args(["--config", "profile.release.debug=\"line-tables-only\""])
        .arg("--manifest-path")
        .arg(fuzz_dir.join("Cargo.toml"))
        .env("RUSTFLAGS", flags);
    for target in targets {
        command.args(["--bin", target]);
    }
    let started = Instant::now();
    let status = command.status().map_err(|e| format!("cargo build: {e}"))?;
    eprintln!(
        "pinroute-fuzz: built {} target(s) in {:.0?}",
        targets.len(),
        started.elapsed()
    );
    if status.success() {
        Ok(())
    } else {
        Err(format!("building the fuzz targets failed: {status}"))
    }
}

/// Runs one target for `seconds` over its committed seeds plus a scratch corpus.
fn fuzz(
    fuzz_dir: &Path,
    target_dir: &Path,
    bin_dir: &Path,
    target: &str,
    seconds: u32,
) -> Result<Outcome, String> {
    let corpus = target_dir.join("corpus").join(target);
    let artifacts = fuzz_dir.join("artifacts").join(target);
    let log = target_dir.join("fuzz-logs").join(format!("{target}.log"));
    for dir in [&corpus, &artifacts, &target_dir.join("fuzz-logs")] {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let log_file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut command = Command::new(bin_dir.join(target));
    command
        .arg(format!("-max_total_time={seconds}"))
        .args(["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"])
        .arg(format!("-artifact_prefix={}/", artifacts.display()));
    let dict = fuzz_dir.join("dicts").join(format!("{target}.dict"));
    if dict.exists() {
        command.arg(format!("-dict={}", dict.display()));
    }
    command
        .arg(&corpus)
        .arg(fuzz_dir.join("seeds").join(target));
    eprintln!("pinroute-fuzz: {target} for {seconds} s");
    let status = command
        .stderr(log_file)
        .status()
        .map_err(|e| format!("{target}: {e}"))?;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    Ok(Outcome {
        target: target.to_string(),
        passed: status.success(),
        runs: stat(&text, "stat::number_of_executed_units:"),
        execs_per_sec: stat(&text, "stat::average_exec_per_sec:"),
        coverage: coverage(&text),
        log,
    })
}

fn stat(log: &str, key: &str) -> String {
    let value = log.lines().rev().find_map(|line| line.strip_prefix(key));
    value.map_or_else(|| "-".to_string(), |v| v.trim().to_string())
}

/// The `cov:` of libFuzzer's last status line.
fn coverage(log: &str) -> String {
    let line = log.lines().rev().find(|line| line.contains(" cov: "));
    let value = line
        .and_then(|l| l.split(" cov: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next());
    value.unwrap_or("-").to_string()
}

fn print_summary(outcomes: &[Outcome], bin_dir: &Path) {
    println!(
        "{:<12} {:>10} {:>8} {:>6}  result",
        "target", "runs", "exec/s", "cov"
    );
    for o in outcomes {
        let result = if o.passed { "ok" } else { "FAILED" };
        println!(
            "{:<12} {:>10} {:>8} {:>6}  {result}",
            o.target, o.runs, o.execs_per_sec, o.coverage
        );
    }
    for o in outcomes.iter().filter(|o| !o.passed) {
        let text = std::fs::read_to_string(&o.log).unwrap_or_default();
        println!(
            "\n--- {} failed (full log: {}) ---",
            o.target,
            o.log.display()
        );
        finding(&text).iter().for_each(|line| println!("{line}"));
        println!(
            "reproduce: {} <the test unit above>",
            bin_dir.join(&o.target).display()
        );
    }
    let failed = outcomes.iter().filter(|o| !o.passed).count();
    println!("{} passed, {failed} failed", outcomes.len() - failed);
}

/// The lines of a libFuzzer log that say what was found: the panic message, libFuzzer's
/// error, and where the input was written.
fn finding(log: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut in_panic = false;
    for line in log.lines() {
        if line.contains("panicked at") {
            in_panic = true;
        } else if in_panic && (line.starts_with("stack backtrace") || line.starts_with("note:")) {
            in_panic = false;
        }
        let notable = ["ERROR: libFuzzer", "Test unit written to", "Base64:"]
            .iter()
            .any(|k| line.contains(k));
        if in_panic || notable {
            lines.push(line);
        }
    }
    lines
}

//! The filter's work per request counted in instructions rather than timed: the same figure
//! on any machine, unmoved by preemption or by what else the CPU's caches hold. It tells
//! whether the filter's own work grows with the registry, which end-to-end CPU, where
//! Envoy's thousands of hosts weigh, cannot (`registry_axis`). The `.wasm` is counted by
//! wasmtime's fuel in the ABI tests' host (wasm instructions); the native module by callgrind
//! (valgrind) around a real Envoy: x86 instructions in the module and in what it calls (the
//! allocator, `memcpy`), apart from Envoy's, its work inside the module's callbacks included.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use super::gateways::{GatewayInputs, Scenario, registry, start_native};
use super::sims::Workers;
use super::table::{Style, grid};
use super::workload::{Bodies, Completion, Route};
use crate::load::{LoadSpec, Stop, run_load};
use pinroute_tests::{Host, HostOptions, streamed};

/// What one build's filter executed per request with `workers` of each role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CountedWork {
    pub workers: u64,
    /// [`Scenario::Pinroute`] or [`Scenario::PinrouteNative`].
    pub build: Scenario,
    /// Instructions per request in the filter's own code.
    pub filter: f64,
    /// The rest of Envoy's process per request (the native module only).
    pub envoy: Option<f64>,
}

/// Requests counted per registry size, after the warm-up; every one is unpinned, so each
/// makes the choice among the workers.
const REQUESTS: u64 = 100;
/// Requests the native module's Envoy serves before the count: its one worker thread has
/// configured its module, read the registry and opened its pools by then (work done once
/// per thread, not per request).
const NATIVE_WARM_UP: u64 = 16;
/// Tokens streamed back, as in the `.wasm`'s count (`streamed::CHUNKS`, `[DONE]` the last).
const TOKENS: u32 = streamed::CHUNKS as u32 - 1;
/// Envoy under callgrind starts about fifty times slower.
const CALLGRIND_READY: Duration = Duration::from_secs(600);

/// The `.wasm`'s instructions per request with `workers` as its registry: a 1 KB unpinned
/// streamed completion through the ABI tests' host, configured as the bench's Envoy is.
pub fn count_wasm(wasm: &Path, workers: &Workers, count: u64) -> Result<CountedWork> {
    let options = HostOptions {
        allow_on_headers_stop_iteration: true,
        ..HostOptions::default()
    };
    let mut host = Host::with_options(wasm, &registry(workers).to_string(), options)?;
    let per_request =
        streamed::instructions_per_request(&mut host, super::registry_axis::SIZE, REQUESTS)?;
    Ok(CountedWork {
        workers: count,
        build: Scenario::Pinroute,
        filter: per_request as f64,
        envoy: None,
    })
}

/// valgrind, when installed: the native module's count needs it.
pub fn valgrind() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("valgrind"))
        .find(|candidate| candidate.is_file())
}

/// The native module's instructions per request with `inputs.workers` as its registry:
/// Envoy with one worker thread under callgrind serves [`NATIVE_WARM_UP`] unpinned 1 KB
/// completions, then [`REQUESTS`] more one at a time between a reset of callgrind's counts
/// and a dump of them. Envoy's timers firing meanwhile are counted as Envoy's.
pub async fn count_native(
    valgrind: &Path,
    inputs: &GatewayInputs<'_>,
    count: u64,
    request_timeout: Duration,
) -> Result<CountedWork> {
    let module = inputs
        .native_module
        .context("the native module was not built")?;
    let dir = inputs.work_dir.join("pinroute-native-counted");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dump = dir.join("callgrind.out");
    let dumped = dir.join("callgrind.out.1");
    // A dump left by an earlier count must not pass for this one's.
    for file in [&dump, &dumped] {
        match std::fs::remove_file(file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", file.display()));
            }
            _ => {}
        }
    }
    // One worker thread: the warm-up's thread is the count's (under callgrind, whose threads
    // take turns, one thread may accept every connection of a run).
    let mut options = inputs.envoy_options(Vec::new());
    options.concurrency = 1;
    options.wrapper = vec![
        valgrind.display().to_string(),
        "--tool=callgrind".into(),
        format!("--callgrind-out-file={}", dump.display()),
        "--quiet".into(),
    ];
    options.ready_timeout = CALLGRIND_READY;
    let envoy = start_native(inputs, &dir, options).await?;
    let sims = inputs.workers.first();
    let route = Route::of(
        Scenario::PinrouteNative,
        sims.prefill,
        sims.decode,
        Some(envoy.listen()),
    )?;
    let workload = Arc::new(Completion {
        route: route.unpinned(),
        bodies: Bodies::new(super::registry_axis::SIZE, TOKENS),
        tls: None,
        named: None,
    });
    let spec = |requests| LoadSpec {
        concurrency: 1,
        stop: Stop::Requests(requests),
        warmup: Duration::ZERO,
        request_timeout,
    };
    let pid = envoy.pid().to_string();
    check_sent(run_load(workload.clone(), &spec(NATIVE_WARM_UP)).await)?;
    callgrind_control(valgrind, "--zero", &pid)?;
    check_sent(run_load(workload.clone(), &spec(REQUESTS)).await)?;
    callgrind_control(valgrind, "--dump", &pid)?;
    let text = std::fs::read_to_string(&dumped)
        .with_context(|| format!("reading callgrind's dump {}", dumped.display()))?;
    drop(envoy);
    let counts = ObjectCounts::of(&text, &module.display().to_string())?;
    let per_request = |instructions: u64| instructions as f64 / REQUESTS as f64;
    Ok(CountedWork {
        workers: count,
        build: Scenario::PinrouteNative,
        filter: per_request(counts.module),
        envoy: Some(per_request(counts.total - counts.module)),
    })
}

fn check_sent(report: crate::load::LoadReport) -> Result<()> {
    ensure!(
        report.outcomes.unexpected == 0,
        "requests to the counted module failed: {}",
        report.problems.join("; ")
    );
    Ok(())
}

/// `callgrind_control <action> <pid>`, installed beside valgrind; it returns once done.
fn callgrind_control(valgrind: &Path, action: &str, pid: &str) -> Result<()> {
    let control = valgrind.with_file_name("callgrind_control");
    let output = Command::new(&control)
        .args([action, pid])
        .output()
        .with_context(|| format!("running {}", control.display()))?;
    if !output.status.success() {
        bail!(
            "{} {action} {pid}: {}",
            control.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// A callgrind dump's instructions (`Ir`): the whole process's, and one shared object's: its
/// own, and those of the functions it calls outside itself (the allocator, `memcpy`), but
/// not of Envoy's callbacks (`envoy_dynamic_module_callback_*`), which are Envoy's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ObjectCounts {
    module: u64,
    total: u64,
}

/// The prefix of the functions Envoy offers a dynamic module.
const ENVOY_CALLBACK: &str = "envoy_dynamic_module_callback_";

impl ObjectCounts {
    /// Reads callgrind's format (one event): `ob=`/`fn=` name the object and function of the
    /// cost lines, `cob=`/`cfn=` those of the next call, and `(n) name` defines a short name
    /// `(n)` for later lines; the cost line after `calls=` is the call's inclusive cost, any
    /// other the function's own.
    fn of(dump: &str, module: &str) -> Result<ObjectCounts> {
        let (mut objects, mut functions) = (Names::default(), Names::default());
        let mut object = String::new();
        let (mut callee_object, mut callee) = (None::<String>, String::new());
        let mut call_cost_next = false;
        let mut counts = ObjectCounts {
            module: 0,
            total: 0,
        };
        for line in dump.lines() {
            if let Some(spec) = line.strip_prefix("ob=") {
                object = objects.resolve(spec);
            } else if let Some(spec) = line.strip_prefix("cob=") {
                callee_object = Some(objects.resolve(spec));
            } else if let Some(spec) = line.strip_prefix("fn=") {
                functions.resolve(spec);
            } else if let Some(spec) = line.strip_prefix("cfn=") {
                callee = functions.resolve(spec);
            } else if line.starts_with("calls=") {
                call_cost_next = true;
            } else if let Some(cost) = cost_of(line) {
                let cost = cost.with_context(|| format!("callgrind's line {line:?}"))?;
                let in_module = object == module;
                if std::mem::take(&mut call_cost_next) {
                    let target = callee_object.take().unwrap_or_else(|| object.clone());
                    let outside = target != module && !callee.starts_with(ENVOY_CALLBACK);
                    if in_module && outside {
                        counts.module += cost;
                    }
                } else {
                    counts.total += cost;
                    if in_module {
                        counts.module += cost;
                    }
                }
            }
        }
        ensure!(counts.total > 0, "callgrind's dump counted no instruction");
        Ok(counts)
    }
}

/// Callgrind's compressed names: `(n) name` defines `(n)`, `(n)` alone refers to it.
#[derive(Default)]
struct Names(std::collections::HashMap<String, String>);

impl Names {
    fn resolve(&mut self, spec: &str) -> String {
        let Some((id, rest)) = spec.strip_prefix('(').and_then(|rest| rest.split_once(')')) else {
            return spec.trim().to_owned();
        };
        let name = rest.trim();
        if !name.is_empty() {
            self.0.insert(id.to_owned(), name.to_owned());
        }
        self.0.get(id).cloned().unwrap_or_default()
    }
}

/// The cost of a cost line (`<position> <Ir>`, the position absolute, `+n`, `-n` or `*`).
fn cost_of(line: &str) -> Option<Result<u64, std::num::ParseIntError>> {
    let first = line.chars().next()?;
    if !(first.is_ascii_digit() || matches!(first, '+' | '-' | '*')) {
        return None;
    }
    let mut fields = line.split_ascii_whitespace();
    fields.next();
    Some(fields.next().unwrap_or("0").parse())
}

/// One row per registry size and build.
pub fn render(counted: &[CountedWork], style: Style) -> String {
    let header = [
        "workers",
        "build",
        "filter's instructions/req",
        "counted by",
        "Envoy's other instructions/req",
    ]
    .map(String::from);
    let rows: Vec<Vec<String>> = counted
        .iter()
        .map(|c| {
            vec![
                format!("{0}+{0}", c.workers),
                c.build.to_string(),
                format!("{:.0}", c.filter),
                counter(c.build).to_owned(),
                c.envoy.map_or_else(|| "-".into(), |e| format!("{e:.0}")),
            ]
        })
        .collect();
    grid(&header, &rows, style)
}

fn counter(build: Scenario) -> &'static str {
    match build {
        Scenario::PinrouteNative => "callgrind (x86)",
        _ => "wasmtime fuel (wasm)",
    }
}

/// The count of `build` with `workers` of each role.
pub fn find(counted: &[CountedWork], build: Scenario, workers: u64) -> Option<&CountedWork> {
    counted
        .iter()
        .find(|c| c.build == build && c.workers == workers)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    /// Envoy's binary calls the module (`ob=(2)`), which calls libc (`cob=(3)`), Envoy back
    /// (`cob=(1)`), the allocator in Envoy's binary and itself.
    const DUMP: &str = "version: 1
creator: callgrind-3.19.0
events: Ir
summary: 1000

ob=(1) /venv/envoy/_bin/envoy
fl=(1) ???
fn=(1) main
0 500
cob=(2) /repo/target/dynamic-module/libpinroute.so
cfn=(2) on_request
calls=2 0
0 260

ob=(2)
fn=(2)
0 100
cob=(3) /usr/lib/libc.so.6
cfn=(3) malloc
calls=4 0
0 40
cob=(1)
cfn=(4) envoy_dynamic_module_callback_get_header
calls=3 0
0 120
+2 20
cob=(1)
cfn=(5) malloc
calls=1 0
0 30
cfn=(2)
calls=1 0
* 7

ob=(3)
fn=(3)
0 40
ob=(1)
fn=(4)
0 120
fn=(5)
0 30
";

    #[test]
    fn the_module_counts_its_own_instructions_and_what_it_calls_but_envoys_callbacks() {
        let counts = ObjectCounts::of(DUMP, "/repo/target/dynamic-module/libpinroute.so").unwrap();
        assert_eq!(
            counts,
            ObjectCounts {
                module: 100 + 40 + 20 + 30,
                total: 500 + 100 + 20 + 40 + 120 + 30,
            },
            "the callback's 120 is Envoy's; malloc's 30 is the module's though in Envoy's binary; a call within the module is counted where it lands"
        );
    }

    #[test]
    fn a_dump_with_nothing_counted_is_an_error() {
        assert!(ObjectCounts::of("events: Ir\n", "/m.so").is_err());
    }
}

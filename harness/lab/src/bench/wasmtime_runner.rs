//! Runs a `wasm32-wasip1` command module (the policy micro-benchmark) under wasmtime's WASI
//! preview 1, as `tests/wasi-run` does but with optimised code, and returns what it printed.

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use wasmtime::{Config, Engine, Linker, Module, OptLevel, Store};
use wasmtime_wasi::p1::{self, WasiP1Ctx};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{I32Exit, WasiCtxBuilder};

/// Far more than the benchmark's lines of JSON; a write past it traps.
const STDOUT_BYTES: usize = 16 << 20;

/// Runs `module_path` with `args` (after the program name) and returns its stdout; its
/// stderr is this process's.
pub fn run_command(module_path: &Path, args: &[String]) -> Result<String> {
    // wasmtime-wasi's synchronous calls block on the thread's Tokio runtime, if it has one:
    // on the thread driving `bench`'s, Tokio panics.
    std::thread::scope(|scope| scope.spawn(|| run(module_path, args)).join())
        .map_err(|_| anyhow!("running {} panicked", module_path.display()))?
}

fn run(module_path: &Path, args: &[String]) -> Result<String> {
    let engine = Engine::new(Config::new().cranelift_opt_level(OptLevel::Speed))?;
    let module = Module::from_file(&engine, module_path)?;
    let mut linker: Linker<WasiP1Ctx> = Linker::new(&engine);
    p1::add_to_linker_sync(&mut linker, |wasi| wasi)?;
    linker.define_unknown_imports_as_traps(&module)?;
    let stdout = MemoryOutputPipe::new(STDOUT_BYTES);
    let argv: Vec<&str> = std::iter::once("policy.wasm")
        .chain(args.iter().map(String::as_str))
        .collect();
    let wasi = WasiCtxBuilder::new()
        .stdout(stdout.clone())
        .inherit_stderr()
        .args(&argv)
        .build_p1();
    let mut store = Store::new(&engine, wasi);
    let instance = linker.instantiate(&mut store, &module)?;
    let start = instance.get_typed_func::<(), ()>(&mut store, "_start")?;
    if let Err(error) = start.call(&mut store, ()) {
        match error.downcast_ref::<I32Exit>() {
            Some(I32Exit(0)) => {}
            Some(I32Exit(code)) => bail!("{} exited with {code}", module_path.display()),
            None => {
                let error = anyhow::Error::from(error);
                return Err(error.context(format!("running {}", module_path.display())));
            }
        }
    }
    String::from_utf8(stdout.contents().to_vec()).context("the benchmark printed non-UTF-8")
}

//! Runs a `wasm32-wasip1` test binary under wasmtime's WASI preview 1: cargo's runner for
//! that target (`CARGO_TARGET_WASM32_WASIP1_RUNNER`), used for the policy core's tests.
//! The module gets the arguments after its path (libtest's filters and flags), this
//! process's environment, stdout and stderr, and no host directory. Its exit code is this
//! process's. Imports other than WASI (proxy-wasm host calls linked in but never called by
//! the core's tests) trap with their name if a test ever reaches one.

use anyhow::{Context, Result, anyhow};
use wasmtime::{Config, Engine, Linker, Module, OptLevel, Store};
use wasmtime_wasi::p1::{self, WasiP1Ctx};
use wasmtime_wasi::{I32Exit, WasiCtxBuilder};

fn main() -> Result<()> {
    let args = module_and_args()?;
    let module_path = args
        .first()
        .context("usage: pinroute-wasi-run MODULE.wasm [ARGS...]")?;
    // The tests run in a fraction of a second; compiling a debug test binary is what costs.
    let engine = Engine::new(Config::new().cranelift_opt_level(OptLevel::None))?;
    let module = Module::from_file(&engine, module_path)?;
    let mut linker: Linker<WasiP1Ctx> = Linker::new(&engine);
    p1::add_to_linker_sync(&mut linker, |wasi| wasi)?;
    linker.define_unknown_imports_as_traps(&module)?;
    let wasi = WasiCtxBuilder::new()
        .inherit_stdout()
        .inherit_stderr()
        .inherit_env()
        .args(&args)
        .build_p1();
    let mut store = Store::new(&engine, wasi);
    let instance = linker.instantiate(&mut store, &module)?;
    // The filter's `_initialize` (proxy-wasm's entry point) is exported too; a command
    // module runs from `_start` alone.
    let start = instance.get_typed_func::<(), ()>(&mut store, "_start")?;
    match start.call(&mut store, ()) {
        Ok(()) => Ok(()),
        Err(error) => match error.downcast_ref::<I32Exit>() {
            Some(&I32Exit(code)) => std::process::exit(code),
            None => Err(error.into()),
        },
    }
}

/// The module's path then its arguments, as the module sees them (`argv[0]` is its path).
fn module_and_args() -> Result<Vec<String>> {
    std::env::args_os()
        .skip(1)
        .map(|arg| {
            arg.into_string()
                .map_err(|arg| anyhow!("argument {arg:?} is not UTF-8"))
        })
        .collect()
}

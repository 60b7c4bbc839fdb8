//! Runs a `wasm32-wasip1` command module (the policy micro-benchmark) under wasmtime with
//! optimised code, and returns what it printed. Only the WASI calls a Rust program with
//! arguments, a clock and stdout needs are provided; any other import traps if called.

use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use wasmtime::{Caller, Engine, Extern, Linker, Memory, Module, Store};

const WASI: &str = "wasi_snapshot_preview1";
const ERRNO_SUCCESS: u32 = 0;
const ERRNO_BADF: u32 = 8;
const ERRNO_FAULT: u32 = 21;
const ERRNO_INVAL: u32 = 28;
const CLOCK_REALTIME: u32 = 0;

/// What the guest sees and what it produced.
struct Wasi {
    args: Vec<Vec<u8>>,
    started: Instant,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit_code: Option<u32>,
    random_state: u64,
}

type C<'a> = Caller<'a, Wasi>;

/// Runs `module_path` with `args` (after the program name) and returns its stdout.
pub fn run_command(module_path: &Path, args: &[String]) -> Result<String> {
    let engine = Engine::default();
    let bytes =
        std::fs::read(module_path).with_context(|| format!("reading {}", module_path.display()))?;
    let module = Module::new(&engine, &bytes)
        .map_err(anyhow::Error::from)
        .with_context(|| format!("compiling {}", module_path.display()))?;
    let mut argv = vec![b"policy.wasm".to_vec()];
    argv.extend(args.iter().map(|a| a.as_bytes().to_vec()));
    let state = Wasi {
        args: argv,
        started: Instant::now(),
        stdout: Vec::new(),
        stderr: Vec::new(),
        exit_code: None,
        random_state: 0x9e37_79b9_7f4a_7c15,
    };
    let mut store = Store::new(&engine, state);
    let mut linker: Linker<Wasi> = Linker::new(&engine);
    add_wasi(&mut linker).map_err(anyhow::Error::from)?;
    linker
        .define_unknown_imports_as_traps(&module)
        .map_err(anyhow::Error::from)?;
    let instance = linker
        .instantiate(&mut store, &module)
        .map_err(anyhow::Error::from)?;
    let start = instance
        .get_typed_func::<(), ()>(&mut store, "_start")
        .map_err(anyhow::Error::from)
        .context("the module has no `_start`: not a WASI command")?;
    let outcome = start.call(&mut store, ());
    let state = store.data();
    let stderr = String::from_utf8_lossy(&state.stderr).into_owned();
    match (outcome, state.exit_code) {
        (Ok(()), None | Some(0)) | (Err(_), Some(0)) => {}
        (_, Some(code)) => bail!("{} exited with {code}: {stderr}", module_path.display()),
        (Err(trap), None) => {
            return Err(anyhow!("{trap:?}"))
                .context(format!("running {}: {stderr}", module_path.display()));
        }
    }
    String::from_utf8(state.stdout.clone()).context("the benchmark printed non-UTF-8")
}

fn add_wasi(linker: &mut Linker<Wasi>) -> wasmtime::Result<()> {
    linker.func_wrap(
        WASI,
        "args_sizes_get",
        |mut c: C<'_>, count: u32, size: u32| {
            let (n, bytes) = list_sizes(&c.data().args);
            Ok(errno(
                write_u32(&mut c, count, n).and_then(|()| write_u32(&mut c, size, bytes)),
            ))
        },
    )?;
    linker.func_wrap(WASI, "args_get", |mut c: C<'_>, argv: u32, buf: u32| {
        let args = c.data().args.clone();
        Ok(errno(write_list(&mut c, &args, argv, buf)))
    })?;
    linker.func_wrap(
        WASI,
        "environ_sizes_get",
        |mut c: C<'_>, count: u32, size: u32| {
            Ok(errno(
                write_u32(&mut c, count, 0).and_then(|()| write_u32(&mut c, size, 0)),
            ))
        },
    )?;
    linker.func_wrap(WASI, "environ_get", |_: C<'_>, _: u32, _: u32| {
        Ok(ERRNO_SUCCESS)
    })?;
    linker.func_wrap(
        WASI,
        "clock_time_get",
        |mut c: C<'_>, clock: u32, _precision: u64, out: u32| {
            let nanos = clock_nanos(c.data(), clock);
            Ok(errno(write_bytes(&mut c, out, &nanos.to_le_bytes())))
        },
    )?;
    linker.func_wrap(WASI, "random_get", |mut c: C<'_>, buf: u32, len: u32| {
        let bytes = pseudo_random(c.data_mut(), len as usize);
        Ok(errno(write_bytes(&mut c, buf, &bytes)))
    })?;
    linker.func_wrap(
        WASI,
        "fd_write",
        |mut c: C<'_>, fd: u32, iovs: u32, iovs_len: u32, written: u32| {
            Ok(match fd {
                1 | 2 => errno(fd_write(&mut c, fd, iovs, iovs_len, written)),
                _ => ERRNO_BADF,
            })
        },
    )?;
    linker.func_wrap(
        WASI,
        "proc_exit",
        |mut c: C<'_>, code: u32| -> wasmtime::Result<()> {
            c.data_mut().exit_code = Some(code);
            Err(wasmtime::Error::msg(format!("proc_exit({code})")))
        },
    )?;
    Ok(())
}

fn errno(result: Result<(), u32>) -> u32 {
    result.err().unwrap_or(ERRNO_SUCCESS)
}

fn clock_nanos(state: &Wasi, clock: u32) -> u64 {
    if clock == CLOCK_REALTIME {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        return u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX);
    }
    u64::try_from(state.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// xorshift64*: HashMap seeds need bytes, not cryptographic quality.
fn pseudo_random(state: &mut Wasi, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        let mut x = state.random_state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.random_state = x;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn list_sizes(items: &[Vec<u8>]) -> (u32, u32) {
    let bytes: usize = items.iter().map(|item| item.len() + 1).sum();
    (
        u32::try_from(items.len()).unwrap_or(u32::MAX),
        u32::try_from(bytes).unwrap_or(u32::MAX),
    )
}

/// Writes NUL-terminated `items` at `buf` and their addresses at `pointers`.
fn write_list(c: &mut C<'_>, items: &[Vec<u8>], pointers: u32, buf: u32) -> Result<(), u32> {
    let mut at = buf;
    for (index, item) in items.iter().enumerate() {
        let slot = pointers
            .checked_add(u32::try_from(index * 4).map_err(|_| ERRNO_INVAL)?)
            .ok_or(ERRNO_FAULT)?;
        write_u32(c, slot, at)?;
        let mut terminated = item.clone();
        terminated.push(0);
        write_bytes(c, at, &terminated)?;
        at = at
            .checked_add(u32::try_from(terminated.len()).map_err(|_| ERRNO_INVAL)?)
            .ok_or(ERRNO_FAULT)?;
    }
    Ok(())
}

fn fd_write(c: &mut C<'_>, fd: u32, iovs: u32, iovs_len: u32, written: u32) -> Result<(), u32> {
    let table = read_bytes(c, iovs, iovs_len.checked_mul(8).ok_or(ERRNO_INVAL)?)?;
    let mut out = Vec::new();
    for iov in table.chunks_exact(8) {
        let (ptr, len) = iov.split_at(4);
        let ptr = u32::from_le_bytes(ptr.try_into().map_err(|_| ERRNO_INVAL)?);
        let len = u32::from_le_bytes(len.try_into().map_err(|_| ERRNO_INVAL)?);
        out.extend(read_bytes(c, ptr, len)?);
    }
    let count = u32::try_from(out.len()).unwrap_or(u32::MAX);
    let state = c.data_mut();
    match fd {
        1 => state.stdout.extend_from_slice(&out),
        _ => state.stderr.extend_from_slice(&out),
    }
    write_u32(c, written, count)
}

fn memory(c: &mut C<'_>) -> Result<Memory, u32> {
    match c.get_export("memory") {
        Some(Extern::Memory(memory)) => Ok(memory),
        _ => Err(ERRNO_FAULT),
    }
}

fn read_bytes(c: &mut C<'_>, ptr: u32, len: u32) -> Result<Vec<u8>, u32> {
    let memory = memory(c)?;
    let mut buf = vec![0u8; len as usize];
    memory
        .read(&*c, ptr as usize, &mut buf)
        .map_err(|_| ERRNO_FAULT)?;
    Ok(buf)
}

fn write_bytes(c: &mut C<'_>, ptr: u32, bytes: &[u8]) -> Result<(), u32> {
    let memory = memory(c)?;
    memory
        .write(&mut *c, ptr as usize, bytes)
        .map_err(|_| ERRNO_FAULT)
}

fn write_u32(c: &mut C<'_>, ptr: u32, value: u32) -> Result<(), u32> {
    write_bytes(c, ptr, &value.to_le_bytes())
}

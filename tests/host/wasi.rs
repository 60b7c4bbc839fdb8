//! The few `wasi_snapshot_preview1` functions a Rust `wasm32-wasip1` filter imports, answered
//! as Envoy's proxy-wasm host does: stdout/stderr go to the log (info/error), no environment,
//! no arguments, the host clock, `proc_exit` ends the VM. Other WASI imports are linked as
//! traps naming themselves, like any unknown import.

use wasmtime::{Caller, Linker};

use crate::memory::{HostError, HostResult, read_bytes, write_bytes, write_u32, write_u64};
use crate::state::HostState;
use crate::types::LogLevel;

type C<'a> = Caller<'a, HostState>;

const ERRNO_SUCCESS: u32 = 0;
const ERRNO_BADF: u32 = 8;
const ERRNO_FAULT: u32 = 21;

/// Turns an outcome into a WASI errno (memory errors are `EFAULT`), keeping traps.
fn errno(result: HostResult<()>) -> wasmtime::Result<u32> {
    match result {
        Ok(()) => Ok(ERRNO_SUCCESS),
        Err(HostError::Status(_)) => Ok(ERRNO_FAULT),
        Err(HostError::Trap(e)) => Err(e),
    }
}

const MODULE: &str = "wasi_snapshot_preview1";

pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        MODULE,
        "fd_write",
        |mut c: C<'_>, fd: u32, iovs: u32, iovs_len: u32, nwritten: u32| {
            if fd != 1 && fd != 2 {
                return Ok(ERRNO_BADF);
            }
            errno(fd_write(&mut c, fd, iovs, iovs_len, nwritten))
        },
    )?;
    linker.func_wrap(
        MODULE,
        "environ_sizes_get",
        |mut c: C<'_>, count: u32, size: u32| {
            errno(write_u32(&mut c, count, 0).and_then(|()| write_u32(&mut c, size, 0)))
        },
    )?;
    linker.func_wrap(
        MODULE,
        "environ_get",
        |_: C<'_>, _environ: u32, _buf: u32| Ok(ERRNO_SUCCESS),
    )?;
    linker.func_wrap(
        MODULE,
        "args_sizes_get",
        |mut c: C<'_>, count: u32, size: u32| {
            errno(write_u32(&mut c, count, 0).and_then(|()| write_u32(&mut c, size, 0)))
        },
    )?;
    linker.func_wrap(MODULE, "args_get", |_: C<'_>, _argv: u32, _buf: u32| {
        Ok(ERRNO_SUCCESS)
    })?;
    linker.func_wrap(
        MODULE,
        "clock_time_get",
        |mut c: C<'_>, _clock: u32, _precision: u64, ret: u32| {
            let now = c.data().now_nanos();
            errno(write_u64(&mut c, ret, now))
        },
    )?;
    linker.func_wrap(MODULE, "random_get", |mut c: C<'_>, buf: u32, len: u32| {
        let bytes = c.data_mut().random_bytes(len as usize);
        errno(write_bytes(&mut c, buf, &bytes))
    })?;
    linker.func_wrap(MODULE, "sched_yield", |_: C<'_>| Ok(ERRNO_SUCCESS))?;
    linker.func_wrap(
        MODULE,
        "proc_exit",
        |_: C<'_>, code: u32| -> wasmtime::Result<()> {
            Err(wasmtime::Error::msg(format!(
                "the filter called proc_exit({code}): the VM is gone"
            )))
        },
    )?;
    Ok(())
}

fn fd_write(c: &mut C<'_>, fd: u32, iovs: u32, iovs_len: u32, nwritten: u32) -> HostResult<()> {
    let table = read_bytes(c, iovs, iovs_len.saturating_mul(8))?;
    let mut out = Vec::new();
    for iov in table.chunks_exact(8) {
        let mut ptr = [0u8; 4];
        let mut len = [0u8; 4];
        ptr.copy_from_slice(iov.get(..4).unwrap_or(&[0; 4]));
        len.copy_from_slice(iov.get(4..).unwrap_or(&[0; 4]));
        out.extend(read_bytes(
            c,
            u32::from_le_bytes(ptr),
            u32::from_le_bytes(len),
        )?);
    }
    let written = u32::try_from(out.len()).unwrap_or(u32::MAX);
    let state = c.data_mut();
    let text = String::from_utf8_lossy(&out)
        .trim_end_matches('\n')
        .to_string();
    let (buffer, level) = if fd == 1 {
        (&mut state.stdout, LogLevel::Info)
    } else {
        (&mut state.stderr, LogLevel::Error)
    };
    buffer.extend_from_slice(&out);
    if !text.is_empty() {
        state.log(level, text);
    }
    write_u32(c, nwritten, written)
}

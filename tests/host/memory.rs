//! Guest memory access for host functions: reading arguments, writing results, and handing
//! buffers to the guest the way Envoy does (allocated with the module's `malloc` or
//! `proxy_on_memory_allocate`, ownership passes to the guest).

use wasmtime::{Caller, Memory};

use crate::state::HostState;
use crate::types::Status;

/// Why a host function did not succeed: either a status to return to the guest, or a trap
/// that aborts the guest call.
pub(crate) enum HostError {
    Status(Status),
    Trap(wasmtime::Error),
}

impl From<Status> for HostError {
    fn from(status: Status) -> HostError {
        HostError::Status(status)
    }
}

pub(crate) type HostResult<T> = Result<T, HostError>;

/// Turns a host function's outcome into the ABI's return value (or a trap).
pub(crate) fn finish(result: HostResult<()>) -> wasmtime::Result<u32> {
    match result {
        Ok(()) => Ok(Status::Ok as u32),
        Err(HostError::Status(status)) => Ok(status as u32),
        Err(HostError::Trap(error)) => Err(error),
    }
}

fn memory(caller: &mut Caller<'_, HostState>) -> HostResult<Memory> {
    if let Some(memory) = caller.data().memory {
        return Ok(memory);
    }
    match caller.get_export("memory") {
        Some(wasmtime::Extern::Memory(memory)) => Ok(memory),
        _ => Err(HostError::Trap(wasmtime::Error::msg(
            "the module exports no memory named `memory`",
        ))),
    }
}

/// Copies `len` bytes at `ptr` out of guest memory.
pub(crate) fn read_bytes(
    caller: &mut Caller<'_, HostState>,
    ptr: u32,
    len: u32,
) -> HostResult<Vec<u8>> {
    let memory = memory(caller)?;
    let mut buf = vec![0u8; len as usize];
    memory
        .read(&*caller, ptr as usize, &mut buf)
        .map_err(|_| Status::InvalidMemoryAccess)?;
    Ok(buf)
}

/// Writes bytes into guest memory.
pub(crate) fn write_bytes(
    caller: &mut Caller<'_, HostState>,
    ptr: u32,
    data: &[u8],
) -> HostResult<()> {
    let memory = memory(caller)?;
    memory
        .write(&mut *caller, ptr as usize, data)
        .map_err(|_| HostError::Status(Status::InvalidMemoryAccess))
}

/// Writes a little-endian u32 (a wasm32 pointer or size).
pub(crate) fn write_u32(
    caller: &mut Caller<'_, HostState>,
    ptr: u32,
    value: u32,
) -> HostResult<()> {
    write_bytes(caller, ptr, &value.to_le_bytes())
}

/// Writes a little-endian u64.
pub(crate) fn write_u64(
    caller: &mut Caller<'_, HostState>,
    ptr: u32,
    value: u64,
) -> HostResult<()> {
    write_bytes(caller, ptr, &value.to_le_bytes())
}

/// Allocates `len` bytes in the guest with its exported allocator.
fn allocate(caller: &mut Caller<'_, HostState>, len: u32) -> HostResult<u32> {
    let Some(alloc) = caller.data().allocator.clone() else {
        return Err(HostError::Trap(wasmtime::Error::msg(
            "the module exports neither `malloc` nor `proxy_on_memory_allocate`",
        )));
    };
    caller.data_mut().count_vm_entry("malloc");
    let ptr = alloc.call(&mut *caller, len).map_err(HostError::Trap)?;
    if ptr == 0 {
        return Err(HostError::Status(Status::InvalidMemoryAccess));
    }
    Ok(ptr)
}

/// Hands `data` to the guest: allocates a buffer in the guest, copies the data there and
/// stores its address and size at `ptr_ptr` / `size_ptr`. Empty data is answered with a null
/// pointer and size 0 without allocating, as Envoy does (the SDK then reads `None`/empty).
pub(crate) fn copy_out(
    caller: &mut Caller<'_, HostState>,
    data: &[u8],
    ptr_ptr: u32,
    size_ptr: u32,
) -> HostResult<()> {
    let len = u32::try_from(data.len()).map_err(|_| Status::InvalidMemoryAccess)?;
    let ptr = if data.is_empty() {
        0
    } else {
        let ptr = allocate(caller, len)?;
        write_bytes(caller, ptr, data)?;
        ptr
    };
    write_u32(caller, ptr_ptr, ptr)?;
    write_u32(caller, size_ptr, len)
}

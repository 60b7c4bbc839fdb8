//! The proxy-wasm host functions (`env.proxy_*`), with Envoy's answers (statuses and
//! phase rules) as implemented in `source/extensions/common/wasm/context.cc` and
//! proxy-wasm-cpp-host's `exports.cc`.
//!
//! Every function reads its arguments from guest memory, acts on [`HostState`] and returns a
//! `WasmResult` code; a failure to allocate in the guest traps. Imports the module has and
//! this file does not define are linked as functions that trap naming themselves
//! ([`define_missing_as_traps`]).

use wasmtime::{Caller, Extern, ExternType, Linker, Module, Store};

use crate::headers::HeaderMap;
use crate::memory::{HostError, HostResult, copy_out, finish, read_bytes, write_u32, write_u64};
use crate::pairs;
use crate::state::{Callback, HostState, HttpCall, LocalReply, Metric, StreamState};
use crate::types::{BufferType, LogLevel, MapType, MetricType, Status, StreamType};
use pinroute::host_rules::{self, Access, Refusal};

type C<'a> = Caller<'a, HostState>;

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Defines the implemented `env.proxy_*` functions.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_log",
        |mut c: C<'_>, level: u32, ptr: u32, len: u32| finish(log(&mut c, level, ptr, len)),
    )?;
    linker.func_wrap("env", "proxy_get_log_level", |mut c: C<'_>, ret: u32| {
        let level = c.data().options.log_level.to_abi();
        finish(write_u32(&mut c, ret, level))
    })?;
    linker.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: C<'_>, ret: u32| {
            let now = c.data().now_nanos();
            finish(write_u64(&mut c, ret, now))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        |mut c: C<'_>, period: u32| {
            c.data_mut().tick_period_ms = period;
            finish(Ok(()))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_buffer_bytes",
        |mut c: C<'_>, kind: u32, start: u32, max: u32, ptr_ptr: u32, size_ptr: u32| {
            finish(get_buffer_bytes(
                &mut c, kind, start, max, ptr_ptr, size_ptr,
            ))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_buffer_bytes",
        |mut c: C<'_>, kind: u32, start: u32, size: u32, ptr: u32, len: u32| {
            finish(set_buffer_bytes(&mut c, kind, start, size, ptr, len))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        |mut c: C<'_>, kind: u32, ptr_ptr: u32, size_ptr: u32| {
            finish(get_header_map_pairs(&mut c, kind, ptr_ptr, size_ptr))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        |mut c: C<'_>, kind: u32, ptr: u32, len: u32| {
            finish(set_header_map_pairs(&mut c, kind, ptr, len))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_value",
        |mut c: C<'_>, kind: u32, kptr: u32, klen: u32, ptr_ptr: u32, size_ptr: u32| {
            finish(get_header_map_value(
                &mut c, kind, kptr, klen, ptr_ptr, size_ptr,
            ))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_add_header_map_value",
        |mut c: C<'_>, kind: u32, kptr: u32, klen: u32, vptr: u32, vlen: u32| {
            finish(edit_header(
                &mut c,
                Edit::Add,
                kind,
                kptr,
                klen,
                Some((vptr, vlen)),
            ))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        |mut c: C<'_>, kind: u32, kptr: u32, klen: u32, vptr: u32, vlen: u32| {
            finish(edit_header(
                &mut c,
                Edit::Replace,
                kind,
                kptr,
                klen,
                Some((vptr, vlen)),
            ))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |mut c: C<'_>, kind: u32, kptr: u32, klen: u32| {
            finish(edit_header(&mut c, Edit::Remove, kind, kptr, klen, None))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_property",
        |mut c: C<'_>, pptr: u32, plen: u32, ptr_ptr: u32, size_ptr: u32| {
            finish(get_property(&mut c, pptr, plen, ptr_ptr, size_ptr))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_property",
        |mut c: C<'_>, pptr: u32, plen: u32, vptr: u32, vlen: u32| {
            finish(set_property(&mut c, pptr, plen, vptr, vlen))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_shared_data",
        |mut c: C<'_>, kptr: u32, klen: u32, ptr_ptr: u32, size_ptr: u32, cas_ptr: u32| {
            finish(get_shared_data(
                &mut c, kptr, klen, ptr_ptr, size_ptr, cas_ptr,
            ))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_shared_data",
        |mut c: C<'_>, kptr: u32, klen: u32, vptr: u32, vlen: u32, cas: u32| {
            finish(set_shared_data(&mut c, kptr, klen, vptr, vlen, cas))
        },
    )?;
    linker.func_wrap("env", "proxy_continue_stream", |mut c: C<'_>, kind: u32| {
        finish(continue_stream(&mut c, kind))
    })?;
    linker.func_wrap("env", "proxy_close_stream", |mut c: C<'_>, kind: u32| {
        finish(close_stream(&mut c, kind))
    })?;
    linker.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut c: C<'_>,
         status: u32,
         dptr: u32,
         dlen: u32,
         bptr: u32,
         blen: u32,
         hptr: u32,
         hlen: u32,
         grpc: i32| {
            let args = LocalReplyArgs {
                status,
                dptr,
                dlen,
                bptr,
                blen,
                hptr,
                hlen,
                grpc,
            };
            finish(send_local_response(&mut c, args))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_http_call",
        |mut c: C<'_>,
         uptr: u32,
         ulen: u32,
         hptr: u32,
         hlen: u32,
         bptr: u32,
         blen: u32,
         tptr: u32,
         tlen: u32,
         timeout: u32,
         token_ptr: u32| {
            let args = HttpCallArgs {
                uptr,
                ulen,
                hptr,
                hlen,
                bptr,
                blen,
                tptr,
                tlen,
                timeout,
                token_ptr,
            };
            finish(http_call(&mut c, args))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_effective_context",
        |mut c: C<'_>, id: u32| finish(set_effective_context(&mut c, id)),
    )?;
    linker.func_wrap(
        "env",
        "proxy_define_metric",
        |mut c: C<'_>, kind: u32, nptr: u32, nlen: u32, id_ptr: u32| {
            finish(define_metric(&mut c, kind, nptr, nlen, id_ptr))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_increment_metric",
        |mut c: C<'_>, id: u32, offset: i64| finish(increment_metric(&mut c, id, offset)),
    )?;
    linker.func_wrap(
        "env",
        "proxy_record_metric",
        |mut c: C<'_>, id: u32, value: u64| finish(record_metric(&mut c, id, value)),
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_metric",
        |mut c: C<'_>, id: u32, ret: u32| finish(get_metric(&mut c, id, ret)),
    )?;
    Ok(())
}

/// Links every import the module has and the linker lacks as a function that traps with a
/// message naming it. Returns the names so linked (`module.name`).
pub(crate) fn define_missing_as_traps(
    linker: &mut Linker<HostState>,
    store: &mut Store<HostState>,
    module: &Module,
) -> wasmtime::Result<Vec<String>> {
    let mut missing = Vec::new();
    for import in module.imports() {
        if linker.get_by_import(&mut *store, &import).is_some() {
            continue;
        }
        let full = format!("{}.{}", import.module(), import.name());
        let ExternType::Func(ty) = import.ty() else {
            return Err(wasmtime::Error::msg(format!(
                "the module imports `{full}`, which is not a function: the test host provides none"
            )));
        };
        let name = full.clone();
        linker.func_new(import.module(), import.name(), ty, move |_, _, _| {
            Err(wasmtime::Error::msg(format!(
                "host function `{name}` is not implemented by the test host \
                 (tests/host/hostcalls.rs); the filter called it"
            )))
        })?;
        missing.push(full);
    }
    Ok(missing)
}

/// A linker whose imports each count their call in `HostState::calls`, then run what
/// `linker` defines for them.
pub(crate) fn counting(
    linker: &Linker<HostState>,
    store: &mut Store<HostState>,
    module: &Module,
) -> wasmtime::Result<Linker<HostState>> {
    let mut counting: Linker<HostState> = Linker::new(module.engine());
    for import in module.imports() {
        let (Some(Extern::Func(inner)), ExternType::Func(ty)) =
            (linker.get_by_import(&mut *store, &import), import.ty())
        else {
            continue;
        };
        let name = import.name().to_string();
        counting.func_new(
            import.module(),
            import.name(),
            ty,
            move |mut caller, params, results| {
                let calls = &mut caller.data_mut().calls.host_calls;
                *calls.entry(name.clone()).or_default() += 1;
                inner.call(&mut caller, params, results)
            },
        )?;
    }
    Ok(counting)
}

fn log(c: &mut C<'_>, level: u32, ptr: u32, len: u32) -> HostResult<()> {
    let level = LogLevel::from_abi(level).ok_or(Status::BadArgument)?;
    let message = read_bytes(c, ptr, len)?;
    c.data_mut().log(level, lossy(&message));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Buffers

/// What `getBuffer` answers: `Err(NotFound)` where Envoy returns no buffer at all.
fn buffer_contents(state: &mut HostState, kind: BufferType) -> Result<Vec<u8>, Status> {
    match kind {
        BufferType::PluginConfiguration => {
            if state.callback() == Some(Callback::Configure) {
                Ok(state.plugin_config.clone())
            } else {
                Err(Status::NotFound)
            }
        }
        BufferType::VmConfiguration => Ok(state.options.vm_configuration.clone()),
        // Envoy answers Ok with nothing where it has no body for the filter.
        BufferType::RequestBody => Ok(state
            .current_stream()
            .filter(|s| allows(Access::ReadBody, s, true))
            .map(|s| s.request_body_buffered.clone())
            .unwrap_or_default()),
        BufferType::ResponseBody => Ok(state
            .current_stream()
            .filter(|s| allows(Access::ReadBody, s, false))
            .map(|s| s.response_body_buffered.clone())
            .unwrap_or_default()),
        BufferType::HttpCallResponseBody => state
            .call_response
            .as_ref()
            .map(|r| r.body.clone())
            .ok_or(Status::NotFound),
        BufferType::DownstreamData
        | BufferType::UpstreamData
        | BufferType::GrpcReceiveBuffer
        | BufferType::CallData => Ok(Vec::new()),
    }
}

fn get_buffer_bytes(
    c: &mut C<'_>,
    kind: u32,
    start: u32,
    max: u32,
    ptr_ptr: u32,
    size_ptr: u32,
) -> HostResult<()> {
    let kind = BufferType::from_abi(kind).ok_or(Status::BadArgument)?;
    let data = buffer_contents(c.data_mut(), kind)?;
    let start = start as usize;
    if start > data.len() {
        return Err(Status::BadArgument.into());
    }
    let end = start.saturating_add(max as usize).min(data.len());
    let slice = data.get(start..end).ok_or(Status::BadArgument)?;
    if slice.is_empty() {
        // Envoy answers Ok without writing the out-pointers: the SDK sees `None`.
        return Ok(());
    }
    copy_out(c, slice, ptr_ptr, size_ptr)
}

/// Envoy's `Buffer::copyFrom` on a mutable body: `start == 0` drains `size` bytes and
/// prepends the data (so `(0, whole_len, new)` replaces the body); `start >= len` appends;
/// anything else is `BadArgument`.
fn apply_body_write(
    buf: &mut Vec<u8>,
    start: usize,
    size: usize,
    data: &[u8],
) -> Result<(), Status> {
    if start == 0 {
        let drained = size.min(buf.len());
        buf.splice(0..drained, data.iter().copied());
        Ok(())
    } else if start >= buf.len() {
        buf.extend_from_slice(data);
        Ok(())
    } else {
        Err(Status::BadArgument)
    }
}

fn set_buffer_bytes(
    c: &mut C<'_>,
    kind: u32,
    start: u32,
    size: u32,
    ptr: u32,
    len: u32,
) -> HostResult<()> {
    let kind = BufferType::from_abi(kind).ok_or(Status::BadArgument)?;
    let data = read_bytes(c, ptr, len)?;
    let state = c.data_mut();
    let callback = state.phase();
    let outcome = match kind {
        BufferType::RequestBody | BufferType::ResponseBody => {
            let request = kind == BufferType::RequestBody;
            match state.current_stream() {
                None => Err(format!(
                    "set_buffer_bytes({kind:?}) from the root context: there is no body"
                )),
                Some(s) => {
                    let reachable = allows(Access::WriteBody, s, request);
                    let buf = if request {
                        &mut s.request_body_buffered
                    } else {
                        &mut s.response_body_buffered
                    };
                    if !reachable {
                        Err(format!(
                            "set_buffer_bytes({kind:?}) in {callback}: Envoy has no body buffer \
                             for the filter here (BadArgument)"
                        ))
                    } else {
                        apply_body_write(buf, start as usize, size as usize, &data).map_err(|_| {
                            format!(
                                "set_buffer_bytes({kind:?}, start {start}, size {size}) on a \
                                 {}-byte body: Envoy only prepends/replaces at 0 or appends at \
                                 the end (BadArgument)",
                                buf.len()
                            )
                        })
                    }
                }
            }
        }
        _ => Err(format!(
            "set_buffer_bytes({kind:?}): that buffer is read-only (BadArgument)"
        )),
    };
    outcome.map_err(|message| {
        state.diagnose(message);
        HostError::Status(Status::BadArgument)
    })
}

// ---------------------------------------------------------------------------------------
// Header maps

/// The map Envoy's `getConstMap` answers for reads; `None` where it answers nullptr.
fn readable_map(state: &HostState, kind: MapType) -> Option<HeaderMap> {
    let ctx = state.context().ok()?;
    match kind {
        MapType::RequestHeaders => {
            let s = state.streams.get(&ctx)?;
            allows(Access::ReadHeaders, s, true).then(|| s.request_headers.clone())
        }
        MapType::ResponseHeaders => {
            let s = state.streams.get(&ctx)?;
            allows(Access::ReadHeaders, s, false).then(|| s.response_headers.clone())
        }
        MapType::HttpCallResponseHeaders => state.call_response.as_ref().map(|r| r.headers.clone()),
        MapType::RequestTrailers
        | MapType::ResponseTrailers
        | MapType::GrpcInitialMetadata
        | MapType::GrpcTrailingMetadata
        | MapType::HttpCallResponseTrailers => None,
    }
}

/// Whether Envoy's rules (`pinroute::host_rules`) allow `access` to the request (`true`) or
/// the response of `stream` now.
fn allows(access: Access, stream: &StreamState, request: bool) -> bool {
    host_rules::check(access, &stream.direction(request), stream.log_phase).is_ok()
}

fn in_log_phase(state: &mut HostState) -> bool {
    state.current_stream().is_some_and(|s| s.log_phase)
}

fn get_header_map_pairs(c: &mut C<'_>, kind: u32, ptr_ptr: u32, size_ptr: u32) -> HostResult<()> {
    let kind = MapType::from_abi(kind).ok_or(Status::BadArgument)?;
    // Envoy answers Ok with an empty map when the map is not available.
    let bytes = match readable_map(c.data(), kind) {
        Some(map) if !map.is_empty() => pairs::serialize(map.entries()),
        _ => Vec::new(),
    };
    copy_out(c, &bytes, ptr_ptr, size_ptr)
}

fn get_header_map_value(
    c: &mut C<'_>,
    kind: u32,
    kptr: u32,
    klen: u32,
    ptr_ptr: u32,
    size_ptr: u32,
) -> HostResult<()> {
    let kind = MapType::from_abi(kind).ok_or(Status::BadArgument)?;
    let key = lossy(&read_bytes(c, kptr, klen)?);
    let Some(map) = readable_map(c.data(), kind) else {
        let state = c.data_mut();
        if in_log_phase(state) {
            return Err(Status::NotFound.into());
        }
        let callback = state.phase();
        state.diagnose(format!(
            "get_header_map_value({kind:?}, {key:?}) in {callback}: the map is not available \
             in this phase (Envoy: BadArgument, the SDK panics)"
        ));
        return Err(Status::BadArgument.into());
    };
    let value = map.get(&key).ok_or(Status::NotFound)?.to_vec();
    copy_out(c, &value, ptr_ptr, size_ptr)
}

#[derive(Clone, Copy, Debug)]
enum Edit {
    Add,
    Replace,
    Remove,
}

/// Runs `edit` on the map Envoy's `getMap` answers for writes, or explains why not.
fn with_writable_map(
    state: &mut HostState,
    kind: MapType,
    what: &str,
    edit: impl FnOnce(&mut HeaderMap),
) -> HostResult<()> {
    let callback = state.phase();
    let refusal = match state.current_stream() {
        None => Some(format!(
            "{what} from the root context: no header map (BadArgument)"
        )),
        Some(s) => {
            let request = match kind {
                MapType::RequestHeaders => Some(true),
                MapType::ResponseHeaders => Some(false),
                _ => None,
            };
            match request {
                None => Some(format!("{what} on {kind:?}: not writable (BadArgument)")),
                Some(request) => {
                    let direction = s.direction(request);
                    match host_rules::check(Access::WriteHeaders, &direction, s.log_phase) {
                        Err(Refusal::WentOn) => Some(format!(
                            "{what} on {kind:?} in {callback}: the headers already went on \
                             (Envoy keeps the map reachable but the change is lost; this host \
                             refuses: BadArgument)"
                        )),
                        Err(refusal) => Some(format!(
                            "{what} on {kind:?} in {callback}: {refusal} (Envoy: BadArgument, \
                             the SDK panics)"
                        )),
                        Ok(()) if request => {
                            edit(&mut s.request_headers);
                            None
                        }
                        Ok(()) => {
                            edit(&mut s.response_headers);
                            None
                        }
                    }
                }
            }
        }
    };
    match refusal {
        None => Ok(()),
        Some(message) => {
            state.diagnose(message);
            Err(Status::BadArgument.into())
        }
    }
}

fn set_header_map_pairs(c: &mut C<'_>, kind: u32, ptr: u32, len: u32) -> HostResult<()> {
    let kind = MapType::from_abi(kind).ok_or(Status::BadArgument)?;
    let bytes = read_bytes(c, ptr, len)?;
    let state = c.data_mut();
    let pairs = match pairs::deserialize(&bytes) {
        Ok(pairs) => pairs,
        Err(e) => {
            state.diagnose(format!("set_header_map_pairs({kind:?}): {e}"));
            return Err(Status::BadArgument.into());
        }
    };
    with_writable_map(state, kind, "set_header_map_pairs", |map| {
        map.set_all(&pairs)
    })
}

fn edit_header(
    c: &mut C<'_>,
    edit: Edit,
    kind: u32,
    kptr: u32,
    klen: u32,
    value: Option<(u32, u32)>,
) -> HostResult<()> {
    let kind = MapType::from_abi(kind).ok_or(Status::BadArgument)?;
    let key = lossy(&read_bytes(c, kptr, klen)?);
    let value = match value {
        Some((ptr, len)) => read_bytes(c, ptr, len)?,
        None => Vec::new(),
    };
    let what = format!("{edit:?} header {key:?}");
    with_writable_map(c.data_mut(), kind, &what, |map| match edit {
        Edit::Add => map.add(&key, &value),
        Edit::Replace => map.replace(&key, &value),
        Edit::Remove => map.remove(&key),
    })
}

// ---------------------------------------------------------------------------------------
// Properties and shared data

fn get_property(
    c: &mut C<'_>,
    pptr: u32,
    plen: u32,
    ptr_ptr: u32,
    size_ptr: u32,
) -> HostResult<()> {
    let path = read_bytes(c, pptr, plen)?;
    let state = c.data_mut();
    let from_stream = state
        .current_stream()
        .and_then(|s| s.filter_properties.get(&path).cloned());
    let value = from_stream
        .or_else(|| state.properties.get(&path).cloned())
        .ok_or(Status::NotFound)?;
    copy_out(c, &value, ptr_ptr, size_ptr)
}

fn set_property(c: &mut C<'_>, pptr: u32, plen: u32, vptr: u32, vlen: u32) -> HostResult<()> {
    let path = read_bytes(c, pptr, plen)?;
    let value = read_bytes(c, vptr, vlen)?;
    let state = c.data_mut();
    match state.current_stream() {
        Some(s) => {
            s.filter_properties.insert(path, value);
            Ok(())
        }
        None => {
            state.diagnose(format!(
                "set_property({:?}) from the root context: no stream info (Envoy: NotFound)",
                lossy(&path)
            ));
            Err(Status::NotFound.into())
        }
    }
}

fn get_shared_data(
    c: &mut C<'_>,
    kptr: u32,
    klen: u32,
    ptr_ptr: u32,
    size_ptr: u32,
    cas_ptr: u32,
) -> HostResult<()> {
    let key = lossy(&read_bytes(c, kptr, klen)?);
    let (value, cas) = c
        .data()
        .shared_data
        .get(&key)
        .cloned()
        .ok_or(Status::NotFound)?;
    copy_out(c, &value, ptr_ptr, size_ptr)?;
    write_u32(c, cas_ptr, cas)
}

fn set_shared_data(
    c: &mut C<'_>,
    kptr: u32,
    klen: u32,
    vptr: u32,
    vlen: u32,
    cas: u32,
) -> HostResult<()> {
    let key = lossy(&read_bytes(c, kptr, klen)?);
    let value = read_bytes(c, vptr, vlen)?;
    let state = c.data_mut();
    if let Some((_, current)) = state.shared_data.get(&key)
        && cas != 0
        && cas != *current
    {
        return Err(Status::CasMismatch.into());
    }
    let next = state.next_cas();
    state.shared_data.insert(key, (value, next));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Stream control

fn continue_stream(c: &mut C<'_>, kind: u32) -> HostResult<()> {
    let kind = StreamType::from_abi(kind).ok_or(Status::BadArgument)?;
    let state = c.data_mut();
    match kind {
        StreamType::Request | StreamType::Response => {
            match state.current_stream() {
                Some(s) => {
                    if kind == StreamType::Request {
                        s.req.continue_pending = true;
                        s.request_resumed = true;
                    } else {
                        s.resp.continue_pending = true;
                        s.response_resumed = true;
                    }
                    // Envoy's continueStream clears the request-side pointers at once (for
                    // either direction); the resume itself runs after the VM call returns.
                    s.req.headers_ptr = false;
                    s.req.chunk_ptr = false;
                }
                None => state.diagnose(format!(
                    "continue_stream({kind:?}) from the root context: nothing to resume"
                )),
            }
            Ok(())
        }
        StreamType::Downstream => Ok(()),
        StreamType::Upstream => Err(Status::Unimplemented.into()),
    }
}

fn close_stream(c: &mut C<'_>, kind: u32) -> HostResult<()> {
    let kind = StreamType::from_abi(kind).ok_or(Status::BadArgument)?;
    let state = c.data_mut();
    if matches!(kind, StreamType::Request | StreamType::Response) {
        match state.current_stream() {
            Some(s) => s.pending_reset = true,
            None => state.diagnose(format!(
                "close_stream({kind:?}) from the root context: nothing to reset"
            )),
        }
    }
    Ok(())
}

struct LocalReplyArgs {
    status: u32,
    dptr: u32,
    dlen: u32,
    bptr: u32,
    blen: u32,
    hptr: u32,
    hlen: u32,
    grpc: i32,
}

fn send_local_response(c: &mut C<'_>, a: LocalReplyArgs) -> HostResult<()> {
    let details = lossy(&read_bytes(c, a.dptr, a.dlen)?);
    let body = read_bytes(c, a.bptr, a.blen)?;
    let header_bytes = read_bytes(c, a.hptr, a.hlen)?;
    let state = c.data_mut();
    let headers = match pairs::deserialize(&header_bytes) {
        Ok(pairs) => HeaderMap::from_pairs(&pairs),
        Err(e) => {
            state.diagnose(format!("send_local_response: {e}"));
            return Err(Status::BadArgument.into());
        }
    };
    let reply = LocalReply {
        status: a.status,
        headers,
        body,
        details,
        grpc_status: (0..=16).contains(&a.grpc).then_some(a.grpc),
    };
    let note = match state.current_stream() {
        None => Some("send_local_response from the root context: Envoy ignores it".to_string()),
        Some(s) if s.pending_local_reply.is_some() => Some(format!(
            "a second send_local_response ({}) in the same callback: ignored",
            reply.status
        )),
        Some(s) => {
            s.pending_local_reply = Some(reply);
            None
        }
    };
    if let Some(note) = note {
        state.diagnose(note);
    }
    Ok(())
}

struct HttpCallArgs {
    uptr: u32,
    ulen: u32,
    hptr: u32,
    hlen: u32,
    bptr: u32,
    blen: u32,
    tptr: u32,
    tlen: u32,
    timeout: u32,
    token_ptr: u32,
}

fn http_call(c: &mut C<'_>, a: HttpCallArgs) -> HostResult<()> {
    let upstream = lossy(&read_bytes(c, a.uptr, a.ulen)?);
    let header_bytes = read_bytes(c, a.hptr, a.hlen)?;
    let body = read_bytes(c, a.bptr, a.blen)?;
    let trailer_bytes = read_bytes(c, a.tptr, a.tlen)?;
    let state = c.data_mut();
    let context_id = state.context()?;
    let refuse = |state: &mut HostState, why: String| {
        state.diagnose(format!("http_call to {upstream:?}: {why}"));
        Err(HostError::Status(Status::BadArgument))
    };
    if i32::try_from(a.timeout).is_err() {
        return refuse(state, format!("negative timeout {}", a.timeout as i32));
    }
    if let Some(clusters) = &state.options.clusters
        && !clusters.contains(&upstream)
    {
        return refuse(state, format!("unknown cluster (known: {clusters:?})"));
    }
    let (headers, trailers) = match (
        pairs::deserialize(&header_bytes),
        pairs::deserialize(&trailer_bytes),
    ) {
        (Ok(h), Ok(t)) => (HeaderMap::from_pairs(&h), HeaderMap::from_pairs(&t)),
        (Err(e), _) | (_, Err(e)) => return refuse(state, e.to_string()),
    };
    let mut headers = headers;
    for required in [":path", ":method", ":authority"] {
        if !headers.contains(required) {
            return refuse(state, format!("the call has no {required} header"));
        }
    }
    if !body.is_empty() {
        headers.replace("content-length", body.len().to_string().as_bytes());
    }
    let token = state.next_token;
    state.next_token = state.next_token.wrapping_add(1).max(1);
    state.pending_calls.insert(token, context_id);
    state.new_calls.push(HttpCall {
        token,
        context_id,
        upstream,
        headers,
        body,
        trailers,
        timeout_ms: a.timeout,
    });
    write_u32(c, a.token_ptr, token)
}

fn set_effective_context(c: &mut C<'_>, id: u32) -> HostResult<()> {
    let state = c.data_mut();
    let known = id == state.root_id || state.streams.get(&id).is_some_and(|s| !s.done);
    if !known {
        return Err(Status::BadArgument.into());
    }
    state.effective_context = Some(id);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Metrics (ids carry the type in their low two bits, as in proxy-wasm-cpp-host)

fn define_metric(c: &mut C<'_>, kind: u32, nptr: u32, nlen: u32, id_ptr: u32) -> HostResult<()> {
    let kind = MetricType::from_abi(kind).ok_or(Status::BadArgument)?;
    let name = lossy(&read_bytes(c, nptr, nlen)?);
    let id = c.data_mut().metrics.define(kind, &name);
    write_u32(c, id_ptr, id)
}

fn tag_of(id: u32) -> Option<MetricType> {
    MetricType::from_abi(id & 3)
}

fn increment_metric(c: &mut C<'_>, id: u32, offset: i64) -> HostResult<()> {
    let metrics = &mut c.data_mut().metrics;
    match tag_of(id) {
        Some(MetricType::Counter) => match metrics.get_mut(id) {
            Some(Metric::Counter(v)) if offset > 0 => {
                *v = v.saturating_add(offset.unsigned_abs());
                Ok(())
            }
            Some(_) => Err(Status::BadArgument.into()),
            None => Err(Status::NotFound.into()),
        },
        Some(MetricType::Gauge) => match metrics.get_mut(id) {
            Some(Metric::Gauge(v)) => {
                *v = v.saturating_add(offset);
                Ok(())
            }
            Some(_) => Err(Status::BadArgument.into()),
            None => Err(Status::NotFound.into()),
        },
        _ => Err(Status::BadArgument.into()),
    }
}

fn record_metric(c: &mut C<'_>, id: u32, value: u64) -> HostResult<()> {
    match c.data_mut().metrics.get_mut(id) {
        Some(Metric::Counter(v)) => *v = v.saturating_add(value),
        Some(Metric::Gauge(v)) => *v = i64::try_from(value).unwrap_or(i64::MAX),
        Some(Metric::Histogram(values)) => values.push(value),
        None => return Err(Status::NotFound.into()),
    }
    Ok(())
}

fn get_metric(c: &mut C<'_>, id: u32, ret: u32) -> HostResult<()> {
    let value = match tag_of(id) {
        Some(MetricType::Counter | MetricType::Gauge) => match c.data_mut().metrics.get_mut(id) {
            Some(Metric::Counter(v)) => *v,
            Some(Metric::Gauge(v)) => *v as u64,
            Some(Metric::Histogram(_)) => return Err(Status::BadArgument.into()),
            None => return Err(Status::NotFound.into()),
        },
        _ => return Err(Status::BadArgument.into()),
    };
    write_u64(c, ret, value)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::apply_body_write;

    #[test]
    fn body_writes_follow_envoy() {
        let mut body = b"hello world".to_vec();
        apply_body_write(&mut body, 0, 11, b"bye").unwrap();
        assert_eq!(body, b"bye");
        apply_body_write(&mut body, 0, 0, b">").unwrap();
        assert_eq!(body, b">bye");
        apply_body_write(&mut body, 4, 0, b"!").unwrap();
        assert_eq!(body, b">bye!");
        apply_body_write(&mut body, 0, 100, b"all").unwrap();
        assert_eq!(body, b"all");
        assert!(apply_body_write(&mut body, 1, 1, b"x").is_err());
    }
}

//! The spans of the filter's own calls (the prefill hop): children of the stream's span in
//! Envoy's tracer, open while the call is in flight, one per stream at most, finished when
//! its answer is judged — or when the stream is destroyed first.

use std::cell::RefCell;
use std::ffi::c_void;

use super::abi::{self, EnvoyBuffer, FilterEnvoyPtr, ModuleBuffer};
use crate::policy::trace::SpanIds;

thread_local! {
    /// Each stream's open call span, on this thread.
    static OPEN: RefCell<Vec<(FilterEnvoyPtr, SpanPtr)>> = const { RefCell::new(Vec::new()) };
}

type SpanPtr = *mut c_void;

/// Opens `filter`'s call span, closing one left open; its ids. None when the request is not
/// traced.
pub fn open(filter: FilterEnvoyPtr, operation: &str) -> Option<SpanIds> {
    abandon(filter);
    // SAFETY: `filter` is the stream of the running hook.
    let parent = unsafe { abi::envoy_dynamic_module_callback_http_get_active_span(filter) };
    if parent.is_null() {
        return None;
    }
    // SAFETY: `parent` is the stream's span, alive during its hook; `operation` lives
    // through the call.
    let child = unsafe {
        abi::envoy_dynamic_module_callback_http_span_spawn_child(
            filter,
            parent,
            ModuleBuffer::of(operation.as_bytes()),
        )
    };
    if child.is_null() {
        return None;
    }
    OPEN.with(|open| open.borrow_mut().push((filter, child)));
    let trace_id = id(
        child,
        abi::envoy_dynamic_module_callback_http_span_get_trace_id,
    );
    let span_id = id(
        child,
        abi::envoy_dynamic_module_callback_http_span_get_span_id,
    );
    let ids = trace_id
        .zip(span_id)
        .and_then(|(trace_id, span_id)| SpanIds::new(&trace_id, &span_id));
    if ids.is_none() {
        close(filter, &[]);
    }
    ids
}

/// Tags and finishes `filter`'s call span, if one is open.
pub fn close(filter: FilterEnvoyPtr, tags: &[(&str, &str)]) {
    let Some(span) = take(filter) else {
        return;
    };
    for (key, value) in tags {
        // SAFETY: `span` is an open child span; the buffers live through the call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_span_set_tag(
                span,
                ModuleBuffer::of(key.as_bytes()),
                ModuleBuffer::of(value.as_bytes()),
            );
        }
    }
    // SAFETY: `span` is open and taken out of `OPEN`: finished (and freed) once.
    unsafe { abi::envoy_dynamic_module_callback_http_child_span_finish(span) };
}

/// The stream is going away with its call in flight: the span ends, so marked.
pub fn abandon(filter: FilterEnvoyPtr) {
    close(filter, &[("pinroute.outcome", "abandoned")]);
}

fn take(filter: FilterEnvoyPtr) -> Option<SpanPtr> {
    OPEN.with(|open| {
        let mut open = open.borrow_mut();
        let index = open.iter().position(|(f, _)| *f == filter)?;
        Some(open.swap_remove(index).1)
    })
}

type IdGetter = unsafe fn(*mut c_void, *mut EnvoyBuffer) -> bool;

fn id(span: SpanPtr, getter: IdGetter) -> Option<String> {
    let mut out = EnvoyBuffer::NULL;
    // SAFETY: `span` is open; `out` is a valid out-pointer; the bytes are copied before any
    // other call can reuse Envoy's storage.
    let bytes = unsafe {
        if !getter(span, &raw mut out) {
            return None;
        }
        out.to_vec()
    };
    String::from_utf8(bytes).ok()
}

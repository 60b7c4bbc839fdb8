//! The one door to the host. The request path sees the host as the [`Host`] trait, in
//! pinroute's own types, so it runs natively against an in-memory host in tests and behind
//! two hosts: `envoy` is the proxy-wasm host and `contexts` maps proxy-wasm's callbacks onto
//! the filter; `dynamic` (the `dynamic-module` feature, native builds) is the same filter as
//! an Envoy dynamic module. Nothing outside this folder names a proxy-wasm item, nothing
//! outside `dynamic/` the dynamic-module ABI.

// The proxy-wasm host, but in the native module: its host calls are wasm imports, which
// nothing resolves in a shared object Envoy loads natively.
#[cfg(not(all(feature = "dynamic-module", not(target_arch = "wasm32"))))]
mod contexts;
#[cfg(all(feature = "dynamic-module", not(target_arch = "wasm32")))]
mod dynamic;
#[cfg(not(all(feature = "dynamic-module", not(target_arch = "wasm32"))))]
mod envoy;
mod headers;
#[cfg(any(test, all(feature = "dynamic-module", not(target_arch = "wasm32"))))]
mod own_time;
pub mod rules;

use std::time::Duration;

use crate::policy::trace::SpanIds;

pub use headers::Headers;

/// A shared-data value and its compare-and-swap token (`None`: no such key).
pub type SharedValue = (Option<Vec<u8>>, Option<u32>);

/// Why a host call did not do what it was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// A shared-data write lost a race: the value changed since it was read.
    #[error("the shared value changed since it was read")]
    CasMismatch,
    #[error("no such value")]
    NotFound,
    /// The host refused the call (the reason as the host names it).
    #[error("the host refused the call ({0})")]
    Refused(&'static str),
}

/// What a callback tells the host to do with the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Go on: the request (or answer) passes to the next filter.
    Continue,
    /// Hold it until the filter resumes it or answers.
    Pause,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

/// The host calls of a request and of the state all Envoy threads share.
pub trait Host {
    fn request_headers(&self) -> Result<Headers, HostError>;
    fn set_request_header(&self, name: &str, value: Option<&str>) -> Result<(), HostError>;
    fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError>;
    /// Replaces the first `replaced` bytes of the held request body with `with` (Envoy
    /// drains them and prepends `with`; the rest of the body is not copied).
    fn edit_request_body(&self, replaced: usize, with: &[u8]) -> Result<(), HostError>;
    fn resume_request(&self) -> Result<(), HostError>;

    fn response_status(&self) -> Option<u16>;
    fn set_response_header(&self, name: &str, value: Option<&str>) -> Result<(), HostError>;
    fn replace_response_body(&self, old_size: usize, body: &[u8]) -> Result<(), HostError>;
    /// Envoy's `response.code_details`: `via_upstream` for a worker's own answer, otherwise
    /// why Envoy answered itself (`upstream_reset_before_response_started{...}`, ...).
    fn response_code_details(&self) -> Option<String>;
    /// `upstream.address`: the `ip:port` the routed request went to, once a response came.
    fn upstream_address(&self) -> Option<String>;
    /// Answers the request from the filter, in place of whatever it would have got.
    fn send_response(
        &self,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError>;

    /// Starts an HTTP call; its token identifies the answer.
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<u32, HostError>;
    /// Starts a unary gRPC call whose answer the filter does not wait for.
    fn dispatch_grpc(
        &self,
        _cluster: &str,
        _service: &str,
        _method: &str,
        _message: &[u8],
        _timeout: Duration,
    ) -> Result<u32, HostError> {
        Err(HostError::Refused("no gRPC calls"))
    }
    fn call_response_headers(&self) -> Result<Headers, HostError>;
    fn call_response_body(&self, size: usize) -> Result<Vec<u8>, HostError>;

    fn shared_data(&self, key: &str) -> Result<SharedValue, HostError>;
    /// Writes `value` if the key's token is still `cas` (`None`: whatever it is).
    fn set_shared_data(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError>;

    /// Sets a string the access log reads for this request: the filter-state entry `key`
    /// (`wasm.`-prefixed, as Envoy names what proxy-wasm's `set_property` sets).
    fn set_log_field(&self, key: &str, value: &str) -> Result<(), HostError>;

    fn define_metric(&self, kind: MetricKind, name: &str) -> Result<u32, HostError>;
    /// Adds `offset` to a counter (positive) or a gauge.
    fn increment_metric(&self, id: u32, offset: i64) -> Result<(), HostError>;
    fn record_metric(&self, id: u32, value: u64) -> Result<(), HostError>;

    /// Whether the host has spans of its own (the native module: Envoy's tracer; proxy-wasm
    /// has none).
    fn has_spans(&self) -> bool {
        false
    }
    /// Opens the span of the filter's own call, a child of the request's span, where the host
    /// has spans; its ids, for the call's `traceparent`. None: no span (the request is not
    /// traced, or the host has none).
    fn open_call_span(&self, _operation: &str) -> Option<SpanIds> {
        None
    }
    /// Tags and ends the span [`Host::open_call_span`] opened; nothing if none is open.
    fn close_call_span(&self, _tags: &[(&str, &str)]) {}

    /// Nanoseconds since the Unix epoch by the host's clock (0 if it cannot tell).
    fn now_nanos(&self) -> u64;

    /// The plugin configuration the host holds for the filter (root context only).
    fn plugin_configuration(&self) -> Option<Vec<u8>>;
    /// Calls the root's tick every `period` (root context only).
    fn set_tick_period(&self, period: Duration) -> Result<(), HostError>;

    /// Whether this root fetches the live registry and scrapes the engines' load when its
    /// turn comes: every proxy-wasm VM may (one at a time); in the native module, the
    /// configuration's root on Envoy's main thread alone, the others adopt what it fetched.
    fn polls_sources(&self) -> bool {
        true
    }
}

//! A proxy-wasm host on wasmtime for testing the compiled filter without Envoy.
//!
//! [`Host`] loads a `wasm32-wasip1` proxy-wasm module (ABI 0.2.1), starts the plugin like
//! Envoy (root context, `proxy_on_vm_start`, `proxy_on_configure`) and drives HTTP streams
//! through the real ABI: the test plays the client and the upstream, the host plays Envoy.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use pinroute_tests::{Action, Host};
//! let mut host = Host::new(std::path::Path::new("pinroute.wasm"), r#"{"routes": []}"#)?;
//! let ctx = host.new_http_stream()?;
//! let action = host.request_headers(ctx, &[(":method", "GET"), (":path", "/")], true)?;
//! assert_eq!(action, Action::Continue);
//! assert_eq!(host.stream(ctx)?.request_header("x-pin"), None);
//! host.done(ctx)?;
//! # Ok(()) }
//! ```
//!
//! Envoy's rules the host enforces (a breach is what the SDK turns into a panic, i.e. a
//! trap, which every driver call reports as an `Err` carrying the trap, the filter's logs of
//! that call — the SDK logs a panic message at critical level — and the host's notes):
//!
//! - Request headers are reachable from the request-headers callback on, and stay reachable
//!   while the filter holds them paused; once the headers go on (Continue, or resume) reads
//!   answer `BadArgument` for a single value and an empty map for the pairs, and writes
//!   answer `BadArgument`. `proxy_continue_stream` drops the request maps at once, before the
//!   resume takes effect. Response headers likewise, from the response-headers callback on.
//! - A missing header or property is `NotFound`.
//! - Body: while the filter answers Pause, Envoy buffers; the next body callback's size is
//!   the whole buffer. `set_buffer` follows Envoy's `copyFrom` (replace from 0, or append).
//! - Pausing in a headers callback without `allow_on_headers_stop_iteration` (Envoy's
//!   default) holds the body back from the filter until it resumes ([`HostOptions`]).
//! - A local reply is sent after the VM call, then passes through the filter's own
//!   response callbacks; the request stops there.
//! - Http calls need `:method`, `:path`, `:authority`; a cluster outside
//!   [`HostOptions::clusters`] is `BadArgument`; the response (or the failure, with no
//!   headers) is reachable only inside `on_http_call_response`; ending a stream cancels its
//!   calls unanswered (Envoy 1.40 instead answers them when they end, after the stream is
//!   gone: [`Host::stray_http_call_response`] plays that).
//! - Unknown imports are linked as functions that trap naming themselves.
//!
//! Module map: `memory` (guest memory and allocation), [`pairs`] (the header-pairs wire
//! format), [`headers`] (Envoy-like header map), `hostcalls` (the `env.proxy_*` functions),
//! `wasi` (preview1 stubs), [`host`] (the driver), [`state`] (what the host records).

pub mod headers;
pub mod host;
mod hostcalls;
mod memory;
pub mod pairs;
pub mod state;
pub mod streamed;
pub mod types;
mod wasi;

pub use headers::HeaderMap;
pub use host::Host;
pub use state::{CallCounts, HostOptions, HttpCall, LocalReply, Metric, StreamState};
pub use types::{Action, LogLevel, MetricType};

#[cfg(test)]
mod filter_tests;

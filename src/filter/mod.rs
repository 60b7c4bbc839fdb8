//! The filter: maps a host's callbacks (Envoy's, through proxy-wasm) onto [`crate::policy`].
//!
//! | module | what |
//! |---|---|
//! | [`host`] | the one door to the host: the [`host::Host`] trait in pinroute's own types, the proxy-wasm host and the proxy-wasm contexts (the only module that names proxy-wasm) |
//! | [`root`] | one per Envoy thread: the configuration, the live registry, the in-flight slots |
//! | [`stream`] | one request's state machine: headers, body, prefill, routed, answered |
//! | [`intake`] | what the client sent: admitted paths, methods and sizes, request id, forwarded headers, whole body |
//! | [`prefill`] | the prefill call: dispatch, retry, judging its answer |
//! | [`response`] | the routed hop and its answer: typed errors, withheld decode refusals |
//! | [`decode_retry`] | the filter's own retry of a refused decode hop Envoy cannot retry |
//! | [`env`] | what every phase works with: host, configuration, counters, request id |
//! | [`shared`] | state all Envoy threads see: passive health, requests in flight, the turn memory |
//! | [`live_registry`] | the registry fetched on a period and shared by all threads |
//! | [`metrics`] | the filter's stats |
//!
//! Host calls are made only in the phases where Envoy allows them; the SDK panics on an
//! unexpected status, and a panic kills the VM of that Envoy worker.

mod decode_retry;
mod env;
mod host;
mod intake;
mod live_registry;
mod metrics;
mod prefill;
mod response;
mod root;
mod shared;
mod stream;
#[cfg(test)]
mod tests;

//! The filter: maps a host's callbacks (Envoy's, through proxy-wasm) onto [`crate::policy`].
//!
//! | module | what |
//! |---|---|
//! | [`host`] | the one door to the host: the [`host::Host`] trait in pinroute's own types, the proxy-wasm host and the proxy-wasm contexts (the only module that names proxy-wasm) |
//! | [`root`] | one per Envoy thread: the configuration, the live registry, the in-flight slots |
//! | [`stream`] | one request's state machine: each callback an event, `step` the only place a phase changes |
//! | [`phase`] | the phases and the data each owns, with no behaviour |
//! | [`prefill`] | the prefill call: dispatch, and what its answer means (a verdict) |
//! | [`response`] | the routed hop and what its answer means: typed errors, withheld decode refusals |
//! | [`decode_retry`] | the filter's own retry of a refused decode hop Envoy cannot retry |
//! | [`call`] | the answer of a call the filter made |
//! | [`call_span`] | the span of the filter's prefill call: the host's, or one the filter makes |
//! | [`span_export`] | the filter's own spans, queued by streams and exported by the root |
//! | [`intake`] | what the client sent: admitted paths, methods and sizes, request id, forwarded headers, whole body |
//! | [`env`] | what every phase works with: host, configuration, counters, request id, the choice of workers |
//! | [`shared`] | state all Envoy threads see: passive health, requests in flight, the turn memory, the engines' load |
//! | [`live_registry`] | the registry fetched on a period and shared by all threads |
//! | [`engine_scrape`] | the engines' load scraped from the workers on a period and shared by all threads |
//! | [`metrics`] | the filter's stats |
//! | [`access_log`] | what the filter tells Envoy's access log about a request |
//!
//! The shape: [`host`] at the bottom knows the host, [`env`], [`intake`], [`call`] and the
//! shared tables sit on it, [`phase`] holds each phase's data, [`prefill`], [`response`] and
//! [`decode_retry`] carry out the hops and say what happened, and [`stream`] alone turns what
//! happened into the next phase; every rule they apply is [`crate::policy`]'s. No module
//! imports one above it (`tests/layout`).
//!
//! Host calls are made only in the phases where Envoy allows them; the SDK panics on an
//! unexpected status, and a panic kills the VM of that Envoy worker.

mod access_log;
mod call;
mod call_span;
mod decode_retry;
mod engine_scrape;
mod env;
mod host;
mod intake;
mod live_registry;
mod metrics;
mod phase;
mod prefill;
mod response;
mod root;
mod shared;
mod span_export;
mod stream;
#[cfg(test)]
mod tests;

pub use host::rules as host_rules;

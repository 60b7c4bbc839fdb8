//! pinroute: per-hop worker pins and two-hop prefill/decode routing inside Envoy.
//!
//! [`policy`] is the pure core (no proxy-wasm); `filter` maps proxy-wasm callbacks onto it.

mod filter;
pub mod policy;

/// Envoy's rules for a filter's host calls in each callback, which the test hosts enforce.
pub use filter::host_rules;

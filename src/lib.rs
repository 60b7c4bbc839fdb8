//! pinroute: per-hop worker pins and two-hop prefill/decode routing inside Envoy.
//!
//! [`policy`] is the pure core (no proxy-wasm); `filter` maps proxy-wasm callbacks onto it.

mod filter;
pub mod policy;

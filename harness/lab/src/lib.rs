//! Measuring pinroute through Envoy, on top of [`pinroute_harness`]: the closed-loop load
//! generator, the benchmark and the soak.
pub mod bench;
pub mod dashboard;
pub mod load;
pub mod soak;
pub mod tls;

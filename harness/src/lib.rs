//! The native side of pinroute: Envoy and worker management, scenarios, benchmarks.
pub mod envoy;
pub mod sim;
pub mod stack;
pub mod vllm;
pub mod wasm;

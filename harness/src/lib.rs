//! The native side of pinroute: Envoy and worker management, scenarios, benchmarks.
pub mod bench;
pub mod envoy;
pub mod load;
pub mod registry_server;
pub mod sim;
pub mod soak;
pub mod stack;
pub mod venv;
pub mod vllm;
pub mod wasm;

//! The native side of pinroute: building the filter, Envoy and worker management (sim
//! workers, a real vLLM pair), the stack they form. The load generator, `bench` and `soak`
//! are `pinroute-lab` (`harness/lab/`), so that `up` builds none of their dependencies.
pub mod certs;
pub mod cli;
pub mod dashboard;
pub mod envoy;
pub mod grpc;
pub mod jwt;
pub mod otlp;
pub mod picker;
pub mod prometheus;
pub mod registry_server;
pub mod sim;
pub mod stack;
pub mod tls_front;
pub mod venv;
pub mod vllm;
pub mod wasm;

//! The compiled `pinroute.wasm` driven through the real proxy-wasm ABI under wasmtime.
//!
//! Needs the release `pinroute.wasm` (`PINROUTE_WASM`, else the default target path);
//! `pinroute-harness test` builds it first.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod apis;
mod cost;
mod engine_load;
mod flow;
mod models;
mod robustness;
mod sdk;

use std::path::PathBuf;

use pinroute_harness::envoy::default_wasm_path;
use pinroute_tests::{Action, Host, HostOptions};
use serde_json::Value;

pub const REGISTRY: &str = r#"{"workers": [
    {"id": 101, "role": "prefill", "address": "10.0.0.11:8000"},
    {"id": 102, "role": "prefill", "address": "10.0.0.12:8000", "dp_size": 2},
    {"id": 201, "role": "decode", "address": "10.0.0.21:8000"},
    {"id": 202, "role": "decode", "address": "10.0.0.22:8000", "dp_size": 2}
], "prefill_retries": 1}"#;

pub fn wasm() -> PathBuf {
    let path = std::env::var_os("PINROUTE_WASM").map_or_else(default_wasm_path, PathBuf::from);
    assert!(
        path.exists(),
        "{} is missing: run `pinroute-harness test` (or build the wasm)",
        path.display()
    );
    path
}

pub fn host(config: &str) -> Host {
    let options = HostOptions {
        allow_on_headers_stop_iteration: true,
        clusters: Some(vec!["pinroute_prefill".into()]),
        ..HostOptions::default()
    };
    Host::with_options(&wasm(), config, options).expect("the filter loads")
}

pub use pinroute_tests::streamed::completion_headers;

/// Sends a completion request's headers and body; returns the stream id.
pub fn send_completion(host: &mut Host, headers: &[(&str, &str)], body: &str) -> u32 {
    let ctx = host.new_http_stream().unwrap();
    let action = host
        .request_headers(ctx, &completion_headers(headers), false)
        .unwrap();
    assert_eq!(action, Action::Pause, "the filter waits for the body");
    host.request_body(ctx, body.as_bytes(), true).unwrap();
    ctx
}

pub fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}

pub const PROMPT: &str = r#"{"model": "m", "prompt": "hello", "max_tokens": 7, "stream": true}"#;

//! Envoy for pinroute: the bootstrap (`envoy/bootstrap.yaml`) and its rendering, obtaining
//! the Envoy binary, validating a bootstrap and running Envoy.
//!
//! Request path in the rendered bootstrap: `header_mutation` strips client copies of the
//! steering headers, CORS answers browsers' preflights, the pinroute wasm filter chooses the workers (prefill through
//! `dispatch_http_call` to the ORIGINAL_DST prefill cluster with `x-envoy-original-dst-host`,
//! decode by setting the upstream header), the router sends the request to the ORIGINAL_DST
//! decode cluster, which dials the address in that header. In picker mode (`picker_mode`)
//! `ext_proc` asks an endpoint picker before the filter, and `header_to_metadata` hands the
//! endpoints that served back to it. With `tls`, the listener terminates TLS, the worker
//! clusters speak (mutual) TLS, and `api_key_auth` refuses callers without a listed key.

mod binary;
mod bootstrap;
mod edge;
pub mod native;
mod picker_mode;
mod process;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
mod tls;
mod tracing;
pub mod vm;

use std::path::{Path, PathBuf};

pub use binary::{
    ENVOY_BIN_ENV, ENVOY_VERSION, VENV_DIR, envoy_binary, envoy_command, envoy_in_venv,
    envoy_install_command, validate,
};
pub use bootstrap::{
    BootstrapOptions, CONNECT_TIMEOUT, DECODE_CLUSTER, DEFAULT_ROUTE_TIMEOUT,
    MAX_UPSTREAM_REQUESTS, buffer_limit_bytes, envoy_duration, exposure_warnings, lb_endpoints,
    render_bootstrap,
};
pub use edge::{
    ANY_ORIGIN, CORS_ALLOW_HEADERS, CORS_ALLOW_METHODS, CORS_EXPOSE_HEADERS, CORS_MAX_AGE,
    DEFAULT_REQUEST_HEADERS_TIMEOUT, DEFAULT_REQUEST_TIMEOUT, EdgeOptions, request_timeout,
};
pub use picker_mode::{PICKER_CLUSTER, PICKER_MESSAGE_TIMEOUT};
pub use process::{
    Envoy, EnvoyOptions, HotRestart, admin_stat, admin_stats_text, cumulative_quantile, stat_value,
};
pub use tls::{
    ApiKey, ApiKeys, Callers, DEFAULT_IDENTITY_HEADER, Jwt, KEY_HEADERS, ListenerTls, WorkerTls,
};

/// The pinroute repository: the parent of the harness crate, as it was at compile time.
pub fn repo_root() -> PathBuf {
    let harness = Path::new(env!("CARGO_MANIFEST_DIR"));
    harness.parent().unwrap_or(harness).to_owned()
}

/// Where `cargo build --release --target wasm32-wasip1` puts the filter.
pub fn default_wasm_path() -> PathBuf {
    repo_root().join("target/wasm32-wasip1/release/pinroute.wasm")
}

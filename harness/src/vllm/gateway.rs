//! Envoy with the pinroute filter in front of a worker registry (any workers: a vLLM pair here).

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Result;
use serde_json::Value;

use crate::envoy::{
    BootstrapOptions, DEFAULT_ROUTE_TIMEOUT, EdgeOptions, Envoy, envoy_binary, render_bootstrap,
    repo_root,
};

/// Starts Envoy on free loopback ports with `wasm` configured by `plugin_config` (the registry
/// and settings), its files in `work_dir`.
pub async fn start_gateway(plugin_config: &Value, wasm: &Path, work_dir: &Path) -> Result<Envoy> {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    start_gateway_on(
        plugin_config,
        wasm,
        work_dir,
        (any, any),
        EdgeOptions::default(),
    )
    .await
}

/// [`start_gateway`] listening on `listen`, with its admin API on `admin`, and `edge`.
pub async fn start_gateway_on(
    plugin_config: &Value,
    wasm: &Path,
    work_dir: &Path,
    (listen, admin): (SocketAddr, SocketAddr),
    edge: EdgeOptions,
) -> Result<Envoy> {
    let bootstrap = render_bootstrap(&BootstrapOptions {
        listen,
        admin,
        wasm: wasm.to_owned(),
        plugin_config: plugin_config.to_string(),
        route_timeout: DEFAULT_ROUTE_TIMEOUT,
        edge,
    })?;
    let binary = envoy_binary(&repo_root())?;
    Envoy::start(&binary, &bootstrap, work_dir).await
}

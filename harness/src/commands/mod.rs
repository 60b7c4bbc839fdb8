//! The subcommands of `pinroute-harness`, one module each.

pub mod envoy_config;
pub mod sim_worker;
pub mod test;
pub mod up;

use anyhow::{Context, Result};

/// Waits for Ctrl-C or SIGTERM, so that Envoy and the workers are stopped either way.
pub async fn until_stopped() -> Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("waiting for Ctrl-C"),
        _ = terminate.recv() => Ok(()),
    }
}

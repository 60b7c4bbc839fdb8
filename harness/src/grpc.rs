//! The harness's gRPC servers (the stand-in picker, the OTLP receiver): bound on
//! `127.0.0.1`, served in the background until their task is aborted.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use tokio::task::JoinHandle;
use tonic::transport::server::{Router, TcpIncoming};

/// Serves `router` on a free loopback port: the address and the serving task.
pub async fn serve(router: Router, what: &'static str) -> Result<(SocketAddr, JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .with_context(|| format!("binding the {what}"))?;
    let address = listener
        .local_addr()
        .with_context(|| format!("reading the {what}'s port"))?;
    let server = tokio::spawn(async move {
        if let Err(error) = router
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
        {
            log::warn!("{what} stopped: {error}");
        }
    });
    Ok((address, server))
}

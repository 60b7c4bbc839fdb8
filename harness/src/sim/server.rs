//! The HTTP/1.1 accept loop. It is hand-rolled (rather than `axum::serve`) so that a
//! handler can drop its connection without answering ([`Fault::Close`](super::Fault)).

use std::fmt;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::ServiceExt;

/// How long `stop` waits for open requests before cutting their connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Response extension: drop the connection instead of writing this response.
#[derive(Debug, Clone, Copy)]
struct CloseConnection;

/// A response that makes the server close the connection without answering.
pub(crate) fn close_connection() -> Response {
    let mut response = Response::new(Body::empty());
    response.extensions_mut().insert(CloseConnection);
    response
}

#[derive(Debug)]
struct ClosedBySimulator;

impl fmt::Display for ClosedBySimulator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("connection closed by the simulator (fault injection)")
    }
}

impl std::error::Error for ClosedBySimulator {}

/// Serves `router` on `listener` until `shutdown` turns true (or its sender is dropped).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => spawn_connection(&mut connections, &graceful, stream, router.clone()),
                Err(error) => {
                    log::warn!("sim accept failed: {error}");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            },
            () = stop_requested(&mut shutdown) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        log::warn!("sim: requests still open after {SHUTDOWN_GRACE:?}, closing their connections");
    }
    connections.shutdown().await;
}

/// Resolves once the stop flag is set or its sender is gone.
pub(crate) async fn stop_requested(shutdown: &mut watch::Receiver<bool>) {
    // An error means the sender is gone: stopped as well.
    let stopped = shutdown.wait_for(|stopping| *stopping).await.is_ok();
    log::trace!("sim stop observed (flag set: {stopped})");
}

fn spawn_connection(
    connections: &mut JoinSet<()>,
    graceful: &GracefulShutdown,
    stream: TcpStream,
    router: Router,
) {
    if let Err(error) = stream.set_nodelay(true) {
        log::debug!("sim: set_nodelay failed: {error}");
    }
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        dispatch(router.clone(), request)
    });
    let connection =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    let connection = graceful.watch(connection);
    connections.spawn(async move {
        if let Err(error) = connection.await {
            log::debug!("sim connection ended: {error}");
        }
    });
}

async fn dispatch(
    router: Router,
    request: hyper::Request<Incoming>,
) -> Result<Response, ClosedBySimulator> {
    let request: Request = request.map(Body::new);
    let response = match router.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    match response.extensions().get::<CloseConnection>() {
        Some(_) => Err(ClosedBySimulator),
        None => Ok(response),
    }
}

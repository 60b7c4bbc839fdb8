//! A live worker registry served over HTTP (`GET /registry`), changed while traffic runs.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::task::JoinHandle;

/// What `GET /registry` answers: the status and the body, as set by the test.
type Answer = Arc<Mutex<(StatusCode, String)>>;

pub struct RegistryServer {
    addr: SocketAddr,
    answer: Answer,
    server: JoinHandle<()>,
}

impl RegistryServer {
    pub async fn start(initial: &serde_json::Value) -> Result<Self> {
        let answer: Answer = Arc::new(Mutex::new((StatusCode::OK, initial.to_string())));
        let app = Router::new()
            .route("/registry", get(serve))
            .with_state(answer.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the registry server")?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                log::error!("registry server stopped: {error}");
            }
        });
        Ok(Self {
            addr,
            answer,
            server,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves `{"workers": workers}` from now on.
    pub fn set_workers(&self, workers: &[serde_json::Value]) {
        self.set_answer(
            StatusCode::OK,
            serde_json::json!({ "workers": workers }).to_string(),
        );
    }

    /// Serves anything, e.g. a broken registry the filter must refuse.
    pub fn set_answer(&self, status: StatusCode, body: String) {
        if let Ok(mut answer) = self.answer.lock() {
            *answer = (status, body);
        }
    }
}

impl Drop for RegistryServer {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn serve(
    State(answer): State<Answer>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let (status, body) = answer
        .lock()
        .map(|a| a.clone())
        .unwrap_or((StatusCode::INTERNAL_SERVER_ERROR, String::new()));
    (status, [("content-type", "application/json")], body)
}

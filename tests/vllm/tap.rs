//! A recording HTTP proxy in front of one engine: the gateway's registry names the tap, which
//! forwards every request unchanged and keeps the exact bytes of each request and response body,
//! so the suite can compare what prefill returned with what decode received, byte for byte.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// One request the tap forwarded, and the engine's answer.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub path: String,
    pub request_body: Bytes,
    pub status: u16,
    pub response_body: Bytes,
}

pub struct Tap {
    address: SocketAddr,
    exchanges: Arc<Mutex<Vec<Exchange>>>,
    server: JoinHandle<()>,
}

/// Headers that describe one connection or one encoding of the body, not the request.
const HOP_BY_HOP: [&str; 5] = [
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "keep-alive",
];

impl Tap {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Tap {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let address = listener.local_addr().unwrap();
        let exchanges = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&exchanges);
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (client, recorded) = (client.clone(), Arc::clone(&recorded));
                let service = service_fn(move |request| {
                    forward(request, upstream, client.clone(), Arc::clone(&recorded))
                });
                tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
            }
        });
        Tap {
            address,
            exchanges,
            server,
        }
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The exchanges recorded since the last call.
    pub fn take(&self) -> Vec<Exchange> {
        std::mem::take(&mut *self.exchanges.lock().unwrap())
    }

    /// The exchanges recorded since the last [`Tap::take`], which still gets them.
    pub fn peek(&self) -> Vec<Exchange> {
        self.exchanges.lock().unwrap().clone()
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn forward(
    request: Request<Incoming>,
    upstream: SocketAddr,
    client: reqwest::Client,
    recorded: Arc<Mutex<Vec<Exchange>>>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let (parts, body) = request.into_parts();
    let request_body = body.collect().await?.to_bytes();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut outgoing = client
        .request(parts.method, format!("http://{upstream}{path}"))
        .body(request_body.clone());
    for (name, value) in &parts.headers {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            outgoing = outgoing.header(name, value);
        }
    }
    let (status, headers, response_body) = match outgoing.send().await {
        Ok(answer) => {
            let (status, headers) = (answer.status(), answer.headers().clone());
            (status, headers, answer.bytes().await.unwrap_or_default())
        }
        Err(e) => (
            reqwest::StatusCode::BAD_GATEWAY,
            reqwest::header::HeaderMap::new(),
            Bytes::from(format!("tap: {e}")),
        ),
    };
    recorded.lock().unwrap().push(Exchange {
        path,
        request_body,
        status: status.as_u16(),
        response_body: response_body.clone(),
    });
    let mut response = Response::builder().status(status);
    for (name, value) in &headers {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            response = response.header(name, value);
        }
    }
    Ok(response.body(Full::new(response_body)).unwrap())
}

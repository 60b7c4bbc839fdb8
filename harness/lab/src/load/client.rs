//! A minimal HTTP/1.1 client for load generation: each virtual user keeps one keep-alive
//! connection per server (no shared pool, no locks) and times every exchange to the first
//! and the last byte of the response body.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::body::ChunkedBody;

/// Bytes of a response body kept for the workload to inspect; the rest is only counted.
pub const KEPT_BODY_BYTES: usize = 256 * 1024;
/// Bytes at the end of a response body always kept (an SSE stream's `data: [DONE]`).
pub const TAIL_BYTES: usize = 64;

/// Why an exchange produced no complete response.
#[derive(Debug)]
pub enum TransportError {
    Connect(SocketAddr, std::io::Error),
    TlsHandshake(SocketAddr, std::io::Error),
    Handshake(SocketAddr, hyper::Error),
    Send(SocketAddr, hyper::Error),
    Body(SocketAddr, hyper::Error),
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::Connect(to, e) => write!(f, "connecting to {to}: {e}"),
            TransportError::TlsHandshake(to, e) => write!(f, "TLS handshake with {to}: {e}"),
            TransportError::Handshake(to, e) => write!(f, "HTTP handshake with {to}: {e}"),
            TransportError::Send(to, e) => write!(f, "request to {to}: {e}"),
            TransportError::Body(to, e) => write!(f, "response body from {to}: {e}"),
        }
    }
}

impl std::error::Error for TransportError {}

/// An exchange without a complete response, and the response head if one arrived.
#[derive(Debug)]
pub struct FailedExchange {
    /// Status and headers, when the failure came while reading the body.
    pub head: Option<(StatusCode, HeaderMap)>,
    pub error: TransportError,
}

impl FailedExchange {
    fn without_head(error: TransportError) -> Self {
        FailedExchange { head: None, error }
    }
}

/// A finished request/response exchange.
#[derive(Debug)]
pub struct Exchange {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// When the first body byte arrived (`None` for an empty body).
    pub first_byte: Option<Instant>,
    /// When the body ended.
    pub last_byte: Instant,
    /// The body, up to [`KEPT_BODY_BYTES`].
    pub body: Vec<u8>,
    /// The last [`TAIL_BYTES`] of the body, however long it was.
    pub tail: Vec<u8>,
    pub body_len: u64,
}

impl Exchange {
    /// The first byte of the body, or the end of the response when the body is empty.
    pub fn first_byte_or_end(&self) -> Instant {
        self.first_byte.unwrap_or(self.last_byte)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// How a client speaks TLS to its servers: whom it trusts, the name it asks for, and the
/// certificate it presents if any (all in the connector's configuration).
#[derive(Clone)]
pub struct ClientTls {
    pub connector: TlsConnector,
    pub server_name: ServerName<'static>,
}

/// The keep-alive connections of one virtual user, one per server.
#[derive(Default)]
pub struct Connections {
    open: HashMap<SocketAddr, SendRequest<ChunkedBody>>,
    /// Connections opened so far (a keep-alive client opens one per server).
    pub opened: u64,
    /// TLS on every connection; `None`: clear text.
    tls: Option<ClientTls>,
}

impl Connections {
    pub fn new(tls: Option<ClientTls>) -> Self {
        Connections {
            tls,
            ..Connections::default()
        }
    }

    /// Forgets every connection (after a timeout left one mid-exchange).
    pub fn reset(&mut self) {
        self.open.clear();
    }

    /// Sends `request` to `server` and reads the whole response, timing its body.
    pub async fn exchange(
        &mut self,
        server: SocketAddr,
        request: Request<ChunkedBody>,
    ) -> Result<Exchange, TransportError> {
        self.exchange_keeping_head(server, request)
            .await
            .map_err(|failed| failed.error)
    }

    /// [`Connections::exchange`], but a failure keeps the response head when one arrived
    /// (a body cut short, such as a stream whose upstream died).
    pub async fn exchange_keeping_head(
        &mut self,
        server: SocketAddr,
        request: Request<ChunkedBody>,
    ) -> Result<Exchange, FailedExchange> {
        let sender = self
            .ready_sender(server)
            .await
            .map_err(FailedExchange::without_head)?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| FailedExchange::without_head(TransportError::Send(server, e)))?;
        let (parts, body) = response.into_parts();
        let received = read_body(body).await.map_err(|e| FailedExchange {
            head: Some((parts.status, parts.headers.clone())),
            error: TransportError::Body(server, e),
        })?;
        Ok(Exchange {
            status: parts.status,
            headers: parts.headers,
            first_byte: received.first_byte,
            last_byte: Instant::now(),
            body: received.kept,
            tail: received.tail,
            body_len: received.len,
        })
    }

    async fn ready_sender(
        &mut self,
        server: SocketAddr,
    ) -> Result<&mut SendRequest<ChunkedBody>, TransportError> {
        let reusable = match self.open.get_mut(&server) {
            Some(sender) => sender.ready().await.is_ok(),
            None => false,
        };
        if !reusable {
            let sender = connect(server, self.tls.as_ref()).await?;
            self.opened += 1;
            self.open.insert(server, sender);
        }
        self.open
            .get_mut(&server)
            .ok_or_else(|| TransportError::Connect(server, std::io::ErrorKind::NotConnected.into()))
    }
}

async fn connect(
    server: SocketAddr,
    tls: Option<&ClientTls>,
) -> Result<SendRequest<ChunkedBody>, TransportError> {
    let stream = TcpStream::connect(server)
        .await
        .map_err(|e| TransportError::Connect(server, e))?;
    if let Err(e) = stream.set_nodelay(true) {
        log::debug!("set_nodelay on a connection to {server}: {e}");
    }
    match tls {
        None => handshake(server, stream).await,
        Some(tls) => {
            let stream = tls
                .connector
                .connect(tls.server_name.clone(), stream)
                .await
                .map_err(|e| TransportError::TlsHandshake(server, e))?;
            handshake(server, stream).await
        }
    }
}

async fn handshake<S>(
    server: SocketAddr,
    stream: S,
) -> Result<SendRequest<ChunkedBody>, TransportError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| TransportError::Handshake(server, e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            log::debug!("connection to {server} ended: {e}");
        }
    });
    Ok(sender)
}

#[derive(Default)]
struct Received {
    first_byte: Option<Instant>,
    kept: Vec<u8>,
    tail: Vec<u8>,
    len: u64,
}

impl Received {
    fn add(&mut self, chunk: &Bytes) {
        if chunk.is_empty() {
            return;
        }
        self.first_byte.get_or_insert_with(Instant::now);
        self.len += chunk.len() as u64;
        let room = KEPT_BODY_BYTES.saturating_sub(self.kept.len());
        self.kept
            .extend_from_slice(chunk.get(..room.min(chunk.len())).unwrap_or_default());
        self.tail.extend_from_slice(chunk);
        let excess = self.tail.len().saturating_sub(TAIL_BYTES);
        self.tail.drain(..excess);
    }
}

async fn read_body(mut body: hyper::body::Incoming) -> Result<Received, hyper::Error> {
    let mut received = Received::default();
    while let Some(frame) = body.frame().await {
        if let Ok(chunk) = frame?.into_data() {
            received.add(&chunk);
        }
    }
    Ok(received)
}

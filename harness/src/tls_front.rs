//! TLS for the tests of `docs/deploy.md` §2.8: a front that terminates TLS (optionally
//! requiring a client certificate) and relays the bytes to a plain worker, as a vLLM started
//! with `--ssl-certfile`/`--ssl-ca-certs` would serve; and a client that speaks HTTP/1.1
//! over TLS to the gateway, or to a vLLM that serves TLS itself.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, anyhow};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::certs::Issued;

/// A TLS listener relaying each connection to `target`.
pub struct TlsFront {
    addr: SocketAddr,
    handshakes: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl TlsFront {
    /// Serves `server`'s certificate on a free loopback port; with `client_ca`, only clients
    /// presenting a certificate that CA signed complete the handshake.
    pub async fn start(
        server: &Issued,
        client_ca: Option<&Path>,
        target: SocketAddr,
    ) -> Result<TlsFront> {
        let builder = match client_ca {
            Some(ca) => {
                let verifier = WebPkiClientVerifier::builder(Arc::new(roots(ca)?))
                    .build()
                    .context("building the client verifier")?;
                ServerConfig::builder().with_client_cert_verifier(verifier)
            }
            None => ServerConfig::builder().with_no_client_auth(),
        };
        let config = builder
            .with_single_cert(certificates(&server.cert)?, private_key(&server.key)?)
            .context("the front's certificate")?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let handshakes = Arc::new(AtomicU64::new(0));
        let counted = handshakes.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (acceptor, counted) = (acceptor.clone(), counted.clone());
                tokio::spawn(async move {
                    // The worker first: a worker that is down then fails the gateway's
                    // connection during the handshake, as a worker serving TLS itself would,
                    // not with a reset after it.
                    let Ok(mut plain) = TcpStream::connect(target).await else {
                        return;
                    };
                    let Ok(mut tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    counted.fetch_add(1, Ordering::Relaxed);
                    // No Nagle delay on either side: a relay must not add latency of its own.
                    let _ = tls.get_ref().0.set_nodelay(true);
                    let _ = plain.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        Ok(TlsFront {
            addr,
            handshakes,
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections whose TLS handshake completed.
    pub fn handshakes(&self) -> u64 {
        self.handshakes.load(Ordering::Relaxed)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long [`https_request`] waits for the whole answer.
pub const TLS_CLIENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What [`https_request`] got: the protocol the server chose by ALPN, and the raw answer.
#[derive(Debug)]
pub struct TlsAnswer {
    pub alpn: Option<Vec<u8>>,
    pub response: String,
}

/// Sends `request` (raw HTTP/1.1, `connection: close`) over TLS to `addr`, trusting `ca`
/// for `server_name` and offering `alpn`; reads the whole answer (for an empty request,
/// only the handshake is made). Gives up after [`TLS_CLIENT_TIMEOUT`].
pub async fn https_request(
    addr: SocketAddr,
    ca: &Path,
    server_name: &str,
    alpn: &[&[u8]],
    request: &str,
) -> Result<TlsAnswer> {
    let mut config = client_config(ca, None)?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tls_exchange(addr, config, server_name, request).await
}

/// `GET path` over TLS to `addr` (an IP address in its certificate), trusting `ca` and
/// presenting `client`: the status and the body (an answer that is not chunked, as vLLM's
/// server sends for everything but streams).
pub async fn https_get(
    addr: SocketAddr,
    ca: &Path,
    client: &Issued,
    path: &str,
) -> Result<(u16, String)> {
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    let config = client_config(ca, Some(client))?;
    let answer = tls_exchange(addr, config, &addr.ip().to_string(), &request).await?;
    let response = answer.response;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("no HTTP answer from {addr}{path}: {response:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow!("no status from {addr}{path}: {head:?}"))?;
    Ok((status, body.to_owned()))
}

async fn tls_exchange(
    addr: SocketAddr,
    config: ClientConfig,
    server_name: &str,
    request: &str,
) -> Result<TlsAnswer> {
    let name =
        ServerName::try_from(server_name.to_owned()).map_err(|e| anyhow!("{server_name}: {e}"))?;
    let stream = TcpStream::connect(addr).await?;
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await
        .with_context(|| format!("TLS handshake with {addr}"))?;
    let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let mut answer = Vec::new();
    if !request.is_empty() {
        tls.write_all(request.as_bytes()).await?;
        // A close_notify-less end of stream still leaves the answer read.
        let read = tokio::time::timeout(TLS_CLIENT_TIMEOUT, tls.read_to_end(&mut answer)).await;
        read.map_err(|_| anyhow!("no whole answer in {TLS_CLIENT_TIMEOUT:?}"))?
            .ok();
    }
    Ok(TlsAnswer {
        alpn,
        response: String::from_utf8_lossy(&answer).into_owned(),
    })
}

/// A client trusting `ca`, presenting `certificate` to servers that ask for one.
pub fn client_config(ca: &Path, certificate: Option<&Issued>) -> Result<ClientConfig> {
    let builder = ClientConfig::builder().with_root_certificates(roots(ca)?);
    Ok(match certificate {
        Some(issued) => builder
            .with_client_auth_cert(certificates(&issued.cert)?, private_key(&issued.key)?)
            .context("the client certificate")?,
        None => builder.with_no_client_auth(),
    })
}

fn roots(ca: &Path) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(ca)? {
        roots.add(cert).context("adding the CA certificate")?;
    }
    Ok(roots)
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", path.display()))
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).with_context(|| format!("reading {}", path.display()))
}

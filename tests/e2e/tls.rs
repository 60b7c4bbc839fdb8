//! TLS on both sides (`docs/deploy.md` §2.8): the listener terminates clients' TLS with
//! HTTP/2 by ALPN; both hops reach workers served over (mutual) TLS, and a worker whose
//! certificate the gateway does not trust, or that does not trust the gateway's, fails the
//! hop with a typed error at once.

use std::path::Path;
use std::time::Duration;

use pinroute_harness::certs::{Issued, LocalCa, Usage};
use pinroute_harness::envoy::{ListenerTls, WorkerTls};
use pinroute_harness::stack::WorkerFronts;
use pinroute_harness::tls_front::https_request;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{complete, prompt};
use crate::{Deployment, StackSpec, disaggregated_spec, nothing_reached_a_worker, start};

const WORKER_NAME: &str = "worker.pinroute.test";

pub struct Pki {
    _dir: TempDir,
    pub ca: LocalCa,
    pub worker: Issued,
    gateway_client: Issued,
}

/// A CA, a worker certificate for [`WORKER_NAME`] and the gateway's client certificate.
pub fn pki() -> Pki {
    let dir = TempDir::new().unwrap();
    let ca = LocalCa::create(dir.path(), "pinroute test CA").unwrap();
    let worker = ca.issue("worker", &[WORKER_NAME], Usage::Server).unwrap();
    let gateway_client = ca.issue("gateway", &["gateway"], Usage::Client).unwrap();
    Pki {
        _dir: dir,
        ca,
        worker,
        gateway_client,
    }
}

/// Workers behind TLS fronts presenting `server`, requiring a client certificate from
/// `client_ca`; the gateway trusts `pki`'s CA and presents its client certificate.
async fn behind_worker_tls(pki: &Pki, server: &Issued, client_ca: Option<&Path>) -> Deployment {
    start(worker_tls_spec(pki, server, client_ca)).await
}

/// The deployment of [`behind_worker_tls`], not started.
pub fn worker_tls_spec(pki: &Pki, server: &Issued, client_ca: Option<&Path>) -> StackSpec {
    let mut spec = disaggregated_spec();
    spec.worker_fronts = Some(WorkerFronts {
        server: server.clone(),
        client_ca: client_ca.map(Path::to_owned),
    });
    spec.edge.worker_tls = Some(WorkerTls {
        ca: pki.ca.cert_path(),
        client_cert: Some((
            pki.gateway_client.cert.clone(),
            pki.gateway_client.key.clone(),
        )),
        names: vec![WORKER_NAME.into()],
    });
    spec
}

#[tokio::test]
async fn both_hops_reach_workers_over_mutual_tls() {
    let pki = pki();
    let deployment = behind_worker_tls(&pki, &pki.worker, Some(&pki.ca.cert_path())).await;
    let reply = complete(&deployment, &[], &prompt()).await;
    reply.assert_ok("a request to workers behind mutual TLS");
    for hop in ["prefill", "decode"] {
        let id = reply.worker(hop).unwrap();
        let front = &deployment.fronts.iter().find(|(w, _)| *w == id).unwrap().1;
        assert!(
            front.handshakes() >= 1,
            "{hop} worker {id}: no TLS handshake"
        );
        assert_eq!(deployment.worker(id).unwrap().requests().len(), 1, "{hop}");
    }
}

#[tokio::test]
async fn a_worker_the_gateway_does_not_trust_fails_the_request_with_a_typed_error() {
    let pki = pki();
    // Signed by another CA, or by ours for another name: both refused by the gateway.
    let other_dir = TempDir::new().unwrap();
    let other = LocalCa::create(other_dir.path(), "someone else's CA").unwrap();
    let untrusted = other
        .issue("worker", &[WORKER_NAME], Usage::Server)
        .unwrap();
    let misnamed = pki
        .ca
        .issue("other", &["other.pinroute.test"], Usage::Server)
        .unwrap();
    for server in [&untrusted, &misnamed] {
        let deployment = behind_worker_tls(&pki, server, None).await;
        let started = std::time::Instant::now();
        let reply = complete(&deployment, &[], &prompt()).await;
        reply.error(502, "upstream_failed");
        assert!(
            started.elapsed().as_secs() < 10,
            "not a hang: {:?}",
            started.elapsed()
        );
        assert!(nothing_reached_a_worker(&deployment));
    }
}

#[tokio::test]
async fn a_worker_that_does_not_trust_the_gateway_fails_the_request_with_a_typed_error() {
    let pki = pki();
    let other_dir = TempDir::new().unwrap();
    let other = LocalCa::create(other_dir.path(), "the workers' own CA").unwrap();
    let deployment = behind_worker_tls(&pki, &pki.worker, Some(&other.cert_path())).await;
    let reply = complete(&deployment, &[], &prompt()).await;
    reply.error(502, "upstream_failed");
    assert!(nothing_reached_a_worker(&deployment));
}

#[tokio::test]
async fn clients_get_tls_with_http2_by_alpn() {
    let pki = pki();
    let listener = pki
        .ca
        .issue("gateway-listener", &["localhost"], Usage::Server)
        .unwrap();
    let mut spec = disaggregated_spec();
    spec.edge.tls = Some(ListenerTls {
        cert: listener.cert,
        key: listener.key,
        client_ca: None,
    });
    let deployment = start(spec).await;
    let addr = deployment.envoy.listen();
    let ca = pki.ca.cert_path();
    let offered = https_request(addr, &ca, "localhost", &[b"h2", b"http/1.1"], "")
        .await
        .unwrap();
    assert_eq!(offered.alpn.as_deref(), Some(&b"h2"[..]), "HTTP/2 by ALPN");
    let body = prompt().to_string();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = https_request(addr, &ca, "localhost", &[b"http/1.1"], &request)
        .await
        .unwrap();
    assert!(
        answer.response.starts_with("HTTP/1.1 200"),
        "{}",
        answer.response
    );
    assert!(
        answer.response.contains("x-pinroute-decode-worker"),
        "{}",
        answer.response
    );
    // The same listener answers no clear text.
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut answer));
    let _ = read.await;
    assert!(
        !answer.starts_with(b"HTTP/1.1 200"),
        "clear text was served"
    );
}

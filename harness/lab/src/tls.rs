//! TLS on both sides of a measured gateway, from a CA made for the run: the listener's
//! certificate, the load generator's client, and with mutual TLS the clients' and the
//! gateway's certificates and the workers' (for the TLS fronts in front of the sim workers).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use pinroute_harness::certs::{Issued, LocalCa, Usage};
use pinroute_harness::envoy::{ListenerTls, WorkerTls};
use pinroute_harness::tls_front::client_config;
use rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

use crate::load::ClientTls;

/// The name on the workers' certificates, which the gateway checks.
pub const WORKER_NAME: &str = "worker.lab.local";
/// The name on the gateway's certificate, which the load generator asks for.
const GATEWAY_NAME: &str = "localhost";

/// Everything one run's TLS needs.
pub struct RunTls {
    /// The CA that signed everything (the fronts require clients it signed).
    pub ca: PathBuf,
    pub listener: ListenerTls,
    pub client: ClientTls,
    /// With mutual TLS: the certificate the workers' fronts present, and how the gateway
    /// checks them and presents its own.
    pub workers: Option<(Issued, WorkerTls)>,
}

impl RunTls {
    /// TLS to the clients; with `mutual`, clients present certificates and the workers are
    /// reached over mutual TLS too. Files are written under `dir`.
    pub fn create(dir: &Path, mutual: bool) -> Result<RunTls> {
        let authority = LocalCa::create(dir, "pinroute lab CA")?;
        let ca = authority.cert_path();
        let listener = authority.issue("gateway", &[GATEWAY_NAME], Usage::Server)?;
        let listener = ListenerTls {
            cert: listener.cert,
            key: listener.key,
            client_ca: mutual.then(|| ca.clone()),
        };
        let client_cert = match mutual {
            true => Some(authority.issue("client", &["lab-client"], Usage::Client)?),
            false => None,
        };
        let client = ClientTls {
            connector: TlsConnector::from(Arc::new(client_config(&ca, client_cert.as_ref())?)),
            server_name: ServerName::try_from(GATEWAY_NAME)?,
        };
        let workers = match mutual {
            true => Some(worker_tls(&authority)?),
            false => None,
        };
        Ok(RunTls {
            ca,
            listener,
            client,
            workers,
        })
    }
}

fn worker_tls(authority: &LocalCa) -> Result<(Issued, WorkerTls)> {
    let server = authority.issue("worker", &[WORKER_NAME], Usage::Server)?;
    let gateway = authority.issue("gateway-client", &["pinroute-gateway"], Usage::Client)?;
    let tls = WorkerTls {
        ca: authority.cert_path(),
        client_cert: Some((gateway.cert, gateway.key)),
        names: vec![WORKER_NAME.into()],
    };
    Ok((server, tls))
}

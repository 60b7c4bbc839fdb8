//! After the soak: every worker is back in service and unpinned requests spread as on a
//! fresh gateway. The filter counts requests in flight per worker (shared data) and prefers
//! the less loaded of two workers; a count left behind by a request the kills cut short would
//! make its worker look busy forever, and it would get (almost) no unpinned request.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use http::Request;
use serde::Serialize;

use super::deployment::{DECODE_WORKERS, PREFILL_WORKERS};
use super::mix::COMPLETIONS;
use crate::load::{ChunkedBody, ClientTls, Connections};

/// Sequential unpinned requests sent after the soak.
pub const RECOVERY_REQUESTS: u64 = 60;

/// Where the post-soak requests went.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Recovery {
    pub requests: u64,
    pub decode: BTreeMap<u64, u64>,
    pub prefill: BTreeMap<u64, u64>,
    /// Requests that were not a 2xx with a decode worker named.
    pub failed: u64,
    pub problems: Vec<String>,
}

impl Recovery {
    /// Sends [`RECOVERY_REQUESTS`] unpinned completions one after the other and checks that
    /// each worker took at least half its fair share.
    pub async fn check(gateway: SocketAddr, tls: Option<ClientTls>) -> Recovery {
        let mut recovery = Recovery {
            requests: RECOVERY_REQUESTS,
            ..Recovery::default()
        };
        for (id, _) in DECODE_WORKERS {
            recovery.decode.insert(id, 0);
        }
        for (id, _) in PREFILL_WORKERS {
            recovery.prefill.insert(id, 0);
        }
        let mut connections = Connections::new(tls);
        for seq in 0..RECOVERY_REQUESTS {
            recovery.send(&mut connections, gateway, seq).await;
        }
        recovery.check_spread();
        recovery
    }

    async fn send(&mut self, connections: &mut Connections, gateway: SocketAddr, seq: u64) {
        let body =
            format!(r#"{{"model":"sim-model","prompt":"after the soak {seq}","max_tokens":2}}"#);
        let request = Request::post(COMPLETIONS)
            .header("host", "soak")
            .header("content-type", "application/json")
            .header("content-length", body.len())
            .body(ChunkedBody::from(bytes::Bytes::from(body)))
            .unwrap_or_else(|_| Request::new(ChunkedBody::empty()));
        let exchange = match connections.exchange(gateway, request).await {
            Ok(exchange) => exchange,
            Err(error) => return self.fail(format!("after the soak: no answer: {error}")),
        };
        let id = |name: &str| exchange.header(name).and_then(|v| v.parse::<u64>().ok());
        match (exchange.status.is_success(), id("x-pinroute-decode-worker")) {
            (true, Some(decode)) => {
                *self.decode.entry(decode).or_default() += 1;
                if let Some(prefill) = id("x-pinroute-prefill-worker") {
                    *self.prefill.entry(prefill).or_default() += 1;
                }
            }
            _ => {
                let body = String::from_utf8_lossy(&exchange.body)
                    .chars()
                    .take(200)
                    .collect::<String>();
                self.fail(format!("after the soak: {} {body}", exchange.status));
            }
        }
    }

    fn fail(&mut self, problem: String) {
        self.failed += 1;
        if self.problems.len() < 5 {
            self.problems.push(problem);
        }
    }

    fn check_spread(&mut self) {
        let served = self.requests.saturating_sub(self.failed);
        let mut problems = Vec::new();
        for (pool, counts) in [("decode", &self.decode), ("prefill", &self.prefill)] {
            let fair = served / counts.len().max(1) as u64;
            for (worker, got) in counts {
                if *got < fair / 2 {
                    problems.push(format!(
                        "after the soak, {pool} worker {worker} took {got} of {served} unpinned requests (fair share {fair}): \
                         out of service, or still counted busy by requests that ended"
                    ));
                }
            }
        }
        self.problems.extend(problems);
    }

    /// `201: 20, 202: 20, ...`.
    pub fn spread(counts: &BTreeMap<u64, u64>) -> String {
        counts
            .iter()
            .map(|(id, n)| format!("{id}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

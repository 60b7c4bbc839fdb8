//! The filter's own retry of a decode hop (`docs/semantics.md` §4): an unpinned hop whose
//! worker refused the connection, when Envoy cannot retry it because the pool cluster does
//! not list the worker (one known only from the live registry). The filter keeps the request
//! it routed, sends it to the next candidate through the decode cluster, and answers the
//! client with that answer, whole.

use super::env::Env;
use super::host::{Headers, Host};
use super::intake::forwarded_headers;
use super::metrics::Counter;
use super::prefill::CallAnswer;
use super::response::{Answer, Outcome, Routed};
use super::stream::host_failure;
use crate::policy::answers;
use crate::policy::config::DECODE_CLUSTER;
use crate::policy::error::RouteError;
use crate::policy::headers::{INTERNAL_PREFIX, RELAYED_HEADER};
use crate::policy::registry::Worker;

/// The routed request, kept to send it again.
pub(super) struct DecodeRetry {
    /// Its headers as routed, but for the steering and hop-by-hop ones.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// The call in flight, if one is.
    pub token: Option<u32>,
}

/// The request headers a call carries besides the forwarded ones.
const CALL_HEADERS: &[&str] = &[
    ":method",
    ":path",
    ":authority",
    "content-type",
    "x-request-id",
];

/// Answer headers not relayed: Envoy frames the answer anew.
const NOT_RELAYED: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
];

impl<H: Host> Env<H> {
    /// The request as it is routed, with the `body_len` bytes of body Envoy holds.
    pub(super) fn keep_for_retry(&self, body_len: usize) -> Result<DecodeRetry, RouteError> {
        let routed = self.host.request_headers().map_err(host_failure)?;
        let mut headers: Vec<(String, String)> = routed
            .iter()
            .filter(|(name, _)| CALL_HEADERS.contains(&name.as_str()))
            .filter_map(|(name, value)| {
                Some((name.clone(), String::from_utf8(value.clone()).ok()?))
            })
            .collect();
        headers.extend(forwarded_headers(
            &routed,
            &self.config.settings.upstream_header,
        ));
        let body = match body_len {
            0 => Vec::new(),
            len => self.host.request_body(len).map_err(host_failure)?,
        };
        Ok(DecodeRetry {
            headers,
            body,
            token: None,
        })
    }

    /// Sends the kept request to `worker` through the decode cluster; the call's token.
    pub(super) fn dispatch_decode(&self, retry: &DecodeRetry, worker: &Worker) -> Option<u32> {
        let settings = &self.config.settings;
        let address = worker.address.to_string();
        let mut headers: Vec<(&str, &str)> = retry
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        headers.push((&settings.upstream_header, &address));
        let body = (!retry.body.is_empty()).then_some(retry.body.as_slice());
        self.call(DECODE_CLUSTER, &headers, body, settings.decode_timeout())
    }

    /// Answers the client with a retried hop's answer, naming the workers that served when
    /// worker ids are shown.
    pub(super) fn relay(&self, call: &CallAnswer, status: u16, served: &[(&str, String)]) {
        let mut headers: Vec<(&str, &str)> = relayed(&call.headers).collect();
        headers.push((RELAYED_HEADER, "decode"));
        if self.config.settings.worker_id_headers {
            headers.extend(served.iter().map(|(name, value)| (*name, value.as_str())));
        }
        if let Err(status) = self.host.send_response(status, &headers, &call.body) {
            log::error!(
                "pinroute: could not answer {} with its retried hop's answer: {status:?}",
                self.request_id
            );
        }
    }
}

/// The worker's answer headers the client gets: never one that speaks for the filter.
fn relayed(headers: &Headers) -> impl Iterator<Item = (&str, &str)> {
    headers
        .iter()
        .filter(|(name, _)| {
            !name.starts_with(':')
                && !name.starts_with(INTERNAL_PREFIX)
                && !NOT_RELAYED.contains(&name.as_str())
        })
        .filter_map(|(name, value)| Some((name.as_str(), std::str::from_utf8(value).ok()?)))
}

impl Routed {
    /// Sends the kept request to the next candidate, if the filter retries this hop and one
    /// is left; the hop then counts against that worker.
    pub(super) fn retry_next<H: Host>(&mut self, env: &Env<H>) -> bool {
        let Some(retry) = &mut self.retry else {
            return false;
        };
        let Some(next) = self.decode.alternates.first() else {
            return false;
        };
        let Some(token) = env.dispatch_decode(retry, next) else {
            return false;
        };
        retry.token = Some(token);
        let next = self.decode.alternates.remove(0);
        log::info!(
            "pinroute: request {}: decode worker {} refused the connection, sent to worker {}",
            env.request_id,
            self.decode.target.worker.id,
            next.id
        );
        env.count(Counter::DecodeRetried);
        env.count_outstanding(self.decode.target.worker.id, -1);
        env.count_outstanding(next.id, 1);
        self.decode.target.worker = next;
        true
    }

    /// Whether the filter's retry with this token is what the request waits for.
    pub fn awaits(&self, token: u32) -> bool {
        self.retry.as_ref().and_then(|r| r.token) == Some(token)
    }

    /// The retried hop's answer: on to the next candidate after another refused connection,
    /// else the client's answer in place of Envoy's — the worker's, whole, or a typed error.
    pub fn on_retry_answer<H: Host>(&mut self, env: &Env<H>, body_size: usize) {
        if let Some(retry) = &mut self.retry {
            retry.token = None;
        }
        let call = CallAnswer::read(&env.host, body_size, usize::MAX);
        let worker = self.worker();
        let failure = answers::decode_call_failure(call.status, &call.body);
        let status = call.status.unwrap_or(0);
        match self.outcome(env, worker, status, failure) {
            Outcome::Retrying => return,
            Outcome::Passed => env.relay(&call, status, &self.served(worker)),
            Outcome::Failed(error) => {
                log::warn!("pinroute: request {}: {error}", env.request_id);
                env.metrics.count_error(&env.host, &error);
                env.send_error(&error);
            }
        }
        self.retry = None;
        self.answer = Answer::AsItIs;
    }
}

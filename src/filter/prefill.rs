//! The prefill hop (`docs/semantics.md` §4): the filter's own call to a prefill worker,
//! its retry on the next candidate, and what its answer means for the request.

use std::time::Duration;

use super::env::Env;
use super::host::{Headers, Host};
use super::intake::header_text;
use super::metrics::Counter;
use super::response::{HeldBody, RoutedBody, ServedPrefill};
use super::stream::{Completion, Phase};
use crate::policy::answers::{self, PrefillAnswer};
use crate::policy::error::RouteError;
use crate::policy::headers::{self, DP_RANK_HEADER};
use crate::policy::hop::{Hop, HopFailure};
use crate::policy::json::JsonObject;
use crate::policy::resolve::{Target, TokenHop};
use crate::policy::rewrite::{self, DecodeBody};

/// A prefill hop in flight, and what is needed to retry it or to go on to decode.
pub(super) struct Prefilling {
    pub token: u32,
    pub current: Target,
    /// Unpinned fallbacks still to try, next last.
    remaining: Vec<Target>,
    path: &'static str,
    forwarded: Vec<(String, String)>,
    /// The prefill body, kept only while a retry may need it.
    body: String,
    decode_body: DecodeBody,
    decode: TokenHop,
    /// Size of the request body Envoy holds.
    held_body_size: usize,
    /// When the current attempt was dispatched, in nanoseconds.
    dispatched_at: u64,
}

impl Prefilling {
    /// The first attempt of `candidates` (in order), not yet dispatched.
    pub fn new(
        completion: &Completion,
        request: &JsonObject<'_>,
        mut candidates: Vec<Target>,
        decode_body: DecodeBody,
        decode: TokenHop,
        held_body_size: usize,
    ) -> Result<Box<Self>, RouteError> {
        candidates.reverse();
        let first = candidates
            .pop()
            .ok_or(RouteError::Internal("empty prefill plan"))?;
        Ok(Box::new(Self {
            token: 0,
            current: first,
            remaining: candidates,
            path: completion.path,
            forwarded: completion.forwarded.clone(),
            body: rewrite::prefill_body(request, held_body_size),
            decode_body,
            decode,
            held_body_size,
            dispatched_at: 0,
        }))
    }
}

/// A finished call's answer: its status (none without a response), headers and body.
pub(super) struct CallAnswer {
    pub status: Option<u16>,
    pub headers: Headers,
    /// Its size, as Envoy announced it.
    pub body_size: usize,
    /// Empty when over the reader's limit: not copied into the VM.
    pub body: Vec<u8>,
}

impl CallAnswer {
    /// The answer, its body read only when at most `limit` bytes.
    pub fn read(host: &impl Host, body_size: usize, limit: usize) -> Self {
        let headers = host.call_response_headers().unwrap_or_default();
        let body = match body_size {
            0 => Vec::new(),
            size if size <= limit => host.call_response_body(size).unwrap_or_default(),
            _ => Vec::new(),
        };
        Self {
            status: header_text(&headers, ":status").parse().ok(),
            body_size,
            body,
            headers,
        }
    }
}

impl<H: Host> Env<H> {
    pub(super) fn dispatch_prefill(
        &self,
        mut prefill: Box<Prefilling>,
    ) -> Result<Phase, RouteError> {
        let address = prefill.current.worker.address.to_string();
        let rank = prefill.current.rank.map(|r| r.to_string());
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", "POST"),
            (":path", prefill.path),
            (":authority", &address),
            ("content-type", "application/json"),
            ("x-request-id", &self.request_id),
            ("x-envoy-original-dst-host", &address),
            // The answer is parsed here: a worker must not compress it.
            ("accept-encoding", "identity"),
        ];
        if let Some(rank) = &rank {
            headers.push((DP_RANK_HEADER, rank));
        }
        headers.extend(
            prefill
                .forwarded
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str())),
        );
        let settings = &self.config.settings;
        let body = Some(prefill.body.as_bytes());
        let dispatched = self.call(
            &settings.prefill_cluster,
            &headers,
            body,
            settings.prefill_timeout(),
        );
        let token = dispatched.ok_or(RouteError::Internal(
            "the prefill hop could not be dispatched",
        ))?;
        let worker = prefill.current.worker.id;
        log::debug!(
            "pinroute: request {} prefill on worker {worker}",
            self.request_id
        );
        self.count_outstanding(worker, 1);
        if prefill.remaining.is_empty() {
            // No retry can need it: Envoy holds its own copy of what was sent.
            prefill.body = String::new();
        }
        prefill.token = token;
        prefill.dispatched_at = self.host.now_nanos();
        Ok(Phase::Prefill(prefill))
    }

    pub(super) fn on_prefill_answer(
        &self,
        prefill: Box<Prefilling>,
        body_size: usize,
    ) -> Result<Phase, RouteError> {
        let worker = prefill.current.worker.id;
        self.count_outstanding(worker, -1);
        let elapsed = self.host.now_nanos().saturating_sub(prefill.dispatched_at);
        self.metrics
            .record_prefill_latency(&self.host, Duration::from_nanos(elapsed));
        let max_kv = self.config.settings.max_kv_transfer_params_bytes;
        let call = CallAnswer::read(&self.host, body_size, answers::prefill_answer_limit(max_kv));
        match answers::prefill_answer(call.status, call.body_size, &call.body, max_kv) {
            PrefillAnswer::Ready(kv_transfer_params) => {
                self.count(Counter::PrefillOk);
                self.record_success(worker);
                let prefill = *prefill;
                let edit = prefill.decode_body.finish(kv_transfer_params.as_deref());
                let held = HeldBody::edited(prefill.held_body_size, edit);
                let served = ServedPrefill {
                    worker,
                    kv_transfer_params,
                };
                self.route(prefill.decode, RoutedBody::Held(held), Some(served))
            }
            PrefillAnswer::Refused(status) => {
                self.record_success(worker);
                Ok(self.pass_on_refusal(worker, status, &call))
            }
            PrefillAnswer::Failed(failure) => self.on_prefill_failure(prefill, failure),
        }
    }

    /// The prefill worker refused the request (4xx): the client gets the worker's answer.
    fn pass_on_refusal(&self, worker: u64, status: u16, call: &CallAnswer) -> Phase {
        log::debug!(
            "pinroute: request {}: prefill worker {worker} refused it with {status}",
            self.request_id
        );
        self.count(Counter::PrefillRefused);
        let worker = worker.to_string();
        let content_type = Some(header_text(&call.headers, "content-type"))
            .filter(|v| !v.is_empty())
            .unwrap_or("application/json");
        let mut headers = vec![
            ("content-type", content_type),
            (headers::RELAYED_HEADER, "prefill"),
        ];
        if self.config.settings.worker_id_headers {
            headers.push((headers::PREFILL_WORKER_HEADER, worker.as_str()));
        }
        if let Err(status) = self.host.send_response(status, &headers, &call.body) {
            log::error!(
                "pinroute: could not pass on the prefill answer of {}: {status:?}",
                self.request_id
            );
        }
        Phase::Answered
    }

    /// A failed prefill: the next candidate, else the decode worker prefills itself (unless
    /// that fallback is off), else a typed error.
    fn on_prefill_failure(
        &self,
        mut prefill: Box<Prefilling>,
        failure: HopFailure,
    ) -> Result<Phase, RouteError> {
        let worker = prefill.current.worker.id;
        log::warn!(
            "pinroute: request {}: prefill worker {worker} failed: {failure}",
            self.request_id
        );
        self.count(Counter::PrefillFailed);
        if answers::takes_worker_out(&failure) {
            self.record_connect_failure(worker);
        }
        if prefill.current.pinned {
            let hop = Hop::Prefill;
            return Err(RouteError::PinnedWorkerFailed {
                hop,
                worker,
                failure,
            });
        }
        if let Some(next) = prefill.remaining.pop() {
            self.count(Counter::PrefillRetried);
            prefill.current = next;
            return self.dispatch_prefill(prefill);
        }
        if !self.config.settings.aggregated_fallback {
            let hop = Hop::Prefill;
            return Err(RouteError::UpstreamFailed {
                hop,
                worker,
                failure,
            });
        }
        log::info!(
            "pinroute: request {}: no prefill worker left, decode prefills itself",
            self.request_id
        );
        self.count(Counter::AggregatedFallback);
        let prefill = *prefill;
        let held = HeldBody::edited(prefill.held_body_size, prefill.decode_body.finish(None));
        self.route(prefill.decode, RoutedBody::Held(held), None)
    }
}

//! One HTTP request through the filter: pins, the prefill hop, the routed decode hop.

use std::cell::Cell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, Status};
use serde_json::value::RawValue;

use super::envoy;
use super::metrics::{Counter, Metrics};
use super::shared;
use crate::policy::answers::{self, PrefillAnswer};
use crate::policy::availability::Observed;
use crate::policy::config::Config;
use crate::policy::error::RouteError;
use crate::policy::headers::{self, DP_RANK_HEADER};
use crate::policy::health::HealthTable;
use crate::policy::hop::{Hop, HopFailure};
use crate::policy::json::JsonObject;
use crate::policy::pins::{self, HeaderHints, Pins};
use crate::policy::registry::{Deployment, Worker, WorkerId};
use crate::policy::resolve::{PrefillPlan, Resolver, Target, TokenHop};
use crate::policy::rewrite::{self, BodyEdit, DecodeBody};
use crate::policy::select::Choice;
use crate::policy::{passthrough, paths};

/// Client headers never copied onto the prefill hop: the filter sets its own, or they
/// describe the client's connection rather than the request.
const NOT_FORWARDED: &[&str] = &[
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "te",
    "expect",
    "host",
    "x-request-id",
];

pub struct Stream {
    config: Rc<Config>,
    turns: Rc<Cell<u64>>,
    metrics: Rc<Metrics>,
    phase: Phase,
    hints: HeaderHints,
    path: &'static str,
    request_id: String,
    /// Client headers, minus stripped ones, for the prefill hop.
    forwarded: Vec<(String, String)>,
    prefill_worker: Option<u64>,
    decode: Option<TokenHop>,
    /// The prefill's `kv_transfer_params`, sent with the decode hop: what locates its KV
    /// must never reach the client.
    kv_transfer_params: Option<Box<RawValue>>,
    response_body: ResponseBody,
}

/// What becomes of the decode response's body on its way to the client.
#[derive(Default)]
enum ResponseBody {
    #[default]
    AsItIs,
    /// A failed decode hop: replaced by this typed error.
    Error(RouteError),
    /// A worker's 4xx, which may echo the decode body: these KV locators in it are redacted.
    Redacted(Vec<String>),
}

enum Phase {
    Headers,
    Body,
    /// Another path's JSON body, read before it goes on (`policy::passthrough`).
    PassthroughBody,
    Prefill(Box<Prefilling>),
    Forwarded,
    Answered,
}

/// A prefill hop in flight, and what is needed to retry it or to go on to decode.
struct Prefilling {
    token: u32,
    current: Target,
    /// Unpinned fallbacks still to try, next last.
    remaining: Vec<Target>,
    body: String,
    decode_body: DecodeBody,
    decode: TokenHop,
    /// Size of the request body Envoy holds.
    held_body_size: usize,
    /// When the current attempt was dispatched, in nanoseconds.
    dispatched_at: u64,
}

impl Stream {
    pub fn new(config: Rc<Config>, turns: Rc<Cell<u64>>, metrics: Rc<Metrics>) -> Self {
        Self {
            config,
            turns,
            metrics,
            phase: Phase::Headers,
            hints: HeaderHints::default(),
            path: "",
            request_id: String::new(),
            forwarded: Vec::new(),
            prefill_worker: None,
            decode: None,
            kv_transfer_params: None,
            response_body: ResponseBody::AsItIs,
        }
    }

    fn on_headers(&mut self, end_of_stream: bool) -> Result<Action, RouteError> {
        self.metrics.count(Counter::Requests);
        let headers = envoy::request_headers().map_err(host_failure)?;
        let all = || headers.iter().map(|(n, v)| (n.as_str(), v.as_slice()));
        self.hints = pins::parse_headers(all())?;
        let upstream_header = self.config.settings.upstream_header.as_str();
        for (name, _) in headers
            .iter()
            .filter(|(n, _)| headers::must_strip(n, upstream_header))
        {
            envoy::set_request_header(name, None).map_err(host_failure)?;
        }
        self.request_id = self.request_id(&headers)?;
        let Some(path) = paths::completion_path(header_text(&headers, ":path")) else {
            let (health, now) = (shared::health(), envoy::now_nanos());
            let token_hop = self.resolver(&health, now).token_hop(&self.hints.pins)?;
            self.route(token_hop, None, None)?;
            if end_of_stream || !passthrough::read_as_json(header_text(&headers, "content-type")) {
                return Ok(Action::Continue);
            }
            self.phase = Phase::PassthroughBody;
            return Ok(Action::Pause);
        };
        self.path = path;
        if end_of_stream {
            return Err(RouteError::InvalidBody("the body is empty".into()));
        }
        let limit = self.config.settings.max_body_bytes;
        if header_text(&headers, "content-length")
            .parse::<u64>()
            .is_ok_and(|n| n > limit as u64)
        {
            return Err(RouteError::BodyTooLarge { limit });
        }
        self.forwarded = forwarded_headers(&headers, upstream_header);
        envoy::set_request_header("content-length", None).map_err(host_failure)?;
        self.phase = Phase::Body;
        Ok(Action::Pause)
    }

    fn request_id(&self, headers: &envoy::Headers) -> Result<String, RouteError> {
        let existing = header_text(headers, "x-request-id");
        if !existing.is_empty() {
            return Ok(existing.to_string());
        }
        let turn = self.turns.get();
        let id = format!("pinroute-{:x}-{turn:x}", envoy::now_nanos());
        envoy::set_request_header("x-request-id", Some(&id)).map_err(host_failure)?;
        Ok(id)
    }

    /// The request body once Envoy holds all of it (`None` until then), within the limit.
    fn whole_body(
        &self,
        body_size: usize,
        end_of_stream: bool,
    ) -> Result<Option<Vec<u8>>, RouteError> {
        let limit = self.config.settings.max_body_bytes;
        if body_size > limit {
            return Err(RouteError::BodyTooLarge { limit });
        }
        if !end_of_stream {
            return Ok(None);
        }
        envoy::request_body(body_size)
            .map(Some)
            .map_err(host_failure)
    }

    fn on_body(&mut self, body_size: usize, end_of_stream: bool) -> Result<Action, RouteError> {
        let Some(body) = self.whole_body(body_size, end_of_stream)? else {
            return Ok(Action::Pause);
        };
        let request =
            JsonObject::parse(&body).map_err(|e| RouteError::InvalidBody(e.to_string()))?;
        let pins = self.hints.pins.clone().or(pins::parse_nvext(&request)?);
        self.count_pins(&pins);
        let (health, now) = (shared::health(), envoy::now_nanos());
        let route = self.resolver(&health, now).resolve(&pins)?;
        let decode_body = DecodeBody::new(&request, &body);
        let mut attempts = match route.prefill {
            PrefillPlan::Skip => {
                if self.config.registry.deployment() == Deployment::Disaggregated {
                    self.metrics.count(Counter::AggregatedFallback);
                }
                self.route(route.decode, decode_body.finish(None), Some(body_size))?;
                return Ok(Action::Continue);
            }
            PrefillPlan::Pinned(target) => vec![target],
            PrefillPlan::Candidates(targets) => targets,
        };
        attempts.reverse();
        let Some(first) = attempts.pop() else {
            return Err(RouteError::Internal("empty prefill plan"));
        };
        let prefilling = Prefilling {
            token: 0,
            current: first,
            remaining: attempts,
            body: rewrite::prefill_body(&request, body.len()),
            decode_body,
            decode: route.decode,
            held_body_size: body_size,
            dispatched_at: 0,
        };
        self.dispatch_prefill(prefilling)
    }

    /// Another path's JSON body, once whole: on to the worker unless it names
    /// `kv_transfer_params`.
    fn on_passthrough_body(
        &mut self,
        body_size: usize,
        end_of_stream: bool,
    ) -> Result<Action, RouteError> {
        let Some(body) = self.whole_body(body_size, end_of_stream)? else {
            return Ok(Action::Pause);
        };
        passthrough::check_body(&body)?;
        self.phase = Phase::Forwarded;
        Ok(Action::Continue)
    }

    fn resolver<'a>(&'a self, health: &'a HealthTable, now: u64) -> Resolver<'a, Observed<'a>> {
        let turn = self.turns.get();
        self.turns.set(turn.wrapping_add(1));
        let choice = match &self.hints.session {
            Some(key) => Choice::Session(key),
            None => Choice::LeastLoaded {
                turn,
                outstanding: &outstanding,
            },
        };
        Resolver {
            registry: &self.config.registry,
            settings: &self.config.settings,
            availability: Observed { table: health, now },
            choice,
        }
    }

    fn count_pins(&self, pins: &Pins) {
        let counted = [
            (pins.prefill_worker_id.is_some(), Counter::PinPrefillWorker),
            (pins.prefill_dp_rank.is_some(), Counter::PinPrefillRank),
            (
                pins.decode_worker_id.or(pins.backend_instance_id).is_some(),
                Counter::PinDecodeWorker,
            ),
            (pins.dp_rank.is_some(), Counter::PinDecodeRank),
            (self.hints.session.is_some(), Counter::PinSession),
        ];
        for (_, counter) in counted.iter().filter(|(pinned, _)| *pinned) {
            self.metrics.count(*counter);
        }
    }

    /// Takes a failed worker out of unpinned selection for a while, on every thread.
    fn mark_unhealthy(&self, worker: WorkerId) {
        let period = self.config.settings.unhealthy_period();
        if !period.is_zero() {
            shared::mark_unhealthy(worker, period, envoy::now_nanos());
            self.metrics.count(Counter::WorkerMarkedUnhealthy);
        }
    }

    fn dispatch_prefill(&mut self, mut prefill: Prefilling) -> Result<Action, RouteError> {
        let address = prefill.current.worker.address.to_string();
        let rank = prefill.current.rank.map(|r| r.to_string());
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", "POST"),
            (":path", self.path),
            (":authority", &address),
            ("content-type", "application/json"),
            ("x-request-id", &self.request_id),
            ("x-envoy-original-dst-host", &address),
        ];
        if let Some(rank) = &rank {
            headers.push((DP_RANK_HEADER, rank));
        }
        headers.extend(self.forwarded.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        let settings = &self.config.settings;
        match envoy::dispatch(
            &settings.prefill_cluster,
            headers,
            prefill.body.as_bytes(),
            settings.prefill_timeout(),
        ) {
            Ok(token) => {
                log::debug!(
                    "pinroute: request {} prefill on worker {}",
                    self.request_id,
                    prefill.current.worker.id
                );
                shared::add_outstanding(prefill.current.worker.id, 1);
                if prefill.remaining.is_empty() {
                    // No retry can need it: Envoy holds its own copy of what was sent.
                    prefill.body = String::new();
                }
                prefill.token = token;
                prefill.dispatched_at = envoy::now_nanos();
                self.phase = Phase::Prefill(Box::new(prefill));
                Ok(Action::Pause)
            }
            Err(status) => {
                log::error!(
                    "pinroute: cannot dispatch to cluster {:?}: {status:?}; is it in the Envoy configuration?",
                    settings.prefill_cluster
                );
                Err(RouteError::Internal(
                    "the prefill hop could not be dispatched",
                ))
            }
        }
    }

    fn on_prefill_response(
        &mut self,
        prefill: Prefilling,
        body_size: usize,
    ) -> Result<(), RouteError> {
        shared::add_outstanding(prefill.current.worker.id, -1);
        let elapsed = envoy::now_nanos().saturating_sub(prefill.dispatched_at);
        self.metrics
            .record_prefill_latency(std::time::Duration::from_nanos(elapsed));
        let call = CallAnswer::read(body_size);
        match answers::prefill_answer(call.status, &call.body) {
            PrefillAnswer::Ready(kv_transfer_params) => {
                self.metrics.count(Counter::PrefillOk);
                self.prefill_worker = Some(prefill.current.worker.id);
                let edit = prefill.decode_body.finish(kv_transfer_params.as_deref());
                self.kv_transfer_params = kv_transfer_params;
                self.route(prefill.decode, edit, Some(prefill.held_body_size))
            }
            PrefillAnswer::Refused(status) => {
                self.pass_on_refusal(prefill.current.worker.id, status, &call);
                Ok(())
            }
            PrefillAnswer::Failed(failure) => self.on_prefill_failure(prefill, failure),
        }
    }

    /// The prefill worker refused the request (4xx): the client gets the worker's answer.
    fn pass_on_refusal(&mut self, worker: WorkerId, status: u16, call: &CallAnswer) {
        log::debug!(
            "pinroute: request {}: prefill worker {worker} refused it with {status}",
            self.request_id
        );
        self.metrics.count(Counter::PrefillRefused);
        self.phase = Phase::Answered;
        let worker = worker.to_string();
        let content_type = call.content_type.as_deref().unwrap_or("application/json");
        let headers = vec![
            ("content-type", content_type),
            (headers::PREFILL_WORKER_HEADER, worker.as_str()),
        ];
        if let Err(status) = envoy::send_response(status, headers, &call.body) {
            log::error!(
                "pinroute: could not pass on the prefill answer of {}: {status:?}",
                self.request_id
            );
        }
    }

    fn on_prefill_failure(
        &mut self,
        mut prefill: Prefilling,
        failure: HopFailure,
    ) -> Result<(), RouteError> {
        let worker = prefill.current.worker.id;
        log::warn!(
            "pinroute: request {}: prefill worker {worker} failed: {failure}",
            self.request_id
        );
        self.metrics.count(Counter::PrefillFailed);
        if answers::takes_worker_out(&failure) {
            self.mark_unhealthy(worker);
        }
        if prefill.current.pinned {
            return Err(RouteError::PinnedWorkerFailed {
                hop: Hop::Prefill,
                worker,
                failure,
            });
        }
        if let Some(next) = prefill.remaining.pop() {
            self.metrics.count(Counter::PrefillRetried);
            prefill.current = next;
            return self.dispatch_prefill(prefill).map(|_| ());
        }
        if !self.config.settings.aggregated_fallback {
            return Err(RouteError::UpstreamFailed {
                hop: Hop::Prefill,
                worker,
                failure,
            });
        }
        log::info!(
            "pinroute: request {}: no prefill worker left, decode prefills itself",
            self.request_id
        );
        self.metrics.count(Counter::AggregatedFallback);
        let edit = prefill.decode_body.finish(None);
        self.route(prefill.decode, edit, Some(prefill.held_body_size))
    }

    /// Sends the request on to its token-generating worker, with `edit` made to the held
    /// body (of `held_body_size` bytes, when the filter holds one) when given.
    fn route(
        &mut self,
        decode: TokenHop,
        edit: Option<BodyEdit>,
        held_body_size: Option<usize>,
    ) -> Result<(), RouteError> {
        let target = &decode.target;
        let address = target.worker.address.to_string();
        envoy::set_request_header(&self.config.settings.upstream_header, Some(&address))
            .map_err(host_failure)?;
        let pool = pool_header(&decode, &self.config.pool_members);
        envoy::set_request_header(headers::POOL_HEADER, pool.as_deref()).map_err(host_failure)?;
        let rank = target.rank.map(|r| r.to_string());
        envoy::set_request_header(DP_RANK_HEADER, rank.as_deref()).map_err(host_failure)?;
        if let Some(held) = held_body_size {
            if let Some(edit) = &edit {
                envoy::edit_request_body(edit.replaced, edit.with.as_bytes())
                    .map_err(host_failure)?;
            }
            let length = edit
                .as_ref()
                .map_or(held, |e| e.edited_len(held))
                .to_string();
            envoy::set_request_header("content-length", Some(&length)).map_err(host_failure)?;
        }
        log::debug!(
            "pinroute: request {} {} on worker {}",
            self.request_id,
            decode.hop,
            target.worker.id
        );
        self.metrics.count(Counter::DecodeRouted);
        shared::add_outstanding(target.worker.id, 1);
        self.decode = Some(decode);
        self.phase = Phase::Forwarded;
        Ok(())
    }

    /// The worker Envoy's last attempt went to: the first candidate, or an alternate after
    /// connections to the ones before it failed (then those are marked unhealthy).
    fn served_decode_worker(&self, decode: &TokenHop) -> WorkerId {
        let first = decode.target.worker.id;
        let Some(served) = envoy::upstream_address() else {
            return first;
        };
        let Some(at) = decode
            .alternates
            .iter()
            .position(|w| w.address.to_string() == served)
        else {
            return first;
        };
        self.mark_unhealthy(first);
        let skipped = decode.alternates.get(..at).unwrap_or_default();
        skipped.iter().for_each(|w| self.mark_unhealthy(w.id));
        decode.alternates.get(at).map_or(first, |w| w.id)
    }

    fn answer(&mut self, error: &RouteError) -> Action {
        log::debug!(
            "pinroute: request {} answered {}: {error}",
            self.request_id,
            error.status()
        );
        self.metrics.count_error(error);
        send_error(error);
        self.phase = Phase::Answered;
        Action::Pause
    }

    /// A failed decode hop becomes a typed error; the served workers are named.
    fn on_response(&mut self) -> Result<(), Status> {
        if let Some(id) = self.prefill_worker {
            envoy::set_response_header(headers::PREFILL_WORKER_HEADER, Some(&id.to_string()))?;
        }
        let Some(decode) = &self.decode else {
            return Ok(());
        };
        let worker = self.served_decode_worker(decode);
        envoy::set_response_header(headers::DECODE_WORKER_HEADER, Some(&worker.to_string()))?;
        let status = envoy::response_status().unwrap_or(0);
        if (400..=499).contains(&status) {
            let locators = self
                .kv_transfer_params
                .as_deref()
                .map(rewrite::kv_locators)
                .unwrap_or_default();
            if !locators.is_empty() {
                envoy::set_response_header("content-length", None)?;
                self.response_body = ResponseBody::Redacted(locators);
            }
            return Ok(());
        }
        if !(500..=599).contains(&status) {
            return Ok(());
        }
        let Some(failure) =
            answers::decode_failure(status, envoy::response_code_details().as_deref())
        else {
            return Ok(());
        };
        let (hop, pinned) = (decode.hop, decode.target.pinned);
        if answers::takes_worker_out(&failure) {
            self.mark_unhealthy(worker);
        }
        let error = if pinned {
            RouteError::PinnedWorkerFailed {
                hop,
                worker,
                failure,
            }
        } else {
            RouteError::UpstreamFailed {
                hop,
                worker,
                failure,
            }
        };
        log::warn!("pinroute: request {}: {error}", self.request_id);
        self.metrics.count(Counter::DecodeFailed);
        self.metrics.count_error(&error);
        envoy::set_response_header(":status", Some(&error.status().to_string()))?;
        envoy::set_response_header("content-type", Some("application/json"))?;
        envoy::set_response_header("content-length", None)?;
        envoy::set_response_header(headers::ERROR_CODE_HEADER, Some(error.code()))?;
        self.response_body = ResponseBody::Error(error);
        Ok(())
    }
}

impl Context for Stream {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let phase = std::mem::replace(&mut self.phase, Phase::Forwarded);
        let Phase::Prefill(prefill) = phase else {
            self.phase = phase;
            return;
        };
        if prefill.token != token {
            self.phase = Phase::Prefill(prefill);
            return;
        }
        let result = self.on_prefill_response(*prefill, body_size);
        match result {
            Ok(()) if matches!(self.phase, Phase::Forwarded) => {
                if let Err(status) = envoy::resume_request() {
                    log::error!(
                        "pinroute: could not resume request {}: {status:?}",
                        self.request_id
                    );
                }
            }
            Ok(()) => {}
            Err(error) => {
                self.answer(&error);
            }
        }
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.on_headers(end_of_stream)
            .unwrap_or_else(|error| self.answer(&error))
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        match self.phase {
            Phase::Body => self
                .on_body(body_size, end_of_stream)
                .unwrap_or_else(|error| self.answer(&error)),
            Phase::PassthroughBody => self
                .on_passthrough_body(body_size, end_of_stream)
                .unwrap_or_else(|error| self.answer(&error)),
            Phase::Prefill(_) | Phase::Answered => Action::Pause,
            Phase::Headers | Phase::Forwarded => Action::Continue,
        }
    }

    /// A body that ends in trailers (HTTP/2) never ends in the body callbacks: a body the
    /// filter must read is refused rather than forwarded unread.
    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        match self.phase {
            Phase::Body | Phase::PassthroughBody => self.answer(&RouteError::InvalidBody(
                "a body followed by trailers is not accepted".into(),
            )),
            Phase::Prefill(_) | Phase::Answered => Action::Pause,
            Phase::Headers | Phase::Forwarded => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if matches!(self.phase, Phase::Forwarded)
            && let Err(status) = self.on_response()
        {
            log::error!(
                "pinroute: could not edit the response of {}: {status:?}",
                self.request_id
            );
        }
        if end_of_stream && let ResponseBody::Error(error) = std::mem::take(&mut self.response_body)
        {
            // No body will come to be replaced: the error is answered whole instead.
            send_error(&error);
            self.phase = Phase::Answered;
            return Action::Pause;
        }
        Action::Continue
    }

    /// The stream is over: its hops no longer count as outstanding.
    fn on_log(&mut self) {
        if let Phase::Prefill(prefill) = &self.phase {
            shared::add_outstanding(prefill.current.worker.id, -1);
        }
        if let Some(decode) = &self.decode {
            shared::add_outstanding(decode.target.worker.id, -1);
        }
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if matches!(self.response_body, ResponseBody::AsItIs) {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let replacement = match &self.response_body {
            ResponseBody::Error(error) => Some(error.body().into_bytes()),
            ResponseBody::Redacted(locators) => envoy::response_body(body_size)
                .ok()
                .and_then(|body| answers::redacted(&body, locators)),
            ResponseBody::AsItIs => None,
        };
        if let Some(body) = replacement
            && let Err(status) = envoy::replace_response_body(body_size, &body)
        {
            log::error!(
                "pinroute: could not replace the response of {}: {status:?}",
                self.request_id
            );
        }
        Action::Continue
    }
}

fn outstanding(worker: &Worker) -> u64 {
    shared::outstanding(worker.id)
}

/// A finished prefill call's answer: its status (none without a response), content type
/// and body.
struct CallAnswer {
    status: Option<u16>,
    content_type: Option<String>,
    body: Vec<u8>,
}

impl CallAnswer {
    fn read(body_size: usize) -> Self {
        let headers = envoy::call_response_headers().unwrap_or_default();
        let text = |name| Some(header_text(&headers, name)).filter(|v| !v.is_empty());
        Self {
            status: text(":status").and_then(|s| s.parse().ok()),
            content_type: text("content-type").map(str::to_string),
            body: envoy::call_response_body(body_size).unwrap_or_default(),
        }
    }
}

/// `ip:port,ip:port,...`: an unpinned decode hop's candidates for Envoy's connect-failure
/// retries, when its first choice is a member of the bootstrap's pool cluster. Only members
/// are listed, so Envoy never picks a host the filter did not choose.
fn pool_header(decode: &TokenHop, members: &[std::net::SocketAddr]) -> Option<String> {
    if decode.target.pinned || !members.contains(&decode.target.worker.address) {
        return None;
    }
    let candidates = std::iter::once(&decode.target.worker).chain(&decode.alternates);
    let listed: Vec<String> = candidates
        .filter(|w| members.contains(&w.address))
        .map(|w| w.address.to_string())
        .collect();
    Some(listed.join(","))
}

fn header_text<'h>(headers: &'h envoy::Headers, name: &str) -> &'h str {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
        .unwrap_or("")
}

/// The client headers worth copying onto the prefill hop (authorization, tracing, ...).
fn forwarded_headers(headers: &envoy::Headers, upstream_header: &str) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| {
            !name.starts_with(':')
                && !NOT_FORWARDED.contains(&name.as_str())
                && !headers::must_strip(name, upstream_header)
        })
        .filter_map(|(name, value)| Some((name.clone(), String::from_utf8(value.clone()).ok()?)))
        .collect()
}

/// Answers `error` in place of whatever the request would have got.
fn send_error(error: &RouteError) {
    let retry_after = error.retry_after_secs().map(|s| s.to_string());
    let mut headers = vec![
        ("content-type", "application/json"),
        (headers::ERROR_CODE_HEADER, error.code()),
    ];
    if let Some(seconds) = &retry_after {
        headers.push(("retry-after", seconds));
    }
    if let Err(status) = envoy::send_response(error.status(), headers, error.body().as_bytes()) {
        log::error!("pinroute: could not send the local response: {status:?}");
    }
}

fn host_failure(status: Status) -> RouteError {
    log::error!("pinroute: host call failed: {status:?}");
    RouteError::Internal("a host call failed")
}

//! The prefill hop (`docs/semantics.md` §4): the filter's own call to a prefill worker, and
//! what its answer means for the request — reported as a [`PrefillVerdict`] for the stream to
//! act on.

use std::time::Duration;

use super::access_log::Field;
use super::call::CallAnswer;
use super::call_span::{self, CallSpan};
use super::env::Env;
use super::host::Host;
use super::intake::header_text;
use super::metrics::Counter;
use super::phase::{Completion, PrefillAttempt, Prefilling, ServedPrefill};
use super::response::HeldBody;
use crate::policy::answers::{self, PrefillAnswer};
use crate::policy::error::RouteError;
use crate::policy::headers::{self, DP_RANK_HEADER};
use crate::policy::hop::{Hop, HopFailure};
use crate::policy::json::JsonObject;
use crate::policy::registry::{Worker, address_text};
use crate::policy::resolve::{Target, TokenHop};
use crate::policy::rewrite::{self, DecodeBody};
use crate::policy::trace::TRACEPARENT;

/// The name of the prefill hop's span, where the host opens one.
const SPAN_OPERATION: &str = "pinroute prefill";
const OUTCOME_TAG: &str = "pinroute.outcome";

/// What a prefill answer means for the request.
pub enum PrefillVerdict {
    /// On to the decode hop, with the held body edited so (the prefill's KV spliced in; none
    /// when the decode worker prefills itself).
    Decode {
        decode: TokenHop,
        held: HeldBody,
        served: Option<ServedPrefill>,
    },
    /// The worker refused the request; the client has its answer.
    Answered,
    /// The next candidate is to be tried.
    Retry(PrefillAttempt),
}

/// The first attempt of `candidates` (in order).
pub fn first_attempt(
    completion: Completion,
    request: &JsonObject<'_>,
    mut candidates: Vec<Target>,
    decode_body: DecodeBody,
    decode: TokenHop,
    held_body_size: usize,
) -> Result<PrefillAttempt, RouteError> {
    candidates.reverse();
    let target = candidates
        .pop()
        .ok_or(RouteError::Internal("empty prefill plan"))?;
    Ok(PrefillAttempt {
        target,
        remaining: candidates,
        api: completion.api,
        forwarded: completion.forwarded,
        body: rewrite::prefill_body(completion.api, request, held_body_size),
        decode_body,
        decode,
        held_body_size,
    })
}

/// Sends `attempt`'s prefill hop; the hop in flight.
pub fn dispatch(
    env: &Env<impl Host>,
    mut attempt: PrefillAttempt,
) -> Result<Box<Prefilling>, RouteError> {
    let address = address_text(attempt.target.worker.address);
    let rank = attempt.target.rank.map(|r| r.to_string());
    let mut headers: Vec<(&str, &str)> = vec![
        (":method", "POST"),
        (":path", attempt.api.path()),
        (":authority", &address),
        ("content-type", "application/json"),
        ("x-request-id", &env.request_id),
        ("x-envoy-original-dst-host", &address),
        // The answer is parsed here: a worker must not compress it.
        ("accept-encoding", "identity"),
    ];
    if let Some(rank) = &rank {
        headers.push((DP_RANK_HEADER, rank));
    }
    // Where the hop has a span of its own, the worker's parent is that span.
    let parent = attempt.forwarded.texts().find(|(n, _)| *n == TRACEPARENT);
    let span = call_span::open(env, SPAN_OPERATION, parent.map_or("", |(_, v)| v));
    headers.extend(
        attempt
            .forwarded
            .texts()
            .filter(|(n, _)| span.is_none() || *n != TRACEPARENT),
    );
    if let Some(span) = &span {
        headers.push((TRACEPARENT, &span.traceparent));
    }
    let settings = &env.config.settings;
    let body = Some(attempt.body.as_bytes());
    let dispatched = env.call(
        &settings.prefill_cluster,
        &headers,
        body,
        settings.prefill_timeout(),
    );
    let Some(token) = dispatched else {
        if let Some(span) = span {
            call_span::close(env, span, &[(OUTCOME_TAG, "not_sent")], Some("not sent"));
        }
        return Err(RouteError::Internal(
            "the prefill hop could not be dispatched",
        ));
    };
    let worker = attempt.target.worker.id;
    log::debug!(
        "pinroute: request {} prefill on worker {worker}",
        env.request_id
    );
    env.count_outstanding(worker, 1);
    if attempt.remaining.is_empty() {
        // No retry can need it: Envoy holds its own copy of what was sent.
        attempt.body = String::new();
    }
    Ok(Box::new(Prefilling {
        token,
        dispatched_at: env.host.now_nanos(),
        attempt,
        span,
    }))
}

/// Judges the answer of the prefill hop in flight.
pub fn judge(
    env: &Env<impl Host>,
    prefilling: Prefilling,
    body_size: usize,
) -> Result<PrefillVerdict, RouteError> {
    let Prefilling {
        dispatched_at,
        attempt,
        span,
        ..
    } = prefilling;
    let worker = attempt.target.worker.id;
    env.count_outstanding(worker, -1);
    let elapsed = Duration::from_nanos(env.host.now_nanos().saturating_sub(dispatched_at));
    env.metrics.record_prefill_latency(&env.host, elapsed);
    let max_kv = env.config.settings.max_kv_transfer_params_bytes;
    let call = CallAnswer::read(&env.host, body_size, answers::prefill_answer_limit(max_kv));
    let answer = answers::prefill_answer(call.status, call.body_size, &call.body, max_kv);
    if let Some(span) = span {
        close_span(env, span, &attempt.target, &answer, call.status);
    }
    match answer {
        PrefillAnswer::Ready(kv_transfer_params) => {
            env.count(Counter::PrefillOk);
            env.record_success(worker);
            env.log_target(&attempt.target, Field::PrefillWorker, Field::PrefillRank);
            env.log_field(Field::PrefillMs, &millis(elapsed));
            let edit = attempt.decode_body.finish(kv_transfer_params.as_deref());
            Ok(PrefillVerdict::Decode {
                decode: attempt.decode,
                held: HeldBody::edited(attempt.held_body_size, edit),
                served: Some(ServedPrefill {
                    worker,
                    address: attempt.target.worker.address,
                    kv_transfer_params,
                }),
            })
        }
        PrefillAnswer::Refused(status) => {
            env.record_success(worker);
            pass_on_refusal(env, &attempt.target.worker, status, &call);
            Ok(PrefillVerdict::Answered)
        }
        PrefillAnswer::Failed(failure) => after_failure(env, attempt, failure),
    }
}

/// Tags and ends the hop's span: the worker, its rank, how the attempt went and the
/// worker's status.
fn close_span(
    env: &Env<impl Host>,
    span: CallSpan,
    target: &Target,
    answer: &PrefillAnswer,
    status: Option<u16>,
) {
    let worker = target.worker.id.to_string();
    let rank = target.rank.map(|r| r.to_string());
    let status = status.map(|s| s.to_string());
    let (outcome, failure) = match answer {
        PrefillAnswer::Ready(_) => ("ok", None),
        PrefillAnswer::Refused(_) => ("refused", None),
        PrefillAnswer::Failed(failure) => ("failed", Some(failure.to_string())),
    };
    let mut tags = vec![
        ("pinroute.prefill_worker", worker.as_str()),
        (OUTCOME_TAG, outcome),
    ];
    let optional = [
        ("pinroute.prefill_rank", &rank),
        ("http.response.status_code", &status),
        ("pinroute.failure", &failure),
    ];
    tags.extend(
        optional
            .iter()
            .filter_map(|(key, value)| Some((*key, value.as_deref()?))),
    );
    call_span::close(env, span, &tags, failure.as_deref());
}

/// The prefill worker refused the request (4xx): the client gets the worker's answer.
fn pass_on_refusal(env: &Env<impl Host>, worker: &Worker, status: u16, call: &CallAnswer) {
    let id = worker.id;
    log::debug!(
        "pinroute: request {}: prefill worker {id} refused it with {status}",
        env.request_id
    );
    env.count(Counter::PrefillRefused);
    let worker = id.to_string();
    let content_type = Some(header_text(&call.headers, "content-type"))
        .filter(|v| !v.is_empty())
        .unwrap_or("application/json");
    let mut headers = vec![
        ("content-type", content_type),
        (headers::RELAYED_HEADER, "prefill"),
    ];
    if env.config.settings.worker_id_headers {
        headers.push((headers::PREFILL_WORKER_HEADER, worker.as_str()));
    }
    if let Err(error) = env.host.send_response(status, &headers, &call.body) {
        log::error!(
            "pinroute: could not pass on the prefill answer of {}: {error}",
            env.request_id
        );
    }
}

/// A failed prefill: the next candidate, else the decode worker prefills itself (unless
/// that fallback is off), else a typed error.
fn after_failure(
    env: &Env<impl Host>,
    mut attempt: PrefillAttempt,
    failure: HopFailure,
) -> Result<PrefillVerdict, RouteError> {
    let worker = attempt.target.worker.id;
    log::warn!(
        "pinroute: request {}: prefill worker {worker} failed: {failure}",
        env.request_id
    );
    env.count(Counter::PrefillFailed);
    if answers::takes_worker_out(&failure) {
        env.record_connect_failure(worker);
    }
    let hop = Hop::Prefill;
    if attempt.target.pinned {
        return Err(RouteError::PinnedWorkerFailed {
            hop,
            worker,
            failure,
        });
    }
    if let Some(next) = attempt.remaining.pop() {
        env.count(Counter::PrefillRetried);
        attempt.target = next;
        return Ok(PrefillVerdict::Retry(attempt));
    }
    if !env.config.settings.aggregated_fallback {
        return Err(RouteError::UpstreamFailed {
            hop,
            worker,
            failure,
        });
    }
    log::info!(
        "pinroute: request {}: no prefill worker left, decode prefills itself",
        env.request_id
    );
    env.count(Counter::AggregatedFallback);
    let held = HeldBody::edited(attempt.held_body_size, attempt.decode_body.finish(None));
    Ok(PrefillVerdict::Decode {
        decode: attempt.decode,
        held,
        served: None,
    })
}

/// Milliseconds, to the microsecond, as the access log shows them.
fn millis(elapsed: Duration) -> String {
    format!("{:.3}", elapsed.as_secs_f64() * 1e3)
}

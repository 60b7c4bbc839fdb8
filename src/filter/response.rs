//! The routed hop and its answer (`docs/semantics.md` §4, §6): the request goes to its
//! token-generating worker; a failed hop becomes a typed error, and so does a worker's 4xx
//! to a hop that carried the prefill's KV transfer parameters. What an answer means is
//! reported as an [`Outcome`] for the stream to act on.

use super::decode_retry;
use super::env::{Env, host_failure};
use super::host::{Host, HostError};
use super::metrics::Counter;
use super::phase::{Answer, Routed, ServedPrefill};
use crate::policy::config::Settings;
use crate::policy::error::RouteError;
use crate::policy::headers::{self, DP_RANK_HEADER};
use crate::policy::hop::HopFailure;
use crate::policy::registry::{WorkerId, address_text, push_address};
use crate::policy::resolve::TokenHop;
use crate::policy::rewrite::BodyEdit;
use crate::policy::{answers, picker, retries};

/// The request body as the routed hop sends it.
pub enum RoutedBody {
    /// The request has none.
    Empty,
    /// Read whole by the filter, and sent as the client wrote it: this many bytes.
    Read(usize),
    /// A completion's body, held whole and edited as the hop needs.
    Held(HeldBody),
    /// Streamed on unread: the hop cannot be sent again.
    Unread,
}

/// The request body Envoy holds, and the edit the routed hop needs made to it.
pub struct HeldBody {
    size: usize,
    edit: Option<BodyEdit>,
}

impl HeldBody {
    pub fn edited(size: usize, edit: Option<BodyEdit>) -> Self {
        Self { size, edit }
    }
}

/// What a worker's answer to the hop means.
pub enum Outcome {
    /// The client's to read.
    Passed,
    Failed(RouteError),
    /// The connection was refused: nothing reached the worker, another may serve it.
    Refused,
}

/// Sends the request on to its token-generating worker, with the held body edited as the hop
/// needs; the routed request.
pub fn route(
    env: &Env<impl Host>,
    decode: TokenHop,
    body: RoutedBody,
    prefill: Option<ServedPrefill>,
) -> Result<Box<Routed>, RouteError> {
    let target = &decode.target;
    let address = address_text(target.worker.address);
    env.set_request_header(&env.config.settings.upstream_header, Some(&address))?;
    // The client's copies of both headers were removed with the headers (§7): only the
    // filter's own need setting.
    let pool = retries::pool_candidates(&decode, &env.config.pool_members);
    if let Some(pool) = &pool {
        let mut listed = String::with_capacity(22 * pool.len());
        for (at, address) in pool.iter().copied().enumerate() {
            if at > 0 {
                listed.push(',');
            }
            push_address(&mut listed, address);
        }
        env.set_request_header(headers::POOL_HEADER, Some(&listed))?;
    }
    if let Some(rank) = target.rank {
        env.set_request_header(DP_RANK_HEADER, Some(&rank.to_string()))?;
    }
    let body_len = match body {
        RoutedBody::Held(held) => Some(edit_held_body(env, &held)?),
        RoutedBody::Read(size) => Some(size),
        RoutedBody::Empty => Some(0),
        RoutedBody::Unread => None,
    };
    // Envoy retries pool members itself; the filter retries the others.
    let retry = match body_len {
        Some(len) if retries::filter_retries(&decode, pool.is_some()) => {
            Some(decode_retry::keep_for_retry(env, len)?)
        }
        _ => None,
    };
    log::debug!(
        "pinroute: request {} {} on worker {}",
        env.request_id,
        decode.hop,
        target.worker.id
    );
    env.count(Counter::DecodeRouted);
    env.count_outstanding(target.worker.id, 1);
    Ok(Box::new(Routed {
        decode,
        pooled: pool.is_some(),
        prefill,
        retry,
        answer: Answer::Awaited,
    }))
}

/// Makes the held body's edit and announces its length; that length. An edit that would grow
/// the body past what Envoy was configured to hold is refused here: Envoy would answer the
/// overflow from inside the host call, with this callback still running.
fn edit_held_body(env: &Env<impl Host>, held: &HeldBody) -> Result<usize, RouteError> {
    let limit = env.config.settings.held_body_limit();
    if held
        .edit
        .as_ref()
        .is_some_and(|e| e.edited_len(held.size) > limit)
    {
        return Err(RouteError::Internal(
            "the decode body would outgrow the gateway's buffer",
        ));
    }
    if let Some(edit) = &held.edit {
        let edited = env
            .host
            .edit_request_body(edit.replaced, edit.with.as_bytes());
        edited.map_err(host_failure)?;
    }
    let length = held
        .edit
        .as_ref()
        .map_or(held.size, |e| e.edited_len(held.size));
    env.set_request_header("content-length", Some(&length.to_string()))?;
    Ok(length)
}

/// The worker counted as serving the request, until the stream ends.
pub fn serving_worker(routed: &Routed) -> WorkerId {
    routed.decode.target.worker.id
}

/// Names the served workers on the answer (when worker ids are shown) and judges the answer's
/// headers: the worker that answered, and what its answer means.
pub fn answer_headers(
    env: &Env<impl Host>,
    routed: &Routed,
) -> Result<(WorkerId, Outcome), HostError> {
    let host = &env.host;
    let worker = served_decode_worker(env, routed);
    let settings = &env.config.settings;
    let endpoints = served_endpoints(settings, routed, worker);
    for (name, value) in served(settings, routed, worker)
        .into_iter()
        .chain(endpoints)
    {
        host.set_response_header(name, Some(&value))?;
    }
    let status = host.response_status().unwrap_or(0);
    // Only a failed hop needs to know why: the property costs a host call.
    let details = (status >= 500)
        .then(|| host.response_code_details())
        .flatten();
    let failure = answers::decode_failure(status, details.as_deref());
    Ok((worker, outcome(env, routed, worker, status, failure)))
}

/// Turns the worker's answer headers into `error`'s; its body is replaced when it comes.
pub fn replace_headers(env: &Env<impl Host>, error: &RouteError) -> Result<(), HostError> {
    log::warn!("pinroute: request {}: {error}", env.request_id);
    env.count_error(error);
    let host = &env.host;
    host.set_response_header(":status", Some(&error.status().to_string()))?;
    host.set_response_header("content-type", Some("application/json"))?;
    host.set_response_header("content-length", None)?;
    host.set_response_header(headers::ERROR_CODE_HEADER, Some(error.code()))
}

/// What `worker`'s answer (`status`, and the failure of the hop it is, if any) means, with the
/// worker's health updated: a failed hop (a 5xx, a refused connection), or a 4xx to a hop that
/// carried the prefill's `kv_transfer_params`, is no answer for the client. vLLM's validation
/// errors echo the request, so that 4xx could show a client the prefill's host, port and ids,
/// or confirm a guess of them; its body is withheld whatever it says.
pub fn outcome(
    env: &Env<impl Host>,
    routed: &Routed,
    worker: WorkerId,
    status: u16,
    failure: Option<HopFailure>,
) -> Outcome {
    let Some(failure) = failure else {
        env.record_success(worker);
        let carried_kv = routed
            .prefill
            .as_ref()
            .is_some_and(|p| p.kv_transfer_params.is_some());
        if (400..=499).contains(&status) && carried_kv {
            return Outcome::Failed(RouteError::DecodeRefused { worker, status });
        }
        return Outcome::Passed;
    };
    if answers::takes_worker_out(&failure) {
        env.record_connect_failure(worker);
    }
    match failure {
        HopFailure::Connect => Outcome::Refused,
        failure => Outcome::Failed(failed(env, routed, worker, failure)),
    }
}

/// The typed error of a failed hop, counted: `pinned_worker_failed` or `upstream_failed`.
pub fn failed(
    env: &Env<impl Host>,
    routed: &Routed,
    worker: WorkerId,
    failure: HopFailure,
) -> RouteError {
    env.count(Counter::DecodeFailed);
    let hop = routed.decode.hop;
    if routed.decode.target.pinned {
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
    }
}

/// The response headers naming the workers that served, when worker ids are shown.
pub fn served(
    settings: &Settings,
    routed: &Routed,
    decode: WorkerId,
) -> Vec<(&'static str, String)> {
    if !settings.worker_id_headers {
        return Vec::new();
    }
    let prefill = routed.prefill.as_ref();
    let prefill = prefill.map(|p| (headers::PREFILL_WORKER_HEADER, p.worker.to_string()));
    let decode = (headers::DECODE_WORKER_HEADER, decode.to_string());
    prefill.into_iter().chain([decode]).collect()
}

/// In picker mode, the endpoints that served, for the served report (`docs/semantics.md` §9).
/// Only on a worker's answer routed through Envoy: the bootstrap's filters before pinroute
/// turn them into `envoy.lb` metadata and remove them, which an answer the filter sends
/// itself would skip, reaching the client with them.
fn served_endpoints(
    settings: &Settings,
    routed: &Routed,
    decode: WorkerId,
) -> Vec<(&'static str, String)> {
    if settings.picker.is_none() {
        return Vec::new();
    }
    let prefill = routed.prefill.as_ref();
    let prefill = prefill.map(|p| (picker::PREFILL_SERVED_HEADER, p.address.to_string()));
    let address = retries::address_of(&routed.decode, decode);
    prefill
        .into_iter()
        .chain([(picker::SERVED_HEADER, address.to_string())])
        .collect()
}

/// The worker Envoy's last attempt went to; the connections that failed before it are
/// counted.
fn served_decode_worker(env: &Env<impl Host>, routed: &Routed) -> WorkerId {
    let upstream = routed.pooled.then(|| env.host.upstream_address()).flatten();
    let (served, failed) =
        retries::served_worker(&routed.decode, routed.pooled, upstream.as_deref());
    failed
        .into_iter()
        .for_each(|worker| env.record_connect_failure(worker));
    served
}

/// Replaces the whole answer body with `error`'s.
pub fn replace_body(env: &Env<impl Host>, error: &RouteError, size: usize) {
    if let Err(status) = env
        .host
        .replace_response_body(size, error.body(env.errors).as_bytes())
    {
        log::error!(
            "pinroute: could not replace the response of {}: {status}",
            env.request_id
        );
    }
}

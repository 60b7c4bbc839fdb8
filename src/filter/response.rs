//! The routed hop and its answer (`docs/semantics.md` §4, §6): the request goes to its
//! token-generating worker; a failed hop becomes a typed error, and so does a worker's 4xx
//! to a hop that carried the prefill's KV transfer parameters.

use serde_json::value::RawValue;

use super::decode_retry::DecodeRetry;
use super::env::Env;
use super::host::{Flow, Host, HostError};
use super::metrics::Counter;
use super::stream::Phase;
use crate::policy::answers;
use crate::policy::error::RouteError;
use crate::policy::headers::{self, DP_RANK_HEADER};
use crate::policy::hop::HopFailure;
use crate::policy::registry::WorkerId;
use crate::policy::resolve::TokenHop;
use crate::policy::rewrite::BodyEdit;

/// The request body as the routed hop sends it.
pub(super) enum RoutedBody {
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
pub(super) struct HeldBody {
    size: usize,
    edit: Option<BodyEdit>,
}

impl HeldBody {
    pub fn edited(size: usize, edit: Option<BodyEdit>) -> Self {
        Self { size, edit }
    }
}

/// The prefill hop that served the request.
pub(super) struct ServedPrefill {
    pub worker: WorkerId,
    /// What locates its KV, sent with the decode hop: it must never reach the client.
    pub kv_transfer_params: Option<Box<RawValue>>,
}

/// A request on its way to its token-generating worker.
pub(super) struct Routed {
    pub(super) decode: TokenHop,
    /// Whether Envoy may retry the hop on the alternates (`x-pinroute-pool` was set).
    pooled: bool,
    prefill: Option<ServedPrefill>,
    /// The request as routed, when only the filter can retry it (`docs/semantics.md` §4).
    pub(super) retry: Option<DecodeRetry>,
    pub(super) answer: Answer,
}

/// What becomes of the worker's answer on its way to the client.
pub(super) enum Answer {
    /// Its headers have not come yet.
    Awaited,
    AsItIs,
    /// Replaced by this typed error.
    Replaced(RouteError),
    /// Envoy's answer to a refused connection, held while the filter sends the request to
    /// the next candidate; that call's answer replaces it.
    Retrying,
}

/// What a worker's answer to the hop means.
pub(super) enum Outcome {
    /// The client's to read.
    Passed,
    Failed(RouteError),
    /// The request went on to the next candidate.
    Retrying,
}

impl<H: Host> Env<H> {
    /// Sends the request on to its token-generating worker, with the held body edited as
    /// the hop needs.
    pub(super) fn route(
        &self,
        decode: TokenHop,
        body: RoutedBody,
        prefill: Option<ServedPrefill>,
    ) -> Result<Phase, RouteError> {
        let target = &decode.target;
        let address = target.worker.address.to_string();
        self.set_request_header(&self.config.settings.upstream_header, Some(&address))?;
        // The client's copies of both headers were removed with the headers (§7): only
        // the filter's own need setting.
        let pool = pool_header(&decode, &self.config.pool_members);
        if let Some(pool) = &pool {
            self.set_request_header(headers::POOL_HEADER, Some(pool))?;
        }
        if let Some(rank) = target.rank {
            self.set_request_header(DP_RANK_HEADER, Some(&rank.to_string()))?;
        }
        let body_len = match body {
            RoutedBody::Held(held) => Some(self.edit_held_body(&held)?),
            RoutedBody::Read(size) => Some(size),
            RoutedBody::Empty => Some(0),
            RoutedBody::Unread => None,
        };
        // Envoy retries pool members itself; the filter retries the others.
        let retry = match body_len {
            Some(len) if pool.is_none() && is_retried(&decode) => Some(self.keep_for_retry(len)?),
            _ => None,
        };
        log::debug!(
            "pinroute: request {} {} on worker {}",
            self.request_id,
            decode.hop,
            target.worker.id
        );
        self.count(Counter::DecodeRouted);
        self.count_outstanding(target.worker.id, 1);
        let routed = Routed {
            decode,
            pooled: pool.is_some(),
            prefill,
            retry,
            answer: Answer::Awaited,
        };
        Ok(Phase::Routed(Box::new(routed)))
    }

    /// Makes the held body's edit and announces its length; that length. An edit that would
    /// grow the body past what Envoy was configured to hold is refused here: Envoy would answer
    /// the overflow from inside the host call, with this callback still running.
    fn edit_held_body(&self, held: &HeldBody) -> Result<usize, RouteError> {
        let limit = self.config.settings.held_body_limit();
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
            let edited = self
                .host
                .edit_request_body(edit.replaced, edit.with.as_bytes());
            edited.map_err(super::stream::host_failure)?;
        }
        let length = held
            .edit
            .as_ref()
            .map_or(held.size, |e| e.edited_len(held.size));
        self.set_request_header("content-length", Some(&length.to_string()))?;
        Ok(length)
    }
}

/// Whether a refused connection of this hop may go on to another worker: unpinned, with
/// candidates left.
fn is_retried(decode: &TokenHop) -> bool {
    !decode.target.pinned && !decode.alternates.is_empty()
}

impl Routed {
    /// The worker counted as serving the request, until the stream ends.
    pub fn worker(&self) -> WorkerId {
        self.decode.target.worker.id
    }

    pub fn on_response_headers<H: Host>(&mut self, env: &Env<H>, end_of_stream: bool) -> Flow {
        if !matches!(self.answer, Answer::Awaited) {
            return Flow::Continue;
        }
        self.answer = self.judge(env).unwrap_or_else(|status| {
            log::error!(
                "pinroute: could not edit the response of {}: {status:?}",
                env.request_id
            );
            Answer::AsItIs
        });
        if matches!(self.answer, Answer::Retrying) {
            return Flow::Pause;
        }
        // Answered: the kept request is no longer needed.
        self.retry = None;
        if end_of_stream && let Answer::Replaced(error) = &self.answer {
            // No body will come to be replaced: the error is answered whole instead.
            env.send_error(error);
            self.answer = Answer::AsItIs;
            return Flow::Pause;
        }
        Flow::Continue
    }

    /// Names the served workers, and decides what the worker's answer becomes.
    fn judge<H: Host>(&mut self, env: &Env<H>) -> Result<Answer, HostError> {
        let host = &env.host;
        let worker = self.served_decode_worker(env);
        if env.config.settings.worker_id_headers {
            for (name, value) in self.served(worker) {
                host.set_response_header(name, Some(&value))?;
            }
        }
        let status = host.response_status().unwrap_or(0);
        // Only a failed hop needs to know why: the property costs a host call.
        let details = (status >= 500)
            .then(|| host.response_code_details())
            .flatten();
        let failure = answers::decode_failure(status, details.as_deref());
        let error = match self.outcome(env, worker, status, failure) {
            Outcome::Passed => return Ok(Answer::AsItIs),
            Outcome::Retrying => return Ok(Answer::Retrying),
            Outcome::Failed(error) => error,
        };
        log::warn!("pinroute: request {}: {error}", env.request_id);
        env.metrics.count_error(host, &error);
        host.set_response_header(":status", Some(&error.status().to_string()))?;
        host.set_response_header("content-type", Some("application/json"))?;
        host.set_response_header("content-length", None)?;
        host.set_response_header(headers::ERROR_CODE_HEADER, Some(error.code()))?;
        Ok(Answer::Replaced(error))
    }

    /// What `worker`'s answer (`status`, and the failure of the hop it is, if any) means, with
    /// the worker's health updated: a failed hop (a refused connection that cannot go on to
    /// another candidate, a 5xx), or a 4xx to a hop that carried the prefill's
    /// `kv_transfer_params`, is a typed error. vLLM's validation errors echo the request, so
    /// that 4xx could show a client the prefill's host, port and ids, or confirm a guess of
    /// them; its body is withheld whatever it says.
    pub(super) fn outcome<H: Host>(
        &mut self,
        env: &Env<H>,
        worker: WorkerId,
        status: u16,
        failure: Option<HopFailure>,
    ) -> Outcome {
        let Some(failure) = failure else {
            env.record_success(worker);
            let carried_kv = self
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
        // A connection never made: nothing reached the worker, so another may serve it.
        if failure == HopFailure::Connect && self.retry_next(env) {
            return Outcome::Retrying;
        }
        env.count(Counter::DecodeFailed);
        let hop = self.decode.hop;
        Outcome::Failed(if self.decode.target.pinned {
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
        })
    }

    /// The response headers naming the workers that served (set only when the operator shows
    /// worker ids).
    pub(super) fn served(&self, decode: WorkerId) -> Vec<(&'static str, String)> {
        let prefill = self.prefill.as_ref().map(|p| p.worker);
        let prefill = prefill.map(|w| (headers::PREFILL_WORKER_HEADER, w.to_string()));
        let decode = (headers::DECODE_WORKER_HEADER, decode.to_string());
        prefill.into_iter().chain([decode]).collect()
    }

    /// The worker Envoy's last attempt went to: the first candidate, or an alternate after
    /// connections to the ones before it failed (then those failures are counted).
    fn served_decode_worker<H: Host>(&self, env: &Env<H>) -> WorkerId {
        let first = self.decode.target.worker.id;
        let alternates = &self.decode.alternates;
        if !self.pooled {
            return first;
        }
        let Some(served) = env.host.upstream_address() else {
            return first;
        };
        let Some(at) = alternates
            .iter()
            .position(|w| w.address.to_string() == served)
        else {
            return first;
        };
        env.record_connect_failure(first);
        let skipped = alternates.get(..at).unwrap_or_default();
        skipped
            .iter()
            .for_each(|w| env.record_connect_failure(w.id));
        alternates.get(at).map_or(first, |w| w.id)
    }

    pub fn on_response_body<H: Host>(&mut self, env: &Env<H>, size: usize, end: bool) -> Flow {
        let error = match &self.answer {
            Answer::Replaced(error) => error,
            Answer::Retrying => return Flow::Pause,
            Answer::Awaited | Answer::AsItIs => return Flow::Continue,
        };
        if !end {
            return Flow::Pause;
        }
        if let Err(status) = env
            .host
            .replace_response_body(size, error.body().as_bytes())
        {
            log::error!(
                "pinroute: could not replace the response of {}: {status:?}",
                env.request_id
            );
        }
        Flow::Continue
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

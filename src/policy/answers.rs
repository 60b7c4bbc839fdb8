//! How a worker's answer is judged (`docs/semantics.md` §4): a failure of the hop (connect
//! error, 5xx, timeout, unusable prefill answer), or an answer that is the client's to read.

use serde_json::value::RawValue;

use super::hop::HopFailure;
use super::rewrite::prefill_kv_transfer_params;

/// What a prefill worker's answer means for the request.
#[derive(Debug)]
pub enum PrefillAnswer {
    /// Go on to decode, with the prefill worker's `kv_transfer_params` (none with
    /// shared-storage connectors).
    Ready(Option<Box<RawValue>>),
    /// The worker refused the request itself (4xx: a prompt too long, a bad parameter, too
    /// many requests): not a failure of the worker, so it is neither retried nor marked
    /// unhealthy, and the client gets the worker's own answer.
    Refused(u16),
    Failed(HopFailure),
}

/// Room for the one-token completion around a prefill answer's `kv_transfer_params`: an
/// answer over `max_kv_transfer_params_bytes` plus this is not read (`docs/semantics.md` §4).
pub const PREFILL_ANSWER_SLACK: usize = 64 * 1024;

/// The largest prefill answer the filter reads, given the bound on `kv_transfer_params`.
pub fn prefill_answer_limit(max_kv_transfer_params: usize) -> usize {
    max_kv_transfer_params.saturating_add(PREFILL_ANSWER_SLACK)
}

/// Judges a prefill call's answer: its `:status` (none when the call got no whole response),
/// the size of its body, and the body itself (read only when within
/// [`prefill_answer_limit`]). `kv_transfer_params` over `max_kv` bytes are no usable answer:
/// they would be spliced into a decode body Envoy must hold.
pub fn prefill_answer(
    status: Option<u16>,
    body_size: usize,
    body: &[u8],
    max_kv: usize,
) -> PrefillAnswer {
    let limit = prefill_answer_limit(max_kv);
    if status.is_some() && body_size > limit {
        return PrefillAnswer::Failed(HopFailure::TooLarge {
            bytes: body_size,
            limit,
        });
    }
    match status {
        None => PrefillAnswer::Failed(HopFailure::Incomplete),
        Some(200..=299) => match prefill_kv_transfer_params(body) {
            Ok(Some(params)) if params.get().len() > max_kv => {
                PrefillAnswer::Failed(HopFailure::TooLarge {
                    bytes: params.get().len(),
                    limit: max_kv,
                })
            }
            Ok(params) => PrefillAnswer::Ready(params),
            Err(failure) => PrefillAnswer::Failed(failure),
        },
        Some(status @ 400..=499) => PrefillAnswer::Refused(status),
        _ => PrefillAnswer::Failed(call_failure(status, body)),
    }
}

/// How a decode hop the filter sent itself (a retry, `docs/semantics.md` §4) failed, if it
/// did: no response, Envoy's own 503 or 504, or the worker's 5xx. Anything else is the
/// client's answer.
pub fn decode_call_failure(status: Option<u16>, body: &[u8]) -> Option<HopFailure> {
    match status {
        Some(status) if status < 500 => None,
        _ => Some(call_failure(status, body)),
    }
}

/// How a call the filter sent itself failed, from an answer that is no success: Envoy answers
/// a connection it could not make with 503 `upstream connect error ...` and a timeout with
/// 504. A call with no answer at all was reached and broke off afterwards (a reset mid-body,
/// an answer over Envoy's limit, a timeout once the headers came): never a connection failure.
fn call_failure(status: Option<u16>, body: &[u8]) -> HopFailure {
    match status {
        None => HopFailure::Incomplete,
        Some(504) => HopFailure::Timeout,
        Some(503) if body.starts_with(b"upstream connect error") => envoy_reset(body),
        Some(status) => HopFailure::Status(status),
    }
}

/// Envoy's own 503 for a call it could not make: a circuit breaker, the connection, or a
/// reset once connected (its body names the reset reason).
fn envoy_reset(body: &[u8]) -> HopFailure {
    let reason = String::from_utf8_lossy(body);
    reset_failure(&reason.replace(' ', "_"))
}

/// The failure a reset reason of Envoy's names (`connection_failure`, `connection_timeout`,
/// `overflow`, `remote_reset`, `connection_termination`, ...): only a connection that was
/// never made is `Connect`.
fn reset_failure(reason: &str) -> HopFailure {
    if reason.contains("overflow") {
        HopFailure::Overloaded
    } else if reason.contains("connection_failure") || reason.contains("connection_timeout") {
        HopFailure::Connect
    } else {
        HopFailure::Reset
    }
}

/// Whether a failure counts towards taking the worker out of unpinned selection (passive
/// health, `docs/semantics.md` §5): only a connection that was never made says the worker
/// may be down, and it takes several in a row to say it is. A reset after the worker
/// accepted the connection can be the worker refusing what a client sent (a body it will
/// not read), so it fails that request only. A timeout, a 5xx or an unusable answer
/// can be caused by the request itself (a huge prompt, a pathological parameter), so it
/// fails that request but costs no other client the worker; a slow or stuck worker is
/// avoided anyway, as its requests pile up in least-loaded selection.
pub fn takes_worker_out(failure: &HopFailure) -> bool {
    *failure == HopFailure::Connect
}

/// How a decode response counts as a failure of the hop: any 5xx, whether the worker's own
/// or Envoy's when the worker could not be reached (`details`, Envoy's
/// `response.code_details`, tells which). Anything else reaches the client as it is.
pub fn decode_failure(status: u16, details: Option<&str>) -> Option<HopFailure> {
    if !(500..=599).contains(&status) {
        return None;
    }
    Some(match details.unwrap_or("via_upstream") {
        "via_upstream" => HopFailure::Status(status),
        d if d.contains("connection_timeout") => HopFailure::Connect,
        d if d.contains("timeout") => HopFailure::Timeout,
        _ if status == 504 => HopFailure::Timeout,
        d => reset_failure(d),
    })
}

#[cfg(test)]
#[path = "tests/answers.rs"]
mod tests;

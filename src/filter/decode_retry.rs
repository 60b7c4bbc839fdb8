//! The filter's own retry of a decode hop (`docs/semantics.md` §4): an unpinned hop whose
//! worker refused the connection, when Envoy cannot retry it because the pool cluster does
//! not list the worker (one known only from the live registry). The filter keeps the request
//! it routed, sends it to the next candidate through the decode cluster, and answers the
//! client with that answer, whole.

use super::call::CallAnswer;
use super::env::{Env, host_failure};
use super::host::{Headers, Host};
use super::intake::forwarded_headers;
use super::metrics::Counter;
use super::phase::{DecodeRetry, Routed};
use crate::policy::answers;
use crate::policy::config::DECODE_CLUSTER;
use crate::policy::error::RouteError;
use crate::policy::headers::{INTERNAL_PREFIX, RELAYED_HEADER};
use crate::policy::hop::HopFailure;
use crate::policy::registry::address_text;

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

/// The request as it is routed, with the `body_len` bytes of body Envoy holds.
pub fn keep_for_retry(env: &Env<impl Host>, body_len: usize) -> Result<DecodeRetry, RouteError> {
    let routed = env.host.request_headers().map_err(host_failure)?;
    // The request's own `traceparent` already names Envoy's span (`stream::on_headers`).
    let forwarded = forwarded_headers(&routed, &env.config.settings.upstream_header, None);
    let headers: Headers = routed
        .texts()
        .filter(|(name, _)| CALL_HEADERS.contains(name))
        .chain(forwarded.texts())
        .collect();
    let body = match body_len {
        0 => Vec::new(),
        len => env.host.request_body(len).map_err(host_failure)?,
    };
    Ok(DecodeRetry {
        headers,
        body,
        token: None,
    })
}

/// Sends the kept request to the next candidate, if the filter retries this hop and one is
/// left: the call's token.
pub fn send_next(env: &Env<impl Host>, routed: &Routed) -> Option<u32> {
    let retry = routed.retry.as_ref()?;
    let next = routed.decode.alternates.first()?;
    let settings = &env.config.settings;
    let address = address_text(next.address);
    let mut headers: Vec<(&str, &str)> = retry.headers.texts().collect();
    headers.push((&settings.upstream_header, &address));
    let body = (!retry.body.is_empty()).then_some(retry.body.as_slice());
    let token = env.call(DECODE_CLUSTER, &headers, body, settings.decode_timeout())?;
    log::info!(
        "pinroute: request {}: decode worker {} refused the connection, sent to worker {}",
        env.request_id,
        routed.decode.target.worker.id,
        next.id
    );
    env.count(Counter::DecodeRetried);
    Some(token)
}

/// A retried hop's answer, and how it failed, if it did.
pub fn read_answer(
    env: &Env<impl Host>,
    body_size: usize,
) -> (CallAnswer, u16, Option<HopFailure>) {
    let call = CallAnswer::read(&env.host, body_size, usize::MAX);
    let failure = answers::decode_call_failure(call.status, &call.body);
    let status = call.status.unwrap_or(0);
    (call, status, failure)
}

/// Answers the client with a retried hop's answer, naming what served
/// ([`super::response::served`]).
pub fn relay(env: &Env<impl Host>, call: &CallAnswer, status: u16, served: &[(&str, String)]) {
    let mut headers: Vec<(&str, &str)> = relayed(&call.headers).collect();
    headers.push((RELAYED_HEADER, "decode"));
    headers.extend(served.iter().map(|(name, value)| (*name, value.as_str())));
    if let Err(error) = env.host.send_response(status, &headers, &call.body) {
        log::error!(
            "pinroute: could not answer {} with its retried hop's answer: {error}",
            env.request_id
        );
    }
}

/// The worker's answer headers the client gets: never one that speaks for the filter.
fn relayed(headers: &Headers) -> impl Iterator<Item = (&str, &str)> {
    headers.texts().filter(|(name, _)| {
        !name.starts_with(':') && !name.starts_with(INTERNAL_PREFIX) && !NOT_RELAYED.contains(name)
    })
}

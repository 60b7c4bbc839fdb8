//! Reading what the client sent (`docs/semantics.md` §1, §2, §4): which paths, methods and
//! sizes are admitted, the request id, the headers the prefill hop carries, the whole body.

use super::env::{Env, host_failure};
use super::host::{Headers, Host};
use crate::policy::api::ErrorShape;
use crate::policy::error::{RouteError, quoted};
use crate::policy::headers;
use crate::policy::paths::{self, Destination};
use crate::policy::pins::{HeaderHints, Pins};
use crate::policy::trace::{SpanIds, TRACE_HEADER, TRACEPARENT};

/// Client headers never copied onto the prefill hop: the filter sets its own, or they
/// describe the client's connection rather than the request.
/// (Nor is any `content-*` header: the prefill body is the filter's own.)
const NOT_FORWARDED: &[&str] = &[
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "te",
    "expect",
    "host",
    "x-request-id",
    // The filter reads the prefill answer: it asks for it uncompressed.
    "accept-encoding",
];

/// Where the request may go, from its path, method and announced size: only the routed
/// paths reach a worker, a generation only by `POST`, no body over the limit. The path also
/// tells how the client reads an error.
pub fn admit(env: &mut Env<impl Host>, headers: &Headers) -> Result<Destination, RouteError> {
    let canonical = paths::canonical_path(header_text(headers, ":path"));
    env.errors = ErrorShape::of_path(&canonical);
    let settings = &env.config.settings;
    let destination = paths::destination_of(canonical, &settings.routed_paths);
    let method = header_text(headers, ":method");
    match &destination {
        Destination::NotRouted(path) => {
            let path = quoted(path);
            return Err(RouteError::UnknownPath { path });
        }
        Destination::Generation(api) if method != "POST" => {
            return Err(RouteError::MethodNotAllowed {
                method: quoted(method),
                path: api.path().to_string(),
                allow: "POST",
            });
        }
        Destination::StoredResponse(stored) if method != stored.method() => {
            return Err(RouteError::MethodNotAllowed {
                method: quoted(method),
                path: quoted(&stored.path),
                allow: stored.method(),
            });
        }
        _ => {}
    }
    let limit = settings.max_body_bytes;
    let length = header_text(headers, "content-length").parse::<u64>();
    if length.is_ok_and(|n| n > limit as u64) {
        return Err(RouteError::BodyTooLarge { limit });
    }
    Ok(destination)
}

/// The client's `x-request-id`, or one of the filter's own, set on the request.
pub fn request_id(env: &Env<impl Host>, headers: &Headers) -> Result<String, RouteError> {
    let existing = header_text(headers, "x-request-id");
    if !existing.is_empty() {
        return Ok(existing.to_string());
    }
    let id = format!(
        "pinroute-{:x}-{:x}",
        env.host.now_nanos(),
        env.rotation.get()
    );
    env.set_request_header("x-request-id", Some(&id))?;
    Ok(id)
}

/// The caller the edge's authentication named, when the operator restricts what callers may
/// do (`docs/semantics.md` §7).
pub fn caller(env: &Env<impl Host>, headers: &Headers) -> Option<String> {
    let rules = env.config.settings.callers.as_ref()?;
    Some(header_text(headers, &rules.header))
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
}

/// Refuses what the caller may not ask for: `pins` (the header pins, or all of them once the
/// body is read) or the session.
pub fn check_caller(
    env: &Env<impl Host>,
    hints: &HeaderHints,
    pins: &Pins,
) -> Result<(), RouteError> {
    let Some(rules) = &env.config.settings.callers else {
        return Ok(());
    };
    rules.check(hints.caller.as_deref(), pins, hints.session.is_some())
}

/// The request body once Envoy holds all of it (`None` until then), within the limit.
pub fn whole_body(
    env: &Env<impl Host>,
    body_size: usize,
    end_of_stream: bool,
) -> Result<Option<Vec<u8>>, RouteError> {
    let limit = env.config.settings.max_body_bytes;
    if body_size > limit {
        return Err(RouteError::BodyTooLarge { limit });
    }
    if !end_of_stream {
        return Ok(None);
    }
    env.host
        .request_body(body_size)
        .map(Some)
        .map_err(host_failure)
}

pub fn header_text<'h>(headers: &'h Headers, name: &str) -> &'h str {
    headers
        .get(name)
        .and_then(|v| std::str::from_utf8(v).ok())
        .unwrap_or("")
}

/// The client headers worth copying onto the prefill hop (authorization, tracing, ...), the
/// client's `traceparent` replaced by `traceparent` when one is given.
pub fn forwarded_headers(
    headers: &Headers,
    upstream_header: &str,
    traceparent: Option<&str>,
) -> Headers {
    let mut forwarded = headers.filtered(|name, value| {
        !name.starts_with(':')
            && !name.starts_with("content-")
            && !NOT_FORWARDED.contains(&name)
            && !headers::must_strip(name, upstream_header)
            && (traceparent.is_none() || name != TRACEPARENT)
            && std::str::from_utf8(value).is_ok()
    });
    if let Some(traceparent) = traceparent {
        forwarded.push(TRACEPARENT.as_bytes(), traceparent.as_bytes());
    }
    forwarded
}

/// The `traceparent` naming Envoy's request span, when Envoy traces the request (§4,
/// "Traces"): the filter's own calls carry it (the routed hop gets the router's).
pub fn request_traceparent(headers: &Headers) -> Option<String> {
    let span = SpanIds::from_trace_header(header_text(headers, TRACE_HEADER))?;
    Some(span.traceparent(header_text(headers, TRACEPARENT)))
}

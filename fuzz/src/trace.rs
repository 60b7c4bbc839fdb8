//! Trace context on the prefill hop (docs/semantics.md §4, "Traces"): the ids Envoy hands the
//! filter in `x-pinroute-trace` and a client's `traceparent`, both from outside.
//!
//! Input: the `x-pinroute-trace` value, a NUL byte, the client's `traceparent`.
//!
//! Properties:
//! - `SpanIds::from_trace_header` accepts exactly `<32 lower-case hex>/<16 lower-case hex>`,
//!   neither all zeros, and keeps both ids as written;
//! - `SpanIds::from_traceparent` accepts exactly a version-00 `traceparent` of such ids and
//!   two hex flag digits, sampled when the flags' low bit is set;
//! - the `traceparent` the filter sends is always one it would accept, naming the span it was
//!   made from, with the client's flags when the client's header is valid and `01`
//!   otherwise; a child span keeps its trace and has a valid id of its own.

use pinroute::policy::trace::SpanIds;

use crate::violated;

pub fn check(data: &[u8]) {
    let mut parts = data.splitn(2, |b| *b == 0);
    let header = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let client = String::from_utf8_lossy(parts.next().unwrap_or_default());
    check_client(&client);
    let parsed = SpanIds::from_trace_header(&header);
    let expected = model_trace_header(&header);
    match (&parsed, expected) {
        (Some(ids), Some((trace, span))) if ids.trace_id == trace && ids.span_id == span => {}
        (None, None) => {}
        _ => violated(format!("x-pinroute-trace {header:?}: {parsed:?}")),
    }
    let Some(ids) = parsed else { return };
    let sent = ids.traceparent(&client);
    let flags = model_traceparent(&client).map_or("01", |(_, _, flags)| flags);
    if sent != format!("00-{}-{}-{flags}", ids.trace_id, ids.span_id) {
        violated(format!("sent {sent:?} for {header:?} and {client:?}"));
    }
    match SpanIds::from_traceparent(&sent) {
        Some((back, _)) if back == ids => {}
        other => violated(format!("the filter's own {sent:?} reads back as {other:?}")),
    }
    let child = ids.child();
    if child.trace_id != ids.trace_id || SpanIds::new(&child.trace_id, &child.span_id).is_none() {
        violated(format!("child {child:?} of {ids:?}"));
    }
}

fn check_client(client: &str) {
    let parsed = SpanIds::from_traceparent(client);
    match (&parsed, model_traceparent(client)) {
        (Some((ids, sampled)), Some((trace, span, flags)))
            if ids.trace_id == trace
                && ids.span_id == span
                && *sampled == (u8::from_str_radix(flags, 16).ok().unwrap_or(0) & 1 == 1) => {}
        (None, None) => {}
        _ => violated(format!("traceparent {client:?}: {parsed:?}")),
    }
}

/// `<trace>/<span>` as the filter must accept it.
fn model_trace_header(value: &str) -> Option<(&str, &str)> {
    let (trace, span) = value.split_once('/')?;
    (is_id(trace, 32) && is_id(span, 16)).then_some((trace, span))
}

/// `00-<trace>-<span>-<flags>` as the filter must accept it.
fn model_traceparent(value: &str) -> Option<(&str, &str, &str)> {
    let fields: Vec<&str> = value.split('-').collect();
    let [version, trace, span, flags] = fields.as_slice() else {
        return None;
    };
    let flags_ok = flags.len() == 2 && flags.chars().all(|c| c.is_ascii_hexdigit());
    (*version == "00" && is_id(trace, 32) && is_id(span, 16) && flags_ok)
        .then_some((*trace, *span, *flags))
}

fn is_id(id: &str, len: usize) -> bool {
    id.len() == len
        && id
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
        && id.chars().any(|c| c != '0')
}

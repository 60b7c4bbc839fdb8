//! Trace context on the prefill hop (`docs/semantics.md` §4, "Traces"): the filter's own
//! call carries a W3C `traceparent` naming Envoy's span, so the prefill worker's span joins
//! the request's trace as the decode worker's does (Envoy's router names its own span there).
//!
//! Envoy hands the filter its request span's ids in [`TRACE_HEADER`] (`trace-id/span-id`,
//! set by the bootstrap from `%TRACE_ID%/%SPAN_ID%` when tracing is on, removed otherwise);
//! the sampled flag is the client's when it sent a valid `traceparent`, else sampled.

use std::hash::{BuildHasher, RandomState};

/// The request span's ids as Envoy gives them to the filter: `<trace-id>/<span-id>`.
pub const TRACE_HEADER: &str = "x-pinroute-trace";
pub const TRACEPARENT: &str = "traceparent";

const SAMPLED: &str = "01";

/// A span's place in its trace: 32 and 16 lower-case hex digits, neither all zeros.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanIds {
    pub trace_id: String,
    pub span_id: String,
}

impl SpanIds {
    pub fn new(trace_id: &str, span_id: &str) -> Option<Self> {
        (is_id(trace_id, 32) && is_id(span_id, 16)).then(|| Self {
            trace_id: trace_id.to_owned(),
            span_id: span_id.to_owned(),
        })
    }

    /// The ids of [`TRACE_HEADER`]'s value.
    pub fn from_trace_header(value: &str) -> Option<Self> {
        let (trace_id, span_id) = value.split_once('/')?;
        Self::new(trace_id, span_id)
    }

    /// The span a valid version-00 `traceparent` names, and whether it is sampled.
    pub fn from_traceparent(value: &str) -> Option<(Self, bool)> {
        let (trace_id, span_id, flags) = parse_traceparent(value)?;
        let sampled = u8::from_str_radix(flags, 16).is_ok_and(|f| f & 1 == 1);
        Some((Self::new(trace_id, span_id)?, sampled))
    }

    /// A new span of the same trace, its id drawn at random.
    pub fn child(&self) -> Self {
        let random = RandomState::new().hash_one(&self.span_id) | 1;
        Self {
            trace_id: self.trace_id.clone(),
            span_id: format!("{random:016x}"),
        }
    }

    /// The `traceparent` naming this span as the parent, with `client`'s sampled flag.
    pub fn traceparent(&self, client: &str) -> String {
        let flags = parse_traceparent(client).map_or(SAMPLED, |(_, _, flags)| flags);
        format!("00-{}-{}-{flags}", self.trace_id, self.span_id)
    }
}

/// The trace id, span id and flags of a valid version-00 `traceparent`.
fn parse_traceparent(traceparent: &str) -> Option<(&str, &str, &str)> {
    let mut parts = traceparent.split('-');
    let (version, trace_id, span_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let valid = version == "00"
        && parts.next().is_none()
        && is_id(trace_id, 32)
        && is_id(span_id, 16)
        && flags.len() == 2
        && flags.bytes().all(|b| b.is_ascii_hexdigit());
    valid.then_some((trace_id, span_id, flags))
}

fn is_id(id: &str, len: usize) -> bool {
    id.len() == len
        && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && id.bytes().any(|b| b != b'0')
}

#[cfg(test)]
#[path = "tests/trace.rs"]
mod tests;

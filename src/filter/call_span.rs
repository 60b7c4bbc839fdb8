//! The span of the filter's own prefill call (`docs/semantics.md` §4, "Traces"): the host's
//! where the host has spans (the native module: Envoy's tracer); otherwise, where the settings
//! name a collector and the request is traced and sampled, one the filter makes itself and
//! queues for its root to export (`super::span_export`; proxy-wasm has no span API). Either
//! way the call's `traceparent` names it; with neither, the request's span.

use super::env::Env;
use super::host::Host;
use crate::policy::otlp::FinishedSpan;
use crate::policy::trace::SpanIds;

/// An open call span: the `traceparent` the call carries, and what the filter's own needs.
pub struct CallSpan {
    pub traceparent: String,
    own: Option<OwnSpan>,
}

struct OwnSpan {
    ids: SpanIds,
    parent: SpanIds,
    operation: &'static str,
    started_nanos: u64,
}

/// Opens the span of a call whose `traceparent` would otherwise be `parent` (the request's
/// span, or the client's).
pub fn open(env: &Env<impl Host>, operation: &'static str, parent: &str) -> Option<CallSpan> {
    if env.host.has_spans() {
        let ids = env.host.open_call_span(operation)?;
        return Some(CallSpan {
            traceparent: ids.traceparent(parent),
            own: None,
        });
    }
    if env.config.settings.trace_export_cluster.is_empty() {
        return None;
    }
    let (parent_ids, sampled) = SpanIds::from_traceparent(parent)?;
    if !sampled {
        return None;
    }
    let ids = parent_ids.child();
    Some(CallSpan {
        traceparent: ids.traceparent(parent),
        own: Some(OwnSpan {
            ids,
            parent: parent_ids,
            operation,
            started_nanos: env.host.now_nanos(),
        }),
    })
}

/// Tags and ends the span (`error`: why the call failed): the host's is closed, the filter's
/// own queued for export.
pub fn close(env: &Env<impl Host>, span: CallSpan, tags: &[(&str, &str)], error: Option<&str>) {
    let Some(own) = span.own else {
        env.host.close_call_span(tags);
        return;
    };
    let finished = FinishedSpan {
        ids: own.ids,
        parent: own.parent,
        name: own.operation.to_owned(),
        start_nanos: own.started_nanos,
        end_nanos: env.host.now_nanos(),
        attributes: tags
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        error: error.map(str::to_owned),
    };
    if !env.spans.push(finished) {
        log::debug!("pinroute: span queue full, a prefill span dropped");
    }
}

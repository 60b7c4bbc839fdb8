//! The spans the filter makes itself where the host has none to give it (proxy-wasm;
//! `super::call_span`): queued by the streams of this VM, exported by its root on its tick in
//! one OTLP/gRPC call, so that an export outlives the stream that made it (Envoy cancels a
//! stream's calls when the stream ends) and costs one call a tick, not one a request.

use std::cell::RefCell;
use std::time::Duration;

use super::host::Host;
use crate::policy::otlp::{self, FinishedSpan};

/// The most spans waiting for the next tick; more are dropped (a collector that cannot keep
/// up must not grow the VM's memory).
const MAX_QUEUED: usize = 512;
/// How long an export may take; nothing waits for it.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Default)]
pub struct SpanQueue {
    spans: RefCell<Vec<FinishedSpan>>,
}

impl SpanQueue {
    /// Queues a finished span; `false` when the queue is full and it was dropped.
    pub fn push(&self, span: FinishedSpan) -> bool {
        let mut spans = self.spans.borrow_mut();
        if spans.len() >= MAX_QUEUED {
            return false;
        }
        spans.push(span);
        true
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.spans.borrow().len()
    }

    /// Exports every queued span to the collector's `cluster` in one call.
    pub fn export(&self, host: &impl Host, cluster: &str) {
        let spans = std::mem::take(&mut *self.spans.borrow_mut());
        if spans.is_empty() {
            return;
        }
        let message = otlp::export_request(&spans);
        if let Err(e) = host.dispatch_grpc(
            cluster,
            otlp::SERVICE,
            otlp::METHOD,
            &message,
            EXPORT_TIMEOUT,
        ) {
            log::warn!(
                "pinroute: {} spans not exported to {cluster}: {e}",
                spans.len()
            );
        }
    }
}

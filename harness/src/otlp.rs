//! An OTLP/gRPC trace receiver (OpenTelemetry's own protocol types): what Envoy's
//! OpenTelemetry tracer and vLLM's `--otlp-traces-endpoint` export to in the trace tests,
//! keeping every span in memory.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use tokio::task::JoinHandle;

use crate::grpc;

/// One span as received, ids in lower-case hex (a root span's parent is empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedSpan {
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub start_nanos: u64,
    pub end_nanos: u64,
    /// String and integer attributes, as text.
    pub attributes: BTreeMap<String, String>,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }

    pub fn duration(&self) -> Duration {
        Duration::from_nanos(self.end_nanos.saturating_sub(self.start_nanos))
    }
}

type Spans = Arc<Mutex<Vec<ReceivedSpan>>>;

/// A running receiver on `127.0.0.1`; it stops when dropped.
pub struct OtlpReceiver {
    address: SocketAddr,
    spans: Spans,
    server: JoinHandle<()>,
}

impl OtlpReceiver {
    pub async fn start() -> Result<Self> {
        let spans = Spans::default();
        let service = TraceServiceServer::new(Collector {
            spans: spans.clone(),
        });
        let router = tonic::transport::Server::builder().add_service(service);
        let (address, server) = grpc::serve(router, "OTLP receiver").await?;
        Ok(Self {
            address,
            spans,
            server,
        })
    }

    /// Where it listens (`envoy-config --otlp`, vLLM's `--otlp-traces-endpoint`).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        lock(&self.spans).clone()
    }

    /// The spans of `trace_id`, once `expected` of them have arrived (exporters batch).
    pub async fn trace(&self, trace_id: &str, expected: usize) -> Result<Vec<ReceivedSpan>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans: Vec<ReceivedSpan> = self
                .spans()
                .into_iter()
                .filter(|s| s.trace_id == trace_id)
                .collect();
            if spans.len() >= expected {
                return Ok(spans);
            }
            if Instant::now() > deadline {
                bail!(
                    "{} spans of trace {trace_id} in 30 s, {expected} expected:\n{}",
                    spans.len(),
                    tree(&spans)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A trace as an indented tree: each span under its parent, with its service, duration and
/// attributes (spans whose parent is not among them at the top).
pub fn tree(spans: &[ReceivedSpan]) -> String {
    let mut text = String::new();
    let ids: Vec<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let mut roots: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| !ids.contains(&s.parent_span_id.as_str()))
        .collect();
    roots.sort_by_key(|s| s.start_nanos);
    for root in roots {
        write_span(&mut text, spans, root, 0);
    }
    text
}

fn write_span(text: &mut String, spans: &[ReceivedSpan], span: &ReceivedSpan, depth: usize) {
    let _ = writeln!(
        text,
        "{}{} [{}] {:.3} ms span {} parent {} {:?}",
        "  ".repeat(depth),
        span.name,
        span.service,
        span.duration().as_secs_f64() * 1000.0,
        span.span_id,
        span.parent_span_id,
        span.attributes
    );
    let mut children: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.parent_span_id == span.span_id)
        .collect();
    children.sort_by_key(|s| s.start_nanos);
    for child in children {
        write_span(text, spans, child, depth + 1);
    }
}

struct Collector {
    spans: Spans,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let resource = resource_spans.resource.unwrap_or_default();
            let service = attributes(&resource.attributes)
                .remove("service.name")
                .unwrap_or_default();
            for span in resource_spans
                .scope_spans
                .into_iter()
                .flat_map(|scope| scope.spans)
            {
                received.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    start_nanos: span.start_time_unix_nano,
                    end_nanos: span.end_time_unix_nano,
                    attributes: attributes(&span.attributes),
                });
            }
        }
        lock(&self.spans).extend(received);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn attributes(pairs: &[KeyValue]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .filter_map(|pair| {
            let value = match pair.value.as_ref()?.value.as_ref()? {
                AnyValue::StringValue(text) => text.clone(),
                AnyValue::IntValue(number) => number.to_string(),
                AnyValue::DoubleValue(number) => number.to_string(),
                AnyValue::BoolValue(flag) => flag.to_string(),
                _ => return None,
            };
            Some((pair.key.clone(), value))
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut text, byte| {
        let _ = write!(text, "{byte:02x}");
        text
    })
}

fn lock(spans: &Spans) -> MutexGuard<'_, Vec<ReceivedSpan>> {
    spans
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use pinroute::policy::otlp::{FinishedSpan, export_request};
    use pinroute::policy::trace::SpanIds;
    use prost::Message as _;

    use super::*;

    /// The span the `.wasm` filter exports itself is what OpenTelemetry's own types decode.
    #[test]
    fn the_filters_own_encoding_decodes_as_otlp() {
        let span = FinishedSpan {
            ids: SpanIds::new("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7").unwrap(),
            parent: SpanIds::new("4bf92f3577b34da6a3ce929d0e0e4736", "b7ad6b7169203331").unwrap(),
            name: "pinroute prefill".into(),
            start_nanos: 1_764_900_000_000_000_000,
            end_nanos: 1_764_900_000_250_000_000,
            attributes: vec![
                ("pinroute.prefill_worker".into(), "101".into()),
                ("pinroute.outcome".into(), "failed".into()),
            ],
            error: Some("connection refused".into()),
        };
        let bytes = export_request(&[span.clone(), span.clone()]);
        let request = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
        let resource = &request.resource_spans[0];
        let service = attributes(&resource.resource.as_ref().unwrap().attributes);
        assert_eq!(service["service.name"], "pinroute");
        assert_eq!(
            resource.scope_spans[0].spans.len(),
            2,
            "one export, both spans"
        );
        let decoded = &resource.scope_spans[0].spans[0];
        assert_eq!(hex(&decoded.trace_id), span.ids.trace_id);
        assert_eq!(hex(&decoded.span_id), span.ids.span_id);
        assert_eq!(hex(&decoded.parent_span_id), span.parent.span_id);
        assert_eq!(decoded.name, "pinroute prefill");
        assert_eq!(decoded.kind, 3, "SPAN_KIND_CLIENT");
        assert_eq!(
            (decoded.start_time_unix_nano, decoded.end_time_unix_nano),
            (span.start_nanos, span.end_nanos)
        );
        let tags = attributes(&decoded.attributes);
        assert_eq!(tags["pinroute.prefill_worker"], "101");
        assert_eq!(tags["pinroute.outcome"], "failed");
        let status = decoded.status.as_ref().unwrap();
        assert_eq!(
            (status.code, status.message.as_str()),
            (2, "connection refused")
        );
    }
}

//! One span as OTLP's `ExportTraceServiceRequest` (protobuf): what the filter exports itself
//! for its prefill hop where the host has no span of its own to give it (proxy-wasm,
//! `docs/semantics.md` §4 "Traces"). Hand-encoded: a handful of fields, no dependency.

use super::trace::SpanIds;

/// The collector's gRPC service and method.
pub const SERVICE: &str = "opentelemetry.proto.collector.trace.v1.TraceService";
pub const METHOD: &str = "Export";
/// `service.name` of the gateway's spans: the filter's own, and Envoy's as the rendered
/// bootstrap names them.
pub const SERVICE_NAME: &str = "pinroute";

/// OTLP's `SPAN_KIND_CLIENT`: the hop is a call the gateway makes.
const SPAN_KIND_CLIENT: u64 = 3;

/// OTLP's `STATUS_CODE_ERROR`.
const STATUS_CODE_ERROR: u64 = 2;

/// A finished span: its ids, its parent (same trace), name, times, string attributes, and
/// why it failed if it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedSpan {
    pub ids: SpanIds,
    pub parent: SpanIds,
    pub name: String,
    pub start_nanos: u64,
    pub end_nanos: u64,
    pub attributes: Vec<(String, String)>,
    pub error: Option<String>,
}

/// `ExportTraceServiceRequest { resource_spans: [{ resource: { service.name }, scope_spans:
/// [{ scope: { name }, spans }] }] }`.
pub fn export_request(spans: &[FinishedSpan]) -> Vec<u8> {
    let resource = message(1, &string_attribute("service.name", SERVICE_NAME));
    let mut scope_spans = message(1, &bytes_field(1, SERVICE_NAME.as_bytes()));
    for span in spans {
        scope_spans.extend(message(2, &span_message(span)));
    }
    let resource_spans = [resource, message(2, &scope_spans)].concat();
    message(1, &resource_spans)
}

fn span_message(span: &FinishedSpan) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend(bytes_field(1, &hex_bytes(&span.ids.trace_id)));
    out.extend(bytes_field(2, &hex_bytes(&span.ids.span_id)));
    out.extend(bytes_field(4, &hex_bytes(&span.parent.span_id)));
    out.extend(bytes_field(5, span.name.as_bytes()));
    out.extend(varint_field(6, SPAN_KIND_CLIENT));
    out.extend(fixed64_field(7, span.start_nanos));
    out.extend(fixed64_field(8, span.end_nanos));
    for (key, value) in &span.attributes {
        out.extend(message(9, &key_value(key, value)));
    }
    if let Some(why) = &span.error {
        // Status { message = 2, code = 3 }.
        let status = [
            bytes_field(2, why.as_bytes()),
            varint_field(3, STATUS_CODE_ERROR),
        ];
        out.extend(message(15, &status.concat()));
    }
    out
}

/// A `KeyValue` wrapped as an `attributes` entry of a `Resource`.
fn string_attribute(key: &str, value: &str) -> Vec<u8> {
    message(1, &key_value(key, value))
}

/// `KeyValue { key, value: AnyValue { string_value } }`.
fn key_value(key: &str, value: &str) -> Vec<u8> {
    [
        bytes_field(1, key.as_bytes()),
        message(2, &bytes_field(1, value.as_bytes())),
    ]
    .concat()
}

fn message(field: u64, body: &[u8]) -> Vec<u8> {
    bytes_field(field, body)
}

fn bytes_field(field: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = varint(field << 3 | 2);
    out.extend(varint(bytes.len() as u64));
    out.extend_from_slice(bytes);
    out
}

fn varint_field(field: u64, value: u64) -> Vec<u8> {
    [varint(field << 3), varint(value)].concat()
}

fn fixed64_field(field: u64, value: u64) -> Vec<u8> {
    [varint(field << 3 | 1), value.to_le_bytes().to_vec()].concat()
}

/// Unsigned LEB128, as protobuf (and the wasm binary format) encode integers.
pub fn varint(mut value: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(10);
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// The bytes of a lower-case hex id ([`SpanIds`] holds only valid ones).
fn hex_bytes(hex: &str) -> Vec<u8> {
    hex.as_bytes()
        .chunks(2)
        .filter_map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

#[cfg(test)]
#[path = "tests/otlp.rs"]
mod tests;

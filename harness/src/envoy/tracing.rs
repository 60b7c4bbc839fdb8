//! Traces (`envoy-config --otlp`, `docs/metrics.md` "Traces"): Envoy's OpenTelemetry tracer
//! exporting over OTLP/gRPC, one span for the request and one for each decode attempt
//! (`spawn_upstream_span`), both tagged with the filter's fields; and the request span's
//! ids handed to the filter so that its prefill hop's `traceparent` names them
//! (`pinroute::policy::trace`).

use std::net::SocketAddr;

use pinroute::policy::trace::TRACE_HEADER;

/// The cluster of the OTLP collector.
pub const OTLP_CLUSTER: &str = "pinroute_otlp";
/// Envoy's name in the traces (`service.name`), the filter's own spans' too.
use pinroute::policy::otlp::SERVICE_NAME;

/// The filter's fields (its filter state, as the access log reads them) on both spans.
const FILTER_TAGS: [&str; 8] = [
    "model",
    "prefill_worker",
    "prefill_rank",
    "prefill_choice",
    "prefill_ms",
    "decode_worker",
    "decode_rank",
    "decode_choice",
];

/// The HTTP connection manager's `tracing`, or nothing without a collector.
pub fn tracing_block(otlp: Option<SocketAddr>) -> String {
    if otlp.is_none() {
        return String::new();
    }
    let mut tags: Vec<String> = FILTER_TAGS
        .iter()
        .map(|field| {
            format!(
                "    - {{ tag: pinroute.{field}, value: \"%FILTER_STATE(wasm.pinroute.{field}:PLAIN)%\" }}"
            )
        })
        .collect();
    tags.push(
        "    - { tag: pinroute.error_code, value: \"%RESP(x-pinroute-error-code)%\" }".to_owned(),
    );
    let tags = tags.join("\n");
    format!(
        "tracing:\n  random_sampling: {{ value: 100 }}\n  spawn_upstream_span: true\n  \
         upstream_operation: \"pinroute decode %UPSTREAM_CLUSTER%\"\n  custom_tags:\n{tags}\n  \
         provider:\n    name: envoy.tracers.opentelemetry\n    typed_config:\n      \
         \"@type\": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig\n      \
         grpc_service:\n        envoy_grpc: {{ cluster_name: {OTLP_CLUSTER} }}\n        \
         timeout: 1s\n      service_name: {SERVICE_NAME}\n"
    )
}

/// The first filter's line for [`TRACE_HEADER`]: Envoy's request span ids when tracing, else
/// the header removed (a client's copy must never reach the filter).
pub fn trace_header_mutation(otlp: Option<SocketAddr>) -> String {
    match otlp {
        Some(_) => format!(
            "- append: {{ header: {{ key: {TRACE_HEADER}, value: \"%TRACE_ID%/%SPAN_ID%\" }}, append_action: OVERWRITE_IF_EXISTS_OR_ADD }}"
        ),
        None => format!("- remove: \"{TRACE_HEADER}\""),
    }
}

/// The collector's cluster (OTLP/gRPC: HTTP/2), or nothing.
pub fn otlp_cluster(otlp: Option<SocketAddr>) -> String {
    let Some(address) = otlp else {
        return String::new();
    };
    format!(
        "- name: {OTLP_CLUSTER}\n  type: STATIC\n  connect_timeout: 1s\n  \
         typed_extension_protocol_options:\n    \
         envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n      \
         \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n      \
         explicit_http_config: {{ http2_protocol_options: {{}} }}\n  \
         load_assignment:\n    cluster_name: {OTLP_CLUSTER}\n    endpoints:\n    \
         - lb_endpoints:\n      - endpoint:\n          address:\n            \
         socket_address: {{ address: \"{}\", port_value: {} }}\n",
        address.ip(),
        address.port()
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_field_the_access_log_reads_is_a_tag_of_both_spans() {
        let template = include_str!("../../../envoy/bootstrap.yaml");
        let mut logged: Vec<&str> = template
            .split("%FILTER_STATE(wasm.pinroute.")
            .skip(1)
            .filter_map(|rest| rest.split(':').next())
            .collect();
        logged.sort_unstable();
        let mut tagged = FILTER_TAGS.to_vec();
        tagged.sort_unstable();
        assert_eq!(logged, tagged);
        let block = tracing_block(Some("127.0.0.1:4317".parse().unwrap()));
        for field in FILTER_TAGS {
            assert!(
                block.contains(&format!("tag: pinroute.{field},")),
                "{block}"
            );
        }
        assert!(block.contains("spawn_upstream_span: true"), "{block}");
    }

    #[test]
    fn without_a_collector_nothing_traces_and_a_clients_ids_are_removed() {
        assert_eq!(tracing_block(None), "");
        assert_eq!(otlp_cluster(None), "");
        assert_eq!(
            trace_header_mutation(None),
            "- remove: \"x-pinroute-trace\""
        );
        let with = trace_header_mutation(Some("127.0.0.1:4317".parse().unwrap()));
        assert!(
            with.contains("%TRACE_ID%/%SPAN_ID%") && with.contains("OVERWRITE"),
            "{with}"
        );
    }
}

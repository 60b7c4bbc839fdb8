//! One trace across the gateway and both engines (`docs/metrics.md`, "Traces"): Envoy's
//! request span continues the client's `traceparent`, each hop's span is its child, and each
//! engine's own `llm_request` span (vLLM's `--otlp-traces-endpoint`) joins under the span of
//! its hop.

use pinroute_harness::otlp::{ReceivedSpan, tree};

use crate::Gateway;
use crate::client::{complete, completion};

const TRACE: &str = "5ce929d0e0e4736a3ce929d0e0e47364";
const CLIENT_SPAN: &str = "a3ce929d0e0e4736";

fn span<'a>(spans: &'a [ReceivedSpan], service: &str, name: &str) -> &'a ReceivedSpan {
    spans
        .iter()
        .find(|s| s.service == service && s.name.starts_with(name))
        .unwrap_or_else(|| panic!("no {service} span {name:?} in\n{}", tree(spans)))
}

pub async fn one_trace_across_the_gateway_and_both_engines(gateway: &Gateway) {
    let traceparent = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    let body = completion(gateway, "Trace this request through both engines.", 4);
    let reply = complete(gateway, &[("traceparent", &traceparent)], &body).await;
    reply.assert_ok("traced");
    assert!(reply.worker("prefill").is_some(), "took both hops");
    let expected = if gateway.traced_engines { 5 } else { 3 };
    let spans = gateway.otlp.trace(TRACE, expected).await.unwrap();
    eprintln!("vllm suite: the request's trace\n{}", tree(&spans));
    let request = span(&spans, "pinroute", "ingress");
    let decode_hop = span(&spans, "pinroute", "pinroute decode");
    let prefill_hop = span(&spans, "pinroute", "pinroute prefill");
    assert_eq!(request.parent_span_id, CLIENT_SPAN);
    assert_eq!(decode_hop.parent_span_id, request.span_id);
    assert_eq!(prefill_hop.parent_span_id, request.span_id);
    if !gateway.traced_engines {
        return;
    }
    let prefill = span(&spans, "vllm-prefill", "llm_request");
    let decode = span(&spans, "vllm-decode", "llm_request");
    assert_eq!(
        prefill.parent_span_id,
        prefill_hop.span_id,
        "{}",
        tree(&spans)
    );
    assert_eq!(
        decode.parent_span_id,
        decode_hop.span_id,
        "{}",
        tree(&spans)
    );
    assert!(prefill.end_nanos <= decode.end_nanos, "{}", tree(&spans));
    // The request's access-log line names the request and workers its spans do.
    let request_id = request.attribute("guid:x-request-id").unwrap();
    let entry = gateway.envoy.access_log_entry(request_id).await.unwrap();
    eprintln!("vllm suite: its access-log line\n{entry}");
    for engine in [prefill, decode] {
        let engine_id = engine.attribute("gen_ai.request.id").unwrap_or_default();
        assert!(
            engine_id.contains(request_id),
            "{engine_id} names {request_id}"
        );
    }
    for field in [
        "prefill_worker",
        "decode_worker",
        "prefill_choice",
        "decode_choice",
    ] {
        let tag = request.attribute(&format!("pinroute.{field}")).unwrap();
        assert_eq!(entry[field].as_str(), Some(tag), "{field}: {entry}");
    }
}

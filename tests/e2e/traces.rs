//! Traces through Envoy (`docs/metrics.md`, "Traces"): with `envoy-config --otlp`, one
//! request is one trace continuing the client's `traceparent` — Envoy's request span, the
//! decode hop's span and the prefill hop's under it, with the filter's fields as tags — and
//! each worker is told its parent: the span of its hop.

use std::time::Duration;

use pinroute_harness::otlp::{OtlpReceiver, ReceivedSpan, tree};
use pinroute_harness::sim::{SimConfig, SimRole};
use pinroute_harness::stack::StackSpec;
use serde_json::json;

use crate::client::post;
use crate::{Deployment, native_everywhere, start, wasm, worker};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// Prefill worker `prefill` (101) and decode worker 201 behind Envoy tracing to `receiver`.
async fn traced(receiver: &OtlpReceiver, prefill: SimConfig) -> Deployment {
    let workers = vec![prefill, worker(201, SimRole::Decode, 1)];
    let mut spec = StackSpec::new(workers, wasm());
    spec.edge.otlp = Some(receiver.address());
    start(spec).await
}

/// The client's `traceparent`: its span of [`TRACE`], sampled.
fn client_traceparent() -> String {
    format!("00-{TRACE}-{CLIENT_SPAN}-01")
}

/// The one request `worker` received: the parent its `traceparent` names.
fn parent_named_to(deployment: &Deployment, id: u64) -> String {
    let requests = deployment.worker(id).unwrap().requests();
    assert_eq!(requests.len(), 1, "worker {id}: {requests:?}");
    let traceparent = requests[0].header("traceparent").unwrap().to_owned();
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(
        (parts.len(), parts[0], parts[1], parts[3]),
        (4, "00", TRACE, "01"),
        "worker {id}: {traceparent}"
    );
    assert_eq!(requests[0].header("x-pinroute-trace"), None);
    parts[2].to_owned()
}

fn named<'a>(spans: &'a [ReceivedSpan], prefix: &str) -> &'a ReceivedSpan {
    spans
        .iter()
        .find(|s| s.name.starts_with(prefix))
        .unwrap_or_else(|| panic!("no span {prefix:?} in\n{}", tree(spans)))
}

#[tokio::test]
async fn one_request_is_one_trace_continuing_the_clients() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let deployment = traced(&receiver, worker(101, SimRole::Prefill, 2)).await;
    let traceparent = client_traceparent();
    let body = json!({"model": "sim-model", "prompt": "a traced request", "max_tokens": 2});
    let headers = [
        ("traceparent", traceparent.as_str()),
        ("x-dynamo-prefill-instance-id", "101"),
        ("x-dynamo-prefill-dp-rank", "1"),
        (
            "x-pinroute-trace",
            "11111111111111111111111111111111/2222222222222222",
        ),
    ];
    let reply = post(&deployment, "/v1/completions", &headers, &body).await;
    reply.assert_ok("traced");

    // The native module's prefill span is Envoy's; the `.wasm` filter exports its own.
    let spans = receiver.trace(TRACE, 3).await.unwrap();
    let request = named(&spans, "ingress");
    let decode = named(&spans, "pinroute decode");
    let prefill = named(&spans, "pinroute prefill");
    assert_eq!(request.parent_span_id, CLIENT_SPAN, "{}", tree(&spans));
    assert_eq!(decode.parent_span_id, request.span_id, "{}", tree(&spans));
    assert_eq!(prefill.parent_span_id, request.span_id, "{}", tree(&spans));
    assert_eq!(parent_named_to(&deployment, 201), decode.span_id);
    assert_eq!(parent_named_to(&deployment, 101), prefill.span_id);
    for (tag, value) in [
        ("pinroute.prefill_worker", "101"),
        ("pinroute.prefill_rank", "1"),
        ("pinroute.outcome", "ok"),
        ("http.response.status_code", "200"),
    ] {
        assert_eq!(prefill.attribute(tag), Some(value), "{}", tree(&spans));
    }
    assert_eq!(prefill.service, request.service);
    assert!(prefill.end_nanos <= decode.start_nanos, "{}", tree(&spans));
    assert_eq!(spans.len(), 3, "{}", tree(&spans));
    for span in [request, decode] {
        for (tag, value) in [
            ("pinroute.model", "sim-model"),
            ("pinroute.prefill_worker", "101"),
            ("pinroute.prefill_rank", "1"),
            ("pinroute.prefill_choice", "pin"),
            ("pinroute.decode_worker", "201"),
            ("pinroute.decode_choice", "load"),
        ] {
            assert_eq!(span.attribute(tag), Some(value), "{}: {tag}", span.name);
        }
        assert!(span.attribute("pinroute.prefill_ms").is_some());
    }
    assert_eq!(request.attribute("pinroute.error_code"), None);
}

#[tokio::test]
async fn an_error_the_filter_answers_is_tagged_on_the_request_span() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let deployment = traced(&receiver, worker(101, SimRole::Prefill, 2)).await;
    let traceparent = client_traceparent();
    let body = json!({"model": "sim-model", "prompt": "a refused request", "max_tokens": 2});
    let headers = [
        ("traceparent", traceparent.as_str()),
        ("x-dynamo-worker-instance-id", "299"),
    ];
    let reply = post(&deployment, "/v1/completions", &headers, &body).await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    let spans = receiver.trace(TRACE, 1).await.unwrap();
    let request = named(&spans, "ingress");
    assert_eq!(
        request.attribute("pinroute.error_code"),
        Some("unknown_worker")
    );
    assert!(spans.iter().all(|s| !s.name.starts_with("pinroute decode")));
}

/// A client that leaves while its prefill hop is in flight: natively, the hop's span (Envoy's)
/// ends as `abandoned` when the stream goes; the `.wasm` filter's own span is never exported
/// (it is queued only when the hop's answer is judged).
#[tokio::test]
async fn a_client_leaving_during_the_prefill_hop_ends_its_span() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let slow = worker(101, SimRole::Prefill, 1).with_prefill_latency(Duration::from_secs(3));
    let deployment = traced(&receiver, slow).await;
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let body = json!({"model": "sim-model", "prompt": "a client that leaves", "max_tokens": 2});
    let sent = impatient
        .post(deployment.url("/v1/completions"))
        .header("traceparent", client_traceparent())
        .json(&body)
        .send()
        .await;
    assert!(sent.is_err(), "the client left before any answer");
    let spans = receiver.trace(TRACE, 1).await.unwrap();
    if native_everywhere() {
        let spans = receiver.trace(TRACE, 2).await.unwrap();
        let prefill = named(&spans, "pinroute prefill");
        assert_eq!(prefill.attribute("pinroute.outcome"), Some("abandoned"));
        assert_eq!(prefill.parent_span_id, named(&spans, "ingress").span_id);
    } else {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let spans = receiver.trace(TRACE, spans.len()).await.unwrap();
        assert!(
            spans
                .iter()
                .all(|s| !s.name.starts_with("pinroute prefill")),
            "{}",
            tree(&spans)
        );
    }
}

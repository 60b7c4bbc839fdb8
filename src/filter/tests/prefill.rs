//! The prefill hop: dispatch, the hand-off to decode, retries, fallback, passive health.

use std::time::Duration;

use super::*;
use crate::policy::trace::SpanIds;

#[test]
fn a_decode_pin_gets_a_free_prefill_hop_then_the_spliced_decode_body() {
    let pins = [
        ("x-dynamo-worker-instance-id", "202"),
        ("authorization", "Bearer k"),
    ];
    let mut request = Request::completion(REGISTRY, &pins, PROMPT);
    let call = request.prefill_call();
    assert_eq!(call.cluster, "pinroute_prefill");
    assert_eq!(
        call.header("x-envoy-original-dst-host"),
        Some("10.0.0.11:8000")
    );
    assert_eq!(call.header(":path"), Some("/v1/completions"));
    assert_eq!(call.header("x-request-id"), Some("req-1"));
    assert_eq!(call.header("authorization"), Some("Bearer k"));
    assert_eq!(call.header("x-dynamo-worker-instance-id"), None);
    assert_eq!(call.timeout, Duration::from_secs(30));
    let prefill_body: serde_json::Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(prefill_body["stream"], false);
    assert_eq!(prefill_body["max_tokens"], 1);
    assert_eq!(
        request.outstanding(101),
        1,
        "the prefill hop counts as load"
    );
    assert_eq!(request.host.state().resumed, 0, "decode waits for prefill");

    let answer = format!(r#"{{"id": "p", "kv_transfer_params": {KV}}}"#);
    request.answer(&call, Some(200), &answer);
    assert_eq!(request.host.state().resumed, 1);
    let upstream = request.host.request_header("x-pinroute-upstream");
    assert_eq!(upstream.as_deref(), Some("10.0.0.22:8000"));
    assert_eq!(request.host.request_header("x-pinroute-pool"), None);
    assert_eq!(request.host.request_header("x-data-parallel-rank"), None);
    let decode_body = request.request_body();
    assert_eq!(
        decode_body,
        format!(r#"{{"kv_transfer_params":{KV},{}"#, &PROMPT[1..])
    );
    let length = request.host.request_header("content-length");
    assert_eq!(length, Some(decode_body.len().to_string()));
    assert_eq!(request.host.metric("pinroute.prefill.ok"), 1);
    assert_eq!((request.outstanding(101), request.outstanding(202)), (0, 1));

    request.respond(200, Some("{}"));
    assert_eq!(
        request
            .host
            .response_header("x-pinroute-prefill-worker")
            .as_deref(),
        Some("101")
    );
    assert_eq!(
        request
            .host
            .response_header("x-pinroute-decode-worker")
            .as_deref(),
        Some("202")
    );
    request.end();
    assert_eq!(
        request.outstanding(202),
        0,
        "the stream's end releases its worker"
    );
}

#[test]
fn a_failed_connection_is_retried_elsewhere_and_with_eject_after_one_takes_the_worker_out() {
    let config = config_with(r#""eject_after_failures": 1"#);
    let mut request = Request::completion(&config, &[], PROMPT);
    let first = request.prefill_call();
    request.answer(&first, Some(503), REFUSED);
    let second = request.prefill_call();
    assert_eq!(first.header(":authority"), Some("10.0.0.11:8000"));
    assert_eq!(second.header(":authority"), Some("10.0.0.12:8000"));
    assert_eq!(
        second.body, first.body,
        "the retry sends the same prefill body"
    );
    assert_eq!(request.host.metric("pinroute.prefill.retried"), 1);
    assert_eq!(request.host.metric("pinroute.workers.marked_unhealthy"), 1);
    assert_eq!(request.outstanding(101), 0);

    let pinned = [("x-dynamo-prefill-instance-id", "101")];
    let next = Request::completion_on(request.host.clone(), &config, &pinned, PROMPT);
    let refused = next.host.take_sent();
    assert_eq!(refused[0].status, 503, "{:?}", refused[0].json());
    assert_eq!(refused[0].json()["error"]["code"], "worker_unavailable");
    assert_eq!(refused[0].header("retry-after"), Some("10"));
}

#[test]
fn when_every_prefill_worker_fails_decode_prefills_itself() {
    let mut request = Request::completion(REGISTRY, &[], PROMPT);
    let first = request.prefill_call();
    request.answer(&first, Some(500), "oops");
    let second = request.prefill_call();
    request.answer(&second, Some(503), "busy");
    assert_eq!(request.host.state().resumed, 1);
    assert_eq!(
        request.request_body(),
        PROMPT,
        "no kv_transfer_params without a prefill"
    );
    assert_eq!(
        request.host.metric("pinroute.prefill.aggregated_fallback"),
        1
    );
    assert_eq!(
        request.host.metric("pinroute.workers.marked_unhealthy"),
        0,
        "a 5xx takes no worker out"
    );
    request.respond(200, Some("{}"));
    assert_eq!(
        request.host.response_header("x-pinroute-prefill-worker"),
        None
    );
}

#[test]
fn a_prefill_answer_that_broke_off_is_retried_but_takes_no_worker_out() {
    let config = config_with(r#""eject_after_failures": 1"#);
    let mut request = Request::completion(&config, &[], PROMPT);
    let first = request.prefill_call();
    request.answer(&first, None, "");
    let second = request.prefill_call();
    assert_ne!(first.header(":authority"), second.header(":authority"));
    assert_eq!(request.host.metric("pinroute.workers.connect_failed"), 0);
    assert_eq!(request.host.metric("pinroute.workers.marked_unhealthy"), 0);
}

#[test]
fn an_oversized_prefill_answer_is_never_read_and_fails_the_hop_alone() {
    let config = config_with(r#""eject_after_failures": 1, "max_kv_transfer_params_bytes": 4096"#);
    let mut request = Request::completion(&config, &[], PROMPT);
    let first = request.prefill_call();
    let padding = "x".repeat(4096 + 64 * 1024);
    request.answer(&first, Some(200), &format!(r#"{{"p":"{padding}"}}"#));
    assert!(
        request.host.state().call_body_reads == 0,
        "the oversized body stays in Envoy"
    );
    let second = request.prefill_call();
    request.answer(
        &second,
        Some(200),
        &format!(r#"{{"kv_transfer_params":{{"p":"{}"}}}}"#, "x".repeat(4096)),
    );
    assert_eq!(request.host.metric("pinroute.workers.marked_unhealthy"), 0);
    assert_eq!(
        request.host.metric("pinroute.prefill.aggregated_fallback"),
        1
    );
    assert_eq!(
        request.host.request_header("x-pinroute-upstream"),
        Some("10.0.0.21:8000".into())
    );
    assert!(!request.request_body().contains("kv_transfer_params"));
}

#[test]
fn without_the_fallback_a_failed_prefill_is_a_typed_502() {
    let config = config_with(r#""aggregated_fallback": false"#);
    let mut request = Request::completion(&config, &[], PROMPT);
    for _ in 0..2 {
        let call = request.prefill_call();
        request.answer(&call, None, "");
    }
    let sent = request.host.take_sent();
    assert_eq!((sent.len(), sent[0].status), (1, 502));
    assert_eq!(sent[0].json()["error"]["code"], "upstream_failed");
    assert_eq!(
        sent[0].header("x-pinroute-error-code"),
        Some("upstream_failed")
    );
    assert_eq!(request.host.state().resumed, 0);
}

#[test]
fn a_pinned_prefill_is_never_retried_elsewhere() {
    let pin = [("x-dynamo-prefill-instance-id", "102")];
    for (status, expected) in [(None, 502), (Some(504), 504)] {
        let mut request = Request::completion(REGISTRY, &pin, PROMPT);
        let call = request.prefill_call();
        request.answer(&call, status, "");
        assert!(request.host.take_calls().is_empty());
        let sent = request.host.take_sent();
        assert_eq!(sent[0].status, expected);
        let message = sent[0].json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            message.contains("prefill hop: pinned worker 102"),
            "{message}"
        );
    }
}

#[test]
fn a_prefill_workers_own_refusal_reaches_the_client_and_costs_it_nothing() {
    let mut request = Request::completion(REGISTRY, &[], PROMPT);
    let call = request.prefill_call();
    let refusal = r#"{"error": {"message": "prompt too long"}}"#;
    request.answer(&call, Some(400), refusal);
    let sent = request.host.take_sent();
    assert_eq!(
        (sent[0].status, sent[0].body.as_slice()),
        (400, refusal.as_bytes())
    );
    assert_eq!(sent[0].header("x-pinroute-prefill-worker"), Some("101"));
    assert!(request.host.take_calls().is_empty(), "not retried");
    assert_eq!(request.host.metric("pinroute.workers.marked_unhealthy"), 0);
    assert_eq!(request.host.metric("pinroute.prefill.refused"), 1);
}

#[test]
fn a_client_leaving_during_its_prefill_releases_the_worker() {
    let mut request = Request::completion(REGISTRY, &[], PROMPT);
    let call = request.prefill_call();
    assert_eq!(request.outstanding(101), 1);
    request.end();
    assert_eq!(request.outstanding(101), 0);
    request.answer(&call, Some(200), "{}");
    assert_eq!(
        request.host.state().resumed,
        0,
        "a late answer to a gone stream is ignored"
    );
}

#[test]
fn an_answer_to_another_call_is_ignored() {
    let mut request = Request::completion(REGISTRY, &[], PROMPT);
    let mut call = request.prefill_call();
    call.token += 1;
    request.answer(&call, Some(200), "{}");
    assert_eq!(request.host.state().resumed, 0);
    assert_eq!(request.outstanding(101), 1);
}

#[test]
fn a_prefill_that_cannot_be_dispatched_is_an_internal_error() {
    let host = FakeHost::default();
    host.state().fail_dispatch = true;
    let request = Request::completion_on(host, REGISTRY, &[], PROMPT);
    let sent = request.host.take_sent();
    assert_eq!(sent[0].status, 500);
    assert_eq!(sent[0].json()["error"]["code"], "internal_error");
    assert_eq!(request.outstanding(101), 0);
}

#[test]
fn a_body_arriving_in_pieces_is_read_once_whole() {
    let mut request = Request::new(REGISTRY, COMPLETION_HEADERS);
    assert_eq!(request.headers(false), Flow::Pause);
    request.host.state().request_body = PROMPT.as_bytes().to_vec();
    assert_eq!(request.body_chunk(10, false), Flow::Pause);
    assert!(request.host.take_calls().is_empty());
    assert_eq!(request.body_chunk(PROMPT.len(), true), Flow::Pause);
    assert_eq!(request.host.take_calls().len(), 1);
}

#[test]
fn where_the_host_has_spans_each_prefill_attempt_is_one_naming_its_worker() {
    let host = FakeHost::default();
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let span = |id: &str| SpanIds::new(trace, id);
    host.state().next_span = span("aaaaaaaaaaaaaaaa");
    let client = [("traceparent", &*format!("00-{trace}-00f067aa0ba902b7-00"))];
    let mut request = Request::completion_on(host, REGISTRY, &client, PROMPT);
    let first = request.prefill_call();
    assert_eq!(
        first.header("traceparent"),
        Some(&*format!("00-{trace}-aaaaaaaaaaaaaaaa-00")),
        "the worker's parent is the hop's span; the client's flag stays"
    );
    let copies = first.headers.iter().filter(|(n, _)| n == "traceparent");
    assert_eq!(copies.count(), 1);
    request.host.state().next_span = span("bbbbbbbbbbbbbbbb");
    request.answer(&first, Some(503), REFUSED);
    let second = request.prefill_call();
    assert_eq!(
        second.header("traceparent"),
        Some(&*format!("00-{trace}-bbbbbbbbbbbbbbbb-00"))
    );
    request.answer(
        &second,
        Some(200),
        &format!(r#"{{"kv_transfer_params": {KV}}}"#),
    );
    let closed = request.host.state().closed_spans.clone();
    let tag = |span: usize, key: &str| {
        closed[span]
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(closed.len(), 2, "{closed:?}");
    for (span, worker, outcome, status) in [(0, "101", "failed", "503"), (1, "102", "ok", "200")] {
        assert_eq!(
            tag(span, "pinroute.prefill_worker").as_deref(),
            Some(worker)
        );
        assert_eq!(tag(span, "pinroute.outcome").as_deref(), Some(outcome));
        assert_eq!(
            tag(span, "http.response.status_code").as_deref(),
            Some(status)
        );
    }
    assert!(tag(0, "pinroute.failure").is_some());
    assert_eq!(request.host.state().open_span, None);
}

#[test]
fn without_host_spans_the_filter_exports_the_prefill_hops_span_when_sampled() {
    let config = config_with(r#""trace_export_cluster": "otlp""#);
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let request_span = "b7ad6b7169203331";
    for (flags, exported) in [("01", true), ("00", false)] {
        let headers = [
            ("x-pinroute-trace", &*format!("{trace}/{request_span}")),
            (
                "traceparent",
                &*format!("00-{trace}-00f067aa0ba902b7-{flags}"),
            ),
        ];
        let mut request = Request::completion(&config, &headers, PROMPT);
        let call = request.prefill_call();
        let (ids, _) = SpanIds::from_traceparent(call.header("traceparent").unwrap()).unwrap();
        assert_eq!(ids.trace_id, trace);
        assert_eq!(ids.span_id != request_span, exported, "flags {flags}");
        request.answer(
            &call,
            Some(200),
            &format!(r#"{{"kv_transfer_params": {KV}}}"#),
        );
        assert!(
            request.host.state().grpc_calls.is_empty(),
            "the stream exports nothing itself: its root does"
        );
        assert_eq!(request.spans.len(), usize::from(exported), "flags {flags}");
        request.spans.export(&request.host, "otlp");
        let grpc = request.host.state().grpc_calls.clone();
        if !exported {
            assert!(grpc.is_empty(), "an unsampled request exports nothing");
            continue;
        }
        assert_eq!(grpc.len(), 1);
        assert_eq!(request.spans.len(), 0, "exported once");
        let (cluster, method, message) = &grpc[0];
        assert_eq!(cluster, "otlp");
        assert_eq!(
            method,
            "opentelemetry.proto.collector.trace.v1.TraceService/Export"
        );
        let text = String::from_utf8_lossy(message);
        for part in [
            "pinroute prefill",
            "pinroute.prefill_worker",
            "pinroute.outcome",
        ] {
            assert!(text.contains(part), "{part}");
        }
    }
}

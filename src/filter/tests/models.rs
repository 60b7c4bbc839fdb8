//! Several models behind one gateway (`docs/semantics.md` §3): each hop among the workers
//! serving the request's model, typed answers for a model or a pin that does not fit, the
//! gateway's own model list, and counters per model the registry names.

use super::*;

/// Prefill 101 and decode 201 serve `tiny`; prefill 102 and decode 202 serve `big` and its
/// adapter `big-lora`.
const MODELS: &str = r#"{"workers": [
    {"id": 101, "role": "prefill", "address": "10.0.0.11:8000", "models": ["tiny"]},
    {"id": 102, "role": "prefill", "address": "10.0.0.12:8000", "models": ["big", "big-lora"]},
    {"id": 201, "role": "decode", "address": "10.0.0.21:8000", "models": ["tiny"]},
    {"id": 202, "role": "decode", "address": "10.0.0.22:8000", "models": ["big", "big-lora"]}
]}"#;

fn completion(model: &str, extra: &[(&str, &str)]) -> Request {
    let body = format!(r#"{{"model": "{model}", "prompt": "hello", "max_tokens": 4}}"#);
    Request::completion(MODELS, extra, &body)
}

/// The only response the filter sent itself, with no worker called.
fn answered_alone(request: &Request) -> fake_host::Sent {
    assert!(request.host.take_calls().is_empty(), "no worker is called");
    let mut sent = request.host.take_sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    sent.remove(0)
}

#[test]
fn each_model_takes_both_hops_on_its_own_workers() {
    for (model, prefill, decode) in [
        ("tiny", "10.0.0.11:8000", "10.0.0.21:8000"),
        ("big", "10.0.0.12:8000", "10.0.0.22:8000"),
        ("big-lora", "10.0.0.12:8000", "10.0.0.22:8000"),
    ] {
        for _ in 0..3 {
            let mut request = completion(model, &[]);
            let call = request.prefill_call();
            assert_eq!(call.header(":authority"), Some(prefill), "{model}");
            request.answer(
                &call,
                Some(200),
                &format!(r#"{{"kv_transfer_params": {KV}}}"#),
            );
            assert_eq!(
                request
                    .host
                    .request_header("x-pinroute-upstream")
                    .as_deref(),
                Some(decode),
                "{model}"
            );
        }
    }
}

#[test]
fn a_model_no_worker_serves_is_404_and_reaches_none() {
    let request = completion("gpt-9", &[]);
    let sent = answered_alone(&request);
    assert_eq!(sent.status, 404);
    assert_eq!(
        sent.header("x-pinroute-error-code"),
        Some("model_not_found")
    );
    assert_eq!(sent.json()["error"]["code"], "model_not_found");
    assert_eq!(request.host.metric("pinroute.errors.model_not_found"), 1);
    assert_eq!(
        request
            .host
            .metric("pinroute.model.errors.model_not_found.gpt-9"),
        0,
        "a client's model is never a metric"
    );
}

#[test]
fn a_pin_to_a_worker_not_serving_the_model_is_400_naming_both() {
    let request = completion("tiny", &[("x-dynamo-worker-instance-id", "202")]);
    let sent = answered_alone(&request);
    assert_eq!(sent.status, 400);
    assert_eq!(sent.json()["error"]["code"], "model_not_served");
    let message = sent.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("worker 202") && message.contains("\"tiny\""),
        "{message}"
    );
    assert_eq!(
        request
            .host
            .metric("pinroute.model.errors.model_not_served.tiny"),
        1
    );
}

#[test]
fn without_a_model_the_request_is_refused_when_workers_serve_different_ones() {
    let request = Request::completion(MODELS, &[], r#"{"prompt": "hello"}"#);
    let sent = answered_alone(&request);
    assert_eq!(sent.status, 400);
    assert_eq!(sent.json()["error"]["code"], "invalid_field");
    assert!(
        sent.json()["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("model: ")
    );
}

#[test]
fn the_gateway_answers_the_model_list_from_its_registry() {
    let headers = [(":method", "GET"), (":path", "/v1/models")];
    let mut request = Request::new(MODELS, &headers);
    request.headers(true);
    let sent = answered_alone(&request);
    assert_eq!(sent.status, 200);
    let ids: Vec<String> = sent.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["big", "big-lora", "tiny"]);
    assert_eq!(request.host.request_header("x-pinroute-upstream"), None);

    let mut unnamed = Request::new(REGISTRY, &headers);
    assert_eq!(unnamed.headers(true), Flow::Continue, "a worker answers it");
    assert!(unnamed.host.take_sent().is_empty());
}

#[test]
fn another_paths_body_goes_to_a_worker_serving_its_model() {
    let headers = [
        (":method", "POST"),
        (":path", "/tokenize"),
        ("content-type", "application/json"),
    ];
    for (model, decode) in [("tiny", "10.0.0.21:8000"), ("big-lora", "10.0.0.22:8000")] {
        let mut request = Request::new(MODELS, &headers);
        assert_eq!(request.headers(false), Flow::Pause);
        let body = format!(r#"{{"model": "{model}", "prompt": "hi"}}"#);
        assert_eq!(request.body(&body), Flow::Continue);
        assert_eq!(
            request
                .host
                .request_header("x-pinroute-upstream")
                .as_deref(),
            Some(decode)
        );
    }
    let mut unknown = Request::new(MODELS, &headers);
    unknown.headers(false);
    unknown.body(r#"{"model": "nope", "prompt": "hi"}"#);
    assert_eq!(answered_alone(&unknown).status, 404);
}

#[test]
fn requests_placements_and_errors_are_counted_per_named_model() {
    let host = FakeHost::default();
    for _ in 0..2 {
        let body = r#"{"model": "big", "prompt": "hello"}"#;
        let mut request = Request::completion_on(host.clone(), MODELS, &[], body);
        let call = request.prefill_call();
        request.answer(
            &call,
            Some(200),
            &format!(r#"{{"kv_transfer_params": {KV}}}"#),
        );
    }
    assert_eq!(host.metric("pinroute.model.requests.big"), 2);
    assert_eq!(host.metric("pinroute.model.requests.tiny"), 0);
    let placed = |pool: &str| {
        ["load", "affinity", "spilled", "remembered", "session"]
            .iter()
            .map(|choice| host.metric(&format!("pinroute.model.placement.{pool}.{choice}.big")))
            .sum::<u64>()
    };
    assert_eq!((placed("prefill"), placed("decode")), (2, 2));
}

/// A host that defines metrics only while it configures the filter (the native module)
/// defines `fixed_metrics` then: every metric the filter asks for afterwards must be there.
#[test]
fn every_metric_the_filter_defines_is_known_at_configuration() {
    let config = Config::from_json(MODELS.as_bytes()).unwrap();
    let fixed: Vec<String> = crate::filter::metrics::fixed_metrics(config.registry.models())
        .into_iter()
        .map(|(_, name)| name)
        .collect();
    let host = FakeHost::default();
    for model in ["big", "tiny"] {
        let body = format!(r#"{{"model": "{model}", "prompt": "hello"}}"#);
        let mut request = Request::completion_on(host.clone(), MODELS, &[], &body);
        let call = request.prefill_call();
        request.answer(&call, Some(500), "");
    }
    let pinned = [("x-dynamo-worker-instance-id", "202")];
    let body = r#"{"model": "tiny", "prompt": "hello"}"#;
    let _ = Request::completion_on(host.clone(), MODELS, &pinned, body);
    assert!(host.metric("pinroute.model.errors.model_not_served.tiny") >= 1);
    let defined = host.state().metric_names.clone();
    assert!(defined.len() > fixed.len() / 2, "{defined:?}");
    for name in defined {
        assert!(
            fixed.contains(&name),
            "{name} is not defined at configuration"
        );
    }
}

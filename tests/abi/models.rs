//! Routing by model as the ABI shows it (`docs/semantics.md` §3): the compiled module sends
//! each hop to workers serving the request's model, answers a model nobody serves and the
//! model list itself, and defines counters for the registry's models only.

use pinroute_tests::{Action, Host};

use crate::{host, json};

const MODELS: &str = r#"{"workers": [
    {"id": 101, "role": "prefill", "address": "10.0.0.11:8000", "models": ["tiny"]},
    {"id": 102, "role": "prefill", "address": "10.0.0.12:8000", "models": ["big", "big-lora"]},
    {"id": 201, "role": "decode", "address": "10.0.0.21:8000", "models": ["tiny"]},
    {"id": 202, "role": "decode", "address": "10.0.0.22:8000", "models": ["big", "big-lora"]}
]}"#;

fn completion(host: &mut Host, model: &str) -> u32 {
    let ctx = host.new_http_stream().unwrap();
    let headers = [
        (":method", "POST"),
        (":path", "/v1/completions"),
        (":authority", "gateway"),
        ("content-type", "application/json"),
    ];
    assert_eq!(
        host.request_headers(ctx, &headers, false).unwrap(),
        Action::Pause
    );
    let body = format!(r#"{{"model": "{model}", "prompt": "hello"}}"#);
    host.request_body(ctx, body.as_bytes(), true).unwrap();
    ctx
}

#[test]
fn each_hop_goes_to_a_worker_serving_the_model() {
    let mut host = host(MODELS);
    for (model, prefill, decode) in [
        ("big-lora", "10.0.0.12:8000", "10.0.0.22:8000"),
        ("tiny", "10.0.0.11:8000", "10.0.0.21:8000"),
    ] {
        let ctx = completion(&mut host, model);
        let calls = host.take_http_calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(
            calls[0].headers.get_str("x-envoy-original-dst-host"),
            Some(prefill)
        );
        host.http_call_response(
            calls[0].token,
            &[(":status", "200")],
            br#"{"kv_transfer_params": {"remote_engine_id": "e"}}"#,
        )
        .unwrap();
        let stream = host.stream(ctx).unwrap();
        assert_eq!(stream.request_header("x-pinroute-upstream"), Some(decode));
    }
    assert_eq!(host.counter("pinroute.model.requests.big-lora"), Some(1));
    assert_eq!(host.counter("pinroute.model.requests.tiny"), Some(1));
}

#[test]
fn an_unknown_model_and_the_model_list_are_answered_by_the_module() {
    let mut host = host(MODELS);
    let ctx = completion(&mut host, "made-up");
    assert!(host.take_http_calls().is_empty());
    let reply = host.stream(ctx).unwrap().local_reply.clone().unwrap();
    assert_eq!(reply.status, 404);
    assert_eq!(json(&reply.body)["error"]["code"], "model_not_found");
    assert!(
        !host.metrics().keys().any(|name| name.contains("made-up")),
        "a client's model defines no metric"
    );

    let list = host.new_http_stream().unwrap();
    let headers = [
        (":method", "GET"),
        (":path", "/v1/models"),
        (":authority", "g"),
    ];
    host.request_headers(list, &headers, true).unwrap();
    let reply = host.stream(list).unwrap().local_reply.clone().unwrap();
    assert_eq!(reply.status, 200);
    let ids: Vec<String> = json(&reply.body)["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["big", "big-lora", "tiny"]);
}

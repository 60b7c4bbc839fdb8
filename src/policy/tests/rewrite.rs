#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use serde_json::{Value, json};

use super::*;
use crate::policy::testing::test;

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

/// The decode hop's body as Envoy sends it, after the edit.
fn decoded(request: &str, kv_transfer_params: Option<&RawValue>) -> String {
    let object = JsonObject::parse(request.as_bytes()).unwrap();
    let edit = DecodeBody::new(&object, request.as_bytes(), &[]).finish(kv_transfer_params);
    let body = edit.map_or_else(
        || request.as_bytes().to_vec(),
        |e| e.apply(request.as_bytes()),
    );
    String::from_utf8(body).unwrap()
}

fn prefill(request: &str) -> Value {
    parse(&prefill_body(
        Api::Completions,
        &JsonObject::parse(request.as_bytes()).unwrap(),
        request.len(),
    ))
}

#[test]
fn the_prefill_body_asks_for_one_token_for_a_remote_decode() {
    let body = prefill(
        r#"{"model": "m", "prompt": "hi", "stream": true, "max_tokens": 100,
            "stream_options": {"include_usage": true}, "min_tokens": 5, "temperature": 0.7,
            "nvext": {"backend_instance_id": 201}}"#,
    );
    assert_eq!(
        body,
        json!({
            "model": "m", "prompt": "hi", "stream": false, "max_tokens": 1, "temperature": 0.7,
            "nvext": {},
            "kv_transfer_params": {
                "do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
                "remote_block_ids": null, "remote_host": null, "remote_port": null
            }
        })
    );
}

#[test]
fn the_prefill_body_adds_the_limits_a_client_left_out() {
    let body = prefill(r#"{"model": "m", "messages": [{"role": "user", "content": "x"}]}"#);
    assert_eq!(body["stream"], false);
    assert_eq!(body["max_tokens"], 1);
    assert!(body.get("max_completion_tokens").is_none());
}

#[test]
fn max_completion_tokens_is_capped_only_when_present() {
    let body =
        prefill(r#"{"messages": [], "max_completion_tokens": 50, "min_completion_tokens": 3}"#);
    assert_eq!(body["max_completion_tokens"], 1);
    assert_eq!(body["max_tokens"], 1);
    assert!(body.get("min_completion_tokens").is_none());
}

#[test]
fn a_clients_kv_transfer_params_never_reach_a_worker() {
    let request = r#"{"prompt": "x", "kv_transfer_params": {"do_remote_prefill": true, "remote_host": "10.0.0.1"}}"#;
    let object = JsonObject::parse(request.as_bytes()).unwrap();
    let prefill = parse(&prefill_body(Api::Completions, &object, request.len()));
    assert_eq!(prefill["kv_transfer_params"]["do_remote_decode"], true);
    assert_eq!(prefill["kv_transfer_params"]["remote_host"], Value::Null);
    let edit = DecodeBody::new(&object, request.as_bytes(), &[])
        .finish(None)
        .unwrap();
    assert_eq!(edit.replaced, request.len(), "the whole body is rebuilt");
    assert_eq!(parse(&decoded(request, None)), json!({"prompt": "x"}));
    let from_prefill = RawValue::from_string(r#"{"remote_engine_id":"e1"}"#.into()).unwrap();
    assert_eq!(
        parse(&decoded(request, Some(&from_prefill))),
        json!({"prompt": "x", "kv_transfer_params": {"remote_engine_id": "e1"}})
    );
}

#[test]
fn the_decode_body_keeps_the_clients_bytes() {
    let request = r#"{"prompt":"caf\u00e9 \ud83d\ude00","stream":true,"max_tokens":100,"n":123456789012345678901234567890,"t":1.50}"#;
    let object = JsonObject::parse(request.as_bytes()).unwrap();
    assert_eq!(
        DecodeBody::new(&object, request.as_bytes(), &[]).finish(None),
        None,
        "nothing to rewrite"
    );
    let params = RawValue::from_string(r#"{"a":1}"#.into()).unwrap();
    let edit = DecodeBody::new(&object, request.as_bytes(), &[])
        .finish(Some(&params))
        .unwrap();
    assert_eq!(
        edit,
        BodyEdit {
            replaced: 1,
            with: r#"{"kv_transfer_params":{"a":1},"#.into()
        },
        "only the brace is replaced"
    );
    assert_eq!(
        decoded(request, Some(&params)),
        format!("{{\"kv_transfer_params\":{{\"a\":1}},{}", &request[1..])
    );
    assert_eq!(
        edit.edited_len(request.len()),
        decoded(request, Some(&params)).len()
    );
}

#[test]
fn the_prefill_body_keeps_every_other_field_byte_for_byte() {
    let request = r#"{"prompt":"\u0000\"x","seed":123456789012345678901234567890,"logit_bias":{"50256":-100},"stream":true}"#;
    let text = prefill_body(
        Api::Completions,
        &JsonObject::parse(request.as_bytes()).unwrap(),
        request.len(),
    );
    assert!(text.contains(r#""prompt":"\u0000\"x""#), "{text}");
    assert!(
        text.contains(r#""seed":123456789012345678901234567890"#),
        "{text}"
    );
    assert!(text.contains(r#""logit_bias":{"50256":-100}"#), "{text}");
}

#[test]
fn an_empty_object_stays_valid() {
    let object = JsonObject::parse(b"{}").unwrap();
    assert_eq!(DecodeBody::new(&object, b"{}", &[]).finish(None), None);
    let params = RawValue::from_string("{}".into()).unwrap();
    assert_eq!(
        parse(&decoded(" \n{ } ", Some(&params))),
        json!({"kv_transfer_params": {}})
    );
    assert_eq!(
        prefill_body(Api::Completions, &object, 2).chars().next(),
        Some('{')
    );
    parse(&prefill_body(Api::Completions, &object, 2));
}

#[test]
fn the_prefill_answer_gives_its_kv_transfer_params() {
    let response = br#"{"id": "x", "choices": [], "kv_transfer_params": {"remote_engine_id": "e", "remote_block_ids": [1, 2]}}"#;
    let params = prefill_kv_transfer_params(response).unwrap().unwrap();
    assert_eq!(
        params.get(),
        r#"{"remote_engine_id": "e", "remote_block_ids": [1, 2]}"#
    );
    assert!(
        prefill_kv_transfer_params(br#"{"kv_transfer_params": null}"#)
            .unwrap()
            .is_none()
    );
    assert!(
        prefill_kv_transfer_params(br#"{"choices": []}"#)
            .unwrap()
            .is_none()
    );
    let deepest = format!(
        r#"{{"kv_transfer_params": {}{}}}"#,
        "{\"a\":".repeat(127),
        "1".to_owned() + &"}".repeat(127)
    );
    assert!(prefill_kv_transfer_params(deepest.as_bytes()).is_ok());
    let other_member_twice = br#"{"id": "a", "id": "b", "kv_transfer_params": {"k": 1}}"#;
    assert_eq!(
        prefill_kv_transfer_params(other_member_twice)
            .unwrap()
            .map(|params| params.get().to_owned()),
        Some(r#"{"k": 1}"#.to_owned())
    );
}

#[test]
fn an_unusable_prefill_answer_is_a_failure_of_the_hop() {
    let deep = format!(
        r#"{{"kv_transfer_params": {}{}}}"#,
        "{\"a\":".repeat(128),
        "}".repeat(128)
    );
    for response in [
        b"not json".as_slice(),
        b"[]",
        br#"[{"kv_transfer_params": {}}]"#,
        br#"{"kv_transfer_params": {}} x"#,
        br#"{"kv_transfer_params": {}, "kv_transfer_params": {}}"#,
        br#"{"kv_transfer_params": "x"}"#,
        br#"{"kv_transfer_params": [1]}"#,
        deep.as_bytes(),
    ] {
        assert!(
            matches!(
                prefill_kv_transfer_params(response),
                Err(HopFailure::BadResponse(_))
            ),
            "{}",
            String::from_utf8_lossy(response)
        );
    }
}

#[test]
fn the_decode_hops_nvext_pins_never_reach_the_prefill_worker() {
    let request = r#"{"prompt": "x", "nvext": {"backend_instance_id": 201, "decode_worker_id": 202, "dp_rank": 1,
        "prefill_worker_id": 101, "prefill_dp_rank": 0, "annotations": ["a"]}}"#;
    let object = JsonObject::parse(request.as_bytes()).unwrap();
    let body = parse(&prefill_body(Api::Completions, &object, request.len()));
    assert_eq!(
        body["nvext"],
        json!({"prefill_worker_id": 101, "prefill_dp_rank": 0, "annotations": ["a"]})
    );
    let decode = parse(&decoded(request, None));
    assert_eq!(
        decode["nvext"]["dp_rank"], 1,
        "the decode hop keeps the client's nvext"
    );
}

#[test]
fn the_prefill_body_asks_for_nothing_but_the_kv() {
    let request = r#"{"prompt":"p","echo":true,"logprobs":5,"top_logprobs":3,"prompt_logprobs":1,"n":4,"best_of":4,"return_token_ids":true,"seed":7}"#;
    let prefill = parse(&prefill_body(
        Api::Completions,
        &JsonObject::parse(request.as_bytes()).unwrap(),
        request.len(),
    ));
    for field in ANSWER_INFLATING_FIELDS {
        assert_eq!(prefill.get(field), None, "{field}");
    }
    assert_eq!(prefill["seed"], 7);
    assert_eq!(prefill["prompt"], "p");
}

fn prefill_of(api: Api, request: &str) -> Value {
    parse(&prefill_body(
        api,
        &JsonObject::parse(request.as_bytes()).unwrap(),
        request.len(),
    ))
}

#[test]
fn a_responses_prefill_asks_for_one_output_token_stored_nowhere() {
    let body = prefill_of(
        Api::Responses,
        r#"{"model": "m", "input": "hi", "instructions": "be brief", "stream": true,
            "max_output_tokens": 300, "background": true, "include": ["message.output_text.logprobs"],
            "top_logprobs": 3, "reasoning": {"effort": "low"}}"#,
    );
    assert_eq!(
        body,
        json!({
            "model": "m", "input": "hi", "instructions": "be brief", "stream": false,
            "max_output_tokens": 1, "reasoning": {"effort": "low"}, "store": false,
            "kv_transfer_params": parse(PREFILL_KV_TRANSFER_PARAMS)
        })
    );
    let minimal = prefill_of(Api::Responses, r#"{"input": "hi", "store": true}"#);
    assert_eq!(
        (
            &minimal["store"],
            &minimal["stream"],
            &minimal["max_output_tokens"]
        ),
        (&json!(false), &json!(false), &json!(1))
    );
}

#[test]
fn a_messages_prefill_asks_for_one_token_and_keeps_the_rest() {
    let body = prefill_of(
        Api::Messages,
        r#"{"model": "m", "system": "s", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 1024, "stream": true, "thinking": {"type": "enabled", "budget_tokens": 512},
            "stop_sequences": ["\n\n"]}"#,
    );
    assert_eq!(
        body,
        json!({
            "model": "m", "system": "s", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 1, "stream": false, "thinking": {"type": "enabled", "budget_tokens": 512},
            "stop_sequences": ["\n\n"], "kv_transfer_params": parse(PREFILL_KV_TRANSFER_PARAMS)
        })
    );
}

#[test]
fn a_generate_prefill_caps_its_sampling_params() {
    let body = prefill_of(
        Api::Generate,
        r#"{"token_ids": [1, 2, 3], "stream": true,
            "sampling_params": {"temperature": 0, "max_tokens": 64, "min_tokens": 8, "logprobs": 2, "n": 3}}"#,
    );
    assert_eq!(
        body,
        json!({
            "token_ids": [1, 2, 3], "stream": false,
            "sampling_params": {"temperature": 0, "max_tokens": 1},
            "kv_transfer_params": parse(PREFILL_KV_TRANSFER_PARAMS)
        })
    );
    for request in [
        r#"{"token_ids": [1]}"#,
        r#"{"token_ids": [1], "sampling_params": null}"#,
    ] {
        assert_eq!(
            prefill_of(Api::Generate, request)["sampling_params"],
            json!({"max_tokens": 1}),
            "{request}"
        );
    }
}

#[test]
fn sampling_params_the_prefill_could_not_cap_are_refused() {
    let check = |request: &str| {
        check_limits(
            Api::Generate,
            &JsonObject::parse(request.as_bytes()).unwrap(),
        )
    };
    for refused in [
        r#"{"token_ids": [1], "sampling_params": [1]}"#,
        r#"{"token_ids": [1], "sampling_params": "max_tokens=1"}"#,
        r#"{"token_ids": [1], "sampling_params": {"max_tokens": 1, "max_tokens": 90}}"#,
    ] {
        assert!(
            matches!(
                check(refused),
                Err(RouteError::InvalidField {
                    field: "sampling_params",
                    ..
                })
            ),
            "{refused}"
        );
    }
    assert!(check(r#"{"token_ids": [1], "sampling_params": {"max_tokens": 9}}"#).is_ok());
    assert!(check(r#"{"token_ids": [1], "sampling_params": null}"#).is_ok());
    let chat = JsonObject::parse(br#"{"messages": [], "sampling_params": [1]}"#).unwrap();
    assert!(check_limits(Api::ChatCompletions, &chat).is_ok());
}

/// The decode body with the gateway's own members, before and after a prefill answer.
fn decoded_with(request: &str, kv: Option<&RawValue>, gateway: &[(&str, &str)]) -> Value {
    let object = JsonObject::parse(request.as_bytes()).unwrap();
    let edit = DecodeBody::new(&object, request.as_bytes(), gateway).finish(kv);
    parse(&String::from_utf8(edit.unwrap().apply(request.as_bytes())).unwrap())
}

#[test]
fn the_gateways_members_reach_the_decode_hop_with_or_without_kv() {
    let kv = RawValue::from_string(r#"{"remote_engine_id":"e"}"#.into()).unwrap();
    let stamp = [("request_id", r#""resp_w201_x""#)];
    for (request, kv, expected) in [
        (
            r#"{"input":"hi"}"#,
            None,
            json!({"input": "hi", "request_id": "resp_w201_x"}),
        ),
        (
            r#"{"input":"hi"}"#,
            Some(&*kv),
            json!({"input": "hi", "request_id": "resp_w201_x", "kv_transfer_params": {"remote_engine_id": "e"}}),
        ),
        (r#"{}"#, None, json!({"request_id": "resp_w201_x"})),
        (
            r#"{}"#,
            Some(&*kv),
            json!({"request_id": "resp_w201_x", "kv_transfer_params": {"remote_engine_id": "e"}}),
        ),
        (
            r#"{"input":"hi","kv_transfer_params":{"forged":1}}"#,
            Some(&*kv),
            json!({"input": "hi", "request_id": "resp_w201_x", "kv_transfer_params": {"remote_engine_id": "e"}}),
        ),
    ] {
        assert_eq!(decoded_with(request, kv, &stamp), expected, "{request}");
    }
}

//! Both body rewrites and the prefill response reader (docs/semantics.md §4).
//!
//! Input: a client body, optionally followed by a NUL byte and a prefill response body.
//!
//! Properties, for every client body that is a JSON object:
//! - the prefill body is a JSON object without duplicate keys; `stream` is `false`,
//!   `max_tokens` is `1`, `max_completion_tokens` is `1` when the client sent it and absent
//!   otherwise, `stream_options`, `min_tokens`, `min_completion_tokens` and the fields that
//!   only inflate its answer (`echo`, `logprobs`, `n`, `best_of`, ...) are gone, and
//!   `kv_transfer_params` is exactly the fixed remote-decode request;
//! - every other client member reaches both bodies byte-identical, in the client's order,
//!   and nothing else is added — but for the prefill body's `nvext`, which loses the decode
//!   hop's pins (`backend_instance_id`, `decode_worker_id`, `dp_rank`) and keeps the rest
//!   byte-identical;
//! - the decode body's `kv_transfer_params` is exactly the prefill worker's (or absent when
//!   it sent none): a client's `kv_transfer_params` never survives, and the held body is
//!   left as it is when there was none and the prefill worker sent none;
//! - the edit's announced length is the edited body's, and the prefill body does not depend
//!   on the capacity hint.
//!
//! For every response: `prefill_kv_transfer_params` never panics, returns the response's
//! own `kv_transfer_params` object byte-identical, `None` for absent or `null`, and an error
//! for a body that is not an object, a `kv_transfer_params` of another type or one given
//! twice (the response's other members are not read: another key given twice is no error).

use pinroute::policy::api::Api;
use pinroute::policy::hop::HopFailure;
use pinroute::policy::json::JsonObject;
use pinroute::policy::rewrite::{
    DecodeBody, PREFILL_KV_TRANSFER_PARAMS, prefill_body, prefill_kv_transfer_params,
};
use std::collections::BTreeMap;

use serde::Deserializer as _;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::violated;

const KV: &str = "kv_transfer_params";
/// Members the prefill body sets to its own values.
const SET_BY_PREFILL: [&str; 4] = ["stream", "max_tokens", "max_completion_tokens", KV];
/// Members the prefill body never carries: the stream's and the limits' options, and what
/// would make its answer larger without changing its KV (§4).
const DROPPED_BY_PREFILL: [&str; 10] = [
    "stream_options",
    "min_tokens",
    "min_completion_tokens",
    "echo",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "n",
    "best_of",
    "return_token_ids",
];
/// What a NIXL prefill worker typically answers, used when the input has no response.
const TYPICAL_KV: &str = r#"{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"10.0.0.1","remote_port":5600}"#;

type Members<'a> = Vec<(String, &'a str)>;

pub fn check(data: &[u8]) {
    let (body, response) = match data.iter().position(|b| *b == 0) {
        Some(nul) => (data.get(..nul).unwrap_or_default(), data.get(nul + 1..)),
        None => (data, None),
    };
    let kv = response.map(check_response);
    if let Ok(request) = JsonObject::parse(body) {
        check_prefill_body(&request, body.len());
        match kv {
            Some(Ok(params)) => check_decode_body(&request, body, params.as_deref()),
            Some(Err(_)) | None => {
                check_decode_body(&request, body, None);
                check_decode_body(&request, body, Some(raw(TYPICAL_KV)).as_deref());
            }
        }
    }
}

fn check_prefill_body(request: &JsonObject<'_>, len: usize) {
    let text = prefill_body(Api::Completions, request, len);
    assert_eq!(
        prefill_body(Api::Completions, request, 0),
        text,
        "the capacity hint changed the prefill body"
    );
    let out = members_of(&text);
    let client = members(request);
    let sent = |key: &str| client.iter().any(|(k, _)| k == key);
    assert_eq!(value(&out, "stream"), Some("false"), "{text}");
    assert_eq!(value(&out, "max_tokens"), Some("1"), "{text}");
    let max_completion = sent("max_completion_tokens").then_some("1");
    assert_eq!(
        value(&out, "max_completion_tokens"),
        max_completion,
        "{text}"
    );
    assert_eq!(value(&out, KV), Some(PREFILL_KV_TRANSFER_PARAMS), "{text}");
    for key in DROPPED_BY_PREFILL {
        assert_eq!(value(&out, key), None, "{key} must be dropped from {text}");
    }
    let kept = |(k, _): &(String, &str)| !SET_BY_PREFILL.contains(&k.as_str()) && k != "nvext";
    assert_eq!(
        out.iter().filter(|m| kept(m)).collect::<Vec<_>>(),
        client
            .iter()
            .filter(|m| kept(m) && !DROPPED_BY_PREFILL.contains(&m.0.as_str()))
            .collect::<Vec<_>>(),
        "client members in the prefill body {text}"
    );
    let client_nvext = client.iter().find(|(k, _)| k == "nvext").map(|(_, v)| *v);
    check_prefill_nvext(client_nvext, value(&out, "nvext"));
    check_prefill_kv_value(value(&out, KV).unwrap_or_default());
}

/// The decode hop's pins are gone from the prefill body's `nvext`; the rest is the client's.
fn check_prefill_nvext(client: Option<&str>, prefill: Option<&str>) {
    const DECODE_PINS: &[&str] = &["backend_instance_id", "decode_worker_id", "dp_rank"];
    let Some(client) = client else {
        assert_eq!(prefill, None, "an nvext appeared in the prefill body");
        return;
    };
    let Some(prefill) = prefill else {
        violated(format!("nvext {client} vanished from the prefill body"))
    };
    match JsonObject::parse(client.as_bytes()) {
        Ok(object) => {
            let expected: Members<'_> = members(&object)
                .into_iter()
                .filter(|(k, _)| !DECODE_PINS.contains(&k.as_str()))
                .collect();
            assert_eq!(
                members_of(prefill),
                expected,
                "prefill nvext {prefill} from {client}"
            );
        }
        Err(_) => assert_eq!(prefill, client, "a non-object nvext is passed as it is"),
    }
}

fn check_prefill_kv_value(raw: &str) {
    let expected = serde_json::json!({
        "do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
        "remote_block_ids": null, "remote_host": null, "remote_port": null
    });
    assert_eq!(read(raw), expected, "prefill kv_transfer_params");
}

fn check_decode_body(request: &JsonObject<'_>, held: &[u8], kv: Option<&RawValue>) {
    let edit = DecodeBody::new(request, held, &[]).finish(kv);
    let client = members(request);
    let client_kv = client.iter().any(|(k, _)| k == KV);
    assert_eq!(
        edit.is_none(),
        kv.is_none() && !client_kv,
        "edited without need, or not edited when needed"
    );
    let bytes = edit
        .as_ref()
        .map_or_else(|| held.to_vec(), |e| e.apply(held));
    if let Some(edit) = &edit {
        assert_eq!(
            edit.edited_len(held.len()),
            bytes.len(),
            "announced length of {edit:?}"
        );
    }
    let Ok(text) = String::from_utf8(bytes) else {
        violated("the decode body is not UTF-8")
    };
    let out = members_of(&text);
    assert_eq!(
        value(&out, KV),
        kv.map(RawValue::get),
        "decode kv_transfer_params in {text}"
    );
    let not_kv = |(k, _): &&(String, &str)| k != KV;
    assert_eq!(
        out.iter().filter(not_kv).collect::<Vec<_>>(),
        client.iter().filter(not_kv).collect::<Vec<_>>(),
        "client members in the decode body {text}"
    );
}

/// Checks `prefill_kv_transfer_params` against `serde_json::Value`, and returns its answer.
fn check_response(response: &[u8]) -> Result<Option<Box<RawValue>>, HopFailure> {
    let answer = prefill_kv_transfer_params(response);
    match (&answer, serde_json::from_slice::<Value>(response)) {
        (Ok(Some(params)), Ok(Value::Object(map))) => {
            assert_eq!(
                Some(&read(params.get())),
                map.get(KV),
                "kv_transfer_params read back"
            );
            assert!(
                params.get().starts_with('{'),
                "kv_transfer_params {} is not an object",
                params.get()
            );
            let own = serde_json::from_slice::<BTreeMap<String, Box<RawValue>>>(response)
                .ok()
                .and_then(|mut members| members.remove(KV));
            assert_eq!(
                own.as_deref().map(RawValue::get),
                Some(params.get()),
                "kv_transfer_params is not the response's own bytes"
            );
        }
        (Ok(None), Ok(Value::Object(map))) => {
            assert!(
                map.get(KV).is_none_or(Value::is_null),
                "kv_transfer_params {:?} lost",
                map.get(KV)
            )
        }
        (Err(_), Ok(Value::Object(map))) => {
            let duplicate = times_given(response, KV) > 1;
            let not_object = map
                .get(KV)
                .is_some_and(|kv| !kv.is_object() && !kv.is_null());
            assert!(
                duplicate || not_object,
                "a usable prefill response refused: {answer:?}"
            );
        }
        (Ok(got), Ok(_)) => violated(format!("a non-object response gave {got:?}")),
        (Ok(Some(params)), Err(_)) => assert!(params.get().starts_with('{'), "not an object"),
        (Ok(None) | Err(_), _) => {}
    }
    answer
}

/// How many times a JSON object gives the member `key` (0 for what is not an object).
fn times_given(json: &[u8], key: &str) -> usize {
    struct Counting<'k>(&'k str);
    impl<'de> Visitor<'de> for Counting<'_> {
        type Value = usize;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
            let mut times = 0;
            while let Some(key) = map.next_key::<String>()? {
                times += usize::from(key == self.0);
                map.next_value::<IgnoredAny>()?;
            }
            Ok(times)
        }
    }
    serde_json::Deserializer::from_slice(json)
        .deserialize_map(Counting(key))
        .unwrap_or(0)
}

fn members<'a>(object: &JsonObject<'a>) -> Members<'a> {
    object
        .members()
        .map(|(k, v)| (k.to_string(), v.get()))
        .collect()
}

/// The members of a rewritten body, which must be a JSON object without duplicate keys.
fn members_of(text: &str) -> Members<'_> {
    match JsonObject::parse(text.as_bytes()) {
        Ok(object) => members(&object),
        Err(e) => violated(format!("rewritten body {text:?} is refused: {e}")),
    }
}

fn value<'a>(members: &Members<'a>, key: &str) -> Option<&'a str> {
    members.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
}

fn read(text: &str) -> Value {
    match serde_json::from_str(text) {
        Ok(value) => value,
        Err(e) => violated(format!("{text:?} is not JSON: {e}")),
    }
}

fn raw(text: &str) -> Box<RawValue> {
    match RawValue::from_string(text.to_string()) {
        Ok(raw) => raw,
        Err(e) => violated(format!("{text} is not JSON: {e}")),
    }
}

#![allow(clippy::unwrap_used)]

use super::*;
use crate::policy::testing::test;

/// Prefill 101 serves `a`, 102 `b` and its adapter `b-lora`; decode 201 `a`, 202 `b` and
/// `b-lora`, 203 every model; `p-only` is served by a prefill worker alone.
const TWO_MODELS: &str = r#"{"workers": [
    {"id": 101, "role": "prefill", "address": "127.0.0.1:8101", "models": ["a", "p-only"]},
    {"id": 102, "role": "prefill", "address": "127.0.0.1:8102", "models": ["b", "b-lora"]},
    {"id": 201, "role": "decode", "address": "127.0.0.1:8201", "models": ["a"]},
    {"id": 202, "role": "decode", "address": "127.0.0.1:8202", "models": ["b-lora", "b"]}
]}"#;

const NO_MODELS: &str = r#"{"workers": [
    {"id": 101, "role": "prefill", "address": "127.0.0.1:8101"},
    {"id": 201, "role": "decode", "address": "127.0.0.1:8201"}
]}"#;

fn registry(json: &str) -> Registry {
    Registry::from_json(json.as_bytes()).unwrap()
}

fn requested_in(json: &str, body: &str) -> Result<Option<String>, RouteError> {
    let body = JsonObject::parse(body.as_bytes()).unwrap();
    let model = requested(&body, &registry(json))?;
    Ok(model.map(|m| m.to_string()))
}

fn invalid_model(reason: &str) -> impl Fn(&RouteError) -> bool + '_ {
    move |error| matches!(error, RouteError::InvalidField { field: "model", reason: r } if r.contains(reason))
}

#[test]
fn a_listed_model_is_the_registrys_own_copy() {
    let registry = registry(TWO_MODELS);
    let body = JsonObject::parse(br#"{"model": "b-lora"}"#).unwrap();
    let model = requested(&body, &registry).unwrap().unwrap();
    assert!(std::rc::Rc::ptr_eq(
        &model,
        registry.listed_model("b-lora").unwrap()
    ));
}

#[test]
fn a_model_the_registry_names_is_the_requests() {
    for model in ["a", "b", "b-lora"] {
        let body = format!(r#"{{"model": "{model}", "prompt": "x"}}"#);
        assert_eq!(requested_in(TWO_MODELS, &body), Ok(Some(model.into())));
    }
    assert_eq!(
        requested_in(TWO_MODELS, r#"{"model": "\u0061"}"#),
        Ok(Some("a".into())),
        "read as JSON, escapes and all"
    );
}

#[test]
fn a_model_no_decode_worker_serves_is_not_found() {
    for model in ["c", "A", "p-only", ""] {
        let body = format!(r#"{{"model": "{model}"}}"#);
        assert_eq!(
            requested_in(TWO_MODELS, &body),
            Err(RouteError::ModelNotFound {
                model: model.into()
            }),
            "{model}"
        );
    }
}

#[test]
fn naming_models_makes_the_model_required_and_typed() {
    for body in [r#"{"prompt": "x"}"#, r#"{"model": null}"#] {
        let error = requested_in(TWO_MODELS, body).unwrap_err();
        assert!(invalid_model("absent or null")(&error), "{body}: {error}");
    }
    for (body, got) in [
        (r#"{"model": 7}"#, "got 7"),
        (r#"{"model": ["a"]}"#, r#"got ["a"]"#),
        (r#"{"model": {"id": "a"}}"#, "got {"),
        (r#"{"model": true}"#, "got true"),
    ] {
        let error = requested_in(TWO_MODELS, body).unwrap_err();
        assert!(invalid_model(got)(&error), "{body}: {error}");
        assert!(invalid_model("must be a string")(&error), "{body}: {error}");
    }
}

#[test]
fn a_registry_naming_no_models_serves_any_and_none() {
    assert_eq!(requested_in(NO_MODELS, r#"{"prompt": "x"}"#), Ok(None));
    assert_eq!(
        requested_in(NO_MODELS, r#"{"model": "anything"}"#),
        Ok(None),
        "not kept: it chooses nothing"
    );
    let error = requested_in(NO_MODELS, r#"{"model": 1}"#).unwrap_err();
    assert!(invalid_model("must be a string")(&error), "{error}");
    assert_eq!(
        list(&registry(NO_MODELS)),
        None,
        "a worker answers the list"
    );
}

#[test]
fn a_worker_naming_no_models_serves_every_one() {
    let mixed = r#"{"workers": [
        {"id": 201, "role": "decode", "address": "127.0.0.1:8201", "models": ["a"]},
        {"id": 202, "role": "decode", "address": "127.0.0.1:8202"}
    ]}"#;
    assert_eq!(
        requested_in(mixed, r#"{"model": "zz"}"#),
        Ok(Some("zz".into()))
    );
    let registry = registry(mixed);
    assert!(registry.names_models());
    assert!(registry.listed_model("a").is_some() && registry.listed_model("zz").is_none());
}

#[test]
fn another_paths_body_selects_by_its_model_when_it_names_one() {
    let two = registry(TWO_MODELS);
    let other =
        |body: &str| in_other_body(body.as_bytes(), &two).map(|model| model.map(|m| m.to_string()));
    assert_eq!(
        other(r#"{"model": "b", "prompt": "x"}"#),
        Ok(Some("b".into()))
    );
    assert_eq!(other(r#"{"prompt": "x"}"#), Ok(None), "absent: any worker");
    assert_eq!(other(r#"["not", "an object"]"#), Ok(None));
    assert_eq!(
        other(r#"{"model": "c"}"#),
        Err(RouteError::ModelNotFound { model: "c".into() })
    );
    assert!(matches!(
        other(r#"{"model": "a", "model": "b"}"#),
        Err(RouteError::InvalidBody(why)) if why.contains("more than once")
    ));
    let error = other(r#"{"model": 3}"#).unwrap_err();
    assert!(invalid_model("must be a string")(&error), "{error}");
    assert_eq!(
        in_other_body(br#"{"model": 3, "model": 4}"#, &registry(NO_MODELS)).unwrap(),
        None,
        "not read when the registry names no models"
    );
}

#[test]
fn the_model_list_has_every_model_once_in_openais_shape() {
    let list: serde_json::Value =
        serde_json::from_str(&list(&registry(TWO_MODELS)).unwrap()).unwrap();
    assert_eq!(list["object"], "list");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b", "b-lora", "p-only"]);
    for model in list["data"].as_array().unwrap() {
        assert_eq!(model["object"], "model");
        assert_eq!(model["owned_by"], "pinroute");
        assert!(model["created"].is_u64());
    }
}

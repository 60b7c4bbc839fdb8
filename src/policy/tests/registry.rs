#![allow(clippy::unwrap_used)]

use super::*;
use crate::policy::config::tests::{DISAGGREGATED, refused};
use crate::policy::testing::test;

#[test]
fn parses_the_registry_format_with_defaults() {
    let registry = Registry::from_json(DISAGGREGATED.as_bytes()).unwrap();
    assert_eq!(registry.deployment(), Deployment::Disaggregated);
    assert_eq!(registry.token_role(), Role::Decode);
    let prefill = registry.get(101).unwrap();
    assert_eq!((prefill.dp_size, prefill.draining), (1, false));
    assert_eq!(prefill.address, "127.0.0.1:8101".parse().unwrap());
    let decode = registry.get(201).unwrap();
    assert_eq!((decode.dp_size, decode.draining), (2, true));
    assert_eq!(registry.pool(Role::Prefill).count(), 1);
    assert!(registry.get(999).is_none());
}

#[test]
fn an_aggregated_registry_is_one_hop() {
    let json = r#"{"workers": [{"id": 1, "role": "aggregated", "address": "[::1]:9000"}]}"#;
    let registry = Registry::from_json(json.as_bytes()).unwrap();
    assert_eq!(registry.deployment(), Deployment::Aggregated);
    assert_eq!(registry.token_role(), Role::Aggregated);
}

#[test]
fn ids_above_2_pow_53_survive() {
    let json = r#"{"workers": [{"id": 18446744073709551615, "role": "decode", "address": "127.0.0.1:1"}]}"#;
    assert!(
        Registry::from_json(json.as_bytes())
            .unwrap()
            .get(u64::MAX)
            .is_some()
    );
}

#[test]
fn a_worker_may_name_the_models_it_serves() {
    let json = r#"{"workers": [
        {"id": 1, "role": "decode", "address": "127.0.0.1:1", "models": ["tiny", "tiny-lora"]},
        {"id": 2, "role": "decode", "address": "127.0.0.1:2"}
    ]}"#;
    let registry = Registry::from_json(json.as_bytes()).unwrap();
    let named = registry.get(1).unwrap();
    assert!(named.serves("tiny") && named.serves("tiny-lora") && !named.serves("other"));
    assert!(
        registry.get(2).unwrap().serves("other"),
        "no models: every model"
    );
    let models: Vec<&str> = registry.models().iter().map(|m| &**m).collect();
    assert_eq!(models, ["tiny", "tiny-lora"]);
}

#[test]
fn invalid_registries_are_refused_with_the_reason() {
    let worker = |id: u64, role: &str, port: u16| {
        format!(r#"{{"id": {id}, "role": "{role}", "address": "127.0.0.1:{port}"}}"#)
    };
    let cases = [
        (
            format!(
                r#"{{"workers": [{}, {}]}}"#,
                worker(1, "decode", 1),
                worker(1, "decode", 2)
            ),
            "worker id 1 appears more than once",
        ),
        (
            format!(
                r#"{{"workers": [{}, {}]}}"#,
                worker(1, "decode", 1),
                worker(2, "decode", 1)
            ),
            "more than one worker",
        ),
        (
            format!(
                r#"{{"workers": [{}, {}]}}"#,
                worker(1, "aggregated", 1),
                worker(2, "decode", 2)
            ),
            "cannot be mixed",
        ),
        (
            format!(r#"{{"workers": [{}]}}"#, worker(1, "prefill", 1)),
            "no decode or aggregated worker",
        ),
        (
            r#"{"workers": []}"#.to_string(),
            "no decode or aggregated worker",
        ),
        (
            r#"{"workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1", "models": []}]}"#
                .into(),
            "worker 1 has an empty models list",
        ),
        (
            r#"{"workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1", "models": ["a", ""]}]}"#
                .into(),
            r#"worker 1 names a model "" in models"#,
        ),
        (
            r#"{"workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1", "models": "a"}]}"#
                .into(),
            "worker 1: invalid type: string",
        ),
        (
            r#"{"workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1", "dp_size": 0}]}"#
                .into(),
            "dp_size 0",
        ),
        (
            r#"{"workers": [{"id": 1, "role": "router", "address": "127.0.0.1:1"}]}"#.into(),
            "unknown variant",
        ),
        (
            r#"{"workers": [{"id": 1, "role": "decode", "address": "localhost:1"}]}"#.into(),
            r#"worker 1: address "localhost:1" is not ip:port (IPv6 as [::1]:8000)"#,
        ),
        (
            r#"{"workers": [{"role": "decode", "address": "127.0.0.1:1", "id": 7},
                            {"role": "decode", "address": "127.0.0.1:2"}]}"#
                .into(),
            "workers[1]: missing field `id`",
        ),
        (
            r#"{"workers": [{"id": -1, "role": "decode", "address": "127.0.0.1:1"}]}"#.into(),
            "invalid",
        ),
        (
            r#"{"workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1", "rank": 2}]}"#
                .into(),
            "unknown field",
        ),
        (r#"{"workerz": []}"#.into(), "unknown field `workerz`"),
        (r#"{}"#.into(), "\"workers\" list is missing"),
        (r#"[]"#.into(), "invalid type: sequence, expected a map"),
        ("".into(), "invalid JSON"),
        (r#"{"workers": [}"#.into(), "invalid JSON"),
    ];
    for (json, why) in cases {
        let message = refused(&json);
        assert!(message.contains(why), "{json}: {message}");
    }
}

#[test]
fn an_address_is_written_as_display_writes_it() {
    let addresses = [
        "0.0.0.0:0",
        "10.0.0.11:8000",
        "127.0.9.99:65535",
        "255.255.255.255:1",
        "1.20.100.3:10",
        "[::1]:8000",
        "[2001:db8::7]:443",
    ];
    for text in addresses {
        let address: SocketAddr = text.parse().unwrap();
        assert_eq!(address_text(address), text);
        assert_eq!(address_text(address), address.to_string());
    }
}

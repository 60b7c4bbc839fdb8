#![allow(clippy::unwrap_used)]

use super::*;
use crate::policy::testing::test;

const DISAGGREGATED: &str = r#"{"workers": [
    {"id": 101, "role": "prefill", "address": "127.0.0.1:8101"},
    {"id": 201, "role": "decode", "address": "127.0.0.1:8201", "dp_size": 2, "draining": true}
]}"#;

fn refused(json: &str) -> String {
    Config::from_json(json.as_bytes()).unwrap_err().to_string()
}

#[test]
fn parses_the_spec_format_with_defaults() {
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
            "invalid",
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
        (r#"[]"#.into(), "invalid JSON"),
        ("".into(), "invalid JSON"),
    ];
    for (json, why) in cases {
        let message = refused(&json);
        assert!(message.contains(why), "{json}: {message}");
    }
}

#[test]
fn settings_default_and_can_be_set() {
    let config = Config::from_json(DISAGGREGATED.as_bytes()).unwrap();
    assert_eq!(config.settings, Settings::default());
    assert_eq!(config.settings.prefill_timeout(), Duration::from_secs(30));
    let json = r#"{"workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1"}],
        "prefill_timeout_ms": 500, "prefill_retries": 3, "aggregated_fallback": false,
        "max_body_bytes": 1024, "upstream_header": "x-my-upstream", "prefill_cluster": "p"}"#;
    let settings = Config::from_json(json.as_bytes()).unwrap().settings;
    assert_eq!(settings.prefill_timeout(), Duration::from_millis(500));
    assert_eq!(settings.prefill_retries, 3);
    assert!(!settings.aggregated_fallback);
    assert_eq!(settings.max_body_bytes, 1024);
    assert_eq!(settings.upstream_header, "x-my-upstream");
    assert_eq!(settings.prefill_cluster, "p");
}

#[test]
fn invalid_settings_are_refused() {
    let base = r#""workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1"}]"#;
    for (setting, why) in [
        (r#""prefill_timeout_ms": 0"#, "prefill_timeout_ms"),
        (r#""max_body_bytes": 0"#, "max_body_bytes"),
        (r#""upstream_header": "X-Upper""#, "upstream_header"),
        (r#""upstream_header": """#, "upstream_header"),
        (r#""prefill_retries": -1"#, "invalid"),
        (r#""prefil_retries": 1"#, "unknown field"),
    ] {
        let message = refused(&format!("{{{base}, {setting}}}"));
        assert!(message.contains(why), "{setting}: {message}");
    }
}

#[test]
fn a_live_registry_makes_workers_optional() {
    let json = r#"{"registry": {"cluster": "pinroute_registry", "address": "registry:8080"}}"#;
    let config = Config::from_json(json.as_bytes()).unwrap();
    assert!(config.registry.workers().is_empty());
    assert!(config.pool_members.is_empty());
    let source = config.settings.registry.unwrap();
    assert_eq!(
        (source.path.as_str(), source.refresh(), source.timeout()),
        ("/registry", Duration::from_secs(5), Duration::from_secs(2))
    );
    assert_eq!(source.address.as_deref(), Some("registry:8080"));

    let with_workers = r#"{"registry": {"cluster": "r", "refresh_ms": 100},
        "workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1"}, {"id": 2, "role": "prefill", "address": "127.0.0.1:2"}]}"#;
    let config = Config::from_json(with_workers.as_bytes()).unwrap();
    assert_eq!(
        config.pool_members,
        vec!["127.0.0.1:1".parse().unwrap()],
        "only token workers are pool members"
    );
    let newer = Registry::from_json(
        br#"{"workers": [{"id": 3, "role": "decode", "address": "127.0.0.1:3"}]}"#,
    )
    .unwrap();
    let updated = config.with_registry(newer.clone());
    assert_eq!(
        (updated.registry, updated.settings, updated.pool_members),
        (newer, config.settings, config.pool_members)
    );
}

#[test]
fn an_invalid_registry_source_is_refused() {
    for (source, why) in [
        (r#"{"cluster": ""}"#, "registry needs a cluster"),
        (r#"{"cluster": "r", "path": "registry"}"#, "starting with /"),
        (r#"{"cluster": "r", "refresh_ms": 0}"#, "must be positive"),
        (r#"{"cluster": "r", "url": "http://x"}"#, "unknown field"),
    ] {
        let message = refused(&format!(r#"{{"registry": {source}}}"#));
        assert!(message.contains(why), "{source}: {message}");
    }
}

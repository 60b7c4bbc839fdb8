#![allow(clippy::unwrap_used)]

use std::collections::HashSet;

use super::*;
use crate::policy::testing::test;

/// Also the registry tests' deployment.
pub(crate) const DISAGGREGATED: &str = r#"{"workers": [
    {"id": 101, "role": "prefill", "address": "127.0.0.1:8101"},
    {"id": 201, "role": "decode", "address": "127.0.0.1:8201", "dp_size": 2, "draining": true}
]}"#;

/// Why `json` is refused as a plugin configuration.
pub(crate) fn refused(json: &str) -> String {
    Config::from_json(json.as_bytes()).unwrap_err().to_string()
}

#[test]
fn settings_default_and_can_be_set() {
    let config = Config::from_json(DISAGGREGATED.as_bytes()).unwrap();
    assert_eq!(config.settings, Settings::default());
    assert_eq!(config.settings.prefill_timeout(), Duration::from_secs(30));
    assert_eq!(config.settings.decode_timeout(), Duration::from_secs(300));
    let json = r#"{"workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1"}],
        "prefill_timeout_ms": 500, "decode_timeout_ms": 700, "prefill_retries": 3, "aggregated_fallback": false,
        "max_body_bytes": 1024, "upstream_header": "x-my-upstream", "prefill_cluster": "p"}"#;
    let settings = Config::from_json(json.as_bytes()).unwrap().settings;
    assert_eq!(settings.prefill_timeout(), Duration::from_millis(500));
    assert_eq!(settings.decode_timeout(), Duration::from_millis(700));
    assert_eq!(settings.prefill_retries, 3);
    assert!(!settings.aggregated_fallback);
    assert_eq!(settings.max_body_bytes, 1024);
    assert_eq!(settings.upstream_header, "x-my-upstream");
    assert_eq!(settings.prefill_cluster, "p");
}

#[test]
fn the_held_decode_body_is_bounded_by_the_body_limit_and_the_kv_bound() {
    let defaults = Settings::default();
    assert_eq!(defaults.max_kv_transfer_params_bytes, 1 << 20);
    assert_eq!(
        defaults.held_body_limit(),
        (8 << 20) + (1 << 20) + (64 << 10)
    );
    let json = r#"{"workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1"}],
        "max_body_bytes": 1000, "max_kv_transfer_params_bytes": 5000, "worker_id_headers": false}"#;
    let settings = Config::from_json(json.as_bytes()).unwrap().settings;
    assert_eq!(settings.held_body_limit(), 6000 + (64 << 10));
    assert!(!settings.worker_id_headers);
}

#[test]
fn passive_health_ejects_after_three_failures_and_panics_below_half_by_default() {
    let defaults = Settings::default();
    assert_eq!(
        defaults.ejection(),
        Some(Ejection {
            period: 10_000_000_000,
            after_failures: 3
        })
    );
    assert_eq!(defaults.panic_threshold_percent, 50);
    let json = r#"{"workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1"}],
        "eject_after_failures": 1, "panic_threshold_percent": 0, "unhealthy_period_ms": 250}"#;
    let settings = Config::from_json(json.as_bytes()).unwrap().settings;
    assert_eq!(
        settings.ejection(),
        Some(Ejection {
            period: 250_000_000,
            after_failures: 1
        })
    );
    assert_eq!(settings.panic_threshold_percent, 0);
    let off = Settings {
        unhealthy_period_ms: 0,
        ..Settings::default()
    };
    assert_eq!(off.ejection(), None);
}

#[test]
fn invalid_settings_are_refused() {
    let base = r#""workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1"}]"#;
    for (setting, why) in [
        (r#""prefill_timeout_ms": 0"#, "prefill_timeout_ms"),
        (r#""decode_timeout_ms": 0"#, "decode_timeout_ms"),
        (r#""max_body_bytes": 0"#, "max_body_bytes"),
        (
            r#""max_kv_transfer_params_bytes": 4095"#,
            "max_kv_transfer_params_bytes",
        ),
        (r#""upstream_header": "X-Upper""#, "upstream_header"),
        (r#""upstream_header": """#, "upstream_header"),
        (r#""prefill_retries": -1"#, "invalid"),
        (r#""prefil_retries": 1"#, "unknown field"),
        (r#""routed_paths": ["v1/models"]"#, "routed_paths"),
        (r#""eject_after_failures": 0"#, "eject_after_failures"),
        (
            r#""panic_threshold_percent": 101"#,
            "panic_threshold_percent",
        ),
        (r#""panic_threshold_percent": -1"#, "invalid"),
        (r#""prefix_affinity_bytes": 16385"#, "prefix_affinity_bytes"),
        (r#""prefix_min_bytes": 255"#, "prefix_min_bytes"),
        (
            r#""prefix_affinity_bytes": 2048, "prefix_min_bytes": 4096"#,
            "prefix_min_bytes",
        ),
        (r#""affinity_busy_percent": 99"#, "affinity_busy_percent"),
        (r#""local_prefill_max_bytes": -1"#, "invalid"),
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
        HashSet::from(["127.0.0.1:1".parse().unwrap()]),
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

#[test]
fn prefix_affinity_and_the_turn_memory_can_be_turned_off() {
    let defaults = Settings::default();
    assert_eq!(
        defaults.busy(),
        Busy {
            excess: 8,
            percent: 200,
            graded: false,
        }
    );
    assert_eq!(defaults.turn_memory_nanos(), Some(30_000_000_000));
    assert_eq!(
        (
            defaults.local_prefill_max_bytes,
            defaults.local_prefill_suffix_bytes
        ),
        (0, 0),
        "every unpinned request takes both hops unless asked"
    );
    let json = r#"{"workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1"}],
        "prefix_affinity_bytes": 0, "prefix_min_bytes": 1, "affinity_busy_excess": 0,
        "affinity_busy_percent": 100, "local_prefill_max_bytes": 2048,
        "local_prefill_suffix_bytes": 512, "turn_memory_ms": 5}"#;
    let settings = Config::from_json(json.as_bytes()).unwrap().settings;
    assert_eq!(settings.turn_memory_nanos(), None, "no hashes, no memory");
    assert_eq!(
        settings.busy(),
        Busy {
            excess: 0,
            percent: 100,
            graded: false,
        }
    );
    assert_eq!(
        (
            settings.local_prefill_max_bytes,
            settings.local_prefill_suffix_bytes
        ),
        (2048, 512)
    );
    let no_memory = Settings {
        turn_memory_ms: 0,
        ..Settings::default()
    };
    assert_eq!(no_memory.turn_memory_nanos(), None);
}

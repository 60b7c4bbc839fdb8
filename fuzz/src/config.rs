//! `Config::from_json` on arbitrary bytes (docs/semantics.md §8).
//!
//! Properties:
//! - it never panics: a bad configuration is refused at load, with a message;
//! - an accepted configuration keeps the documented bounds: `prefill_timeout_ms` in
//!   `1..=4294967295`, a positive `max_body_bytes`, a lowercase `upstream_header`, an
//!   `engine_load` whose period, timeout, staleness, page limit and thresholds are in range;
//! - its registry is one `Registry::new` accepts (unique ids and addresses, positive
//!   `dp_size`, no mixed deployment, a token-generating worker), or empty only while a
//!   live registry source is configured and no `workers` were given.

use pinroute::policy::config::Config;

use crate::resolve::registry_is_valid;

pub fn check(data: &[u8]) {
    match Config::from_json(data) {
        Ok(config) => check_accepted(&config, data),
        Err(error) => assert!(
            !error.to_string().is_empty(),
            "a refusal must say what is wrong"
        ),
    }
}

fn check_accepted(config: &Config, data: &[u8]) {
    let settings = &config.settings;
    assert!(
        (1..=u64::from(u32::MAX)).contains(&settings.prefill_timeout_ms),
        "prefill_timeout_ms"
    );
    assert!(settings.max_body_bytes > 0, "max_body_bytes");
    let header = settings.upstream_header.as_bytes();
    let header_ok = !header.is_empty()
        && header
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    assert!(header_ok, "upstream_header {:?}", settings.upstream_header);
    if let Some(engines) = &settings.engine_load {
        let in_range = (50..=3_600_000).contains(&engines.period_ms)
            && engines.timeout_ms > 0
            && engines.stale_ms >= engines.period_ms
            && (1..=16 << 20).contains(&engines.max_bytes)
            && engines.busy_waiting != Some(0)
            && engines
                .busy_kv_percent
                .is_none_or(|p| (1..=100).contains(&p))
            && engines.path.starts_with('/');
        assert!(in_range, "engine_load out of range: {engines:?}");
    }
    let workers = config.registry.workers();
    if workers.is_empty() {
        let doc: serde_json::Value = serde_json::from_slice(data).unwrap_or_default();
        assert!(
            settings.registry.is_some() && doc.get("workers").is_none(),
            "an empty registry was accepted"
        );
    } else {
        assert!(
            registry_is_valid(workers),
            "an invalid registry was accepted: {workers:?}"
        );
    }
}

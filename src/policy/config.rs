//! The filter's plugin configuration (`docs/semantics.md` §8): the registry, the settings
//! an operator may turn, and where a live registry comes from.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

use super::callers::CallerRules;
use super::engine_load::EngineLoadSource;
use super::headers::must_strip;
use super::health::Ejection;
use super::paths::INFERENCE_PATHS;
use super::picker::PickerSettings;
use super::prefix::{BLOCK_BYTES, MAX_WINDOW_BYTES};
use super::registry::{Registry, RegistryError, workers_from};
use super::select::Busy;

/// The Envoy cluster of the decode (or aggregated) hop: ORIGINAL_DST, steered by
/// `upstream_header`. The routes send the routed hop there; the filter's own decode retries
/// are dispatched to it.
pub const DECODE_CLUSTER: &str = "pinroute_decode";

/// The plugin configuration: the registry plus the knobs an operator may turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub registry: Registry,
    pub settings: Settings,
    /// Token-generating workers of the configured (static) list: the members of the
    /// bootstrap's decode pool cluster, the only addresses an `x-pinroute-pool` may name.
    pub pool_members: HashSet<SocketAddr>,
}

impl Config {
    /// The same settings with a newer registry (from the live source).
    pub fn with_registry(&self, registry: Registry) -> Self {
        Self {
            registry,
            settings: self.settings.clone(),
            pool_members: self.pool_members.clone(),
        }
    }
}

/// Where the filter fetches the registry (`docs/semantics.md` §8) on a period.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySource {
    /// The Envoy cluster serving it.
    pub cluster: String,
    #[serde(default = "default_registry_path")]
    pub path: String,
    #[serde(default = "default_registry_authority")]
    pub authority: String,
    #[serde(default = "default_refresh_ms")]
    pub refresh_ms: u64,
    #[serde(default = "default_fetch_timeout_ms")]
    pub timeout_ms: u64,
    /// `host:port` of the registry service, for the bootstrap renderer to define `cluster`
    /// (the filter itself only names the cluster).
    #[serde(default)]
    pub address: Option<String>,
}

fn default_registry_path() -> String {
    "/registry".into()
}

fn default_registry_authority() -> String {
    "pinroute-registry".into()
}

fn default_refresh_ms() -> u64 {
    5_000
}

fn default_fetch_timeout_ms() -> u64 {
    2_000
}

impl RegistrySource {
    pub fn refresh(&self) -> Duration {
        Duration::from_millis(self.refresh_ms)
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Envoy cluster the prefill hop is dispatched to (ORIGINAL_DST, `x-envoy-original-dst-host`).
    pub prefill_cluster: String,
    /// Request header the filter alone sets to steer the decode hop (the decode cluster's
    /// ORIGINAL_DST `http_header_name`).
    pub upstream_header: String,
    pub prefill_timeout_ms: u64,
    /// Timeout of a decode hop the filter sends itself: the retry of a worker Envoy cannot
    /// retry (`docs/semantics.md` §4). The routed hop has the route's timeout.
    pub decode_timeout_ms: u64,
    /// How many other prefill workers an unpinned request tries after the first fails.
    pub prefill_retries: u32,
    /// When every prefill attempt of an unpinned request failed, let decode prefill locally.
    pub aggregated_fallback: bool,
    pub max_body_bytes: usize,
    /// The most a prefill worker's `kv_transfer_params` may hold: they are spliced into the
    /// decode body Envoy holds, so Envoy's buffer must fit `max_body_bytes` plus this
    /// ([`Settings::held_body_limit`]). A larger answer fails the hop.
    pub max_kv_transfer_params_bytes: usize,
    /// Whether answers name the workers that served them (`x-pinroute-prefill-worker`,
    /// `x-pinroute-decode-worker`).
    pub worker_id_headers: bool,
    /// Whether the filter tells Envoy's access log each hop's worker, rank and choice, the
    /// model and the prefill time (filter state `wasm.pinroute.*`, `docs/metrics.md`).
    pub access_log_fields: bool,
    /// The OTLP/gRPC collector's cluster the filter exports its prefill hop's span to where the
    /// host opens none (proxy-wasm; `docs/semantics.md` §4, "Traces"); empty: none exported.
    pub trace_export_cluster: String,
    /// Completion requests the gateway holds at once, over all Envoy threads, from their
    /// headers to the end of their stream; one more gets 503 `overloaded`. 0: no limit.
    pub max_requests_in_flight: u64,
    /// How long a worker whose connections failed is skipped by unpinned selection (pins to
    /// it answer 503), doubled for repeated outages. 0 disables passive health.
    pub unhealthy_period_ms: u64,
    /// Connection failures in a row (seen by any Envoy thread, each within a period of the
    /// one before, no success between) that take a worker out of service. 1: the first does.
    pub eject_after_failures: u32,
    /// Panic mode: below this percentage of healthy workers in a hop's pool, unpinned
    /// selection uses its unhealthy workers too, after the healthy ones. 0 disables it.
    pub panic_threshold_percent: u32,
    /// A live registry replacing `workers` as it changes.
    pub registry: Option<RegistrySource>,
    /// Load as the engines report it (`docs/semantics.md` §5): scraped from each worker's
    /// metrics page. Off: the gateway's own counts alone.
    pub engine_load: Option<EngineLoadSource>,
    /// The paths besides the completion paths that reach a worker (exact, or `/prefix/*`);
    /// any other answers 404 `unknown_path`.
    pub routed_paths: Vec<String>,
    /// Prefix affinity: how many bytes of a prompt's beginning place an unpinned hop. 0 turns
    /// it off (and the turn memory with it).
    pub prefix_affinity_bytes: usize,
    /// A shared beginning shorter than this is no reason to place requests together; shorter
    /// prompts are placed by load alone.
    pub prefix_min_bytes: usize,
    /// Affinity skips a worker with more requests in flight than `affinity_busy_percent` %
    /// of its pool's mean plus this many.
    pub affinity_busy_excess: u64,
    pub affinity_busy_percent: u64,
    /// Skip the prefill hop of an unpinned prefill whose prompt is at most this many bytes
    /// (the decode worker prefills it). 0: never.
    pub local_prefill_max_bytes: usize,
    /// Skip the prefill hop of an unpinned prefill when the decode worker served the
    /// conversation's last turn and the prompt adds at most this many bytes to it. 0: never.
    pub local_prefill_suffix_bytes: usize,
    /// How long the turn memory trusts a served turn. 0 turns the memory off.
    pub turn_memory_ms: u64,
    /// Picker mode (`docs/semantics.md` §9): the endpoint picker's choices are obeyed.
    pub picker: Option<PickerSettings>,
    /// Who may pin and who may name a session (`docs/semantics.md` §7).
    pub callers: Option<CallerRules>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            prefill_cluster: "pinroute_prefill".into(),
            upstream_header: "x-pinroute-upstream".into(),
            prefill_timeout_ms: 30_000,
            decode_timeout_ms: 300_000,
            prefill_retries: 1,
            aggregated_fallback: true,
            max_body_bytes: 8 * 1024 * 1024,
            max_kv_transfer_params_bytes: 1024 * 1024,
            worker_id_headers: true,
            access_log_fields: true,
            trace_export_cluster: String::new(),
            max_requests_in_flight: DEFAULT_MAX_REQUESTS_IN_FLIGHT,
            unhealthy_period_ms: 10_000,
            eject_after_failures: 3,
            panic_threshold_percent: 50,
            registry: None,
            engine_load: None,
            routed_paths: INFERENCE_PATHS.iter().map(|p| p.to_string()).collect(),
            prefix_affinity_bytes: 4096,
            prefix_min_bytes: 1024,
            affinity_busy_excess: 8,
            affinity_busy_percent: 200,
            local_prefill_max_bytes: 0,
            local_prefill_suffix_bytes: 0,
            turn_memory_ms: 30_000,
            picker: None,
            callers: None,
        }
    }
}

/// See `docs/soak.md` (memory per request in flight) for the measurements behind it.
pub const DEFAULT_MAX_REQUESTS_IN_FLIGHT: u64 = 1024;

/// What the decode body adds around the prefill's `kv_transfer_params`: the key, its quotes,
/// a colon and a comma, with room to spare.
const SPLICE_OVERHEAD_BYTES: usize = 64 * 1024;

/// The smallest bound on `kv_transfer_params`: a NIXL answer for a short prompt fits in it.
const MIN_KV_TRANSFER_PARAMS_BYTES: usize = 4096;

impl Settings {
    /// The largest decode body the filter asks Envoy to hold: the client's body with the
    /// prefill's `kv_transfer_params` spliced in. Envoy's buffer limit for the listener must be
    /// at least this (`docs/deploy.md`), or the splice overflows it.
    pub fn held_body_limit(&self) -> usize {
        self.max_body_bytes
            .saturating_add(self.max_kv_transfer_params_bytes)
            .saturating_add(SPLICE_OVERHEAD_BYTES)
    }

    /// The in-flight limit; `None` when off.
    pub fn in_flight_limit(&self) -> Option<u64> {
        (self.max_requests_in_flight > 0).then_some(self.max_requests_in_flight)
    }

    pub fn prefill_timeout(&self) -> Duration {
        Duration::from_millis(self.prefill_timeout_ms)
    }

    pub fn decode_timeout(&self) -> Duration {
        Duration::from_millis(self.decode_timeout_ms)
    }

    /// When a worker is too busy for prefix affinity.
    pub fn busy(&self) -> Busy {
        Busy {
            excess: self.affinity_busy_excess,
            percent: self.affinity_busy_percent,
            graded: self.engine_load.is_some(),
        }
    }

    /// How long a served turn is remembered, in nanoseconds; `None` with the memory off.
    pub fn turn_memory_nanos(&self) -> Option<u64> {
        let nanos = self.turn_memory_ms.saturating_mul(1_000_000);
        (nanos > 0 && self.prefix_affinity_bytes > 0).then_some(nanos)
    }

    /// When failed connections take a worker out of service; `None` with passive health off.
    pub fn ejection(&self) -> Option<Ejection> {
        let period = self.unhealthy_period_ms.saturating_mul(1_000_000);
        (period > 0).then_some(Ejection {
            period,
            after_failures: u64::from(self.eject_after_failures),
        })
    }
}

impl Config {
    pub fn from_json(json: &[u8]) -> Result<Self, ConfigError> {
        let mut doc: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(json).map_err(RegistryError::from)?;
        let workers = doc.remove("workers");
        let settings: Settings =
            serde_json::from_value(serde_json::Value::Object(doc)).map_err(RegistryError::from)?;
        settings.validate()?;
        let registry = match (workers, &settings.registry) {
            (Some(workers), _) => Registry::new(workers_from(workers)?)?,
            (None, Some(_)) => Registry::empty(),
            (None, None) => return Err(ConfigError::MissingWorkers),
        };
        let role = registry.token_role();
        let pool_members = registry.pool(role).map(|w| w.address).collect();
        Ok(Self {
            registry,
            settings,
            pool_members,
        })
    }
}

impl Settings {
    fn validate(&self) -> Result<(), ConfigError> {
        let settings = self;
        if settings.prefill_timeout_ms == 0 || settings.prefill_timeout_ms > u64::from(u32::MAX) {
            return Err(ConfigError::Setting(
                "prefill_timeout_ms must be in 1..=4294967295",
            ));
        }
        if settings.decode_timeout_ms == 0 || settings.decode_timeout_ms > u64::from(u32::MAX) {
            return Err(ConfigError::Setting(
                "decode_timeout_ms must be in 1..=4294967295",
            ));
        }
        if settings.eject_after_failures == 0 {
            return Err(ConfigError::Setting(
                "eject_after_failures must be at least 1 (unhealthy_period_ms: 0 turns passive health off)",
            ));
        }
        if settings.panic_threshold_percent > 100 {
            return Err(ConfigError::Setting(
                "panic_threshold_percent must be in 0..=100",
            ));
        }
        if settings.prefix_affinity_bytes > MAX_WINDOW_BYTES {
            return Err(ConfigError::Setting(
                "prefix_affinity_bytes must be at most 16384",
            ));
        }
        if settings.prefix_affinity_bytes > 0
            && !(BLOCK_BYTES..=settings.prefix_affinity_bytes).contains(&settings.prefix_min_bytes)
        {
            return Err(ConfigError::Setting(
                "prefix_min_bytes must be at least 256 and at most prefix_affinity_bytes",
            ));
        }
        if settings.affinity_busy_percent < 100 {
            return Err(ConfigError::Setting(
                "affinity_busy_percent must be at least 100",
            ));
        }
        if settings.max_body_bytes == 0 {
            return Err(ConfigError::Setting("max_body_bytes must be positive"));
        }
        if settings.max_kv_transfer_params_bytes < MIN_KV_TRANSFER_PARAMS_BYTES {
            return Err(ConfigError::Setting(
                "max_kv_transfer_params_bytes must be at least 4096",
            ));
        }
        if !is_header_name(&settings.upstream_header) {
            return Err(ConfigError::Setting(
                "upstream_header must be a lowercase header name",
            ));
        }
        if let Some(why) = settings.engine_load.as_ref().and_then(|e| e.invalid()) {
            return Err(ConfigError::Setting(why));
        }
        if settings.routed_paths.iter().any(|p| !p.starts_with('/')) {
            return Err(ConfigError::Setting("routed_paths must start with /"));
        }
        if let Some(rules) = &settings.callers {
            if !is_header_name(&rules.header) {
                return Err(ConfigError::Setting(
                    "callers.header must be a lowercase header name",
                ));
            }
            if must_strip(&rules.header, &settings.upstream_header) {
                return Err(ConfigError::Setting(
                    "callers.header is a header the filter removes (docs/semantics.md §7)",
                ));
            }
            if settings.picker.is_some() && rules.may_pin.is_some() {
                return Err(ConfigError::Setting(
                    "callers.may_pin cannot be used with a picker: its choices arrive as pin \
                     headers (docs/semantics.md §9); restrict pins in the picker",
                ));
            }
        }
        if let Some(source) = &settings.registry {
            if source.cluster.is_empty() || !source.path.starts_with('/') {
                return Err(ConfigError::Setting(
                    "registry needs a cluster and a path starting with /",
                ));
            }
            if source.refresh_ms == 0
                || source.timeout_ms == 0
                || source.timeout_ms > u64::from(u32::MAX)
            {
                return Err(ConfigError::Setting(
                    "registry refresh_ms and timeout_ms must be positive",
                ));
            }
        }
        Ok(())
    }
}

/// A lower-case HTTP header name of letters, digits and dashes.
pub fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Why a plugin configuration was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("the \"workers\" list is missing")]
    MissingWorkers,
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("{0}")]
    Setting(&'static str),
}

#[cfg(test)]
#[path = "tests/config.rs"]
pub(crate) mod tests;

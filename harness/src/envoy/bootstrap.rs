//! Renders `envoy/bootstrap.yaml`: a static Envoy bootstrap that runs the pinroute filter.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use pinroute::policy::config::{Config, Settings};
use serde_json::json;

use super::edge::{self, EdgeOptions};
use super::picker_mode::{PICKER_CLUSTER, fill_block, render_picker_blocks};
use super::{tls, tracing};

const TEMPLATE: &str = include_str!("../../../envoy/bootstrap.yaml");

/// The cluster the routed (decode or aggregated) request goes to.
pub use pinroute::policy::config::DECODE_CLUSTER;
/// LLM generations are long: the default route (and stream idle) timeout.
pub const DEFAULT_ROUTE_TIMEOUT: Duration = Duration::from_secs(300);
/// A worker that does not accept a connection in this long is down.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Circuit-breaker thresholds (connections, pending and active requests) of both clusters.
pub const MAX_UPSTREAM_REQUESTS: u32 = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapOptions {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    /// The filter's wasm module; made absolute when rendered.
    pub wasm: PathBuf,
    /// The plugin configuration JSON: the registry and the filter's settings.
    pub plugin_config: String,
    /// Route timeout and HTTP stream idle timeout; zero disables both.
    pub route_timeout: Duration,
    /// Request timeouts and CORS.
    pub edge: EdgeOptions,
}

/// Renders the bootstrap, refusing a plugin configuration the filter would refuse.
pub fn render_bootstrap(opts: &BootstrapOptions) -> Result<String> {
    let config = Config::from_json(opts.plugin_config.as_bytes())
        .map_err(|e| anyhow::anyhow!("invalid plugin configuration (worker registry): {e}"))?;
    check_cluster_names(&config.settings)?;
    check_caller_rules(&config.settings, opts.edge.callers.as_ref())?;
    edge::check_origins(&opts.edge)?;
    let mut values = placeholder_values(opts, &config.settings)?;
    values.push(("{{DECODE_POOL_ENDPOINTS}}", decode_pool_endpoints(&config)));
    values.push(("{{REGISTRY_CLUSTER}}", registry_cluster(&config)?));
    values.push(("{{CORS_POLICY}}", edge::cors_policy(&opts.edge)));
    values.push(("{{METRICS_ROUTE}}", edge::metrics_route(&opts.edge)));
    values.push((
        "{{ADMIN_CLUSTER}}",
        edge::admin_cluster(&opts.edge, opts.admin)?,
    ));
    let template = render_picker_blocks(TEMPLATE, config.settings.picker.as_ref())?;
    let template = render_tls_blocks(&template, &opts.edge)?;
    let template = match opts.edge.access_log {
        true => template,
        false => without_access_log(&template),
    };
    let rendered = values.iter().fold(template, |text, (marker, value)| {
        text.replace(marker, value)
    });
    ensure_no_marker_left(&rendered)?;
    Ok(rendered)
}

/// Fills the marker lines of TLS, API keys and tracing: with their parts, or with nothing.
fn render_tls_blocks(template: &str, edge: &EdgeOptions) -> Result<String> {
    let blocks = [
        (
            "{{LISTENER_TRANSPORT_SOCKET}}",
            tls::listener_transport_socket(edge.tls.as_ref())?,
        ),
        (
            "{{WORKER_TRANSPORT_SOCKET}}",
            tls::worker_transport_socket(edge.worker_tls.as_ref())?,
        ),
        (
            "{{CALLER_FILTER}}",
            tls::caller_filter(edge.callers.as_ref())?,
        ),
        (
            "{{IDENTITY_HEADER_REMOVAL}}",
            tls::identity_header_removal(edge.callers.as_ref())?,
        ),
        ("{{TRACING}}", tracing::tracing_block(edge.otlp)),
        (
            "{{TRACE_HEADER_MUTATION}}",
            tracing::trace_header_mutation(edge.otlp),
        ),
        ("{{OTLP_CLUSTER}}", tracing::otlp_cluster(edge.otlp)),
    ];
    Ok(blocks
        .iter()
        .fold(template.to_owned(), |text, (marker, block)| {
            fill_block(&text, marker, block)
        }))
}

fn check_cluster_names(settings: &Settings) -> Result<()> {
    ensure!(
        !settings.prefill_cluster.is_empty(),
        "prefill_cluster must not be empty"
    );
    ensure!(
        settings.prefill_cluster != DECODE_CLUSTER,
        "prefill_cluster must not be {DECODE_CLUSTER:?}: that name is the decode hop's cluster"
    );
    ensure!(
        settings.picker.is_none() || settings.prefill_cluster != PICKER_CLUSTER,
        "prefill_cluster must not be {PICKER_CLUSTER:?}: that name is the picker's cluster"
    );
    Ok(())
}

/// The filter's caller rules need a caller the edge vouches for, in the header they read: without
/// API keys or tokens the identity header would be the client's own word.
fn check_caller_rules(settings: &Settings, callers: Option<&tls::Callers>) -> Result<()> {
    let Some(rules) = &settings.callers else {
        return Ok(());
    };
    let Some(callers) = callers else {
        bail!(
            "the plugin configuration restricts callers (\"callers\"), but no caller is \
             authenticated: add --api-keys or --jwt-issuer"
        );
    };
    ensure!(
        rules.header == callers.identity_header(),
        "callers.header {:?} is not the header the edge names callers in ({:?}, --identity-header)",
        rules.header,
        callers.identity_header()
    );
    Ok(())
}

fn placeholder_values(
    opts: &BootstrapOptions,
    settings: &Settings,
) -> Result<Vec<(&'static str, String)>> {
    Ok(vec![
        ("{{ADMIN_IP}}", yaml_string(&opts.admin.ip().to_string())?),
        ("{{ADMIN_PORT}}", opts.admin.port().to_string()),
        ("{{LISTEN_IP}}", yaml_string(&opts.listen.ip().to_string())?),
        ("{{LISTEN_PORT}}", opts.listen.port().to_string()),
        (
            "{{BUFFER_LIMIT_BYTES}}",
            buffer_limit_bytes(settings)?.to_string(),
        ),
        ("{{ROUTE_TIMEOUT}}", envoy_duration(opts.route_timeout)),
        (
            "{{REQUEST_HEADERS_TIMEOUT}}",
            envoy_duration(opts.edge.request_headers_timeout),
        ),
        (
            "{{REQUEST_TIMEOUT}}",
            envoy_duration(edge::request_timeout(&opts.edge, settings)),
        ),
        ("{{CONNECT_TIMEOUT}}", envoy_duration(CONNECT_TIMEOUT)),
        (
            "{{MAX_UPSTREAM_REQUESTS}}",
            MAX_UPSTREAM_REQUESTS.to_string(),
        ),
        (
            "{{UPSTREAM_HEADER}}",
            yaml_string(&settings.upstream_header)?,
        ),
        (
            "{{PREFILL_CLUSTER}}",
            yaml_string(&settings.prefill_cluster)?,
        ),
        (
            "{{PLUGIN_CONFIG}}",
            yaml_string(&plugin_json(
                &opts.plugin_config,
                opts.route_timeout,
                &opts.edge,
            )?)?,
        ),
        ("{{WASM_PATH}}", yaml_string(&absolute_utf8(&opts.wasm)?)?),
    ])
}

/// The template without the listener's `access_log:` and its list (items at its indentation
/// or deeper).
fn without_access_log(template: &str) -> String {
    let indent = |line: &str| line.len() - line.trim_start().len();
    let mut kept = String::with_capacity(template.len());
    let mut cutting: Option<usize> = None;
    for line in template.split_inclusive('\n') {
        let content = line.trim_end();
        if let Some(key_indent) = cutting {
            let item = indent(content) == key_indent && content.trim_start().starts_with('-');
            if content.is_empty() || indent(content) > key_indent || item {
                continue;
            }
            cutting = None;
        }
        if content.trim_start() == "access_log:" {
            cutting = Some(indent(content));
            continue;
        }
        kept.push_str(line);
    }
    kept
}

/// The token-generating workers as `lb_endpoints`.
fn decode_pool_endpoints(config: &Config) -> String {
    let role = config.registry.token_role();
    lb_endpoints(config.registry.pool(role).map(|w| w.address))
}

/// `addresses` as a cluster's `lb_endpoints`, in JSON (valid YAML flow style).
pub fn lb_endpoints(addresses: impl Iterator<Item = SocketAddr>) -> String {
    let endpoints: Vec<_> = addresses
        .map(|address| {
            let socket = json!({"address": address.ip().to_string(), "port_value": address.port()});
            json!({"endpoint": {"address": {"socket_address": socket}}})
        })
        .collect();
    serde_json::Value::Array(endpoints).to_string()
}

/// The live registry's cluster, as one more item of the `clusters` list (JSON flow style),
/// or nothing without a live registry.
fn registry_cluster(config: &Config) -> Result<String> {
    let Some(source) = &config.settings.registry else {
        return Ok(String::new());
    };
    let Some(address) = &source.address else {
        bail!(
            "registry.address (host:port) is needed to render the {:?} cluster",
            source.cluster
        )
    };
    let (host, port) = host_and_port("registry.address", address)?;
    let endpoint =
        json!({"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}});
    let cluster = json!({
        "name": source.cluster,
        "type": "STRICT_DNS",
        "connect_timeout": envoy_duration(CONNECT_TIMEOUT),
        "load_assignment": {"cluster_name": source.cluster, "endpoints": [{"lb_endpoints": [endpoint]}]},
    });
    Ok(format!("  - {cluster}"))
}

/// `host:port` (IPv6 in brackets) as host and port; `setting` names it in the error.
pub(super) fn host_and_port<'a>(setting: &str, address: &'a str) -> Result<(&'a str, u16)> {
    address
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host.trim_matches(['[', ']']), port.parse::<u16>().ok()?)))
        .with_context(|| format!("{setting} {address:?} is not host:port"))
}

/// A JSON string literal: a valid YAML double-quoted scalar for any string.
pub(super) fn yaml_string(value: &str) -> Result<String> {
    serde_json::to_string(value).context("encoding a string for the bootstrap")
}

/// The plugin configuration as one line of JSON, with what the rendering decides unless the
/// configuration does: the filter's own decode call (`docs/semantics.md` §4, §8) gets the
/// route's timeout, without an access log the filter writes no fields for it, and with
/// traces it exports its prefill hop's span (where Envoy gives it none) to the collector.
fn plugin_json(json: &str, route_timeout: Duration, edge: &EdgeOptions) -> Result<String> {
    let mut value: serde_json::Value =
        serde_json::from_str(json).context("plugin configuration is not JSON")?;
    if let Some(settings) = value.as_object_mut() {
        if !route_timeout.is_zero() && !settings.contains_key(DECODE_TIMEOUT_SETTING) {
            let ms = u64::try_from(route_timeout.as_millis()).unwrap_or(u64::MAX);
            settings.insert(DECODE_TIMEOUT_SETTING.into(), ms.into());
        }
        if !edge.access_log && !settings.contains_key(ACCESS_LOG_FIELDS_SETTING) {
            settings.insert(ACCESS_LOG_FIELDS_SETTING.into(), false.into());
        }
        if edge.otlp.is_some() && !settings.contains_key(TRACE_EXPORT_SETTING) {
            settings.insert(TRACE_EXPORT_SETTING.into(), tracing::OTLP_CLUSTER.into());
        }
    }
    Ok(value.to_string())
}

const DECODE_TIMEOUT_SETTING: &str = "decode_timeout_ms";
const ACCESS_LOG_FIELDS_SETTING: &str = "access_log_fields";
const TRACE_EXPORT_SETTING: &str = "trace_export_cluster";

pub(super) fn absolute_utf8(path: &Path) -> Result<String> {
    let absolute =
        std::path::absolute(path).with_context(|| format!("making {} absolute", path.display()))?;
    match absolute.to_str() {
        Some(text) => Ok(text.to_owned()),
        None => bail!("{} is not UTF-8", absolute.display()),
    }
}

/// Envoy's per-connection buffer limit (a 32-bit field): the largest decode body the filter
/// asks Envoy to hold, the client's body with the prefill's `kv_transfer_params` spliced in
/// (`Settings::held_body_limit`). An oversized client body still reaches the filter, which
/// answers it with its typed 413 rather than Envoy's own.
pub fn buffer_limit_bytes(settings: &Settings) -> Result<u32> {
    let held = settings.held_body_limit();
    u32::try_from(held).with_context(|| {
        format!(
            "max_body_bytes {} plus max_kv_transfer_params_bytes {} exceeds Envoy's 32-bit \
             buffer limit",
            settings.max_body_bytes, settings.max_kv_transfer_params_bytes
        )
    })
}

/// What an operator should know before serving this bootstrap: an admin interface reachable
/// from other hosts (it can change and stop Envoy), and a live registry or an endpoint picker
/// reached in clear text on another host (`docs/security.md`): either chooses where prompts go.
pub fn exposure_warnings(opts: &BootstrapOptions) -> Vec<String> {
    let mut warnings = Vec::new();
    if !opts.admin.ip().is_loopback() {
        warnings.push(format!(
            "the admin interface listens on {}: anyone who reaches it can reconfigure and stop \
             Envoy; keep it on 127.0.0.1 unless a firewall guards it (docs/security.md)",
            opts.admin
        ));
    }
    let settings = Config::from_json(opts.plugin_config.as_bytes())
        .ok()
        .map(|config| config.settings);
    let registry = settings
        .as_ref()
        .and_then(|s| s.registry.as_ref())
        .and_then(|source| source.address.clone());
    if let Some(address) = registry.filter(|a| !is_loopback_address(a)) {
        warnings.push(format!(
            "the live registry is fetched from {address} over plain HTTP with no integrity \
             check: serve it through the mesh's mutual TLS or on this host \
             (docs/security.md, \"The live registry\")"
        ));
    }
    let picker = settings
        .and_then(|s| s.picker)
        .and_then(|picker| picker.address);
    if let Some(address) = picker.filter(|a| !is_loopback_address(a)) {
        warnings.push(format!(
            "the endpoint picker at {address} is reached over plain HTTP/2: whoever answers for \
             it chooses workers within the allowlist; reach it through the mesh's mutual TLS or \
             on this host (docs/security.md, \"Behind an endpoint picker\")"
        ));
    }
    warnings
}

fn is_loopback_address(host_port: &str) -> bool {
    let host = host_port
        .rsplit_once(':')
        .map_or(host_port, |(host, _)| host)
        .trim_matches(['[', ']']);
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A protobuf `Duration` in the form Envoy's YAML accepts: `300s`, `0.250000000s`.
pub fn envoy_duration(duration: Duration) -> String {
    match duration.subsec_nanos() {
        0 => format!("{}s", duration.as_secs()),
        nanos => format!("{}.{nanos:09}s", duration.as_secs()),
    }
}

fn ensure_no_marker_left(rendered: &str) -> Result<()> {
    match rendered.lines().find(|line| line.contains("{{")) {
        Some(line) => bail!(
            "bootstrap template has an unknown placeholder: {}",
            line.trim()
        ),
        None => Ok(()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;
    use crate::envoy::test_support::{
        AGGREGATED_REGISTRY, DISAGGREGATED_REGISTRY, PICKER_PROTOCOLS, options, with_picker,
    };
    use pinroute::policy::picker::{PICKER_HEADERS, PREFILL_SERVED_HEADER, SERVED_HEADER};

    #[test]
    fn renders_every_placeholder() {
        let yaml =
            render_bootstrap(&options(DISAGGREGATED_REGISTRY, Path::new("/x.wasm"))).unwrap();
        assert!(!yaml.contains("{{"), "{yaml}");
        assert!(
            yaml.contains("http_header_name: \"x-pinroute-upstream\""),
            "{yaml}"
        );
        // Stripped from the client's request, and from what the workers receive.
        assert_eq!(
            yaml.matches("- remove: \"x-pinroute-upstream\"").count(),
            2,
            "{yaml}"
        );
        assert_eq!(
            yaml.matches("- remove: \"x-envoy-original-dst-host\"")
                .count(),
            2,
            "{yaml}"
        );
        assert!(yaml.contains("- name: \"pinroute_prefill\""), "{yaml}");
        assert!(yaml.contains("filename: \"/x.wasm\""), "{yaml}");
        assert!(yaml.contains("timeout: 300s"), "{yaml}");
        assert!(
            yaml.contains("per_connection_buffer_limit_bytes: 9502720"),
            "{yaml}"
        );
        assert!(yaml.contains("request_headers_timeout: 10s"), "{yaml}");
        assert!(yaml.contains("request_timeout: 120s"), "{yaml}");
        assert!(
            yaml.contains("headers_with_underscores_action: REJECT_REQUEST"),
            "{yaml}"
        );
        assert!(yaml.contains("typed_per_filter_config: {\"envoy.filters.http.cors\""));
    }

    #[test]
    fn the_access_log_can_be_turned_off_alone() {
        let mut opts = options(DISAGGREGATED_REGISTRY, Path::new("/x.wasm"));
        let with = render_bootstrap(&opts).unwrap();
        assert!(with.contains("access_log:"), "{with}");
        assert!(with.contains("wasm.pinroute.decode_choice"), "{with}");
        opts.edge.access_log = false;
        let without = render_bootstrap(&opts).unwrap();
        assert!(!without.contains("access_log:"), "{without}");
        assert!(!without.contains("StdoutAccessLog"), "{without}");
        assert!(!without.contains("FILTER_STATE"), "{without}");
        assert!(
            without.contains(r#"\"access_log_fields\":false"#),
            "nor does the filter write its fields: {without}"
        );
        let removed: Vec<&str> = with
            .lines()
            .filter(|line| !without.contains(*line))
            .collect();
        assert!(
            removed.iter().all(|line| line.starts_with(&" ".repeat(10))),
            "only the access log's lines go: {removed:?}"
        );
        assert!(without.contains("route_config:"), "{without}");
    }

    #[test]
    fn caller_rules_need_callers_the_edge_names_in_their_header() {
        let config = r#"{"workers": [{"id": 201, "role": "decode", "address": "127.0.0.1:8201"}],
            "callers": {"header": "x-tenant", "may_pin": ["ops"]}}"#;
        let mut opts = options(config, Path::new("/x.wasm"));
        let err = render_bootstrap(&opts).unwrap_err().to_string();
        assert!(err.contains("add --api-keys or --jwt-issuer"), "{err}");
        let keys = |header: &str| {
            tls::Callers::ApiKeys(tls::ApiKeys {
                keys: vec![tls::ApiKey {
                    client: "ops".into(),
                    key: "k".into(),
                }],
                identity_header: header.into(),
            })
        };
        opts.edge.callers = Some(keys("x-client-id"));
        let err = render_bootstrap(&opts).unwrap_err().to_string();
        assert!(
            err.contains("is not the header the edge names callers in"),
            "{err}"
        );
        opts.edge.callers = Some(keys("x-tenant"));
        render_bootstrap(&opts).unwrap();
    }

    #[test]
    fn every_placeholder_is_in_the_template() {
        let opts = options(DISAGGREGATED_REGISTRY, Path::new("/x.wasm"));
        let config = Config::from_json(opts.plugin_config.as_bytes()).unwrap();
        for (marker, _) in placeholder_values(&opts, &config.settings).unwrap() {
            assert!(TEMPLATE.contains(marker), "{marker} unused");
        }
    }

    #[test]
    fn settings_shape_the_clusters() {
        let yaml = render_bootstrap(&options(AGGREGATED_REGISTRY, Path::new("/x.wasm"))).unwrap();
        assert!(
            yaml.contains("http_header_name: \"x-custom-upstream\""),
            "{yaml}"
        );
        assert!(yaml.contains("- remove: \"x-custom-upstream\""), "{yaml}");
        assert!(
            yaml.contains("per_connection_buffer_limit_bytes: 2162688"),
            "{yaml}"
        );
        assert!(
            yaml.contains(r#"- name: "prefill: #1 'odd' \"name\"""#),
            "{yaml}"
        );
    }

    #[test]
    fn plugin_config_is_one_json_string_literal() {
        let yaml =
            render_bootstrap(&options(DISAGGREGATED_REGISTRY, Path::new("/x.wasm"))).unwrap();
        let line = yaml
            .lines()
            .find(|l| l.trim_start().starts_with("value: "))
            .unwrap();
        let literal = line.trim_start().trim_start_matches("value: ");
        let decoded: String = serde_json::from_str(literal).unwrap();
        assert_eq!(
            Config::from_json(decoded.as_bytes()).unwrap(),
            Config::from_json(DISAGGREGATED_REGISTRY.as_bytes()).unwrap()
        );
    }

    #[test]
    fn with_traces_the_filter_exports_its_spans_to_the_collector_cluster() {
        let export = |edge: &EdgeOptions| {
            let json = plugin_json(DISAGGREGATED_REGISTRY, Duration::ZERO, edge).unwrap();
            Config::from_json(json.as_bytes())
                .unwrap()
                .settings
                .trace_export_cluster
        };
        assert_eq!(export(&EdgeOptions::default()), "");
        let traced = EdgeOptions {
            otlp: Some("127.0.0.1:4317".parse().unwrap()),
            ..EdgeOptions::default()
        };
        assert_eq!(export(&traced), tracing::OTLP_CLUSTER);
    }

    #[test]
    fn the_filters_own_decode_call_gets_the_route_timeout_unless_configured() {
        let setting = |json: &str, route: Duration| {
            let rendered: serde_json::Value =
                serde_json::from_str(&plugin_json(json, route, &EdgeOptions::default()).unwrap())
                    .unwrap();
            rendered.get(DECODE_TIMEOUT_SETTING).cloned()
        };
        let registry = DISAGGREGATED_REGISTRY;
        assert_eq!(
            setting(registry, Duration::from_secs(600)),
            Some(600_000.into())
        );
        assert_eq!(setting(registry, Duration::ZERO), None, "no route timeout");
        let configured = r#"{"workers": [], "decode_timeout_ms": 1000}"#;
        assert_eq!(
            setting(configured, Duration::from_secs(600)),
            Some(1000.into())
        );
    }

    #[test]
    fn relative_wasm_path_is_made_absolute() {
        let yaml = render_bootstrap(&options(DISAGGREGATED_REGISTRY, Path::new("a.wasm"))).unwrap();
        let cwd = std::env::current_dir().unwrap();
        assert!(
            yaml.contains(&format!("{:?}", cwd.join("a.wasm").to_str().unwrap())),
            "{yaml}"
        );
    }

    #[test]
    fn bad_registries_are_refused() {
        for bad in [
            "",
            "{}",
            r#"{"workers": []}"#,
            r#"{"workers": [{"id": 1, "role": "prefill", "address": "127.0.0.1:1"}]}"#,
            r#"{"workers": [{"id": 1, "role": "decode", "address": "localhost:1"}]}"#,
            r#"{"workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1"}], "bogus": 1}"#,
            r#"{"workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1"}],
                "upstream_header": "X Bad"}"#,
        ] {
            let err = render_bootstrap(&options(bad, Path::new("/x.wasm"))).unwrap_err();
            assert!(
                err.to_string().contains("invalid plugin configuration"),
                "{bad}: {err:#}"
            );
        }
    }

    /// Only a syntax error is called invalid JSON; a bad address names its worker and value.
    #[test]
    fn a_refused_registry_says_what_is_wrong_where() {
        let decode = r#"{"id": 1, "role": "decode", "address": "127.0.0.1:1"}"#;
        for (registry, why) in [
            (
                r#"{"workers": [{"id": 7, "role": "decode", "address": "10.0.0.1"}]}"#.to_owned(),
                r#"worker 7: address "10.0.0.1" is not ip:port"#,
            ),
            (
                format!(r#"{{"workers": [{decode}], "prefill_timeout": 5}}"#),
                "unknown field `prefill_timeout`",
            ),
            (
                format!(r#"{{"workers": [{decode}], "prefill_retries": "2"}}"#),
                r#"invalid type: string "2", expected u32"#,
            ),
            (format!(r#"{{"workers": [{decode}]"#), "invalid JSON: EOF"),
        ] {
            let err = render_bootstrap(&options(&registry, Path::new("/x.wasm"))).unwrap_err();
            let message = err.to_string();
            assert!(message.contains(why), "{registry}: {message}");
            let syntax = why.starts_with("invalid JSON");
            assert_eq!(message.contains("invalid JSON"), syntax, "{message}");
        }
    }

    #[test]
    fn prefill_cluster_cannot_shadow_the_decode_cluster() {
        let config = r#"{"workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1"}],
                         "prefill_cluster": "pinroute_decode"}"#;
        let err = render_bootstrap(&options(config, Path::new("/x.wasm"))).unwrap_err();
        assert!(err.to_string().contains("prefill_cluster"), "{err:#}");
    }

    #[test]
    fn huge_max_body_is_refused() {
        let settings = |max_body_bytes| Settings {
            max_body_bytes,
            ..Settings::default()
        };
        assert_eq!(
            buffer_limit_bytes(&settings(8 << 20)).unwrap(),
            (8 << 20) + (1 << 20) + (64 << 10)
        );
        assert!(buffer_limit_bytes(&settings(u32::MAX as usize)).is_err());
        assert!(buffer_limit_bytes(&settings(usize::MAX)).is_err());
    }

    #[test]
    fn a_public_admin_and_a_remote_plain_registry_are_warned_of() {
        let quiet = options(DISAGGREGATED_REGISTRY, Path::new("/x.wasm"));
        assert!(exposure_warnings(&quiet).is_empty());
        let public_admin = BootstrapOptions {
            admin: "0.0.0.0:9901".parse().unwrap(),
            ..quiet.clone()
        };
        let warnings = exposure_warnings(&public_admin);
        assert!(
            warnings.len() == 1 && warnings[0].contains("0.0.0.0:9901"),
            "{warnings:?}"
        );
        let registry = |address: &str| BootstrapOptions {
            plugin_config: format!(
                r#"{{"registry": {{"cluster": "pinroute_registry", "address": "{address}"}}}}"#
            ),
            ..quiet.clone()
        };
        for local in ["127.0.0.1:8080", "localhost:80", "[::1]:8080"] {
            assert!(exposure_warnings(&registry(local)).is_empty(), "{local}");
        }
        let remote = exposure_warnings(&registry("registry.internal:8080"));
        assert!(
            remote.len() == 1 && remote[0].contains("plain HTTP"),
            "{remote:?}"
        );
        let picker = |address: &str| BootstrapOptions {
            plugin_config: with_picker(DISAGGREGATED_REGISTRY, "gie", address),
            ..quiet.clone()
        };
        assert!(exposure_warnings(&picker("127.0.0.1:9002")).is_empty());
        let remote = exposure_warnings(&picker("epp.llm.svc:9002"));
        assert!(
            remote.len() == 1 && remote[0].contains("epp.llm.svc:9002"),
            "{remote:?}"
        );
    }

    fn picker_bootstrap(protocol: &str, address: &str) -> String {
        let config = with_picker(DISAGGREGATED_REGISTRY, protocol, address);
        render_bootstrap(&options(&config, Path::new("/x.wasm"))).unwrap()
    }

    /// Where each filter of the listener's chain is, in the order of the chain.
    fn filter_positions(yaml: &str, filters: &[&str]) -> Vec<usize> {
        let position = |name: &&str| yaml.find(&format!("- name: {name}\n")).unwrap();
        filters.iter().map(position).collect()
    }

    #[test]
    fn picker_mode_asks_the_picker_between_cors_and_the_filter() {
        for protocol in PICKER_PROTOCOLS {
            let yaml = picker_bootstrap(protocol, "127.0.0.1:9002");
            let chain = [
                "envoy.filters.http.header_mutation",
                "envoy.filters.http.cors",
                "envoy.filters.http.ext_proc",
                "envoy.filters.http.header_to_metadata",
                "envoy.filters.http.wasm",
                "envoy.filters.http.router",
            ];
            let positions = filter_positions(&yaml, &chain);
            assert!(positions.is_sorted(), "{protocol}: {positions:?}\n{yaml}");
            for header in PICKER_HEADERS {
                let removal = format!("- remove: \"{header}\"");
                assert_eq!(yaml.matches(&removal).count(), 1, "{header}\n{yaml}");
                assert!(
                    yaml.find(&removal) < Some(positions[1]),
                    "{header} at the edge"
                );
            }
            assert!(
                !yaml.contains("instance-id\""),
                "Dynamo's pins stay: {yaml}"
            );
            for expected in [
                "cluster_name: \"pinroute_picker\"",
                "request_body_mode: FULL_DUPLEX_STREAMED",
                "failure_mode_allow: false",
                "message_timeout: 1000s",
                "untyped: [\"envoy.lb\"]",
                r#"{"address":"127.0.0.1","port_value":9002}"#,
                r#""type":"STATIC""#,
                r#""http2_protocol_options":{}"#,
            ] {
                assert!(yaml.contains(expected), "{expected}\n{yaml}");
            }
            for served in [SERVED_HEADER, PREFILL_SERVED_HEADER] {
                let rule = format!("- header: \"{served}\"");
                assert!(yaml.contains(&rule), "{served}\n{yaml}");
            }
        }
    }

    #[test]
    fn a_picker_by_name_is_resolved_by_dns() {
        let yaml = picker_bootstrap("gie", "epp.inference.svc:9002");
        assert!(yaml.contains(r#""type":"STRICT_DNS""#), "{yaml}");
        assert!(yaml.contains(r#""address":"epp.inference.svc""#), "{yaml}");
    }

    #[test]
    fn a_picker_needs_an_address() {
        let config = r#"{"workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1"}],
                         "picker": {"protocol": "gie"}}"#;
        let err = render_bootstrap(&options(config, Path::new("/x.wasm"))).unwrap_err();
        assert!(err.to_string().contains("picker.address"), "{err:#}");
        let bad = with_picker(DISAGGREGATED_REGISTRY, "gie", "epp");
        let err = render_bootstrap(&options(&bad, Path::new("/x.wasm"))).unwrap_err();
        assert!(err.to_string().contains("is not host:port"), "{err:#}");
    }

    /// Without `picker` the bootstrap is the template with the picker's marker lines gone.
    #[test]
    fn without_a_picker_nothing_of_picker_mode_is_rendered() {
        for registry in [DISAGGREGATED_REGISTRY, AGGREGATED_REGISTRY] {
            let yaml = render_bootstrap(&options(registry, Path::new("/x.wasm"))).unwrap();
            for absent in [
                "envoy.filters.http.ext_proc",
                "envoy.filters.http.header_to_metadata",
                "pinroute_picker",
                "- remove: \"x-gateway",
                "- remove: \"x-prefiller",
                "- remove: \"x-dynamo",
                "Picker mode",
            ] {
                assert!(!yaml.contains(absent), "{absent}\n{yaml}");
            }
            let blank_but_indented = |line: &&str| !line.is_empty() && line.trim().is_empty();
            assert_eq!(yaml.lines().find(blank_but_indented), None, "{yaml}");
        }
    }

    #[test]
    fn durations_use_envoy_syntax() {
        assert_eq!(envoy_duration(Duration::from_secs(300)), "300s");
        assert_eq!(envoy_duration(Duration::ZERO), "0s");
        assert_eq!(envoy_duration(Duration::from_millis(1500)), "1.500000000s");
    }
}

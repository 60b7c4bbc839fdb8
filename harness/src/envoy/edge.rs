//! The gateway's edges: what the listener asks of clients before the filter sees a request
//! (how long the request may take to arrive, which browser origins may call the gateway:
//! `docs/deploy.md` §2.4, §2.6; TLS and API keys: §2.8), what a `GET /metrics` gets
//! (`docs/metrics.md`), and how the worker clusters reach the workers (§2.8).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use anyhow::{Result, ensure};
use pinroute::policy::config::Settings;
use pinroute::policy::headers::{DECODE_WORKER_HEADER, ERROR_CODE_HEADER, PREFILL_WORKER_HEADER};
use serde_json::json;

use super::tls::{Callers, ListenerTls, WorkerTls};

/// Time for the request headers to arrive.
pub const DEFAULT_REQUEST_HEADERS_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for the whole request to arrive, on top of the prefill hop's budget.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The origin that allows every origin (as vLLM's own server does by default).
pub const ANY_ORIGIN: &str = "*";

/// The methods a browser may use: completions are POST, the rest GET.
pub const CORS_ALLOW_METHODS: &str = "POST, GET, OPTIONS";
/// The request headers a browser may send besides the pin headers (all of them, with their
/// aliases: `docs/semantics.md` §2): the OpenAI client's and the request id.
pub const CORS_ALLOW_HEADERS: &[&str] = &["authorization", "content-type", "x-request-id"];

/// Every request header a browser may send.
pub fn cors_allow_headers() -> Vec<&'static str> {
    let pins = pinroute::policy::pins::pin_header_names();
    CORS_ALLOW_HEADERS.iter().copied().chain(pins).collect()
}
/// The response headers a page may read: the workers that served, the error code, and when
/// to retry.
pub const CORS_EXPOSE_HEADERS: &[&str] = &[
    PREFILL_WORKER_HEADER,
    DECODE_WORKER_HEADER,
    ERROR_CODE_HEADER,
    "retry-after",
];
/// How long a browser may cache a preflight's answer.
pub const CORS_MAX_AGE: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeOptions {
    /// Time for the request headers to arrive; zero disables it.
    pub request_headers_timeout: Duration,
    /// Time for the whole request to arrive; zero disables it. The prefill hop's budget is
    /// added when rendered ([`request_timeout`]).
    pub request_timeout: Duration,
    /// Browser origins allowed by CORS, exactly (`*`: any); none turns CORS off.
    pub cors_origins: Vec<String>,
    /// `GET /metrics` answers Envoy's Prometheus stats (pinroute's included) instead of 404.
    pub serve_metrics: bool,
    /// TLS to clients; none: clear text.
    pub tls: Option<ListenerTls>,
    /// Who may call (API keys or tokens); none: anyone who reaches the listener.
    pub callers: Option<Callers>,
    /// TLS (or mutual TLS) from the worker clusters, both hops, to the workers.
    pub worker_tls: Option<WorkerTls>,
    /// One JSON line a request on Envoy's stdout (`docs/metrics.md`, "The access log").
    pub access_log: bool,
    /// Traces exported to this OTLP/gRPC collector (`docs/metrics.md`, "Traces"); none: off.
    pub otlp: Option<SocketAddr>,
}

impl Default for EdgeOptions {
    fn default() -> Self {
        EdgeOptions {
            request_headers_timeout: DEFAULT_REQUEST_HEADERS_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            cors_origins: vec![ANY_ORIGIN.to_owned()],
            serve_metrics: false,
            tls: None,
            callers: None,
            worker_tls: None,
            access_log: true,
            otlp: None,
        }
    }
}

/// Envoy's `request_timeout`, which runs until the filter lets the request go on: the time
/// to send it, plus every prefill attempt the filter may make meanwhile. Zero stays zero.
pub fn request_timeout(edge: &EdgeOptions, settings: &Settings) -> Duration {
    if edge.request_timeout.is_zero() {
        return Duration::ZERO;
    }
    let attempts = settings.prefill_retries.saturating_add(1);
    edge.request_timeout
        .saturating_add(settings.prefill_timeout().saturating_mul(attempts))
}

/// Refuses an origin no browser sends: a browser's `Origin` is `scheme://host[:port]`, with
/// no path, so `https://app.example.com/` would never match.
pub fn check_origins(edge: &EdgeOptions) -> Result<()> {
    for origin in &edge.cors_origins {
        let host = origin
            .strip_prefix("https://")
            .or_else(|| origin.strip_prefix("http://"));
        let is_origin = host.is_some_and(|h| !h.is_empty() && !h.contains(['/', '?', '#', ' ']));
        ensure!(
            origin == ANY_ORIGIN || is_origin,
            "CORS origin {origin:?} is not `*` nor scheme://host[:port] (a browser's Origin has no path)"
        );
    }
    Ok(())
}

/// The virtual host's `typed_per_filter_config` for the CORS filter, in JSON (valid YAML
/// flow style), or nothing when no origin is allowed. A preflight from another origin is
/// answered without CORS headers rather than passed on to the filter.
pub fn cors_policy(edge: &EdgeOptions) -> String {
    if edge.cors_origins.is_empty() {
        return String::new();
    }
    let origins: Vec<_> = edge
        .cors_origins
        .iter()
        .map(|origin| json!({ "exact": origin }))
        .collect();
    let policy = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy",
        "allow_origin_string_match": origins,
        "allow_methods": CORS_ALLOW_METHODS,
        "allow_headers": cors_allow_headers().join(", "),
        "expose_headers": CORS_EXPOSE_HEADERS.join(", "),
        "max_age": CORS_MAX_AGE.as_secs().to_string(),
        "forward_not_matching_preflights": false,
    });
    format!(
        "typed_per_filter_config: {}",
        json!({ "envoy.filters.http.cors": policy })
    )
}

/// The path benchmark clients (aiperf, `vllm bench serve`) probe for the server's metrics.
pub const METRICS_PATH: &str = "/metrics";
/// The cluster of Envoy's own admin interface, for `GET /metrics` with `serve_metrics`.
pub const ADMIN_CLUSTER: &str = "pinroute_admin";
const METRICS_NOT_SERVED: &str = "GET /metrics is not served through the gateway: its metrics \
    (Envoy's and pinroute's) are on Envoy's admin interface, /stats/prometheus";

/// The first route, as one item of the `routes` list (JSON flow style): `GET /metrics`
/// answered by Envoy without the filter, so a client's probe counts as no pinroute error.
/// Envoy's Prometheus stats with `serve_metrics` (the admin's `/stats/prometheus`, nothing
/// else of it), else a 404 `unknown_path` saying where the metrics are.
pub fn metrics_route(edge: &EdgeOptions) -> String {
    let mut route = json!({
        "match": {"path": METRICS_PATH, "headers": [{"name": ":method", "string_match": {"exact": "GET"}}]},
        "typed_per_filter_config": {"envoy.filters.http.wasm": {
            "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "disabled": true,
        }},
    });
    let action = if edge.serve_metrics {
        json!({"route": {"cluster": ADMIN_CLUSTER, "prefix_rewrite": "/stats/prometheus"}})
    } else {
        let error = json!({"error": {"message": METRICS_NOT_SERVED,
                                     "type": "invalid_request_error", "code": "unknown_path"}});
        json!({
            "direct_response": {"status": 404, "body": {"inline_string": error.to_string()}},
            "response_headers_to_add": [{"header": {"key": ERROR_CODE_HEADER, "value": "unknown_path"}}],
        })
    };
    if let (Some(route), Some(action)) = (route.as_object_mut(), action.as_object()) {
        route.extend(action.clone());
    }
    format!("- {route}")
}

/// Envoy's admin interface as a cluster (one more item of `clusters`), with `serve_metrics`.
pub fn admin_cluster(edge: &EdgeOptions, admin: SocketAddr) -> Result<String> {
    if !edge.serve_metrics {
        return Ok(String::new());
    }
    ensure!(
        admin.port() != 0,
        "serving /metrics needs the admin interface on a port of its own (--admin IP:PORT), not 0"
    );
    let ip = match admin.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let address =
        json!({"socket_address": {"address": ip.to_string(), "port_value": admin.port()}});
    let cluster = json!({
        "name": ADMIN_CLUSTER, "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": ADMIN_CLUSTER,
                            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}]},
    });
    Ok(format!("  - {cluster}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn settings(json: &str) -> Settings {
        let registry = r#""workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1"}]"#;
        let config = format!("{{{registry}{json}}}");
        pinroute::policy::config::Config::from_json(config.as_bytes())
            .unwrap()
            .settings
    }

    #[test]
    fn the_request_timeout_leaves_room_for_every_prefill_attempt() {
        let edge = EdgeOptions::default();
        assert_eq!(
            request_timeout(&edge, &settings("")),
            Duration::from_secs(60 + 30 * 2)
        );
        let short = settings(r#", "prefill_timeout_ms": 500, "prefill_retries": 0"#);
        assert_eq!(
            request_timeout(&edge, &short),
            Duration::from_millis(60_500)
        );
        let off = EdgeOptions {
            request_timeout: Duration::ZERO,
            ..EdgeOptions::default()
        };
        assert_eq!(request_timeout(&off, &short), Duration::ZERO);
    }

    fn policy(edge: &EdgeOptions) -> Value {
        let rendered = cors_policy(edge);
        let json = rendered.strip_prefix("typed_per_filter_config: ").unwrap();
        serde_json::from_str::<Value>(json).unwrap()["envoy.filters.http.cors"].clone()
    }

    #[test]
    fn cors_allows_the_listed_origins_exactly_or_is_off() {
        let default = policy(&EdgeOptions::default());
        assert_eq!(
            default["allow_origin_string_match"],
            json!([{"exact": "*"}])
        );
        assert_eq!(default["forward_not_matching_preflights"], false);
        let listed = EdgeOptions {
            cors_origins: vec!["https://a.example".into(), "http://localhost:3000".into()],
            ..EdgeOptions::default()
        };
        assert_eq!(
            policy(&listed)["allow_origin_string_match"],
            json!([{"exact": "https://a.example"}, {"exact": "http://localhost:3000"}])
        );
        let off = EdgeOptions {
            cors_origins: Vec::new(),
            ..EdgeOptions::default()
        };
        assert_eq!(cors_policy(&off), "");
    }

    /// Every spelling of a pin header the filter reads may be sent by a page, and every
    /// `x-` header allowed besides the request id is one the filter reads.
    #[test]
    fn cors_allows_every_pin_header() {
        let allowed = cors_allow_headers();
        for name in [
            "x-dynamo-worker-instance-id",
            "x-data-parallel-rank",
            "x-dynamo-session-id",
        ] {
            assert!(allowed.contains(&name), "{name}");
        }
        assert_eq!(allowed.len(), CORS_ALLOW_HEADERS.len() + 10);
    }

    #[test]
    fn an_origin_no_browser_sends_is_refused() {
        for good in ["*", "https://a.example", "http://localhost:3000"] {
            let edge = EdgeOptions {
                cors_origins: vec![good.into()],
                ..EdgeOptions::default()
            };
            check_origins(&edge).unwrap();
        }
        for bad in [
            "https://a.example/",
            "a.example",
            "https://",
            "*.example",
            "https://a b",
        ] {
            let edge = EdgeOptions {
                cors_origins: vec![bad.into()],
                ..EdgeOptions::default()
            };
            assert!(check_origins(&edge).is_err(), "{bad}");
        }
    }
}

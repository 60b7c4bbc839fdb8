//! `envoy-config`: prints the Envoy bootstrap for a worker registry.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use pinroute_harness::envoy::native::{SEARCH_PATH_ENV, default_module_path, with_native_module};
use pinroute_harness::envoy::{
    ANY_ORIGIN, ApiKeys, BootstrapOptions, Callers, DEFAULT_IDENTITY_HEADER,
    DEFAULT_REQUEST_HEADERS_TIMEOUT, DEFAULT_REQUEST_TIMEOUT, DEFAULT_ROUTE_TIMEOUT, EdgeOptions,
    Jwt, ListenerTls, WorkerTls, default_wasm_path, exposure_warnings, render_bootstrap,
};

#[derive(clap::Args)]
pub struct Args {
    /// The plugin configuration: `{"workers": [...]}` plus optional filter settings.
    #[arg(long, value_name = "FILE")]
    workers: PathBuf,
    /// Address of the gateway listener.
    #[arg(long, value_name = "IP:PORT")]
    listen: SocketAddr,
    /// Address of Envoy's admin API.
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:9901")]
    admin: SocketAddr,
    /// The pinroute filter [default: <repo>/target/wasm32-wasip1/release/pinroute.wasm].
    #[arg(long, value_name = "PATH")]
    wasm: Option<PathBuf>,
    /// Run the filter as the native Envoy dynamic module (`libpinroute.so`, built with
    /// `cargo build -p pinroute --profile dynamic-module --features dynamic-module`) in place
    /// of the wasm filter: Envoy must be started with ENVOY_DYNAMIC_MODULES_SEARCH_PATH set
    /// to its folder (`docs/deploy.md` §3.1).
    #[arg(long, conflicts_with = "wasm")]
    native: bool,
    /// Route (whole request) timeout in seconds; 0 disables it.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_ROUTE_TIMEOUT.as_secs())]
    route_timeout: u64,
    /// Seconds a client has to send its request headers; 0 disables it.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_REQUEST_HEADERS_TIMEOUT.as_secs())]
    request_headers_timeout: u64,
    /// Seconds a client has to send its whole request (408 after that; the prefill hop's
    /// budget is added, a streamed response is never cut); 0 disables it.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_REQUEST_TIMEOUT.as_secs())]
    request_timeout: u64,
    /// A browser origin allowed by CORS (`https://app.example.com`), repeatable; `*` allows
    /// any.
    #[arg(long = "cors-origin", value_name = "ORIGIN", default_value = ANY_ORIGIN)]
    cors_origins: Vec<String>,
    /// No CORS: browsers' preflights get the filter's 405, pages cannot read answers.
    #[arg(long, conflicts_with = "cors_origins")]
    no_cors: bool,
    /// No access log: by default Envoy writes one JSON line a request to its stdout, with the
    /// workers, ranks and choices of both hops (`docs/metrics.md`, "The access log").
    #[arg(long)]
    no_access_log: bool,
    /// Trace every request with Envoy's OpenTelemetry tracer, exporting over OTLP/gRPC to this
    /// collector: a span for the request and one for each decode attempt, the filter's fields
    /// as tags, the prefill hop's `traceparent` naming the request's span (`docs/metrics.md`,
    /// "Traces").
    #[arg(long, value_name = "IP:PORT")]
    otlp: Option<std::net::SocketAddr>,
    /// Answer `GET /metrics` on the listener with Envoy's Prometheus stats (pinroute's
    /// included) instead of a 404, for benchmark clients that read the server's metrics.
    #[arg(long)]
    metrics: bool,
    #[command(flatten)]
    picker: PickerArgs,
    #[command(flatten)]
    tls: TlsArgs,
}

/// TLS on both sides and API keys (docs/deploy.md §2.8).
#[derive(clap::Args, Debug, Default, Clone, PartialEq, Eq)]
pub struct TlsArgs {
    /// Terminate TLS on the listener with this certificate chain (PEM); HTTP/2 over ALPN.
    /// Replacing the file by a move reloads it.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The listener certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require clients to present a certificate signed by this CA (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Speak TLS to the workers on both hops, accepting certificates signed by this CA (PEM).
    #[arg(long, value_name = "FILE")]
    worker_ca: Option<PathBuf>,
    /// The gateway's certificate (PEM) for workers that verify their callers (mutual TLS).
    #[arg(long, value_name = "FILE", requires_all = ["worker_key", "worker_ca"])]
    worker_cert: Option<PathBuf>,
    /// The private key of --worker-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "worker_cert")]
    worker_key: Option<PathBuf>,
    /// A DNS name a worker's certificate must carry (repeatable: any one suffices)
    /// [default: any certificate the CA signed].
    #[arg(long = "worker-name", value_name = "NAME", requires = "worker_ca")]
    worker_names: Vec<String>,
    /// Only callers with a key listed in this file get in (a JSON list of
    /// `{"client": NAME, "key": KEY}`); others get 401. Keys are read from
    /// `Authorization: Bearer KEY` or `x-api-key: KEY` and never reach a worker.
    #[arg(long, value_name = "FILE", conflicts_with = "jwt_issuer")]
    api_keys: Option<PathBuf>,
    /// Only callers with a token this issuer signed get in (`Authorization: Bearer TOKEN`,
    /// checked by Envoy's jwt_authn: signature, `iss`, `exp`, `nbf`); others get 401.
    #[arg(long, value_name = "ISS", requires = "jwt_jwks")]
    jwt_issuer: Option<String>,
    /// The issuer's public keys (a JWKS file).
    #[arg(long, value_name = "FILE", requires = "jwt_issuer")]
    jwt_jwks: Option<PathBuf>,
    /// An `aud` a token must carry (repeatable: any one) [default: any].
    #[arg(long = "jwt-audience", value_name = "AUD", requires = "jwt_issuer")]
    jwt_audiences: Vec<String>,
    /// The token claim that names the caller.
    #[arg(
        long,
        value_name = "CLAIM",
        default_value = "sub",
        requires = "jwt_issuer"
    )]
    jwt_identity_claim: String,
    /// The request header that tells the workers which client called.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_IDENTITY_HEADER)]
    identity_header: String,
}

impl TlsArgs {
    /// Fills the edge's TLS and API keys from these flags.
    pub fn apply(&self, edge: &mut EdgeOptions) -> Result<()> {
        edge.tls = self
            .tls_cert
            .clone()
            .zip(self.tls_key.clone())
            .map(|(cert, key)| ListenerTls {
                cert,
                key,
                client_ca: self.tls_client_ca.clone(),
            });
        edge.worker_tls = self.worker_ca.clone().map(|ca| WorkerTls {
            ca,
            client_cert: self.worker_cert.clone().zip(self.worker_key.clone()),
            names: self.worker_names.clone(),
        });
        edge.callers = match (&self.api_keys, &self.jwt_issuer, &self.jwt_jwks) {
            (Some(file), _, _) => Some(Callers::ApiKeys(ApiKeys::from_file(
                file,
                &self.identity_header,
            )?)),
            (None, Some(issuer), Some(jwks)) => {
                let jwt = Jwt {
                    issuer: issuer.clone(),
                    jwks: jwks.clone(),
                    audiences: self.jwt_audiences.clone(),
                    identity_claim: self.jwt_identity_claim.clone(),
                    identity_header: self.identity_header.to_ascii_lowercase(),
                };
                jwt.check()?;
                Some(Callers::Jwt(jwt))
            }
            _ => None,
        };
        Ok(())
    }
}

/// Picker mode's flags, merged into the plugin configuration's `picker`.
#[derive(clap::Args, Debug, Default, Clone, PartialEq, Eq)]
struct PickerArgs {
    /// Picker mode: an endpoint picker (GIE EPP, llm-d, Dynamo), called by Envoy's ext_proc
    /// before the filter, chooses the workers, and the filter obeys it inside the allowlist
    /// (docs/semantics.md §9). Sets `picker.protocol`.
    #[arg(long = "picker", value_name = "PROTOCOL", value_parser = ["gie", "llm-d", "dynamo"])]
    protocol: Option<String>,
    /// The picker's gRPC ext_proc service (`picker.address`), which the bootstrap's
    /// `pinroute_picker` cluster dials: an IP address, or a name resolved by DNS.
    #[arg(long = "picker-address", value_name = "HOST:PORT")]
    address: Option<String>,
    /// Where the filter obeys the picker's endpoints: `registry` (the registry's workers of
    /// the hop's role) or a CIDR range (`10.0.0.0/8`); repeatable, replaces `picker.allow`
    /// [default: the configuration's `picker.allow`, else `registry`].
    #[arg(long = "picker-allow", value_name = "ENTRY")]
    allow: Vec<String>,
}

impl PickerArgs {
    fn is_empty(&self) -> bool {
        self.protocol.is_none() && self.address.is_none() && self.allow.is_empty()
    }

    /// The plugin configuration with these flags merged into its `picker`.
    fn merged_into(&self, plugin_config: String) -> Result<String> {
        if self.is_empty() {
            return Ok(plugin_config);
        }
        let mut config: serde_json::Value =
            serde_json::from_str(&plugin_config).context("the plugin configuration is not JSON")?;
        let Some(settings) = config.as_object_mut() else {
            bail!("the plugin configuration is not a JSON object");
        };
        let picker = settings
            .entry("picker")
            .or_insert_with(|| serde_json::json!({}));
        let Some(picker) = picker.as_object_mut() else {
            bail!("the plugin configuration's `picker` is not a JSON object");
        };
        if let Some(protocol) = &self.protocol {
            picker.insert("protocol".into(), protocol.as_str().into());
        }
        if let Some(address) = &self.address {
            picker.insert("address".into(), address.as_str().into());
        }
        if !self.allow.is_empty() {
            picker.insert("allow".into(), self.allow.clone().into());
        }
        picker
            .entry("allow")
            .or_insert_with(|| serde_json::json!(["registry"]));
        ensure!(
            picker.contains_key("protocol"),
            "--picker-address and --picker-allow need --picker PROTOCOL (or a `picker` in the \
             configuration)"
        );
        Ok(config.to_string())
    }
}

impl Args {
    fn edge(&self) -> Result<EdgeOptions> {
        let mut edge = EdgeOptions {
            request_headers_timeout: Duration::from_secs(self.request_headers_timeout),
            request_timeout: Duration::from_secs(self.request_timeout),
            cors_origins: if self.no_cors {
                Vec::new()
            } else {
                self.cors_origins.clone()
            },
            serve_metrics: self.metrics,
            access_log: !self.no_access_log,
            otlp: self.otlp,
            ..EdgeOptions::default()
        };
        self.tls.apply(&mut edge)?;
        Ok(edge)
    }
}

pub fn run(args: &Args) -> Result<()> {
    let plugin_config = std::fs::read_to_string(&args.workers)
        .with_context(|| format!("reading {}", args.workers.display()))?;
    let plugin_config = args.picker.merged_into(plugin_config)?;
    let wasm = args.wasm.clone().unwrap_or_else(default_wasm_path);
    if !args.native && !wasm.is_file() {
        log::warn!(
            "{} does not exist (yet): Envoy will refuse to start without it",
            wasm.display()
        );
    }
    let options = BootstrapOptions {
        listen: args.listen,
        admin: args.admin,
        wasm,
        plugin_config,
        route_timeout: Duration::from_secs(args.route_timeout),
        edge: args.edge()?,
    };
    let mut bootstrap = render_bootstrap(&options)
        .with_context(|| format!("rendering the bootstrap for {}", args.workers.display()))?;
    if args.native {
        bootstrap = with_native_module(&bootstrap)?;
        log::info!(
            "start Envoy with {SEARCH_PATH_ENV} naming the folder of libpinroute.so (built: {})",
            default_module_path().display()
        );
    }
    for warning in exposure_warnings(&options) {
        log::warn!("{warning}");
    }
    std::io::stdout()
        .write_all(bootstrap.as_bytes())
        .context("writing the bootstrap")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const WORKERS: &str = r#"{"workers": [{"id": 1, "role": "decode", "address": "127.0.0.1:1"}]}"#;

    fn picker_of(flags: &PickerArgs, config: &str) -> Value {
        let merged: Value =
            serde_json::from_str(&flags.merged_into(config.into()).unwrap()).unwrap();
        merged.get("picker").cloned().unwrap_or_default()
    }

    #[test]
    fn no_picker_flag_leaves_the_configuration_as_written() {
        let config = "{\"workers\": []}\n".to_owned();
        assert_eq!(
            PickerArgs::default().merged_into(config.clone()).unwrap(),
            config
        );
    }

    #[test]
    fn the_picker_flags_make_the_configurations_picker() {
        let flags = PickerArgs {
            protocol: Some("dynamo".into()),
            address: Some("epp:9002".into()),
            allow: Vec::new(),
        };
        assert_eq!(
            picker_of(&flags, WORKERS),
            json!({"protocol": "dynamo", "address": "epp:9002", "allow": ["registry"]})
        );
        let flags = PickerArgs {
            allow: vec!["10.0.0.0/8".into(), "registry".into()],
            ..flags
        };
        assert_eq!(
            picker_of(&flags, WORKERS)["allow"],
            json!(["10.0.0.0/8", "registry"])
        );
    }

    #[test]
    fn a_flag_overrides_the_configurations_picker_only_where_given() {
        let config = r#"{"workers": [], "picker": {"protocol": "gie", "allow": ["10.0.0.0/8"]}}"#;
        let flags = PickerArgs {
            address: Some("127.0.0.1:9002".into()),
            ..PickerArgs::default()
        };
        assert_eq!(
            picker_of(&flags, config),
            json!({"protocol": "gie", "address": "127.0.0.1:9002", "allow": ["10.0.0.0/8"]})
        );
    }

    #[test]
    fn an_address_without_a_protocol_is_refused() {
        let flags = PickerArgs {
            address: Some("127.0.0.1:9002".into()),
            ..PickerArgs::default()
        };
        let err = flags.merged_into(WORKERS.into()).unwrap_err();
        assert!(err.to_string().contains("need --picker"), "{err:#}");
    }
}

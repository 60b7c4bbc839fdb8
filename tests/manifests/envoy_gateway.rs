//! The Envoy Gateway manifest (`envoy/envoy-gateway/pinroute.yaml`): Gateway, EnvoyProxy,
//! BackendTLSPolicy, HTTPRoute, EnvoyExtensionPolicy, ClientTrafficPolicy, EnvoyPatchPolicy.
//!
//! The types below are the fields of Gateway API and Envoy Gateway resources the manifest
//! uses (Envoy Gateway's Go API types, `api/v1alpha1`); unknown fields are refused.

use std::path::Path;

use pinroute_harness::certs::{LocalCa, Usage};
use pinroute_harness::envoy::test_support::{envoy, stub_wasm};
use pinroute_harness::envoy::{DECODE_CLUSTER, buffer_limit_bytes, validate};
use serde::Deserialize;
use serde_json::{Value, json};

use super::picker::ENVOY_GATEWAY_PICKER;
use super::{
    CORS_POLICY_TYPE, DECODE_POOL_CLUSTER, HCM_NAME, HCM_TYPE, InferencePoolSpec, Resource,
    TLS_SOCKET, UPSTREAM_TLS_TYPE, WASM_FILTER_TYPE, bootstrap_document, check_clusters,
    check_cors, check_edge_hcm, cors_filter, documents, edge_removals, envoy_accepts, find,
    local_code, picker_member, plugin_config, pool_header_matcher, pool_retry_policy,
    rendered_clusters, router, seconds, typed, with_member, without_tls, yaml,
};

pub const ENVOY_GATEWAY: &str = include_str!("../../envoy/envoy-gateway/pinroute.yaml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GatewaySpec {
    pub gateway_class_name: String,
    pub infrastructure: Option<GatewayInfrastructure>,
    pub listeners: Vec<Listener>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GatewayInfrastructure {
    pub parameters_ref: TargetRef,
}

/// The EnvoyProxy's fields pinroute sets.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvoyProxySpec {
    #[serde(rename = "backendTLS")]
    pub backend_tls: BackendTlsConfig,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendTlsConfig {
    pub client_certificate_ref: SecretObjectReference,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretObjectReference {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub name: String,
    pub namespace: Option<String>,
}

/// Gateway API's `BackendTLSPolicy` (`gateway.networking.k8s.io/v1`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendTlsPolicySpec {
    pub target_refs: Vec<TargetRef>,
    pub validation: BackendTlsValidation,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendTlsValidation {
    pub ca_certificate_refs: Vec<TargetRef>,
    pub hostname: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listener {
    pub name: String,
    pub protocol: String,
    pub port: u16,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRouteSpec {
    pub parent_refs: Vec<NameRef>,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameRef {
    pub name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Rule {
    pub matches: Vec<RouteMatch>,
    pub backend_refs: Vec<BackendRef>,
    pub timeouts: Timeouts,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteMatch {
    pub path: PathMatch,
    #[serde(default)]
    pub headers: Vec<HeaderMatch>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatch {
    #[serde(rename = "type")]
    pub kind: HeaderMatchType,
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum HeaderMatchType {
    Exact,
    RegularExpression,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathMatch {
    #[serde(rename = "type")]
    pub kind: String,
    pub value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendRef {
    pub name: String,
    pub port: u16,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    pub request: String,
}

/// A local reference by group, kind and name: a policy's target, a CA reference, a
/// Gateway's `parametersRef`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetRef {
    pub group: String,
    pub kind: String,
    pub name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtensionPolicySpec {
    pub target_refs: Vec<TargetRef>,
    #[serde(default)]
    pub wasm: Vec<Wasm>,
    #[serde(default)]
    pub ext_proc: Vec<ExtProc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtProc {
    pub backend_refs: Vec<PolicyBackendRef>,
    pub processing_mode: ExtProcProcessingMode,
    pub fail_open: bool,
    pub metadata: ExtProcMetadata,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyBackendRef {
    pub group: String,
    pub kind: String,
    pub name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtProcProcessingMode {
    pub request: ProcessingModeOptions,
    pub response: ProcessingModeOptions,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessingModeOptions {
    pub body: ExtProcBodyMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum ExtProcBodyMode {
    Streamed,
    Buffered,
    BufferedPartial,
    FullDuplexStreamed,
}

impl ExtProcBodyMode {
    fn envoy(self) -> &'static str {
        match self {
            ExtProcBodyMode::Streamed => "STREAMED",
            ExtProcBodyMode::Buffered => "BUFFERED",
            ExtProcBodyMode::BufferedPartial => "BUFFERED_PARTIAL",
            ExtProcBodyMode::FullDuplexStreamed => "FULL_DUPLEX_STREAMED",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtProcMetadata {
    pub accessible_namespaces: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSpec {
    pub endpoints: Vec<BackendEndpoint>,
    pub tls: Option<BackendTls>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendEndpoint {
    pub fqdn: FqdnEndpoint,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FqdnEndpoint {
    pub hostname: String,
    pub port: u16,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendTls {
    pub insecure_skip_verify: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Wasm {
    pub name: String,
    #[serde(rename = "rootID")]
    pub root_id: String,
    pub code: WasmCodeSource,
    pub config: Value,
    pub fail_open: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WasmCodeSource {
    #[serde(rename = "type")]
    pub kind: WasmCodeSourceType,
    pub http: Option<HttpWasmCodeSource>,
    pub image: Option<ImageWasmCodeSource>,
    pub pull_policy: Option<PullPolicy>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum WasmCodeSourceType {
    #[serde(rename = "HTTP")]
    Http,
    Image,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpWasmCodeSource {
    pub url: String,
    pub sha256: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ImageWasmCodeSource {
    pub url: String,
    pub sha256: Option<String>,
    pub pull_secret_ref: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub enum PullPolicy {
    IfNotPresent,
    Always,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientTrafficPolicySpec {
    pub target_refs: Vec<TargetRef>,
    pub headers: HeaderSettings,
    pub connection: ClientConnection,
    pub timeout: ClientTimeout,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HeaderSettings {
    pub early_request_headers: HeaderFilter,
    pub with_underscores_action: WithUnderscoresAction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum WithUnderscoresAction {
    Allow,
    RejectRequest,
    DropHeader,
}

impl WithUnderscoresAction {
    /// Envoy's `headers_with_underscores_action`.
    fn envoy(self) -> &'static str {
        match self {
            WithUnderscoresAction::Allow => "ALLOW",
            WithUnderscoresAction::RejectRequest => "REJECT_REQUEST",
            WithUnderscoresAction::DropHeader => "DROP_HEADER",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderFilter {
    pub remove: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientConnection {
    pub buffer_limit: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTimeout {
    pub http: HttpClientTimeout,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpClientTimeout {
    pub stream_idle_timeout: String,
    pub request_received_timeout: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecurityPolicySpec {
    pub target_refs: Vec<TargetRef>,
    pub cors: Cors,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Cors {
    pub allow_origins: Vec<String>,
    pub allow_methods: Vec<String>,
    pub allow_headers: Vec<String>,
    pub expose_headers: Vec<String>,
    pub max_age: String,
}

impl Cors {
    /// A route's Envoy `CorsPolicy`, as Envoy Gateway translates it (`buildCORS`, then the
    /// `cors` route patch): origins with `*` become regular expressions.
    fn envoy(&self) -> Value {
        let origins: Vec<Value> = self
            .allow_origins
            .iter()
            .map(|origin| {
                if origin.contains('*') {
                    let regex = origin
                        .split('*')
                        .map(regex_quoted)
                        .collect::<Vec<_>>()
                        .join(".*");
                    json!({"safe_regex": {"regex": regex}})
                } else {
                    json!({"exact": origin})
                }
            })
            .collect();
        json!({
            "@type": CORS_POLICY_TYPE,
            "allow_origin_string_match": origins,
            "allow_methods": self.allow_methods.join(", "),
            "allow_headers": self.allow_headers.join(", "),
            "expose_headers": self.expose_headers.join(", "),
            "max_age": seconds(&self.max_age).to_string(),
            "allow_credentials": false,
            "forward_not_matching_preflights": false,
        })
    }
}

/// Go's `regexp.QuoteMeta`.
fn regex_quoted(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let special = r"\.+*?()|[]{}^$".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PatchPolicySpec {
    pub target_ref: TargetRef,
    #[serde(rename = "type")]
    pub kind: PatchType,
    pub json_patches: Vec<JsonPatch>,
}

#[derive(Debug, Deserialize)]
pub enum PatchType {
    #[serde(rename = "JSONPatch")]
    JsonPatch,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonPatch {
    #[serde(rename = "type")]
    pub kind: ResourceType,
    pub name: String,
    pub operation: JsonPatchOperation,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum ResourceType {
    #[serde(rename = "type.googleapis.com/envoy.config.listener.v3.Listener")]
    Listener,
    #[serde(rename = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration")]
    RouteConfiguration,
    #[serde(rename = "type.googleapis.com/envoy.config.cluster.v3.Cluster")]
    Cluster,
    #[serde(rename = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment")]
    ClusterLoadAssignment,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JsonPatchOperation {
    pub op: JsonPatchOp,
    pub path: Option<String>,
    pub json_path: Option<String>,
    pub from: Option<String>,
    pub value: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JsonPatchOp {
    Add,
    Remove,
    Replace,
    Move,
    Copy,
    Test,
}

/// A Kubernetes quantity as Envoy Gateway reads `bufferLimit`: `9Mi`, `512Ki`, `1048576`.
fn quantity_bytes(text: &str) -> u64 {
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let factor = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => panic!("quantity unit {other:?} not handled by this test"),
    };
    digits.parse::<u64>().unwrap() * factor
}

pub struct EnvoyGatewayManifest {
    pub gateway: Resource<GatewaySpec>,
    proxy: Resource<EnvoyProxySpec>,
    backend_tls: Resource<BackendTlsPolicySpec>,
    route: Resource<HttpRouteSpec>,
    pub extension: Resource<ExtensionPolicySpec>,
    traffic: Resource<ClientTrafficPolicySpec>,
    security: Resource<SecurityPolicySpec>,
    patch: Resource<PatchPolicySpec>,
    /// `picker.yaml` applied as well, with its `picker` member in the plugin configuration.
    pub picker: Option<EnvoyGatewayPicker>,
}

/// The documents of `envoy/envoy-gateway/picker.yaml`.
pub struct EnvoyGatewayPicker {
    pub pool: Resource<InferencePoolSpec>,
    pub backend: Resource<BackendSpec>,
    pub extension: Resource<ExtensionPolicySpec>,
    pub patch: Resource<PatchPolicySpec>,
    /// The member the overlay's header asks to add to the plugin configuration.
    pub settings: Value,
}

pub fn envoy_gateway_manifest(text: &str) -> EnvoyGatewayManifest {
    let docs = documents(text);
    assert_eq!(docs.len(), 8);
    EnvoyGatewayManifest {
        gateway: typed(find(&docs, "Gateway")),
        proxy: typed(find(&docs, "EnvoyProxy")),
        backend_tls: typed(find(&docs, "BackendTLSPolicy")),
        route: typed(find(&docs, "HTTPRoute")),
        extension: typed(find(&docs, "EnvoyExtensionPolicy")),
        traffic: typed(find(&docs, "ClientTrafficPolicy")),
        security: typed(find(&docs, "SecurityPolicy")),
        patch: typed(find(&docs, "EnvoyPatchPolicy")),
        picker: None,
    }
}

/// Both Envoy Gateway manifests, as applied behind an endpoint picker.
pub fn envoy_gateway_behind_picker(base: &str, overlay: &str) -> EnvoyGatewayManifest {
    let docs = documents(overlay);
    assert_eq!(
        docs.len(),
        4,
        "InferencePool, Backend, EnvoyExtensionPolicy, EnvoyPatchPolicy"
    );
    EnvoyGatewayManifest {
        picker: Some(EnvoyGatewayPicker {
            pool: typed(find(&docs, "InferencePool")),
            backend: typed(find(&docs, "Backend")),
            extension: typed(find(&docs, "EnvoyExtensionPolicy")),
            patch: typed(find(&docs, "EnvoyPatchPolicy")),
            settings: picker_member(overlay),
        }),
        ..envoy_gateway_manifest(base)
    }
}

impl EnvoyGatewayManifest {
    pub fn plugin_config(&self) -> String {
        let text = self.extension.spec.wasm[0].config.to_string();
        match &self.picker {
            Some(picker) => with_member(&text, &picker.settings),
            None => text,
        }
    }

    /// The name of the picker's `ext_proc` filter, as Envoy Gateway names it.
    pub fn ext_proc_filter_name(picker: &EnvoyGatewayPicker) -> String {
        format!(
            "envoy.filters.http.ext_proc/envoyextensionpolicy/{}/{}/extproc/0",
            picker.extension.metadata.namespace, picker.extension.metadata.name
        )
    }

    /// The picker's `ext_proc` filter as Envoy Gateway translates the EnvoyExtensionPolicy
    /// (FullDuplexStreamed also sends trailers); its gRPC cluster is [`Self::picker_cluster`].
    fn ext_proc_filter(picker: &EnvoyGatewayPicker) -> Value {
        let ext_proc = &picker.extension.spec.ext_proc[0];
        let mode = &ext_proc.processing_mode;
        let trailers = |body: ExtProcBodyMode| {
            if body == ExtProcBodyMode::FullDuplexStreamed {
                "SEND"
            } else {
                "SKIP"
            }
        };
        json!({
            "name": Self::ext_proc_filter_name(picker),
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
                "grpc_service": {"envoy_grpc": {"cluster_name": Self::picker_cluster_name(picker)}},
                "failure_mode_allow": ext_proc.fail_open,
                "processing_mode": {
                    "request_header_mode": "SEND",
                    "response_header_mode": "SEND",
                    "request_body_mode": mode.request.body.envoy(),
                    "response_body_mode": mode.response.body.envoy(),
                    "request_trailer_mode": trailers(mode.request.body),
                    "response_trailer_mode": trailers(mode.response.body),
                },
                "metadata_options": {
                    "forwarding_namespaces": {"untyped": ext_proc.metadata.accessible_namespaces},
                },
            },
        })
    }

    fn picker_cluster_name(picker: &EnvoyGatewayPicker) -> String {
        let backend = &picker.backend.metadata;
        format!("backend/{}/{}", backend.namespace, backend.name)
    }

    /// The Backend's cluster: gRPC (HTTP/2) to its endpoint, TLS as its `tls` says, with the
    /// EnvoyProxy's client certificate.
    pub fn picker_cluster(&self, picker: &EnvoyGatewayPicker) -> Value {
        let endpoint = &picker.backend.spec.endpoints[0].fqdn;
        let name = Self::picker_cluster_name(picker);
        let mut cluster = json!({
            "name": name,
            "type": "STRICT_DNS",
            "connect_timeout": "10s",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}},
                },
            },
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": endpoint.hostname, "port_value": endpoint.port}}}},
            ]}]},
        });
        if picker.backend.spec.tls.is_some() {
            let mut common = self.client_tls();
            common["alpn_protocols"] = json!(["h2"]);
            cluster["transport_socket"] = json!({
                "name": TLS_SOCKET,
                "typed_config": {
                    "@type": UPSTREAM_TLS_TYPE,
                    "sni": endpoint.hostname,
                    "common_tls_context": common,
                },
            });
        }
        cluster
    }

    /// The name Envoy Gateway serves the BackendTLSPolicy's CA under:
    /// `<policy>/<namespace>-ca` (`getBackendTLSBundle`).
    fn ca_secret_name(&self) -> String {
        let policy = &self.backend_tls.metadata;
        format!("{}/{}-ca", policy.name, policy.namespace)
    }

    /// The name Envoy Gateway serves the EnvoyProxy's client certificate under:
    /// `<namespace>/<Secret>` (`irTLSListenerConfigName`).
    fn client_certificate_secret_name(&self) -> String {
        let secret = &self.proxy.spec.backend_tls.client_certificate_ref;
        let namespace = secret
            .namespace
            .as_ref()
            .unwrap_or(&self.proxy.metadata.namespace);
        format!("{namespace}/{}", secret.name)
    }

    /// The gateway's side of every backend TLS connection of this Gateway, from its
    /// EnvoyProxy: the client certificate, and TLS 1.2 to 1.3 (Envoy Gateway's defaults).
    fn client_tls(&self) -> Value {
        json!({
            "tls_params": {
                "tls_minimum_protocol_version": "TLSv1_2",
                "tls_maximum_protocol_version": "TLSv1_3",
            },
            "tls_certificate_sds_secret_configs": [xds_secret(&self.client_certificate_secret_name())],
        })
    }

    /// The `UpstreamTlsContext` Envoy Gateway (1.9 and later) builds for the cluster of a
    /// route whose backend the BackendTLSPolicy targets (`buildXdsUpstreamTLSSocketWthCert`):
    /// the policy's hostname as SNI and as the one DNS SAN accepted, its CA and the
    /// EnvoyProxy's client certificate as secrets from Envoy Gateway's xDS stream.
    pub fn backend_tls_context(&self) -> Value {
        let hostname = &self.backend_tls.spec.validation.hostname;
        let mut common = self.client_tls();
        common["combined_validation_context"] = json!({
            "default_validation_context": {
                "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": hostname}}],
            },
            "validation_context_sds_secret_config": xds_secret(&self.ca_secret_name()),
        });
        json!({"@type": UPSTREAM_TLS_TYPE, "sni": hostname, "common_tls_context": common})
    }

    /// Checks that Envoy Gateway serves the secrets [`Self::backend_tls_context`] names to
    /// this Gateway's Envoys: the BackendTLSPolicy targets the Service every HTTPRoute rule
    /// routes to (so that a cluster Envoy Gateway generates uses them), with a CA it serves
    /// under `<policy>/<namespace>-ca`, and the EnvoyProxy is this Gateway's.
    fn check_backend_tls_is_served(&self) {
        let policy = &self.backend_tls;
        assert_eq!(policy.api_version, "gateway.networking.k8s.io/v1");
        assert_eq!(policy.metadata.namespace, self.route.metadata.namespace);
        for rule in &self.route.spec.rules {
            for backend in &rule.backend_refs {
                let targeted = policy.spec.target_refs.iter().any(|target| {
                    target.group.is_empty()
                        && target.kind == "Service"
                        && target.name == backend.name
                });
                assert!(targeted, "the BackendTLSPolicy targets {}", backend.name);
            }
        }
        let validation = &policy.spec.validation;
        assert!(!validation.ca_certificate_refs.is_empty());
        for ca in &validation.ca_certificate_refs {
            assert_eq!(ca.group, "", "{ca:?}");
            assert!(
                ["ConfigMap", "Secret"].contains(&ca.kind.as_str()),
                "{ca:?}"
            );
        }
        assert!(!validation.hostname.is_empty());

        let parameters = &self
            .gateway
            .spec
            .infrastructure
            .as_ref()
            .expect("the Gateway names its EnvoyProxy")
            .parameters_ref;
        assert_eq!(
            (
                parameters.group.as_str(),
                parameters.kind.as_str(),
                &parameters.name
            ),
            (
                "gateway.envoyproxy.io",
                "EnvoyProxy",
                &self.proxy.metadata.name
            )
        );
        assert_eq!(
            self.proxy.metadata.namespace,
            self.gateway.metadata.namespace
        );
        let secret = &self.proxy.spec.backend_tls.client_certificate_ref;
        assert!(
            secret.group.as_deref().is_none_or(str::is_empty),
            "{secret:?}"
        );
        assert!(
            secret.kind.as_deref().is_none_or(|k| k == "Secret"),
            "{secret:?}"
        );
        assert!(
            secret
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == self.proxy.metadata.namespace),
            "Envoy Gateway reads the client certificate from the EnvoyProxy's namespace"
        );
    }

    /// Checks that the worker cluster `cluster` speaks the TLS Envoy Gateway builds for the
    /// decode Service's cluster, with the secrets it serves for that.
    fn check_worker_tls(&self, cluster: &Value) {
        self.check_backend_tls_is_served();
        assert_eq!(
            cluster["transport_socket"],
            json!({"name": TLS_SOCKET, "typed_config": self.backend_tls_context()}),
            "{}",
            cluster["name"]
        );
    }

    /// Envoy Gateway's xDS names: listener and route configuration
    /// `<namespace>/<gateway>/<listener>`.
    fn listener_name(&self) -> String {
        format!(
            "{}/{}/{}",
            self.gateway.metadata.namespace,
            self.gateway.metadata.name,
            self.gateway.spec.listeners[0].name
        )
    }

    /// `envoyextensionpolicy/<namespace>/<name>/wasm/<index>` (its vm_id), and the HTTP
    /// filter is `envoy.filters.http.wasm/` followed by it.
    pub fn wasm_ir_name(&self) -> String {
        format!(
            "envoyextensionpolicy/{}/{}/wasm/0",
            self.extension.metadata.namespace, self.extension.metadata.name
        )
    }

    /// Envoy Gateway's name of a rule's cluster (and the prefix of its routes' names).
    fn rule_name(&self, rule: usize) -> String {
        format!(
            "httproute/{}/{}/rule/{rule}",
            self.route.metadata.namespace, self.route.metadata.name
        )
    }

    fn cluster_patches(&self) -> Vec<&JsonPatch> {
        self.patch
            .spec
            .json_patches
            .iter()
            .filter(|p| p.kind == ResourceType::Cluster)
            .collect()
    }

    pub fn clusters(&self) -> Vec<Value> {
        let mut clusters: Vec<Value> = self
            .cluster_patches()
            .iter()
            .map(|p| p.operation.value.clone().unwrap())
            .collect();
        clusters.extend(self.picker.as_ref().map(|p| self.picker_cluster(p)));
        clusters
    }

    /// The clusters that reach workers: every cluster an EnvoyPatchPolicy adds (the
    /// picker's is Envoy Gateway's own, for the Backend).
    fn worker_clusters(&self) -> Vec<Value> {
        let overlay = self.picker.as_ref().map(|p| &p.patch.spec.json_patches);
        self.patch
            .spec
            .json_patches
            .iter()
            .chain(overlay.into_iter().flatten())
            .filter(|p| p.kind == ResourceType::Cluster)
            .map(|p| p.operation.value.clone().unwrap())
            .collect()
    }

    /// Stand-ins for the secrets Envoy Gateway serves this Gateway's Envoys for the
    /// BackendTLSPolicy and the EnvoyProxy, under the names it gives them: a throwaway CA,
    /// and a client certificate it issued.
    pub fn served_secrets(&self) -> ServedSecrets {
        let dir = tempfile::tempdir().unwrap();
        let ca = LocalCa::create(dir.path(), "stand-in workers' CA").unwrap();
        let client = ca
            .issue("gateway-client", &["pinroute-gateway"], Usage::Client)
            .unwrap();
        let file = |path: &Path| json!({"filename": path.to_str().unwrap()});
        let secrets = vec![
            json!({
                "name": self.client_certificate_secret_name(),
                "tls_certificate": {"certificate_chain": file(&client.cert), "private_key": file(&client.key)},
            }),
            json!({
                "name": self.ca_secret_name(),
                "validation_context": {"trusted_ca": file(&ca.cert_path())},
            }),
        ];
        ServedSecrets { _dir: dir, secrets }
    }

    /// The Gateway's configuration as Envoy validates it: the patched listener and the
    /// clusters. Envoy Gateway delivers clusters and secrets over its xDS stream; Envoy's
    /// validate mode takes neither (it crashes on a static cluster's secret from ADS), so
    /// `served` stands in for the stream as static secrets, and the clusters name them
    /// without their ADS source, the one change. A secret a cluster names that Envoy
    /// Gateway would not serve is an unknown secret to Envoy.
    pub fn envoy_bootstrap(&self, wasm: &Path, served: &ServedSecrets) -> String {
        let mut clusters = self.clusters();
        for cluster in &mut clusters {
            without_ads_sources(&mut cluster["transport_socket"]);
        }
        let mut bootstrap = bootstrap_document(self.patched_listener(wasm), clusters);
        bootstrap["static_resources"]["secrets"] = json!(served.secrets);
        yaml(&bootstrap)
    }

    /// The listener (route configuration inlined) as Envoy Gateway generates it before the
    /// EnvoyPatchPolicy: its Wasm filter from the EnvoyExtensionPolicy (the module served
    /// locally here), the ClientTrafficPolicy's early header removal, buffer limit and
    /// stream idle timeout, the HTTPRoute's route and timeout.
    fn generated_listener(&self, wasm: &Path) -> Value {
        let policy = &self.extension.spec.wasm[0];
        let wasm_filter = json!({
            "name": format!("envoy.filters.http.wasm/{}", self.wasm_ir_name()),
            "typed_config": {
                "@type": WASM_FILTER_TYPE,
                "config": {
                    "name": policy.name,
                    "root_id": policy.root_id,
                    "vm_config": {
                        "vm_id": self.wasm_ir_name(),
                        "runtime": "envoy.wasm.runtime.v8",
                        "code": local_code(wasm),
                    },
                    "configuration": {
                        "@type": "type.googleapis.com/google.protobuf.StringValue",
                        "value": self.plugin_config(),
                    },
                    "fail_open": policy.fail_open,
                },
            },
        });
        let early_removals: Vec<Value> = self
            .traffic
            .spec
            .headers
            .early_request_headers
            .remove
            .iter()
            .map(|name| json!({"remove": name}))
            .collect();
        let routes: Vec<Value> = self
            .route
            .spec
            .rules
            .iter()
            .enumerate()
            .map(|(i, rule)| {
                let mut envoy_match = json!({"prefix": rule.matches[0].path.value});
                let headers: Vec<Value> = rule.matches[0]
                    .headers
                    .iter()
                    .map(|h| {
                        let string_match = match h.kind {
                            HeaderMatchType::Exact => json!({"exact": h.value}),
                            HeaderMatchType::RegularExpression => {
                                json!({"safe_regex": {"regex": h.value}})
                            }
                        };
                        json!({"name": h.name, "string_match": string_match})
                    })
                    .collect();
                if !headers.is_empty() {
                    envoy_match["headers"] = Value::Array(headers);
                }
                json!({
                    "name": format!("{}/match/0/*", self.rule_name(i)),
                    "match": envoy_match,
                    "route": {"cluster": self.rule_name(i), "timeout": rule.timeouts.request},
                    "typed_per_filter_config": {"envoy.filters.http.cors": self.security.spec.cors.envoy()},
                })
            })
            .collect();
        // Envoy Gateway's order: CORS, then ext_proc, then Wasm filters, the router last.
        let http_filters: Vec<Value> = [
            Some(cors_filter()),
            self.picker.as_ref().map(Self::ext_proc_filter),
            Some(wasm_filter),
            Some(router()),
        ]
        .into_iter()
        .flatten()
        .collect();
        let timeout = &self.traffic.spec.timeout.http;
        let underscores = self.traffic.spec.headers.with_underscores_action.envoy();
        let hcm = json!({
            "@type": HCM_TYPE,
            "stat_prefix": "http-80",
            "stream_idle_timeout": timeout.stream_idle_timeout,
            "request_timeout": timeout.request_received_timeout,
            "common_http_protocol_options": {"headers_with_underscores_action": underscores},
            "early_header_mutation_extensions": [{
                "name": "envoy.http.early_header_mutation.header_mutation",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation",
                    "mutations": early_removals,
                },
            }],
            "route_config": {
                "name": self.listener_name(),
                "virtual_hosts": [{
                    "name": format!("{}/*", self.listener_name()),
                    "domains": ["*"],
                    "routes": routes,
                }],
            },
            "http_filters": http_filters,
        });
        json!({
            "name": self.listener_name(),
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10080}},
            "per_connection_buffer_limit_bytes": quantity_bytes(&self.traffic.spec.connection.buffer_limit),
            "default_filter_chain": {"filters": [{"name": HCM_NAME, "typed_config": hcm}]},
        })
    }

    /// The generated listener with the EnvoyPatchPolicy's listener and route patches applied.
    pub fn patched_listener(&self, wasm: &Path) -> Value {
        let mut listener = self.generated_listener(wasm);
        let overlay = self.picker.as_ref().map(|p| &p.patch.spec.json_patches);
        for patch in self
            .patch
            .spec
            .json_patches
            .iter()
            .chain(overlay.into_iter().flatten())
        {
            let target = match patch.kind {
                ResourceType::Cluster => continue,
                ResourceType::Listener => &mut listener,
                ResourceType::RouteConfiguration => {
                    &mut listener["default_filter_chain"]["filters"][0]["typed_config"]["route_config"]
                }
                ResourceType::ClusterLoadAssignment => panic!("no endpoint patch expected"),
            };
            assert_eq!(target["name"], patch.name.as_str(), "patch target name");
            apply_json_patch(target, &patch.operation);
        }
        listener
    }
}

/// A secret from Envoy Gateway's xDS stream (`makeConfigSource`).
fn xds_secret(name: &str) -> Value {
    json!({
        "name": name,
        "sds_config": {"ads": {}, "resource_api_version": "V3", "initial_fetch_timeout": "0s"},
    })
}

/// The secrets [`EnvoyGatewayManifest::served_secrets`] stands in for, and the folder of
/// their files.
pub struct ServedSecrets {
    _dir: tempfile::TempDir,
    secrets: Vec<Value>,
}

/// Every secret under `value` taken from ADS becomes a reference to a static secret of the
/// same name.
fn without_ads_sources(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map
                .get("sds_config")
                .is_some_and(|source| source.get("ads").is_some())
            {
                map.remove("sds_config");
            }
            map.values_mut().for_each(without_ads_sources);
        }
        Value::Array(items) => items.iter_mut().for_each(without_ads_sources),
        _ => {}
    }
}

/// One EnvoyPatchPolicy operation on `doc`: `add` at each node `jsonPath` selects, `path`
/// appended (Envoy Gateway's semantics; a `jsonPath` that selects nothing is an error).
/// Without `path`, the selected node is the JSON Patch target: an array element, before
/// which the value is inserted.
fn apply_json_patch(doc: &mut Value, operation: &JsonPatchOperation) {
    assert_eq!(operation.op, JsonPatchOp::Add, "only add is used");
    let json_path = operation.json_path.as_deref().expect("jsonPath");
    let pointers = select(doc, json_path);
    assert!(!pointers.is_empty(), "jsonPath {json_path} selects nothing");
    let value = operation.value.clone().unwrap();
    for pointer in pointers {
        let Some(path) = &operation.path else {
            let (array, index) = pointer.rsplit_once('/').unwrap();
            let index: usize = index.parse().expect("an array element is selected");
            let items = doc.pointer_mut(array).unwrap().as_array_mut().unwrap();
            items.insert(index, value.clone());
            continue;
        };
        let node = doc.pointer_mut(&pointer).unwrap();
        let key = path.trim_start_matches('/');
        assert!(
            !key.contains('/'),
            "one key appended to the selected node: {key}"
        );
        node.as_object_mut()
            .unwrap()
            .insert(key.to_owned(), value.clone());
    }
}

/// The JSONPath forms the manifest uses, evaluated like ojg does: `..KEY[?(@.name ==
/// 'VALUE')]` or `..KEY[?match(@.name, 'PREFIX.*')]`, then `.child` steps. Returns JSON
/// pointers of the selected nodes.
fn select(doc: &Value, json_path: &str) -> Vec<String> {
    let rest = json_path.strip_prefix("..").expect("recursive descent");
    let (key, rest) = rest.split_once("[?").expect("a filter");
    let (filter, children) = rest.split_once(")]").expect("end of filter");
    let accepts: Box<dyn Fn(&str) -> bool> =
        if let Some(value) = filter.strip_prefix("(@.name == '") {
            let value = value.strip_suffix('\'').expect("quoted value").to_owned();
            Box::new(move |name| name == value)
        } else if let Some(pattern) = filter.strip_prefix("match(@.name, '") {
            let pattern = pattern.strip_suffix('\'').expect("quoted pattern");
            let prefix = pattern
                .strip_suffix(".*")
                .expect("PREFIX.* pattern")
                .to_owned();
            assert!(
                !prefix.contains(['.', '*', '[', '(', '+', '?', '^', '$', '|', '\\']),
                "only a literal prefix then .* is handled: {pattern}"
            );
            Box::new(move |name| name.starts_with(&prefix))
        } else {
            panic!("unsupported filter {filter}")
        };
    let children: Vec<&str> = children.split('.').filter(|s| !s.is_empty()).collect();
    let mut found = Vec::new();
    descend(doc, String::new(), key, &accepts, &children, &mut found);
    found
}

fn descend(
    node: &Value,
    pointer: String,
    key: &str,
    accepts: &dyn Fn(&str) -> bool,
    children: &[&str],
    found: &mut Vec<String>,
) {
    let escape = |s: &str| s.replace('~', "~0").replace('/', "~1");
    match node {
        Value::Object(map) => {
            for (k, v) in map {
                let here = format!("{pointer}/{}", escape(k));
                if k == key
                    && let Some(items) = v.as_array()
                {
                    for (i, item) in items.iter().enumerate() {
                        if item["name"].as_str().is_some_and(accepts) {
                            let mut target = format!("{here}/{i}");
                            let mut at = item;
                            let mut complete = true;
                            for child in children {
                                match at.get(child) {
                                    Some(next) => {
                                        at = next;
                                        target = format!("{target}/{}", escape(child));
                                    }
                                    None => complete = false,
                                }
                            }
                            if complete {
                                found.push(target);
                            }
                        }
                    }
                }
                descend(v, here, key, accepts, children, found);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                descend(
                    item,
                    format!("{pointer}/{i}"),
                    key,
                    accepts,
                    children,
                    found,
                );
            }
        }
        _ => {}
    }
}

#[test]
fn envoy_gateway_manifest_is_consistent() {
    let m = envoy_gateway_manifest(ENVOY_GATEWAY);
    for api_version in [&m.gateway.api_version, &m.route.api_version] {
        assert_eq!(api_version, "gateway.networking.k8s.io/v1");
    }
    for api_version in [
        &m.proxy.api_version,
        &m.extension.api_version,
        &m.traffic.api_version,
        &m.security.api_version,
        &m.patch.api_version,
    ] {
        assert_eq!(api_version, "gateway.envoyproxy.io/v1alpha1");
    }
    let namespace = &m.gateway.metadata.namespace;
    for other in [
        &m.proxy.metadata.namespace,
        &m.backend_tls.metadata.namespace,
        &m.route.metadata.namespace,
        &m.extension.metadata.namespace,
        &m.traffic.metadata.namespace,
        &m.security.metadata.namespace,
        &m.patch.metadata.namespace,
    ] {
        assert_eq!(other, namespace, "policies attach within one namespace");
    }
    let gateway = &m.gateway.metadata.name;
    assert_eq!(m.route.spec.parent_refs[0].name, *gateway);
    for target in m
        .extension
        .spec
        .target_refs
        .iter()
        .chain(&m.traffic.spec.target_refs)
        .chain(&m.security.spec.target_refs)
        .chain([&m.patch.spec.target_ref])
    {
        assert_eq!(
            (
                target.group.as_str(),
                target.kind.as_str(),
                target.name.as_str()
            ),
            ("gateway.networking.k8s.io", "Gateway", gateway.as_str())
        );
    }
    assert!(matches!(m.patch.spec.kind, PatchType::JsonPatch));

    let wasm = &m.extension.spec.wasm;
    assert_eq!(wasm.len(), 1, "the flag patch names wasm/0");
    assert!(!wasm[0].fail_open);
    assert_eq!(wasm[0].root_id, "pinroute");
    let code = &wasm[0].code;
    let sha256 = match code.kind {
        WasmCodeSourceType::Image => code.image.as_ref().unwrap().sha256.clone(),
        WasmCodeSourceType::Http => code.http.as_ref().unwrap().sha256.clone(),
    };
    let sha256 = sha256.expect("the module is pinned by its sha256");
    assert!(
        sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit()),
        "{sha256}"
    );
    assert!(code.pull_policy.is_some());

    let plugin = plugin_config(&m.plugin_config());
    let settings = &plugin.settings;
    assert_eq!(
        m.traffic.spec.headers.early_request_headers.remove,
        edge_removals(settings)
    );
    assert_eq!(
        quantity_bytes(&m.traffic.spec.connection.buffer_limit),
        u64::from(buffer_limit_bytes(settings).unwrap())
    );
    let rules = &m.route.spec.rules;
    assert_eq!(rules.len(), 2);
    for rule in rules {
        assert!(
            seconds(&m.traffic.spec.timeout.http.stream_idle_timeout)
                >= seconds(&rule.timeouts.request)
        );
    }

    // Clusters are added whole, under their own names.
    for patch in m.cluster_patches() {
        assert_eq!(patch.operation.op, JsonPatchOp::Add);
        assert_eq!(patch.operation.path.as_deref(), Some(""));
        assert_eq!(
            patch.operation.value.as_ref().unwrap()["name"],
            patch.name.as_str()
        );
    }
    check_clusters(&m.clusters(), &plugin);

    // After the patches: the flag is on pinroute's filter; the pool route (rule 0, matched
    // on the pool header) goes to the pool cluster with the bootstrap's retries, the pinned
    // route to the decode cluster, both with the HTTPRoute's timeout.
    let listener = m.patched_listener(Path::new("/x.wasm"));
    let hcm = &listener["default_filter_chain"]["filters"][0]["typed_config"];
    let config = &hcm["http_filters"][1]["typed_config"]["config"];
    assert_eq!(config["allow_on_headers_stop_iteration"], true);
    let routes = &hcm["route_config"]["virtual_hosts"][0]["routes"];
    assert_eq!(routes[0]["match"]["headers"], pool_header_matcher(".+"));
    assert_eq!(
        routes[0]["route"],
        json!({"cluster": DECODE_POOL_CLUSTER, "timeout": "300s", "retry_policy": pool_retry_policy()})
    );
    assert!(routes[1]["match"].get("headers").is_none());
    assert_eq!(
        routes[1]["route"],
        json!({"cluster": DECODE_CLUSTER, "timeout": "300s"})
    );

    // The bootstrap's edge: request timeouts, underscores refused, Envoy's answers as JSON
    // on the connection manager; its CORS policy on both routes.
    check_edge_hcm(hcm, &m.plugin_config());
    for route in routes.as_array().unwrap() {
        check_cors(
            &route["typed_per_filter_config"]["envoy.filters.http.cors"],
            &m.plugin_config(),
        );
    }
}

#[test]
fn envoy_gateway_clusters_are_the_bootstrap_clusters_but_for_tls() {
    let m = envoy_gateway_manifest(ENVOY_GATEWAY);
    assert_eq!(
        without_tls(m.clusters()),
        rendered_clusters(&m.plugin_config())
    );
}

#[test]
fn every_envoy_gateway_worker_cluster_speaks_the_backend_tls_policys_tls() {
    let m = envoy_gateway_behind_picker(ENVOY_GATEWAY, ENVOY_GATEWAY_PICKER);
    let clusters = m.worker_clusters();
    assert_eq!(clusters.len(), 3, "prefill, decode, pool");
    for cluster in &clusters {
        m.check_worker_tls(cluster);
    }
}

#[test]
fn a_worker_cluster_without_the_backend_tls_policys_tls_is_caught() {
    for (broken, what) in [
        // No TLS on one cluster.
        ("        transport_socket: *worker_tls\n", ""),
        // The policy renamed: the CA secret the clusters name is no longer served.
        (
            "kind: BackendTLSPolicy\nmetadata:\n  name: pinroute-workers\n",
            "kind: BackendTLSPolicy\nmetadata:\n  name: pinroute-workers-v2\n",
        ),
        // The policy's hostname changed, the clusters' not.
        (
            "    hostname: vllm.llm.svc\n",
            "    hostname: vllm.llm.svc.cluster.local\n",
        ),
        // Another client certificate Secret.
        (
            "      name: pinroute-gateway-client\n",
            "      name: gateway-client\n",
        ),
        // The policy on another Service: Envoy Gateway serves its secrets to no cluster.
        (
            "    kind: Service\n    name: vllm-decode\n",
            "    kind: Service\n    name: vllm-prefill\n",
        ),
    ] {
        let bad = ENVOY_GATEWAY.replacen(broken, what, 1);
        assert_ne!(bad, ENVOY_GATEWAY, "{broken}");
        let m = envoy_gateway_manifest(&bad);
        let caught = std::panic::catch_unwind(|| {
            for cluster in &m.worker_clusters() {
                m.check_worker_tls(cluster);
            }
        });
        assert!(caught.is_err(), "{broken} -> {what} not caught");
    }
}

#[test]
fn envoy_accepts_the_envoy_gateway_fragments() {
    let m = envoy_gateway_manifest(ENVOY_GATEWAY);
    let served = m.served_secrets();
    envoy_accepts(|wasm| m.envoy_bootstrap(wasm, &served));
}

#[test]
fn envoy_refuses_a_worker_secret_envoy_gateway_does_not_serve() {
    let bad = ENVOY_GATEWAY.replacen(
        "name: pinroute-workers/llm-ca",
        "name: pinroute-workers-ca",
        1,
    );
    assert_ne!(bad, ENVOY_GATEWAY);
    let m = envoy_gateway_manifest(&bad);
    let stub = stub_wasm();
    let err = validate(
        &envoy(),
        &m.envoy_bootstrap(stub.path(), &m.served_secrets()),
    )
    .unwrap_err();
    assert!(
        format!("{err:#}")
            .contains("Unknown static certificate validation context: pinroute-workers-ca"),
        "{err:#}"
    );
}

#[test]
fn a_patch_for_another_policy_name_selects_nothing() {
    // Renaming the EnvoyExtensionPolicy without updating the EnvoyPatchPolicy is the likely
    // mistake: Envoy Gateway then marks the patch policy Invalid.
    let renamed = ENVOY_GATEWAY.replacen(
        "kind: EnvoyExtensionPolicy\nmetadata:\n  name: pinroute",
        "kind: EnvoyExtensionPolicy\nmetadata:\n  name: pinroute-v2",
        1,
    );
    assert_ne!(renamed, ENVOY_GATEWAY);
    let m = envoy_gateway_manifest(&renamed);
    let caught = std::panic::catch_unwind(|| m.patched_listener(Path::new("/x.wasm")));
    assert!(caught.is_err());
}

#[test]
fn a_misspelt_envoy_gateway_field_is_refused() {
    let bad = ENVOY_GATEWAY.replace("failOpen: false", "failopen: false");
    let docs = documents(&bad);
    let err = serde_json::from_value::<Resource<ExtensionPolicySpec>>(
        find(&docs, "EnvoyExtensionPolicy").clone(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("failopen"), "{err}");
}

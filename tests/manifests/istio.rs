//! The Istio manifest (`envoy/istio/pinroute.yaml`): Gateway, VirtualService,
//! PeerAuthentication, EnvoyFilter.
//!
//! The types below are the fields of Istio's `networking.istio.io` and `security.istio.io`
//! resources the manifest uses (istio/api `networking/v1alpha3/*.proto`,
//! `security/v1beta1/peer_authentication.proto`); unknown fields are refused.

use std::collections::BTreeMap;
use std::path::Path;

use pinroute::policy::headers::POOL_HEADER;
use pinroute_harness::envoy::test_support::{envoy, stub_wasm};
use pinroute_harness::envoy::{DECODE_CLUSTER, PICKER_CLUSTER, buffer_limit_bytes, validate};
use serde::Deserialize;
use serde_json::{Value, json};

use super::picker::{ISTIO_PICKER, LabelSelector};
use super::{
    CORS_POLICY_TYPE, DECODE_POOL_CLUSTER, HCM_NAME, HCM_TYPE, InferencePoolSpec, Resource,
    WASM_FILTER_TYPE, bootstrap, check_clusters, check_cors, check_edge_hcm, cors_filter,
    documents, edge_removals, envoy_accepts, find, local_code, picker_member, plugin_config,
    pool_header_matcher, pool_retry_policy, removed_headers, rendered_clusters, router, seconds,
    typed, upstream_tls_context, with_member, without_tls,
};

pub const ISTIO: &str = include_str!("../../envoy/istio/pinroute.yaml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewaySpec {
    pub selector: BTreeMap<String, String>,
    pub servers: Vec<Server>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Server {
    pub port: ServerPort,
    pub hosts: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerPort {
    pub number: u16,
    pub name: String,
    pub protocol: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VirtualServiceSpec {
    pub hosts: Vec<String>,
    pub gateways: Vec<String>,
    pub http: Vec<HttpRoute>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpRoute {
    pub name: String,
    #[serde(default, rename = "match")]
    pub matches: Vec<HttpMatchRequest>,
    pub route: Vec<RouteDestination>,
    pub timeout: String,
    pub retries: Retries,
    #[serde(rename = "corsPolicy")]
    pub cors_policy: Option<CorsPolicy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CorsPolicy {
    pub allow_origins: Vec<StringMatch>,
    pub allow_methods: Vec<String>,
    pub allow_headers: Vec<String>,
    pub expose_headers: Vec<String>,
    pub max_age: String,
    pub unmatched_preflights: Option<UnmatchedPreflights>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum UnmatchedPreflights {
    Unspecified,
    Forward,
    Ignore,
}

impl CorsPolicy {
    /// The route's Envoy `CorsPolicy`, as Istio translates it (`TranslateCORSPolicy`).
    fn envoy(&self) -> Value {
        let origins: Vec<Value> = self.allow_origins.iter().map(StringMatch::envoy).collect();
        let mut policy = json!({
            "@type": CORS_POLICY_TYPE,
            "allow_origin_string_match": origins,
            "allow_methods": self.allow_methods.join(","),
            "allow_headers": self.allow_headers.join(","),
            "expose_headers": self.expose_headers.join(","),
            "max_age": seconds(&self.max_age).to_string(),
            "filter_enabled": {"default_value": {"numerator": 100, "denominator": "HUNDRED"}},
        });
        if self.unmatched_preflights == Some(UnmatchedPreflights::Ignore) {
            policy["forward_not_matching_preflights"] = json!(false);
        }
        policy
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpMatchRequest {
    pub headers: BTreeMap<String, StringMatch>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StringMatch {
    pub exact: Option<String>,
    pub prefix: Option<String>,
    pub regex: Option<String>,
}

impl StringMatch {
    /// Envoy's `StringMatcher` for it, as Istio converts it.
    fn envoy(&self) -> Value {
        match (&self.exact, &self.prefix, &self.regex) {
            (Some(exact), None, None) => json!({"exact": exact}),
            (None, Some(prefix), None) => json!({"prefix": prefix}),
            (None, None, Some(regex)) => json!({"safe_regex": {"regex": regex}}),
            _ => panic!("a StringMatch sets exactly one of exact, prefix and regex: {self:?}"),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteDestination {
    pub destination: Destination,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Destination {
    pub host: String,
    pub port: PortSelector,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortSelector {
    pub number: u16,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retries {
    pub attempts: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerAuthenticationSpec {
    pub selector: LabelSelector,
    pub mtls: PeerMtls,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerMtls {
    pub mode: MtlsMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MtlsMode {
    Unset,
    Disable,
    Permissive,
    Strict,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EnvoyFilterSpec {
    pub workload_selector: WorkloadSelector,
    /// Patch sets with a lower priority are applied first (0 when unset).
    #[serde(default)]
    pub priority: i32,
    pub config_patches: Vec<ConfigPatch>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSelector {
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConfigPatch {
    pub apply_to: ApplyTo,
    #[serde(default, rename = "match")]
    pub matches: Option<PatchMatch>,
    pub patch: Patch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ApplyTo {
    Listener,
    FilterChain,
    NetworkFilter,
    HttpFilter,
    RouteConfiguration,
    VirtualHost,
    HttpRoute,
    Cluster,
    ExtensionConfig,
    Bootstrap,
    ListenerFilter,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PatchMatch {
    pub context: Context,
    pub listener: Option<ListenerMatch>,
    pub route_configuration: Option<RouteConfigurationMatch>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Context {
    Any,
    SidecarInbound,
    SidecarOutbound,
    Gateway,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListenerMatch {
    pub filter_chain: FilterChainMatch,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterChainMatch {
    pub filter: FilterMatch,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FilterMatch {
    pub name: String,
    pub sub_filter: Option<NameMatch>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameMatch {
    pub name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfigurationMatch {
    pub vhost: VirtualHostMatch,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VirtualHostMatch {
    pub route: NameMatch,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Patch {
    pub operation: Operation,
    pub value: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Operation {
    Merge,
    Add,
    Remove,
    InsertBefore,
    InsertAfter,
    InsertFirst,
    Replace,
}

/// Merges `patch` into `base` the way a proto merge treats these messages: objects
/// recursively, everything else replaced.
fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (key, value) in patch {
                match base.get_mut(key) {
                    Some(existing) => merge(existing, value),
                    None => {
                        base.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (base, patch) => *base = patch.clone(),
    }
}

pub struct IstioManifest {
    pub gateway: Resource<GatewaySpec>,
    virtual_service: Resource<VirtualServiceSpec>,
    pub peer_authentication: Resource<PeerAuthenticationSpec>,
    pub envoy_filter: Resource<EnvoyFilterSpec>,
    /// `picker.yaml` applied as well, with its `picker` member in the plugin configuration.
    pub picker: Option<IstioPicker>,
}

/// The documents of `envoy/istio/picker.yaml`.
pub struct IstioPicker {
    pub pool: Resource<InferencePoolSpec>,
    pub envoy_filter: Resource<EnvoyFilterSpec>,
    /// The member the overlay's header asks to add to the plugin configuration.
    pub settings: Value,
}

pub fn istio_manifest(text: &str) -> IstioManifest {
    let docs = documents(text);
    assert_eq!(
        docs.len(),
        4,
        "Gateway, VirtualService, PeerAuthentication, EnvoyFilter"
    );
    IstioManifest {
        gateway: typed(find(&docs, "Gateway")),
        virtual_service: typed(find(&docs, "VirtualService")),
        peer_authentication: typed(find(&docs, "PeerAuthentication")),
        envoy_filter: typed(find(&docs, "EnvoyFilter")),
        picker: None,
    }
}

/// Both Istio manifests, as applied behind an endpoint picker.
pub fn istio_behind_picker(base: &str, overlay: &str) -> IstioManifest {
    let docs = documents(overlay);
    assert_eq!(docs.len(), 2, "InferencePool, EnvoyFilter");
    IstioManifest {
        picker: Some(IstioPicker {
            pool: typed(find(&docs, "InferencePool")),
            envoy_filter: typed(find(&docs, "EnvoyFilter")),
            settings: picker_member(overlay),
        }),
        ..istio_manifest(base)
    }
}

impl IstioManifest {
    fn patches(&self, apply_to: ApplyTo, operation: Operation) -> Vec<&ConfigPatch> {
        self.envoy_filter
            .spec
            .config_patches
            .iter()
            .filter(|p| p.apply_to == apply_to && p.patch.operation == operation)
            .collect()
    }

    fn patch(&self, apply_to: ApplyTo, operation: Operation) -> &ConfigPatch {
        let found = self.patches(apply_to, operation);
        assert_eq!(
            found.len(),
            1,
            "exactly one {apply_to:?} {operation:?} patch"
        );
        found[0]
    }

    /// The HTTP_ROUTE patch of the VirtualService route `name`.
    fn route_patch(&self, name: &str) -> &ConfigPatch {
        let found: Vec<&ConfigPatch> = self
            .patches(ApplyTo::HttpRoute, Operation::Merge)
            .into_iter()
            .filter(|p| {
                let matches = p.matches.as_ref().unwrap();
                matches
                    .route_configuration
                    .as_ref()
                    .unwrap()
                    .vhost
                    .route
                    .name
                    == name
            })
            .collect();
        assert_eq!(
            found.len(),
            1,
            "exactly one HTTP_ROUTE patch for route {name}"
        );
        found[0]
    }

    /// The ECDS resource: `{name, typed_config}`.
    fn extension_config(&self) -> &Value {
        &self
            .patch(ApplyTo::ExtensionConfig, Operation::Add)
            .patch
            .value
    }

    pub fn plugin_config(&self) -> String {
        let text = self.extension_config()["typed_config"]["config"]["configuration"]["value"]
            .as_str()
            .unwrap();
        match &self.picker {
            Some(picker) => with_member(text, &picker.settings),
            None => text.to_owned(),
        }
    }

    /// The EnvoyFilters in the order Istio applies them: by priority, then as listed.
    fn envoy_filters(&self) -> Vec<&Resource<EnvoyFilterSpec>> {
        let mut filters = vec![&self.envoy_filter];
        filters.extend(self.picker.as_ref().map(|p| &p.envoy_filter));
        filters.sort_by_key(|f| f.spec.priority);
        filters
    }

    pub fn clusters(&self) -> Vec<Value> {
        let mut clusters: Vec<Value> = Vec::new();
        for filter in [
            Some(&self.envoy_filter),
            self.picker.as_ref().map(|p| &p.envoy_filter),
        ]
        .into_iter()
        .flatten()
        {
            clusters.extend(
                filter
                    .spec
                    .config_patches
                    .iter()
                    .filter(|p| {
                        p.apply_to == ApplyTo::Cluster && p.patch.operation == Operation::Add
                    })
                    .map(|p| p.patch.value.clone()),
            );
        }
        clusters
    }

    /// The HTTP filters once every EnvoyFilter's HTTP_FILTER patches were applied to the
    /// chain Istio generates (its CORS filter, the router), pinroute's ECDS filter inlined.
    fn http_filters(&self, wasm: &Path) -> Vec<Value> {
        let mut chain = vec![cors_filter(), router()];
        for filter in self.envoy_filters() {
            for patch in &filter.spec.config_patches {
                if patch.apply_to != ApplyTo::HttpFilter {
                    continue;
                }
                let value = if patch.patch.value.get("config_discovery").is_some() {
                    self.inlined_wasm_filter(wasm)
                } else {
                    patch.patch.value.clone()
                };
                let at = match patch.patch.operation {
                    Operation::InsertFirst => 0,
                    Operation::InsertBefore => {
                        let before = patch_sub_filter(patch);
                        chain
                            .iter()
                            .position(|f| f["name"] == before)
                            .unwrap_or_else(|| panic!("no {before} in the chain"))
                    }
                    other => panic!("HTTP_FILTER {other:?} is not modelled"),
                };
                chain.insert(at, value);
            }
        }
        chain
    }

    /// pinroute's ECDS filter as istio-agent hands it to Envoy: the module a local file.
    fn inlined_wasm_filter(&self, wasm: &Path) -> Value {
        let discovered = &self
            .patch(ApplyTo::HttpFilter, Operation::InsertBefore)
            .patch
            .value;
        let mut typed_config = self.extension_config()["typed_config"].clone();
        typed_config["config"]["vm_config"]["code"] = local_code(wasm);
        typed_config["config"]["configuration"]["value"] = json!(self.plugin_config());
        json!({"name": discovered["name"], "typed_config": typed_config})
    }

    /// The gateway's listener as Envoy receives it once Istio applied the patches and
    /// istio-agent made the module local: the ECDS config inlined where the
    /// `config_discovery` filter stands. Istio's own filters (authn, authz, stats) would
    /// sit between the first filter and pinroute; they are not needed to check ours.
    pub fn listener(&self, wasm: &Path) -> Value {
        let envoy_routes: Vec<Value> = self
            .virtual_service
            .spec
            .http
            .iter()
            .map(|route| {
                let destination = &route.route[0].destination;
                let mut envoy_match = json!({"prefix": "/"});
                if let Some(request) = route.matches.first() {
                    let headers: Vec<Value> = request
                        .headers
                        .iter()
                        .map(|(name, m)| json!({"name": name, "string_match": m.envoy()}))
                        .collect();
                    envoy_match["headers"] = Value::Array(headers);
                }
                let mut envoy_route = json!({
                    "name": route.name,
                    "match": envoy_match,
                    "route": {
                        "cluster": format!("outbound|{}||{}", destination.port.number, destination.host),
                        "timeout": route.timeout,
                    },
                });
                if let Some(cors) = &route.cors_policy {
                    envoy_route["typed_per_filter_config"] =
                        json!({"envoy.filters.http.cors": cors.envoy()});
                }
                merge(&mut envoy_route, &self.route_patch(&route.name).patch.value);
                envoy_route
            })
            .collect();

        let http_filters = self.http_filters(wasm);
        let mut hcm = json!({
            "@type": HCM_TYPE,
            "stat_prefix": "outbound_0.0.0.0_8080",
            "route_config": {
                "name": "http.8080",
                "virtual_hosts": [{"name": "*:80", "domains": ["*"], "routes": envoy_routes}],
            },
            "http_filters": http_filters,
        });
        let hcm_patch = &self
            .patch(ApplyTo::NetworkFilter, Operation::Merge)
            .patch
            .value;
        assert_eq!(hcm_patch["name"], HCM_NAME);
        merge(&mut hcm, &hcm_patch["typed_config"]);

        let mut listener = json!({
            "name": "0.0.0.0_8080",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 8080}},
            "filter_chains": [{"filters": [{"name": HCM_NAME, "typed_config": hcm}]}],
        });
        merge(
            &mut listener,
            &self.patch(ApplyTo::Listener, Operation::Merge).patch.value,
        );
        listener
    }

    /// The gateway's configuration as Envoy validates it: the listener, the clusters the
    /// EnvoyFilters add, and istio-agent's SDS cluster their mutual TLS names, as Istio's
    /// bootstrap defines it. (Envoy's validate mode neither resolves nor contacts an SDS
    /// source, so it would accept the sockets without that cluster too: `check_mesh_mtls`
    /// holds their source to it.)
    pub fn envoy_bootstrap(&self, wasm: &Path) -> String {
        let mut clusters = self.clusters();
        clusters.push(istio_agent_sds_cluster());
        bootstrap(self.listener(wasm), clusters)
    }

    /// The clusters that reach workers: every cluster the EnvoyFilters add but the endpoint
    /// picker's, which speaks the picker's own TLS (`picker.rs`).
    pub fn worker_clusters(&self) -> Vec<Value> {
        self.clusters()
            .into_iter()
            .filter(|cluster| cluster["name"] != PICKER_CLUSTER)
            .collect()
    }
}

/// The cluster through which Istio's bootstrap reaches istio-agent's SDS server
/// (`pkg/model/authentication.go`).
const ISTIO_AGENT_SDS_CLUSTER: &str = "sds-grpc";
/// istio-agent's names for the proxy's own certificate and the mesh's root.
const ISTIO_CERTIFICATE_SECRET: &str = "default";
const ISTIO_ROOT_SECRET: &str = "ROOTCA";
/// The ALPN values a worker sidecar's inbound HTTP mTLS filter chain matches in every mode
/// (Istio's `mtlsHTTPALPNs`, `pilot/pkg/networking/core/listener.go`).
const INBOUND_MTLS_HTTP_ALPNS: [&str; 3] = ["istio-http/1.0", "istio-http/1.1", "istio-h2"];

/// The SDS source of Istio's own clusters' secrets (`ConstructSdsSecretConfig`).
fn istio_agent_sds_config() -> Value {
    json!({
        "api_config_source": {
            "api_type": "GRPC",
            "set_node_on_first_message_only": true,
            "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": ISTIO_AGENT_SDS_CLUSTER}}],
        },
        "resource_api_version": "V3",
        "initial_fetch_timeout": "0s",
    })
}

/// istio-agent's SDS cluster as Istio's bootstrap defines it
/// (`tools/packaging/common/envoy_bootstrap.json`). A stand-in: nothing listens on the socket.
fn istio_agent_sds_cluster() -> Value {
    json!({
        "name": ISTIO_AGENT_SDS_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            },
        },
        "load_assignment": {
            "cluster_name": ISTIO_AGENT_SDS_CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                "pipe": {"path": "./var/run/secrets/workload-spiffe-uds/socket"},
            }}}]}],
        },
    })
}

/// Checks that `cluster` reaches the workers with Istio's mutual TLS, so that a worker
/// sidecar under STRICT accepts it: the gateway's mesh certificate and the mesh's root from
/// istio-agent, an ALPN value the sidecar's inbound HTTP mTLS chain matches, and the worker
/// checked by its exact SPIFFE identity, in the namespace the PeerAuthentication covers.
fn check_mesh_mtls(cluster: &Value, workers: &Resource<PeerAuthenticationSpec>) {
    let name = &cluster["name"];
    let common = &upstream_tls_context(cluster)["common_tls_context"];
    assert_eq!(
        common["tls_certificate_sds_secret_configs"],
        json!([{"name": ISTIO_CERTIFICATE_SECRET, "sds_config": istio_agent_sds_config()}]),
        "{name}: the gateway's mesh certificate"
    );
    let validation = &common["combined_validation_context"];
    assert_eq!(
        validation["validation_context_sds_secret_config"],
        json!({"name": ISTIO_ROOT_SECRET, "sds_config": istio_agent_sds_config()}),
        "{name}: the mesh's root"
    );
    assert!(common.get("validation_context").is_none(), "{name}");
    let alpn = common["alpn_protocols"].as_array().unwrap();
    assert!(
        !alpn.is_empty()
            && alpn
                .iter()
                .all(|p| INBOUND_MTLS_HTTP_ALPNS.contains(&p.as_str().unwrap())),
        "{name}: {alpn:?} does not select the inbound HTTP mTLS chain"
    );
    let sans = validation["default_validation_context"]["match_typed_subject_alt_names"]
        .as_array()
        .unwrap();
    assert!(!sans.is_empty(), "{name}: no SAN check");
    let namespace_prefix = format!("/ns/{}/sa/", workers.metadata.namespace);
    for san in sans {
        assert_eq!(san["san_type"], "URI", "{name}");
        let identity = san["matcher"]["exact"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: {san} is not one exact identity"));
        let (trust_domain, service_account) = identity
            .strip_prefix("spiffe://")
            .and_then(|rest| rest.split_once(&namespace_prefix))
            .unwrap_or_else(|| panic!("{name}: {identity} is not a worker's SPIFFE identity"));
        assert!(
            !trust_domain.is_empty()
                && !service_account.is_empty()
                && !service_account.contains('/'),
            "{name}: {identity}"
        );
    }
}

/// The filter an INSERT_BEFORE patch names.
fn patch_sub_filter(patch: &ConfigPatch) -> String {
    let filter = &patch
        .matches
        .as_ref()
        .unwrap()
        .listener
        .as_ref()
        .unwrap()
        .filter_chain
        .filter;
    assert_eq!(filter.name, HCM_NAME);
    filter.sub_filter.as_ref().unwrap().name.clone()
}

#[test]
fn istio_manifest_is_consistent() {
    let m = istio_manifest(ISTIO);
    assert_eq!(m.gateway.api_version, "networking.istio.io/v1");
    assert_eq!(m.virtual_service.api_version, "networking.istio.io/v1");
    assert_eq!(m.envoy_filter.api_version, "networking.istio.io/v1alpha3");
    // One namespace and one gateway workload for everything.
    for namespace in [
        &m.gateway.metadata.namespace,
        &m.virtual_service.metadata.namespace,
        &m.peer_authentication.metadata.namespace,
    ] {
        assert_eq!(namespace, &m.envoy_filter.metadata.namespace);
    }
    assert_eq!(
        m.gateway.spec.selector,
        m.envoy_filter.spec.workload_selector.labels
    );
    assert_eq!(
        m.virtual_service.spec.gateways,
        std::slice::from_ref(&m.gateway.metadata.name)
    );
    // Every patch but the ECDS resource is scoped to gateways.
    for patch in &m.envoy_filter.spec.config_patches {
        match (&patch.apply_to, &patch.matches) {
            (ApplyTo::ExtensionConfig, None) => {}
            (_, Some(matches)) => assert_eq!(matches.context, Context::Gateway),
            (other, None) => panic!("{other:?} patch without a match"),
        }
    }

    let plugin = plugin_config(&m.plugin_config());
    let settings = &plugin.settings;
    let config = &m.extension_config()["typed_config"]["config"];
    assert_eq!(
        m.extension_config()["typed_config"]["@type"],
        WASM_FILTER_TYPE
    );
    assert_eq!(config["allow_on_headers_stop_iteration"], true);
    assert_eq!(config["failure_policy"], "FAIL_RELOAD");
    assert_eq!(config["root_id"], "pinroute");
    assert_eq!(config["vm_config"]["vm_id"], "pinroute");
    let remote = &config["vm_config"]["code"]["remote"];
    let uri = remote["http_uri"]["uri"].as_str().unwrap();
    assert!(
        uri.starts_with("oci://") || uri.starts_with("https://"),
        "{uri}"
    );
    let sha256 = remote["sha256"].as_str().unwrap();
    assert!(
        sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit()),
        "{sha256}"
    );

    // The filter in the chain names the ECDS resource and accepts its type (and the RBAC
    // stand-in istio-agent serves when the module cannot be fetched).
    let insert = m.patch(ApplyTo::HttpFilter, Operation::InsertBefore);
    assert_eq!(patch_sub_filter(insert), "envoy.filters.http.router");
    let discovery = &insert.patch.value["config_discovery"];
    assert_eq!(insert.patch.value["name"], m.extension_config()["name"]);
    assert_eq!(
        discovery["config_source"],
        json!({"ads": {}, "initial_fetch_timeout": "0s"})
    );
    assert_eq!(
        discovery["type_urls"],
        json!([
            WASM_FILTER_TYPE,
            "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
        ])
    );

    // Client copies of the steering headers go first.
    let strip = &m
        .patch(ApplyTo::HttpFilter, Operation::InsertFirst)
        .patch
        .value;
    assert_eq!(
        removed_headers(&strip["typed_config"]),
        edge_removals(settings)
    );

    check_clusters(&m.clusters(), &plugin);

    // The VirtualService routes: the pool route (matched on the pool header) first, to the
    // pool cluster with the bootstrap's retries; then the pinned route, to the decode
    // cluster. Istio adds no retry policy of its own.
    let routes = &m.virtual_service.spec.http;
    assert_eq!(routes.len(), 2);
    assert_eq!(routes[0].matches.len(), 1);
    let pool_match = &routes[0].matches[0].headers;
    assert_eq!(pool_match.keys().collect::<Vec<_>>(), [POOL_HEADER]);
    assert!(routes[1].matches.is_empty());
    assert_eq!(
        m.route_patch(&routes[0].name).patch.value,
        json!({"route": {"cluster": DECODE_POOL_CLUSTER, "retry_policy": pool_retry_policy()}})
    );
    assert_eq!(
        m.route_patch(&routes[1].name).patch.value,
        json!({"route": {"cluster": DECODE_CLUSTER}})
    );
    for route in routes {
        assert_eq!(
            route.retries.attempts, 0,
            "Istio's default retries would re-send a failed hop"
        );
        assert_eq!(route.timeout, routes[1].timeout);
    }

    // Limits sized together.
    let listener_patch = &m.patch(ApplyTo::Listener, Operation::Merge).patch.value;
    assert_eq!(
        listener_patch["per_connection_buffer_limit_bytes"],
        buffer_limit_bytes(settings).unwrap()
    );
    let idle = &m
        .patch(ApplyTo::NetworkFilter, Operation::Merge)
        .patch
        .value["typed_config"]["stream_idle_timeout"];
    assert!(seconds(idle.as_str().unwrap()) >= seconds(&routes[1].timeout));

    // The assembled routes.
    let listener = m.listener(Path::new("/x.wasm"));
    let envoy_routes = &listener["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]
        ["virtual_hosts"][0]["routes"];
    assert_eq!(
        envoy_routes[0]["match"]["headers"],
        pool_header_matcher(".+")
    );
    assert_eq!(envoy_routes[0]["route"]["cluster"], DECODE_POOL_CLUSTER);
    assert_eq!(envoy_routes[1]["route"]["cluster"], DECODE_CLUSTER);

    // The bootstrap's edge: request timeouts, underscores refused, Envoy's answers as JSON
    // on the connection manager; its CORS policy on both routes.
    let hcm = &listener["filter_chains"][0]["filters"][0]["typed_config"];
    check_edge_hcm(hcm, &m.plugin_config());
    for route in envoy_routes.as_array().unwrap() {
        check_cors(
            &route["typed_per_filter_config"]["envoy.filters.http.cors"],
            &m.plugin_config(),
        );
    }
}

#[test]
fn istio_clusters_are_the_bootstrap_clusters_but_for_the_mesh_mtls() {
    let m = istio_manifest(ISTIO);
    assert_eq!(
        without_tls(m.clusters()),
        rendered_clusters(&m.plugin_config())
    );
}

#[test]
fn every_istio_worker_cluster_speaks_the_meshs_mutual_tls() {
    let m = istio_behind_picker(ISTIO, ISTIO_PICKER);
    let workers = &m.peer_authentication;
    assert_eq!(workers.api_version, "security.istio.io/v1");
    assert_eq!(workers.metadata.namespace, m.gateway.metadata.namespace);
    assert_eq!(workers.spec.mtls.mode, MtlsMode::Strict);
    assert!(!workers.spec.selector.match_labels.is_empty());
    let clusters = m.worker_clusters();
    assert_eq!(clusters.len(), 3, "prefill, decode, pool");
    for cluster in &clusters {
        check_mesh_mtls(cluster, workers);
        // Dialled by address: no SNI names a host.
        assert!(upstream_tls_context(cluster).get("sni").is_none());
    }
}

#[test]
fn a_worker_cluster_without_the_meshs_mutual_tls_is_caught() {
    for (broken, what) in [
        ("        transport_socket: *mesh_mtls\n", ""),
        (
            "exact: spiffe://cluster.local/ns/llm/sa/vllm",
            "prefix: spiffe://cluster.local/ns/llm/",
        ),
        ("alpn_protocols: [istio-http/1.1]", "alpn_protocols: [h2]"),
        ("- name: default\n", "- name: gateway\n"),
    ] {
        let bad = ISTIO.replacen(broken, what, 1);
        assert_ne!(bad, ISTIO, "{broken}");
        let m = istio_manifest(&bad);
        let caught = std::panic::catch_unwind(|| {
            for cluster in &m.worker_clusters() {
                check_mesh_mtls(cluster, &m.peer_authentication);
            }
        });
        assert!(caught.is_err(), "{broken} -> {what} not caught");
    }
}

#[test]
fn envoy_accepts_the_istio_fragments() {
    let m = istio_manifest(ISTIO);
    envoy_accepts(|wasm| m.envoy_bootstrap(wasm));
}

#[test]
fn a_misspelt_istio_field_is_refused() {
    let bad = ISTIO.replace("workloadSelector:", "workloadSelectors:");
    let docs = documents(&bad);
    let err =
        serde_json::from_value::<Resource<EnvoyFilterSpec>>(find(&docs, "EnvoyFilter").clone())
            .unwrap_err();
    assert!(err.to_string().contains("workloadSelectors"), "{err}");
}

#[test]
fn envoy_refuses_an_istio_fragment_envoy_does_not_know() {
    let bad = ISTIO.replace(
        "allow_on_headers_stop_iteration: true",
        "allow_on_header_stop_iteration: true",
    );
    let m = istio_manifest(&bad);
    let stub = stub_wasm();
    let err = validate(&envoy(), &m.envoy_bootstrap(stub.path())).unwrap_err();
    assert!(
        format!("{err:#}").contains("allow_on_header_stop_iteration"),
        "{err:#}"
    );
}

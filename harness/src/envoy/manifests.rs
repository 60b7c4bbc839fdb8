//! Tests of the deployment manifests in `envoy/istio/` and `envoy/envoy-gateway/`
//! (docs/deploy.md says what they prove and what they cannot).
//!
//! - Every YAML document parses, and the fields pinroute relies on parse into typed
//!   structures that refuse unknown fields (a misspelt field fails here, not silently in a
//!   cluster). The Envoy Gateway structures follow its Go API types (`api/v1alpha1`).
//! - The Istio and Gateway API documents validate against the published schemas of the npm
//!   packages `@kubernetes-models/istio` and `@kubernetes-models/gateway-api` (installed on
//!   first use into `.cache/k8s-models`; skipped without `node` and `npm`). No registry
//!   package ships Envoy Gateway's CRD schemas.
//! - Names agree across documents and with the plugin configuration (the filter's own
//!   `Config::from_json` accepts it), and the clusters are those of `envoy/bootstrap.yaml`.
//! - The Envoy fragments are assembled into a static bootstrap the way each control plane
//!   assembles them (Istio: ECDS config inlined with the module made local, as istio-agent
//!   does; Envoy Gateway: its filter and route naming, then the EnvoyPatchPolicy applied) and
//!   checked with `envoy --mode validate`.

// Some typed fields are only parsed, for their names and types: never read.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use pinroute::policy::config::{Config, Settings};
use pinroute::policy::headers::POOL_HEADER;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::test_support::{envoy, real_wasm, stub_wasm};
use super::{BootstrapOptions, DEFAULT_ROUTE_TIMEOUT, buffer_limit_bytes, render_bootstrap};
use super::{repo_root, validate};

const ISTIO: &str = include_str!("../../../envoy/istio/pinroute.yaml");
const ENVOY_GATEWAY: &str = include_str!("../../../envoy/envoy-gateway/pinroute.yaml");
/// The steering header Envoy's ORIGINAL_DST reads when no `http_header_name` is set.
const ORIGINAL_DST_HEADER: &str = "x-envoy-original-dst-host";
/// The cluster of unpinned decode hops (`envoy/bootstrap.yaml`).
const DECODE_POOL_CLUSTER: &str = "pinroute_decode_pool";
/// The bootstrap's retry policy for unpinned decode hops.
fn pool_retry_policy() -> Value {
    json!({"retry_on": "connect-failure,refused-stream,reset-before-request", "num_retries": 2})
}

const WASM_FILTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const HCM_NAME: &str = "envoy.filters.network.http_connection_manager";
const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";

// ---------------------------------------------------------------------------------------
// Parsing

/// Every non-empty YAML document of `text`, as JSON.
fn documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|doc| !doc.is_null())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "exactly one {kind}");
    found[0]
}

fn typed<T: DeserializeOwned>(doc: &Value) -> Resource<T> {
    serde_json::from_value(doc.clone()).unwrap_or_else(|e| {
        panic!(
            "{} {}: {e}",
            doc["kind"],
            doc["metadata"]["name"].as_str().unwrap_or("?")
        )
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Resource<S> {
    api_version: String,
    kind: String,
    metadata: Metadata,
    spec: S,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    name: String,
    namespace: String,
}

/// The fields of Istio's `networking.istio.io` resources the manifest uses (istio/api
/// `networking/v1alpha3/*.proto`); unknown fields are refused.
mod istio {
    use super::*;

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
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct HttpMatchRequest {
        pub headers: BTreeMap<String, StringMatch>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct StringMatch {
        pub regex: String,
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
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct EnvoyFilterSpec {
        pub workload_selector: WorkloadSelector,
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
}

/// The fields of Gateway API and Envoy Gateway resources the manifest uses (Envoy
/// Gateway's Go API types, `api/v1alpha1`); unknown fields are refused.
mod eg {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct GatewaySpec {
        pub gateway_class_name: String,
        pub listeners: Vec<Listener>,
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
        pub wasm: Vec<Wasm>,
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
        pub path: String,
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
}

// ---------------------------------------------------------------------------------------
// Small helpers

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

/// Seconds of a whole-second duration (`300s`).
fn seconds(text: &str) -> u64 {
    text.strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text:?} is not a whole-second duration"))
}

fn plugin_config(json: &str) -> Config {
    Config::from_json(json.as_bytes())
        .unwrap_or_else(|e| panic!("the filter refuses the manifest's configuration: {e}\n{json}"))
}

/// Header names removed by every `header_mutation` `request_mutations` list under `value`.
fn removed_headers(value: &Value) -> Vec<String> {
    value["mutations"]["request_mutations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["remove"].as_str().unwrap().to_owned())
        .collect()
}

/// The steering headers, in the order the bootstrap removes them.
fn steering_headers(settings: &Settings) -> [&str; 3] {
    [
        settings.upstream_header.as_str(),
        POOL_HEADER,
        ORIGINAL_DST_HEADER,
    ]
}

/// The clusters the filter needs, checked against its configuration: the prefill cluster
/// reads `x-envoy-original-dst-host`, the decode cluster the upstream header, the pool
/// cluster holds exactly the registry's token-generating workers and follows the pool
/// header; all strip the steering headers before the worker sees them.
fn check_clusters(clusters: &[Value], config: &Config) {
    let settings = &config.settings;
    let names: Vec<&str> = clusters
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            settings.prefill_cluster.as_str(),
            super::DECODE_CLUSTER,
            DECODE_POOL_CLUSTER
        ]
    );
    for cluster in clusters {
        let upstream_filters = cluster["typed_extension_protocol_options"]
            ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["http_filters"]
            .as_array()
            .unwrap();
        assert_eq!(
            removed_headers(&upstream_filters[0]["typed_config"]),
            steering_headers(settings)
        );
        assert_eq!(
            cluster["per_connection_buffer_limit_bytes"],
            buffer_limit_bytes(settings.max_body_bytes).unwrap()
        );
    }
    for cluster in &clusters[..2] {
        assert_eq!(cluster["type"], "ORIGINAL_DST", "{cluster}");
        assert_eq!(cluster["original_dst_lb_config"]["use_http_header"], true);
    }
    assert!(
        clusters[0]["original_dst_lb_config"]
            .get("http_header_name")
            .is_none()
    );
    assert_eq!(
        clusters[1]["original_dst_lb_config"]["http_header_name"],
        settings.upstream_header.as_str()
    );
    let pool = &clusters[2];
    assert_eq!(pool["type"], "STATIC");
    let members: Vec<String> = pool["load_assignment"]["endpoints"][0]["lb_endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let socket = &e["endpoint"]["address"]["socket_address"];
            format!(
                "{}:{}",
                socket["address"].as_str().unwrap(),
                socket["port_value"]
            )
        })
        .collect();
    let expected: Vec<String> = config.pool_members.iter().map(|a| a.to_string()).collect();
    assert_eq!(
        members, expected,
        "pool endpoints are the registry's token-generating workers"
    );
    let policy = &pool["load_balancing_policy"]["policies"][0]["typed_extension_config"];
    assert_eq!(
        policy["name"],
        "envoy.load_balancing_policies.override_host"
    );
    assert_eq!(
        policy["typed_config"]["override_host_sources"],
        json!([{"header": POOL_HEADER}])
    );
}

/// The Envoy header matchers of a route that needs the pool header.
fn pool_header_matcher(regex: &str) -> Value {
    json!([{"name": POOL_HEADER, "string_match": {"safe_regex": {"regex": regex}}}])
}

/// The clusters of `envoy/bootstrap.yaml` rendered for the same plugin configuration.
fn rendered_clusters(plugin_config: &str) -> Value {
    let yaml = render_bootstrap(&BootstrapOptions {
        listen: "127.0.0.1:10000".parse().unwrap(),
        admin: "127.0.0.1:9901".parse().unwrap(),
        wasm: PathBuf::from("/x.wasm"),
        plugin_config: plugin_config.to_owned(),
        route_timeout: DEFAULT_ROUTE_TIMEOUT,
    })
    .unwrap();
    let bootstrap = documents(&yaml).remove(0);
    bootstrap["static_resources"]["clusters"].clone()
}

/// A static bootstrap around one listener and the given clusters.
fn bootstrap(listener: Value, clusters: Vec<Value>) -> String {
    let bootstrap = json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 9901}}},
        "static_resources": {"listeners": [listener], "clusters": clusters},
    });
    // JSON is YAML.
    serde_json::to_string_pretty(&bootstrap).unwrap()
}

fn router() -> Value {
    json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
    })
}

fn local_code(wasm: &Path) -> Value {
    json!({"local": {"filename": wasm.to_str().unwrap()}})
}

// ---------------------------------------------------------------------------------------
// Istio

struct IstioManifest {
    gateway: Resource<istio::GatewaySpec>,
    virtual_service: Resource<istio::VirtualServiceSpec>,
    envoy_filter: Resource<istio::EnvoyFilterSpec>,
}

fn istio_manifest(text: &str) -> IstioManifest {
    let docs = documents(text);
    assert_eq!(docs.len(), 3, "Gateway, VirtualService, EnvoyFilter");
    IstioManifest {
        gateway: typed(find(&docs, "Gateway")),
        virtual_service: typed(find(&docs, "VirtualService")),
        envoy_filter: typed(find(&docs, "EnvoyFilter")),
    }
}

impl IstioManifest {
    fn patches(
        &self,
        apply_to: istio::ApplyTo,
        operation: istio::Operation,
    ) -> Vec<&istio::ConfigPatch> {
        self.envoy_filter
            .spec
            .config_patches
            .iter()
            .filter(|p| p.apply_to == apply_to && p.patch.operation == operation)
            .collect()
    }

    fn patch(&self, apply_to: istio::ApplyTo, operation: istio::Operation) -> &istio::ConfigPatch {
        let found = self.patches(apply_to, operation);
        assert_eq!(
            found.len(),
            1,
            "exactly one {apply_to:?} {operation:?} patch"
        );
        found[0]
    }

    /// The HTTP_ROUTE patch of the VirtualService route `name`.
    fn route_patch(&self, name: &str) -> &istio::ConfigPatch {
        let found: Vec<&istio::ConfigPatch> = self
            .patches(istio::ApplyTo::HttpRoute, istio::Operation::Merge)
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
            .patch(istio::ApplyTo::ExtensionConfig, istio::Operation::Add)
            .patch
            .value
    }

    fn plugin_config(&self) -> String {
        self.extension_config()["typed_config"]["config"]["configuration"]["value"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn clusters(&self) -> Vec<Value> {
        self.patches(istio::ApplyTo::Cluster, istio::Operation::Add)
            .iter()
            .map(|p| p.patch.value.clone())
            .collect()
    }

    /// The gateway's listener as Envoy receives it once Istio applied the patches and
    /// istio-agent made the module local: the ECDS config inlined where the
    /// `config_discovery` filter stands. Istio's own filters (authn, authz, stats) would
    /// sit between the first filter and pinroute; they are not needed to check ours.
    fn listener(&self, wasm: &Path) -> Value {
        use istio::{ApplyTo, Operation};
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
                        .map(|(name, m)| json!({"name": name, "string_match": {"safe_regex": {"regex": m.regex}}}))
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
                merge(&mut envoy_route, &self.route_patch(&route.name).patch.value);
                envoy_route
            })
            .collect();

        let extension = self.extension_config();
        let discovered = &self
            .patch(ApplyTo::HttpFilter, Operation::InsertBefore)
            .patch
            .value;
        let mut typed_config = extension["typed_config"].clone();
        typed_config["config"]["vm_config"]["code"] = local_code(wasm);
        let wasm_filter = json!({"name": discovered["name"], "typed_config": typed_config});

        let mut http_filters = vec![
            self.patch(ApplyTo::HttpFilter, Operation::InsertFirst)
                .patch
                .value
                .clone(),
            wasm_filter,
        ];
        http_filters.push(router());

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
}

#[test]
fn istio_manifest_is_consistent() {
    use istio::{ApplyTo, Context, Operation};
    let m = istio_manifest(ISTIO);
    assert_eq!(m.gateway.api_version, "networking.istio.io/v1");
    assert_eq!(m.virtual_service.api_version, "networking.istio.io/v1");
    assert_eq!(m.envoy_filter.api_version, "networking.istio.io/v1alpha3");
    // One namespace and one gateway workload for everything.
    for namespace in [
        &m.gateway.metadata.namespace,
        &m.virtual_service.metadata.namespace,
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
    let sub_filter = &insert
        .matches
        .as_ref()
        .unwrap()
        .listener
        .as_ref()
        .unwrap()
        .filter_chain
        .filter;
    assert_eq!(sub_filter.name, HCM_NAME);
    assert_eq!(
        sub_filter.sub_filter.as_ref().unwrap().name,
        "envoy.filters.http.router"
    );
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
        steering_headers(settings)
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
        json!({"route": {"cluster": super::DECODE_CLUSTER}})
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
        buffer_limit_bytes(settings.max_body_bytes).unwrap()
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
    assert_eq!(envoy_routes[1]["route"]["cluster"], super::DECODE_CLUSTER);
}

#[test]
fn istio_clusters_are_the_bootstrap_clusters() {
    let m = istio_manifest(ISTIO);
    assert_eq!(
        Value::Array(m.clusters()),
        rendered_clusters(&m.plugin_config())
    );
}

#[test]
fn envoy_accepts_the_istio_fragments() {
    let m = istio_manifest(ISTIO);
    let stub = stub_wasm();
    let mut wasms = vec![stub.path().to_owned()];
    wasms.extend(real_wasm());
    for wasm in wasms {
        let yaml = bootstrap(m.listener(&wasm), m.clusters());
        validate(&envoy(), &yaml).unwrap_or_else(|e| panic!("{e:#}\n{yaml}"));
    }
}

#[test]
fn a_misspelt_istio_field_is_refused() {
    let bad = ISTIO.replace("workloadSelector:", "workloadSelectors:");
    let docs = documents(&bad);
    let err = serde_json::from_value::<Resource<istio::EnvoyFilterSpec>>(
        find(&docs, "EnvoyFilter").clone(),
    )
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
    let err = validate(&envoy(), &bootstrap(m.listener(stub.path()), m.clusters())).unwrap_err();
    assert!(
        format!("{err:#}").contains("allow_on_header_stop_iteration"),
        "{err:#}"
    );
}

// ---------------------------------------------------------------------------------------
// Envoy Gateway

struct EnvoyGatewayManifest {
    gateway: Resource<eg::GatewaySpec>,
    route: Resource<eg::HttpRouteSpec>,
    extension: Resource<eg::ExtensionPolicySpec>,
    traffic: Resource<eg::ClientTrafficPolicySpec>,
    patch: Resource<eg::PatchPolicySpec>,
}

fn envoy_gateway_manifest(text: &str) -> EnvoyGatewayManifest {
    let docs = documents(text);
    assert_eq!(docs.len(), 5);
    EnvoyGatewayManifest {
        gateway: typed(find(&docs, "Gateway")),
        route: typed(find(&docs, "HTTPRoute")),
        extension: typed(find(&docs, "EnvoyExtensionPolicy")),
        traffic: typed(find(&docs, "ClientTrafficPolicy")),
        patch: typed(find(&docs, "EnvoyPatchPolicy")),
    }
}

impl EnvoyGatewayManifest {
    fn plugin_config(&self) -> String {
        self.extension.spec.wasm[0].config.to_string()
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
    fn wasm_ir_name(&self) -> String {
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

    fn cluster_patches(&self) -> Vec<&eg::JsonPatch> {
        self.patch
            .spec
            .json_patches
            .iter()
            .filter(|p| p.kind == eg::ResourceType::Cluster)
            .collect()
    }

    fn clusters(&self) -> Vec<Value> {
        self.cluster_patches()
            .iter()
            .map(|p| p.operation.value.clone().unwrap())
            .collect()
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
                            eg::HeaderMatchType::Exact => json!({"exact": h.value}),
                            eg::HeaderMatchType::RegularExpression => {
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
                })
            })
            .collect();
        let hcm = json!({
            "@type": HCM_TYPE,
            "stat_prefix": "http-80",
            "stream_idle_timeout": self.traffic.spec.timeout.http.stream_idle_timeout,
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
            "http_filters": [wasm_filter, router()],
        });
        json!({
            "name": self.listener_name(),
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10080}},
            "per_connection_buffer_limit_bytes": quantity_bytes(&self.traffic.spec.connection.buffer_limit),
            "default_filter_chain": {"filters": [{"name": HCM_NAME, "typed_config": hcm}]},
        })
    }

    /// The generated listener with the EnvoyPatchPolicy's listener and route patches applied.
    fn patched_listener(&self, wasm: &Path) -> Value {
        let mut listener = self.generated_listener(wasm);
        for patch in &self.patch.spec.json_patches {
            let target = match patch.kind {
                eg::ResourceType::Cluster => continue,
                eg::ResourceType::Listener => &mut listener,
                eg::ResourceType::RouteConfiguration => {
                    &mut listener["default_filter_chain"]["filters"][0]["typed_config"]["route_config"]
                }
                eg::ResourceType::ClusterLoadAssignment => panic!("no endpoint patch expected"),
            };
            assert_eq!(target["name"], patch.name.as_str(), "patch target name");
            apply_json_patch(target, &patch.operation);
        }
        listener
    }
}

/// One EnvoyPatchPolicy operation on `doc`: `add` at each node `jsonPath` selects, `path`
/// appended (Envoy Gateway's semantics; a `jsonPath` that selects nothing is an error).
fn apply_json_patch(doc: &mut Value, operation: &eg::JsonPatchOperation) {
    assert_eq!(operation.op, eg::JsonPatchOp::Add, "only add is used");
    let json_path = operation.json_path.as_deref().expect("jsonPath");
    let pointers = select(doc, json_path);
    assert!(!pointers.is_empty(), "jsonPath {json_path} selects nothing");
    for pointer in pointers {
        let node = doc.pointer_mut(&pointer).unwrap();
        let key = operation.path.trim_start_matches('/');
        assert!(
            !key.contains('/'),
            "one key appended to the selected node: {key}"
        );
        node.as_object_mut()
            .unwrap()
            .insert(key.to_owned(), operation.value.clone().unwrap());
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
        &m.extension.api_version,
        &m.traffic.api_version,
        &m.patch.api_version,
    ] {
        assert_eq!(api_version, "gateway.envoyproxy.io/v1alpha1");
    }
    let namespace = &m.gateway.metadata.namespace;
    for other in [
        &m.route.metadata.namespace,
        &m.extension.metadata.namespace,
        &m.traffic.metadata.namespace,
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
    assert!(matches!(m.patch.spec.kind, eg::PatchType::JsonPatch));

    let wasm = &m.extension.spec.wasm;
    assert_eq!(wasm.len(), 1, "the flag patch names wasm/0");
    assert!(!wasm[0].fail_open);
    assert_eq!(wasm[0].root_id, "pinroute");
    let code = &wasm[0].code;
    let sha256 = match code.kind {
        eg::WasmCodeSourceType::Image => code.image.as_ref().unwrap().sha256.clone(),
        eg::WasmCodeSourceType::Http => code.http.as_ref().unwrap().sha256.clone(),
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
        steering_headers(settings)
    );
    assert_eq!(
        quantity_bytes(&m.traffic.spec.connection.buffer_limit),
        u64::from(buffer_limit_bytes(settings.max_body_bytes).unwrap())
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
        assert_eq!(patch.operation.op, eg::JsonPatchOp::Add);
        assert_eq!(patch.operation.path, "");
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
    let config = &hcm["http_filters"][0]["typed_config"]["config"];
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
        json!({"cluster": super::DECODE_CLUSTER, "timeout": "300s"})
    );
}

#[test]
fn envoy_gateway_clusters_are_the_bootstrap_clusters() {
    let m = envoy_gateway_manifest(ENVOY_GATEWAY);
    assert_eq!(
        Value::Array(m.clusters()),
        rendered_clusters(&m.plugin_config())
    );
}

#[test]
fn envoy_accepts_the_envoy_gateway_fragments() {
    let m = envoy_gateway_manifest(ENVOY_GATEWAY);
    let stub = stub_wasm();
    let mut wasms = vec![stub.path().to_owned()];
    wasms.extend(real_wasm());
    for wasm in wasms {
        let yaml = bootstrap(m.patched_listener(&wasm), m.clusters());
        validate(&envoy(), &yaml).unwrap_or_else(|e| panic!("{e:#}\n{yaml}"));
    }
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
    let err = serde_json::from_value::<Resource<eg::ExtensionPolicySpec>>(
        find(&docs, "EnvoyExtensionPolicy").clone(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("failopen"), "{err}");
}

// ---------------------------------------------------------------------------------------
// Both

#[test]
fn both_manifests_configure_the_filter_alike() {
    let istio = Config::from_json(istio_manifest(ISTIO).plugin_config().as_bytes()).unwrap();
    let eg = Config::from_json(
        envoy_gateway_manifest(ENVOY_GATEWAY)
            .plugin_config()
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(istio, eg);
}

/// Every YAML file under `envoy/istio/` and `envoy/envoy-gateway/` parses and is one of the
/// two manifests checked above (a new file needs its own checks).
#[test]
fn every_manifest_file_is_checked() {
    for (dir, expected) in [
        ("envoy/istio", ISTIO),
        ("envoy/envoy-gateway", ENVOY_GATEWAY),
    ] {
        let mut files: Vec<PathBuf> = fs::read_dir(repo_root().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["pinroute.yaml"], "{dir}");
        let text = fs::read_to_string(&files[0]).unwrap();
        assert_eq!(text, expected);
        for doc in documents(&text) {
            assert!(
                doc["apiVersion"].is_string() && doc["kind"].is_string(),
                "{doc}"
            );
            assert!(doc["metadata"]["name"].is_string(), "{doc}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Published schemas (npm)

/// Packages shipping JSON-schema validators generated from Istio's CRDs and the Gateway API.
const SCHEMA_PACKAGES: [(&str, &str); 2] = [
    ("@kubernetes-models/istio", "3.0.1"),
    ("@kubernetes-models/gateway-api", "2.0.0"),
];
const SCHEMA_DIR: &str = ".cache/k8s-models";

/// Validates each document it is given (a JSON array on stdin) whose kind one of the
/// packages models; prints `OK`, `FAIL` or `SKIP` per document.
const VALIDATE_MJS: &str = r#"
import { readFileSync } from "node:fs";
const models = {
  "networking.istio.io/v1/Gateway": ["@kubernetes-models/istio/networking.istio.io/v1/Gateway", "Gateway"],
  "networking.istio.io/v1/VirtualService": ["@kubernetes-models/istio/networking.istio.io/v1/VirtualService", "VirtualService"],
  "networking.istio.io/v1alpha3/EnvoyFilter": ["@kubernetes-models/istio/networking.istio.io/v1alpha3/EnvoyFilter", "EnvoyFilter"],
  "gateway.networking.k8s.io/v1/Gateway": ["@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/Gateway", "Gateway"],
  "gateway.networking.k8s.io/v1/HTTPRoute": ["@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/HTTPRoute", "HTTPRoute"],
};
const docs = JSON.parse(readFileSync(0, "utf8"));
for (const doc of docs) {
  const key = `${doc.apiVersion}/${doc.kind}`;
  const model = models[key];
  if (!model) { console.log(`SKIP ${key} ${doc.metadata.name}`); continue; }
  const module = await import(model[0]);
  try {
    new module[model[1]](doc).validate();
    console.log(`OK ${key} ${doc.metadata.name}`);
  } catch (e) {
    console.log(`FAIL ${key} ${doc.metadata.name}: ${e.message}`);
  }
}
"#;

static SCHEMA_INSTALL: Mutex<()> = Mutex::new(());

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn installed_version(dir: &Path, package: &str) -> Option<String> {
    let manifest = dir.join("node_modules").join(package).join("package.json");
    let text = fs::read_to_string(manifest).ok()?;
    let json: Value = serde_json::from_str(&text).ok()?;
    json["version"].as_str().map(str::to_owned)
}

/// The schema packages in `.cache/k8s-models`, installed with npm when missing; `None`
/// (test skipped) without node and npm.
fn schema_packages() -> Option<PathBuf> {
    if !have("node") || !have("npm") {
        eprintln!("skipped: node and npm are needed for the published schemas");
        return None;
    }
    let dir = repo_root().join(SCHEMA_DIR);
    let ready = |dir: &Path| {
        SCHEMA_PACKAGES
            .iter()
            .all(|(name, version)| installed_version(dir, name).as_deref() == Some(*version))
    };
    if ready(&dir) {
        return Some(dir);
    }
    let _guard = SCHEMA_INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    fs::create_dir_all(&dir).unwrap();
    let lock = File::create(dir.with_extension("lock")).unwrap();
    lock.lock().unwrap();
    if !ready(&dir) {
        let dependencies: serde_json::Map<String, Value> = SCHEMA_PACKAGES
            .iter()
            .map(|(name, version)| ((*name).to_owned(), json!(version)))
            .collect();
        let package = json!({"name": "pinroute-k8s-models", "private": true, "type": "module",
                             "dependencies": dependencies});
        fs::write(dir.join("package.json"), package.to_string()).unwrap();
        eprintln!(
            "pinroute-harness: npm install {SCHEMA_PACKAGES:?} into {}",
            dir.display()
        );
        let status = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "npm install in {} failed", dir.display());
        assert!(ready(&dir));
    }
    Some(dir)
}

/// Runs the validators over `docs`; the lines they print.
fn schema_verdicts(dir: &Path, docs: &[Value]) -> Vec<String> {
    let script = dir.join("validate.mjs");
    fs::write(&script, VALIDATE_MJS).unwrap();
    let mut child = Command::new("node")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(Value::Array(docs.to_vec()).to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "node failed");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn istio_and_gateway_api_documents_pass_the_published_schemas() {
    let Some(dir) = schema_packages() else { return };
    let mut docs = documents(ISTIO);
    docs.extend(documents(ENVOY_GATEWAY));
    let verdicts = schema_verdicts(&dir, &docs);
    let expected = [
        "OK networking.istio.io/v1/Gateway pinroute",
        "OK networking.istio.io/v1/VirtualService pinroute",
        "OK networking.istio.io/v1alpha3/EnvoyFilter pinroute",
        "OK gateway.networking.k8s.io/v1/Gateway pinroute",
        "OK gateway.networking.k8s.io/v1/HTTPRoute pinroute",
        // No registry package ships Envoy Gateway's CRD schemas: the typed checks above.
        "SKIP gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy pinroute",
        "SKIP gateway.envoyproxy.io/v1alpha1/ClientTrafficPolicy pinroute",
        "SKIP gateway.envoyproxy.io/v1alpha1/EnvoyPatchPolicy pinroute",
    ];
    assert_eq!(verdicts, expected);
}

#[test]
fn the_published_schemas_catch_bad_values() {
    let Some(dir) = schema_packages() else { return };
    let bad_istio = ISTIO.replace("applyTo: HTTP_ROUTE", "applyTo: ROUTE");
    let bad_route = ENVOY_GATEWAY.replace("request: 300s", "request: 5 minutes");
    let docs = [
        find(&documents(&bad_istio), "EnvoyFilter").clone(),
        find(&documents(&bad_route), "HTTPRoute").clone(),
    ];
    let verdicts = schema_verdicts(&dir, &docs);
    assert_eq!(verdicts.len(), 2);
    assert!(
        verdicts[0].starts_with("FAIL") && verdicts[0].contains("applyTo"),
        "{verdicts:?}"
    );
    assert!(
        verdicts[1].starts_with("FAIL") && verdicts[1].contains("timeouts/request"),
        "{verdicts:?}"
    );
}

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
//!   `Config::from_json` accepts it), and the clusters are those of `envoy/bootstrap.yaml`
//!   but for their TLS: every cluster that reaches workers speaks the mesh's mutual TLS
//!   (Istio) or the TLS of the decode Service's BackendTLSPolicy (Envoy Gateway).
//! - The Envoy fragments are assembled into a static bootstrap the way each control plane
//!   assembles them (Istio: ECDS config inlined with the module made local, as istio-agent
//!   does; Envoy Gateway: its filter and route naming, then the EnvoyPatchPolicy applied) and
//!   checked with `envoy --mode validate`, with stand-ins for the control plane's secret
//!   sources (Istio's `sds-grpc` cluster; Envoy Gateway's served secrets, as static ones).

// Some typed fields are only parsed, for their names and types: never read.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

mod envoy_gateway;
mod istio;
mod picker;
mod published_schemas;

use std::fs;
use std::path::{Path, PathBuf};

use pinroute::policy::config::{Config, Settings};
use pinroute::policy::headers::POOL_HEADER;
use pinroute::policy::picker::PICKER_HEADERS;
use pinroute_harness::envoy::test_support::{envoy, real_wasm, stub_wasm};
use pinroute_harness::envoy::{
    BootstrapOptions, DECODE_CLUSTER, DEFAULT_ROUTE_TIMEOUT, EdgeOptions, buffer_limit_bytes,
    render_bootstrap, repo_root, validate,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use envoy_gateway::{ENVOY_GATEWAY, envoy_gateway_manifest};
use istio::{ISTIO, istio_manifest};
use picker::{ENVOY_GATEWAY_PICKER, ISTIO_PICKER, InferencePoolSpec, picker_member, with_member};

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
// ---------------------------------------------------------------------------------------
// Small helpers

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

/// What the manifests' edge removes from every request: the steering headers, then the
/// headers an endpoint picker sets (only the picker's copies may reach the filter).
fn edge_removals(settings: &Settings) -> Vec<&str> {
    let mut headers = steering_headers(settings).to_vec();
    headers.extend_from_slice(PICKER_HEADERS);
    headers
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
            DECODE_CLUSTER,
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
            buffer_limit_bytes(settings).unwrap()
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
    let mut members: Vec<String> = pool["load_assignment"]["endpoints"][0]["lb_endpoints"]
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
    let mut expected: Vec<String> = config.pool_members.iter().map(|a| a.to_string()).collect();
    members.sort();
    expected.sort();
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

/// `envoy/bootstrap.yaml` rendered for the same plugin configuration, with the defaults of
/// `envoy-config`.
fn rendered_bootstrap(plugin_config: &str) -> Value {
    let yaml = render_bootstrap(&BootstrapOptions {
        listen: "127.0.0.1:10000".parse().unwrap(),
        admin: "127.0.0.1:9901".parse().unwrap(),
        wasm: PathBuf::from("/x.wasm"),
        plugin_config: plugin_config.to_owned(),
        route_timeout: DEFAULT_ROUTE_TIMEOUT,
        edge: EdgeOptions::default(),
    })
    .unwrap();
    documents(&yaml).remove(0)
}

/// The clusters of the rendered bootstrap.
fn rendered_clusters(plugin_config: &str) -> Value {
    rendered_bootstrap(plugin_config)["static_resources"]["clusters"].clone()
}

/// The rendered bootstrap's HTTP connection manager.
fn rendered_hcm(plugin_config: &str) -> Value {
    rendered_bootstrap(plugin_config)["static_resources"]["listeners"][0]["filter_chains"][0]
        ["filters"][0]["typed_config"]
        .clone()
}

/// The settings of the connection manager a deployment must share with the bootstrap:
/// request timeouts, header names with underscores refused, Envoy's answers as JSON.
const EDGE_HCM_FIELDS: [&str; 4] = [
    "request_headers_timeout",
    "request_timeout",
    "common_http_protocol_options",
    "local_reply_config",
];

/// Checks that `hcm` (a connection manager as Envoy receives it) has the bootstrap's edge
/// settings.
fn check_edge_hcm(hcm: &Value, plugin_config: &str) {
    let rendered = rendered_hcm(plugin_config);
    for field in EDGE_HCM_FIELDS {
        assert!(rendered.get(field).is_some(), "the bootstrap sets {field}");
        assert_eq!(hcm[field], rendered[field], "{field}");
    }
}

/// Checks that `policy` (an Envoy `CorsPolicy` as a control plane generates it) allows what
/// the bootstrap's allows: any origin, the same methods and headers, the same exposed
/// headers and preflight lifetime, and answers other origins' preflights itself.
fn check_cors(policy: &Value, plugin_config: &str) {
    let rendered = &rendered_bootstrap(plugin_config)["static_resources"]["listeners"][0]["filter_chains"]
        [0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["typed_per_filter_config"]
        ["envoy.filters.http.cors"];
    let list = |value: &Value| -> Vec<String> {
        value
            .as_str()
            .unwrap()
            .split(',')
            .map(|item| item.trim().to_owned())
            .collect()
    };
    for field in ["allow_methods", "allow_headers", "expose_headers"] {
        assert_eq!(list(&policy[field]), list(&rendered[field]), "{field}");
    }
    assert_eq!(policy["max_age"], rendered["max_age"]);
    assert_eq!(policy["forward_not_matching_preflights"], false);
    assert_eq!(
        rendered["allow_origin_string_match"],
        json!([{"exact": "*"}])
    );
    let any_origin = [
        json!({"exact": "*"}),
        json!({"safe_regex": {"regex": ".*"}}),
    ];
    assert!(
        policy["allow_origin_string_match"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| any_origin.contains(m)),
        "{policy}"
    );
}

/// Envoy's CORS filter, whose policies are the routes'.
fn cors_filter() -> Value {
    json!({
        "name": "envoy.filters.http.cors",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"},
    })
}

const CORS_POLICY_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy";

/// A static bootstrap around one listener and the given clusters. The node is named, as
/// every control plane's bootstrap names it: Envoy requires that of an SDS source.
fn bootstrap_document(listener: Value, clusters: Vec<Value>) -> Value {
    json!({
        "node": {"id": "pinroute-manifest-test", "cluster": "pinroute-manifest-test"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 9901}}},
        "static_resources": {"listeners": [listener], "clusters": clusters},
    })
}

fn bootstrap(listener: Value, clusters: Vec<Value>) -> String {
    yaml(&bootstrap_document(listener, clusters))
}

fn yaml(bootstrap: &Value) -> String {
    // JSON is YAML.
    serde_json::to_string_pretty(bootstrap).unwrap()
}

const TLS_SOCKET: &str = "envoy.transport_sockets.tls";
const UPSTREAM_TLS_TYPE: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";

/// The `UpstreamTlsContext` of `cluster`'s TLS transport socket.
fn upstream_tls_context(cluster: &Value) -> &Value {
    let socket = &cluster["transport_socket"];
    assert_eq!(
        socket["name"], TLS_SOCKET,
        "{}: no TLS socket",
        cluster["name"]
    );
    let context = &socket["typed_config"];
    assert_eq!(context["@type"], UPSTREAM_TLS_TYPE, "{}", cluster["name"]);
    context
}

/// The manifests' clusters with their TLS removed, which is the mesh's or the gateway's
/// where the rendered bootstrap has none (checked per manifest).
fn without_tls(clusters: Vec<Value>) -> Value {
    clusters
        .iter()
        .map(|cluster| without(cluster, &["transport_socket"]))
        .collect()
}

fn without(value: &Value, keys: &[&str]) -> Value {
    let mut value = value.clone();
    for key in keys {
        value.as_object_mut().unwrap().remove(*key);
    }
    value
}

/// Envoy validates the bootstrap `assemble` builds around a module, with a stub module and
/// with the real filter (when built).
fn envoy_accepts(assemble: impl Fn(&Path) -> String) {
    let stub = stub_wasm();
    let mut wasms = vec![stub.path().to_owned()];
    wasms.extend(real_wasm());
    for wasm in wasms {
        let yaml = assemble(&wasm);
        validate(&envoy(), &yaml).unwrap_or_else(|e| panic!("{e:#}\n{yaml}"));
    }
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
/// manifests checked here and in `picker.rs` (a new file needs its own checks).
#[test]
fn every_manifest_file_is_checked() {
    for (dir, expected) in [
        ("envoy/istio", [ISTIO_PICKER, ISTIO]),
        ("envoy/envoy-gateway", [ENVOY_GATEWAY_PICKER, ENVOY_GATEWAY]),
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
        assert_eq!(names, ["picker.yaml", "pinroute.yaml"], "{dir}");
        for (file, expected) in files.iter().zip(expected) {
            let text = fs::read_to_string(file).unwrap();
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
}

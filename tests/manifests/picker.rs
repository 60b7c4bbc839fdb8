//! The picker overlays (`envoy/istio/picker.yaml`, `envoy/envoy-gateway/picker.yaml`):
//! pinroute behind an InferencePool's endpoint picker, applied together with each
//! `pinroute.yaml`.
//!
//! - The InferencePool parses into the Inference Extension's v1 fields
//!   (`inference.networking.k8s.io/v1`, `api/v1/inferencepool_types.go`); unknown fields are
//!   refused. No registry package ships its schema.
//! - The plugin configuration with the overlay's `picker` member is accepted by the filter.
//! - The `ext_proc` and `header_to_metadata` filters are those `envoy-config --picker`
//!   renders on plain Envoy (the chain the end-to-end suites run), and the assembled chain
//!   orders them as it does: edge removal, CORS, `ext_proc`, `header_to_metadata`, pinroute,
//!   router.
//! - Names agree: the EPP Service of the pool is the cluster's (Istio) or the Backend's
//!   (Envoy Gateway) address; Envoy validates the assembled listener and clusters.

use std::collections::BTreeMap;
use std::path::Path;

use pinroute::policy::picker::{Allowed, Protocol};
use serde::Deserialize;
use serde_json::{Value, json};

use super::envoy_gateway::{EnvoyGatewayManifest, envoy_gateway_behind_picker};
use super::istio::{ApplyTo, Operation, istio_behind_picker};
use super::{
    ENVOY_GATEWAY, ISTIO, Resource, documents, envoy_accepts, find, plugin_config,
    rendered_bootstrap, without,
};

pub const ISTIO_PICKER: &str = include_str!("../../envoy/istio/picker.yaml");
pub const ENVOY_GATEWAY_PICKER: &str = include_str!("../../envoy/envoy-gateway/picker.yaml");

const EXT_PROC: &str = "envoy.filters.http.ext_proc";
const HEADER_TO_METADATA: &str = "envoy.filters.http.header_to_metadata";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InferencePoolSpec {
    pub selector: LabelSelector,
    pub target_ports: Vec<PoolPort>,
    pub endpoint_picker_ref: EndpointPickerRef,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolPort {
    pub number: u16,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndpointPickerRef {
    pub group: String,
    pub kind: String,
    pub name: String,
    pub port: PoolPort,
    pub failure_mode: FailureMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum FailureMode {
    FailOpen,
    FailClose,
}

/// The `picker` member an overlay's header comment asks to add to the plugin
/// configuration (a JSON or YAML flow line after `#   `).
pub fn picker_member(overlay: &str) -> Value {
    let line = overlay
        .lines()
        .filter_map(|line| line.strip_prefix("#   "))
        .find(|line| line.starts_with("\"picker\":") || line.starts_with("picker:"))
        .expect("the overlay names the picker member to add");
    let member: Value = serde_norway::from_str(line).unwrap();
    member["picker"].clone()
}

/// The plugin configuration `json` with `picker` set to `member`.
pub fn with_member(json: &str, member: &Value) -> String {
    let mut config: Value = serde_json::from_str(json).unwrap();
    config["picker"] = member.clone();
    config.to_string()
}

/// The Kubernetes DNS name and port of the pool's picker Service.
fn picker_service(pool: &Resource<InferencePoolSpec>) -> (String, u16) {
    let picker = &pool.spec.endpoint_picker_ref;
    assert_eq!(
        (picker.group.as_str(), picker.kind.as_str()),
        ("", "Service")
    );
    let host = format!(
        "{}.{}.svc.cluster.local",
        picker.name, pool.metadata.namespace
    );
    (host, picker.port.number)
}

/// Checks the pool and the plugin configuration behind it.
fn check_pool(pool: &Resource<InferencePoolSpec>, plugin: &str, namespace: &str) {
    assert_eq!(pool.api_version, "inference.networking.k8s.io/v1");
    assert_eq!(pool.metadata.namespace, namespace);
    assert!(!pool.spec.selector.match_labels.is_empty());
    assert!((1..=8).contains(&pool.spec.target_ports.len()));
    assert_eq!(
        pool.spec.endpoint_picker_ref.failure_mode,
        FailureMode::FailClose,
        "a request the picker did not see is never routed"
    );
    let config = plugin_config(plugin);
    let picker = config.settings.picker.expect("picker mode is on");
    assert!(matches!(picker.protocol, Protocol::LlmD));
    assert!(picker.allow.contains(&Allowed::Registry));
    assert!(
        picker.allow.iter().any(|a| matches!(a, Allowed::Range(_))),
        "the pool's pod range is allowed"
    );
}

/// The bootstrap `envoy-config --picker` renders for `plugin` with the picker at `address`.
fn rendered_picker_bootstrap(plugin: &str, address: &str) -> Value {
    let mut config: Value = serde_json::from_str(plugin).unwrap();
    config["picker"]["address"] = json!(address);
    rendered_bootstrap(&config.to_string())
}

fn rendered_filter(bootstrap: &Value, name: &str) -> Value {
    let filters = &bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["http_filters"];
    let found: Vec<&Value> = filters
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "the rendered bootstrap has one {name}");
    found[0]["typed_config"].clone()
}

fn filter_names(listener: &Value, chain: &str) -> Vec<String> {
    listener[chain]["filters"][0]["typed_config"]["http_filters"]
        .as_array()
        .or_else(|| listener[chain][0]["filters"][0]["typed_config"]["http_filters"].as_array())
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_owned())
        .collect()
}

// ---------------------------------------------------------------------------------------
// Istio

#[test]
fn the_istio_picker_overlay_is_the_plain_envoy_chain() {
    let m = istio_behind_picker(ISTIO, ISTIO_PICKER);
    let picker = m.picker.as_ref().unwrap();
    let overlay = &picker.envoy_filter;
    assert_eq!(overlay.api_version, "networking.istio.io/v1alpha3");
    assert_eq!(
        overlay.metadata.namespace,
        m.envoy_filter.metadata.namespace
    );
    assert_eq!(
        overlay.spec.workload_selector.labels,
        m.envoy_filter.spec.workload_selector.labels
    );
    assert!(
        overlay.spec.priority < m.envoy_filter.spec.priority,
        "applied first, so that pinroute lands after header_to_metadata"
    );
    check_pool(
        &picker.pool,
        &m.plugin_config(),
        &m.gateway.metadata.namespace,
    );
    assert_eq!(
        m.peer_authentication.spec.selector.match_labels, picker.pool.spec.selector.match_labels,
        "STRICT mutual TLS covers the pods the EPP chooses among"
    );

    let (host, port) = picker_service(&picker.pool);
    let rendered = rendered_picker_bootstrap(&m.plugin_config(), &format!("{host}:{port}"));
    let patches = &overlay.spec.config_patches;
    let inserted: Vec<&Value> = patches
        .iter()
        .filter(|p| p.apply_to == ApplyTo::HttpFilter)
        .inspect(|p| assert_eq!(p.patch.operation, Operation::InsertBefore))
        .map(|p| &p.patch.value)
        .collect();
    assert_eq!(inserted.len(), 2);
    for filter in inserted {
        let name = filter["name"].as_str().unwrap();
        assert_eq!(
            filter["typed_config"],
            rendered_filter(&rendered, name),
            "{name}"
        );
    }

    // The picker's cluster is the rendered one but for its address and TLS (the EPP
    // serves TLS); its address is the pool's picker Service.
    let clusters = m.clusters();
    let cluster = clusters.last().unwrap();
    let rendered_cluster = rendered["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .last()
        .unwrap();
    let address_and_tls = ["type", "load_assignment", "transport_socket"];
    assert_eq!(
        without(cluster, &address_and_tls),
        without(rendered_cluster, &address_and_tls)
    );
    assert_eq!(cluster["type"], "STRICT_DNS");
    let socket = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        ["socket_address"];
    assert_eq!(
        (
            socket["address"].as_str().unwrap(),
            socket["port_value"].as_u64()
        ),
        (host.as_str(), Some(u64::from(port)))
    );
    assert_eq!(
        cluster["transport_socket"]["typed_config"]["sni"],
        host.as_str()
    );

    let listener = m.listener(Path::new("/x.wasm"));
    assert_eq!(
        filter_names(&listener, "filter_chains"),
        [
            "pinroute.strip_steering_headers",
            "envoy.filters.http.cors",
            EXT_PROC,
            HEADER_TO_METADATA,
            "pinroute",
            "envoy.filters.http.router",
        ]
    );
}

#[test]
fn envoy_accepts_the_istio_picker_fragments() {
    let m = istio_behind_picker(ISTIO, ISTIO_PICKER);
    envoy_accepts(|wasm| m.envoy_bootstrap(wasm));
}

// ---------------------------------------------------------------------------------------
// Envoy Gateway

#[test]
fn the_envoy_gateway_picker_overlay_is_the_plain_envoy_chain() {
    let m = envoy_gateway_behind_picker(ENVOY_GATEWAY, ENVOY_GATEWAY_PICKER);
    let picker = m.picker.as_ref().unwrap();
    let namespace = &m.gateway.metadata.namespace;
    check_pool(&picker.pool, &m.plugin_config(), namespace);
    for (api_version, other) in [
        (
            &picker.backend.api_version,
            &picker.backend.metadata.namespace,
        ),
        (
            &picker.extension.api_version,
            &picker.extension.metadata.namespace,
        ),
        (&picker.patch.api_version, &picker.patch.metadata.namespace),
    ] {
        assert_eq!(api_version, "gateway.envoyproxy.io/v1alpha1");
        assert_eq!(other, namespace);
    }
    let gateway = &m.gateway.metadata.name;
    for target in picker
        .extension
        .spec
        .target_refs
        .iter()
        .chain([&picker.patch.spec.target_ref])
    {
        assert_eq!(target.name, *gateway);
    }

    // The EnvoyExtensionPolicy calls the Backend, which is the pool's picker Service.
    let (host, port) = picker_service(&picker.pool);
    assert!(picker.extension.spec.wasm.is_empty());
    let ext_proc = &picker.extension.spec.ext_proc;
    assert_eq!(ext_proc.len(), 1);
    let backend_ref = &ext_proc[0].backend_refs[0];
    assert_eq!(
        (
            backend_ref.group.as_str(),
            backend_ref.kind.as_str(),
            &backend_ref.name
        ),
        (
            "gateway.envoyproxy.io",
            "Backend",
            &picker.backend.metadata.name
        )
    );
    let endpoint = &picker.backend.spec.endpoints[0].fqdn;
    assert_eq!(
        (endpoint.hostname.as_str(), endpoint.port),
        (host.as_str(), port)
    );

    // Its ext_proc filter, as Envoy Gateway translates it, is the rendered one but for the
    // cluster (and the message timeout, which FULL_DUPLEX_STREAMED does not apply); the
    // patch inserts the rendered header_to_metadata.
    let rendered = rendered_picker_bootstrap(&m.plugin_config(), &format!("{host}:{port}"));
    let listener = m.patched_listener(Path::new("/x.wasm"));
    let filters = &listener["default_filter_chain"]["filters"][0]["typed_config"]["http_filters"];
    let named = |name: &str| {
        filters
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("no {name}"))["typed_config"]
            .clone()
    };
    let rendered_ext_proc = rendered_filter(&rendered, EXT_PROC);
    let ext_proc_name = EnvoyGatewayManifest::ext_proc_filter_name(picker);
    let not_compared = ["grpc_service", "message_timeout"];
    assert_eq!(
        without(&named(&ext_proc_name), &not_compared),
        without(&rendered_ext_proc, &not_compared)
    );
    assert_eq!(
        named(HEADER_TO_METADATA),
        rendered_filter(&rendered, HEADER_TO_METADATA)
    );

    let wasm_filter = format!("envoy.filters.http.wasm/{}", m.wasm_ir_name());
    assert_eq!(
        filter_names(&listener, "default_filter_chain"),
        [
            "envoy.filters.http.cors",
            ext_proc_name.as_str(),
            HEADER_TO_METADATA,
            wasm_filter.as_str(),
            "envoy.filters.http.router",
        ]
    );
}

#[test]
fn envoy_accepts_the_envoy_gateway_picker_fragments() {
    let m = envoy_gateway_behind_picker(ENVOY_GATEWAY, ENVOY_GATEWAY_PICKER);
    let served = m.served_secrets();
    envoy_accepts(|wasm| m.envoy_bootstrap(wasm, &served));
}

// ---------------------------------------------------------------------------------------
// Both

#[test]
fn both_overlays_describe_the_same_pool_and_picker() {
    let istio = istio_behind_picker(ISTIO, ISTIO_PICKER);
    let eg = envoy_gateway_behind_picker(ENVOY_GATEWAY, ENVOY_GATEWAY_PICKER);
    let (istio, eg) = (istio.picker.unwrap(), eg.picker.unwrap());
    assert_eq!(istio.settings, eg.settings);
    assert_eq!(
        documents(ISTIO_PICKER)[0]["spec"],
        documents(ENVOY_GATEWAY_PICKER)[0]["spec"]
    );
}

#[test]
fn a_misspelt_pool_field_is_refused() {
    let bad = ISTIO_PICKER.replace("endpointPickerRef:", "endpointPicker:");
    let docs = documents(&bad);
    let err =
        serde_json::from_value::<Resource<InferencePoolSpec>>(find(&docs, "InferencePool").clone())
            .unwrap_err();
    assert!(err.to_string().contains("endpointPicker"), "{err}");
}

//! Shared by the Envoy tests, here and (feature `test-support`) in `pinroute-tests`:
//! registries, options, the Envoy binary and wasm modules.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tempfile::NamedTempFile;

use super::{
    BootstrapOptions, DEFAULT_ROUTE_TIMEOUT, EdgeOptions, default_wasm_path, envoy_binary,
    repo_root,
};

pub const DISAGGREGATED_REGISTRY: &str = r#"{"workers": [
    {"id": 101, "role": "prefill", "address": "127.0.0.1:8101", "dp_size": 1},
    {"id": 201, "role": "decode", "address": "127.0.0.1:8201", "dp_size": 2}
]}"#;

/// Settings chosen to show in the bootstrap, and a cluster name hostile to YAML.
pub const AGGREGATED_REGISTRY: &str = r#"{
    "workers": [{"id": 301, "role": "aggregated", "address": "[::1]:8301"}],
    "upstream_header": "x-custom-upstream",
    "prefill_cluster": "prefill: #1 'odd' \"name\"",
    "max_body_bytes": 1048576
}"#;

/// The protocols of picker mode's `picker.protocol`.
pub const PICKER_PROTOCOLS: [&str; 3] = ["gie", "llm-d", "dynamo"];

/// `registry` (a JSON object) in picker mode with `protocol`, the picker at `address`.
pub fn with_picker(registry: &str, protocol: &str, address: &str) -> String {
    let mut config: serde_json::Value = serde_json::from_str(registry).unwrap();
    config["picker"] = serde_json::json!({
        "protocol": protocol, "allow": ["registry", "10.0.0.0/8"], "address": address,
    });
    config.to_string()
}

pub fn options(plugin_config: &str, wasm: &Path) -> BootstrapOptions {
    BootstrapOptions {
        listen: "127.0.0.1:10000".parse().unwrap(),
        admin: "127.0.0.1:9901".parse().unwrap(),
        wasm: wasm.to_owned(),
        plugin_config: plugin_config.to_owned(),
        route_timeout: DEFAULT_ROUTE_TIMEOUT,
        edge: EdgeOptions::default(),
    }
}

/// The project's Envoy, installed on first use.
pub fn envoy() -> PathBuf {
    static ENVOY: OnceLock<PathBuf> = OnceLock::new();
    ENVOY
        .get_or_init(|| envoy_binary(&repo_root()).expect("an Envoy binary"))
        .clone()
}

/// The built pinroute filter, if any (`cargo build --release --target wasm32-wasip1`).
pub fn real_wasm() -> Option<PathBuf> {
    let wasm = default_wasm_path();
    if wasm.is_file() {
        Some(wasm)
    } else {
        eprintln!("skipped: {} is not built", wasm.display());
        None
    }
}

/// A proxy-wasm module that loads in Envoy and does nothing: requests pass through it.
pub fn stub_wasm() -> NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".wasm").tempfile().unwrap();
    file.write_all(&stub_module()).unwrap();
    file
}

const I32: u8 = 0x7f;
const FUNC_TYPE: u8 = 0x60;
const END: u8 = 0x0b;
const I32_CONST: u8 = 0x41;

/// Exports the memory and the five functions Envoy calls to load a plugin; the others
/// (`proxy_on_request_headers`, ...) are absent, so Envoy continues past the filter.
fn stub_module() -> Vec<u8> {
    let types = [
        vec![FUNC_TYPE, 0, 0],                // 0: () -> ()
        vec![FUNC_TYPE, 1, I32, 1, I32],      // 1: (i32) -> i32
        vec![FUNC_TYPE, 2, I32, I32, 1, I32], // 2: (i32, i32) -> i32
        vec![FUNC_TYPE, 2, I32, I32, 0],      // 3: (i32, i32) -> ()
    ];
    // (export name, type, body)
    let functions: [(&str, u8, Vec<u8>); 5] = [
        ("proxy_abi_version_0_2_1", 0, vec![0, END]),
        (
            "proxy_on_memory_allocate",
            1,
            vec![0, I32_CONST, 0x80, 0x08, END],
        ), // 1024
        ("proxy_on_vm_start", 2, vec![0, I32_CONST, 1, END]), // true
        ("proxy_on_configure", 2, vec![0, I32_CONST, 1, END]), // true
        ("proxy_on_context_create", 3, vec![0, END]),
    ];
    let mut exports = vec![[name("memory"), vec![2, 0]].concat()];
    exports.extend(
        functions
            .iter()
            .zip(0u8..)
            .map(|((n, _, _), i)| [name(n), vec![0, i]].concat()),
    );
    let bodies = functions
        .iter()
        .map(|(_, _, body)| [vec![body.len() as u8], body.clone()].concat());
    [
        b"\0asm\x01\0\0\0".to_vec(),
        section(1, vector(types.to_vec())),
        section(
            3,
            vector(functions.iter().map(|(_, ty, _)| vec![*ty]).collect()),
        ),
        section(5, vector(vec![vec![0, 1]])), // one memory, at least one page
        section(7, vector(exports)),
        section(10, vector(bodies.collect())),
    ]
    .concat()
}

fn leb128(value: usize) -> Vec<u8> {
    pinroute::policy::otlp::varint(value as u64)
}

fn vector(items: Vec<Vec<u8>>) -> Vec<u8> {
    [leb128(items.len()), items.concat()].concat()
}

fn section(id: u8, payload: Vec<u8>) -> Vec<u8> {
    [vec![id], leb128(payload.len()), payload].concat()
}

fn name(text: &str) -> Vec<u8> {
    [leb128(text.len()), text.as_bytes().to_vec()].concat()
}

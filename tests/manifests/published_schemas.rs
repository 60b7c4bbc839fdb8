//! The Istio and Gateway API documents of the manifests (and their picker overlays) against the published schemas of
//! the npm packages `@kubernetes-models/istio` and `@kubernetes-models/gateway-api`.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use pinroute_harness::envoy::repo_root;
use serde_json::{Value, json};

use super::{ENVOY_GATEWAY, ENVOY_GATEWAY_PICKER, ISTIO, ISTIO_PICKER, documents, find};

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
  "security.istio.io/v1/PeerAuthentication": ["@kubernetes-models/istio/security.istio.io/v1/PeerAuthentication", "PeerAuthentication"],
  "gateway.networking.k8s.io/v1/Gateway": ["@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/Gateway", "Gateway"],
  "gateway.networking.k8s.io/v1/HTTPRoute": ["@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/HTTPRoute", "HTTPRoute"],
  "gateway.networking.k8s.io/v1/BackendTLSPolicy": ["@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/BackendTLSPolicy", "BackendTLSPolicy"],
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
    docs.extend(documents(ISTIO_PICKER));
    docs.extend(documents(ENVOY_GATEWAY));
    docs.extend(documents(ENVOY_GATEWAY_PICKER));
    let verdicts = schema_verdicts(&dir, &docs);
    let expected = [
        "OK networking.istio.io/v1/Gateway pinroute",
        "OK networking.istio.io/v1/VirtualService pinroute",
        "OK security.istio.io/v1/PeerAuthentication pinroute-workers",
        "OK networking.istio.io/v1alpha3/EnvoyFilter pinroute",
        // No registry package ships the Inference Extension's schemas: picker.rs.
        "SKIP inference.networking.k8s.io/v1/InferencePool vllm-pool",
        "OK networking.istio.io/v1alpha3/EnvoyFilter pinroute-picker",
        "OK gateway.networking.k8s.io/v1/Gateway pinroute",
        // No registry package ships Envoy Gateway's CRD schemas: the typed checks above.
        "SKIP gateway.envoyproxy.io/v1alpha1/EnvoyProxy pinroute",
        "OK gateway.networking.k8s.io/v1/BackendTLSPolicy pinroute-workers",
        "OK gateway.networking.k8s.io/v1/HTTPRoute pinroute",
        "SKIP gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy pinroute",
        "SKIP gateway.envoyproxy.io/v1alpha1/ClientTrafficPolicy pinroute",
        "SKIP gateway.envoyproxy.io/v1alpha1/SecurityPolicy pinroute",
        "SKIP gateway.envoyproxy.io/v1alpha1/EnvoyPatchPolicy pinroute",
        "SKIP inference.networking.k8s.io/v1/InferencePool vllm-pool",
        "SKIP gateway.envoyproxy.io/v1alpha1/Backend vllm-epp",
        "SKIP gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy pinroute-picker",
        "SKIP gateway.envoyproxy.io/v1alpha1/EnvoyPatchPolicy pinroute-picker",
    ];
    assert_eq!(verdicts, expected);
}

#[test]
fn the_published_schemas_catch_bad_values() {
    let Some(dir) = schema_packages() else { return };
    let bad_istio = ISTIO
        .replace("applyTo: HTTP_ROUTE", "applyTo: ROUTE")
        .replace("mode: STRICT", "mode: MUTUAL");
    let bad_eg = ENVOY_GATEWAY
        .replace("request: 300s", "request: 5 minutes")
        .replace("hostname: vllm.llm.svc", "hostname: vLLM_workers");
    let docs = [
        find(&documents(&bad_istio), "EnvoyFilter").clone(),
        find(&documents(&bad_eg), "HTTPRoute").clone(),
        find(&documents(&bad_istio), "PeerAuthentication").clone(),
        find(&documents(&bad_eg), "BackendTLSPolicy").clone(),
    ];
    let verdicts = schema_verdicts(&dir, &docs);
    assert_eq!(verdicts.len(), 4);
    for (verdict, field) in verdicts
        .iter()
        .zip(["applyTo", "timeouts/request", "mode", "hostname"])
    {
        assert!(
            verdict.starts_with("FAIL") && verdict.contains(field),
            "{verdicts:?}"
        );
    }
}

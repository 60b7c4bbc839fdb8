//! The OpenAI Python SDK, as a user runs it, against the gateway over HTTPS with a locally
//! made CA (`docs/deploy.md` §2.8): TLS to the client, an API key, mutual TLS to both
//! workers; the SDK gets its answers, its typed errors, and a stream.

use std::process::Command;

use pinroute_harness::certs::Usage;
use pinroute_harness::envoy::{
    ApiKey, ApiKeys, Callers, DEFAULT_IDENTITY_HEADER, ListenerTls, repo_root,
};
use pinroute_harness::venv::python_with;
use serde_json::Value;

use crate::start;
use crate::tls::{pki, worker_tls_spec};

const SDK_VENV: &str = ".cache/sdk-venv";
const REQUIREMENTS: &str = "tests/e2e/sdk/requirements.txt";
const SCRIPT: &str = "tests/e2e/sdk/openai_over_https.py";
const KEY: &str = "sk-sdk-0123456789";

#[tokio::test]
async fn the_openai_sdk_gets_answers_errors_and_streams_over_https() {
    let root = repo_root();
    let python = tokio::task::spawn_blocking({
        let root = root.clone();
        move || python_with(&root.join(SDK_VENV), &root.join(REQUIREMENTS))
    })
    .await
    .unwrap()
    .expect("installing the SDK venv");
    let pki = pki();
    let ca = pki.ca.cert_path();
    let listener = pki
        .ca
        .issue("listener", &["localhost"], Usage::Server)
        .unwrap();
    let mut spec = worker_tls_spec(&pki, &pki.worker, Some(&ca));
    spec.edge.tls = Some(ListenerTls {
        cert: listener.cert,
        key: listener.key,
        client_ca: None,
    });
    spec.edge.callers = Some(Callers::ApiKeys(ApiKeys {
        keys: vec![ApiKey {
            client: "sdk".into(),
            key: KEY.into(),
        }],
        identity_header: DEFAULT_IDENTITY_HEADER.into(),
    }));
    let deployment = start(spec).await;
    let base_url = format!("https://localhost:{}/v1", deployment.envoy.listen().port());
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(root.join(SCRIPT))
            .args([&base_url, &ca.display().to_string(), KEY])
            .env("NO_PROXY", "*")
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the SDK script failed: {stderr}");
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    let completion = &seen["completion"];
    assert_eq!(completion["status"], 200, "{seen}");
    assert!(completion["prefill"].is_string(), "two hops: {seen}");
    assert!(completion["decode"].is_string(), "{seen}");
    assert!(!completion["text"].as_str().unwrap().is_empty(), "{seen}");
    assert!(
        seen["chat_stream"]["chunks"].as_u64().unwrap() >= 2,
        "{seen}"
    );
    assert_eq!(seen["bad_pin"]["status"], 400, "{seen}");
    assert_eq!(seen["bad_pin"]["code"], "unknown_worker", "{seen}");
    assert_eq!(seen["unlisted_key"]["status"], 401, "{seen}");
    assert_eq!(seen["unlisted_key"]["code"], "invalid_api_key", "{seen}");
    let handshakes: u64 = deployment.fronts.iter().map(|(_, f)| f.handshakes()).sum();
    assert!(handshakes >= 2, "both hops over mutual TLS: {handshakes}");
}

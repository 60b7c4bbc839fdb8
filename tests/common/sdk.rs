//! The official Python SDKs as users run them: a script of `tests/` run with the SDKs of
//! `tests/e2e/sdk/requirements.txt` (installed once into `.cache/sdk-venv`), printing one JSON
//! object of what each call got.

use std::process::Command;

use pinroute_harness::envoy::repo_root;
use pinroute_harness::venv::python_with;
use serde_json::Value;

const SDK_VENV: &str = ".cache/sdk-venv";
const REQUIREMENTS: &str = "tests/e2e/sdk/requirements.txt";

/// Runs `script` (a path under the repository) with `args`: what it printed.
pub async fn run_sdk_script(script: &'static str, args: Vec<String>) -> Value {
    let root = repo_root();
    let output = tokio::task::spawn_blocking(move || {
        let python = python_with(&root.join(SDK_VENV), &root.join(REQUIREMENTS))
            .expect("installing the SDK venv");
        Command::new(python)
            .arg(root.join(script))
            .args(args)
            .env("NO_PROXY", "*")
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{script} failed: {stderr}");
    serde_json::from_slice(&output.stdout).unwrap()
}

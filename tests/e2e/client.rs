//! Requests to the gateway and what the tests read back.

use serde_json::{Value, json};

use crate::Deployment;
pub use crate::reply::Reply;

pub fn prompt() -> Value {
    json!({"model": "sim-model", "prompt": "The quick brown fox jumps over the lazy dog", "max_tokens": 5})
}

pub async fn send(
    deployment: &Deployment,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<String>,
) -> Reply {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut request = client.request(method, deployment.url(path));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body);
    }
    Reply::read(request.send().await.expect("the gateway answered")).await
}

pub async fn complete(deployment: &Deployment, headers: &[(&str, &str)], body: &Value) -> Reply {
    send(
        deployment,
        reqwest::Method::POST,
        "/v1/completions",
        headers,
        Some(body.to_string()),
    )
    .await
}

/// `POST path` with a JSON body.
pub async fn post(
    deployment: &Deployment,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> Reply {
    send(
        deployment,
        reqwest::Method::POST,
        path,
        headers,
        Some(body.to_string()),
    )
    .await
}

//! Requests to the gateway and what the tests read back.

use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use crate::Deployment;

pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub text: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The id in a `x-pinroute-*-worker` or `x-sim-*` header.
    pub fn number(&self, name: &str) -> Option<u64> {
        self.header(name).map(|v| v.parse().unwrap())
    }

    /// Asserts an OpenAI-shaped pinroute error and returns its message.
    pub fn error(&self, status: u16, code: &str) -> String {
        assert_eq!(self.status, status, "{}", self.text);
        let body = self.json();
        assert_eq!(body["error"]["code"], code, "{}", self.text);
        let kind = if status < 500 { "invalid_request_error" } else { "server_error" };
        assert_eq!(body["error"]["type"], kind, "{}", self.text);
        assert_eq!(self.header("x-pinroute-error-code"), Some(code));
        assert_eq!(self.header("content-type"), Some("application/json"));
        let message = body["error"]["message"].as_str().unwrap().to_string();
        assert!(!message.contains("127.0.0.1"), "an internal address leaked: {message}");
        message
    }
}

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
        request = request.header("content-type", "application/json").body(body);
    }
    reply(request.send().await.expect("the gateway answered")).await
}

pub async fn reply(response: reqwest::Response) -> Reply {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    Reply { status, headers, text }
}

pub async fn complete(deployment: &Deployment, headers: &[(&str, &str)], body: &Value) -> Reply {
    send(deployment, reqwest::Method::POST, "/v1/completions", headers, Some(body.to_string())).await
}

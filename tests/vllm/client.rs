//! Requests through the gateway (and, for controls, straight to one engine).

use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use crate::Gateway;

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

    pub fn worker(&self, hop: &str) -> Option<u64> {
        self.header(&format!("x-pinroute-{hop}-worker"))
            .map(|v| v.parse().unwrap())
    }

    pub fn assert_ok(&self, what: &str) {
        assert_eq!(self.status, 200, "{what}: {}", self.text);
    }

    /// Asserts an OpenAI-shaped pinroute error and returns its message.
    pub fn error(&self, status: u16, code: &str) -> String {
        assert_eq!(self.status, status, "{}", self.text);
        let body = self.json();
        assert_eq!(body["error"]["code"], code, "{}", self.text);
        assert_eq!(self.header("x-pinroute-error-code"), Some(code));
        let message = body["error"]["message"].as_str().unwrap().to_string();
        assert!(
            !message.contains("127.0.0.1"),
            "an internal address leaked: {message}"
        );
        message
    }
}

/// `POST <base><path>` with a JSON body and headers.
pub async fn post(gateway: &Gateway, url: String, headers: &[(&str, &str)], body: &Value) -> Reply {
    let mut request = gateway
        .http
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = match request.send().await {
        Ok(response) => response,
        Err(e) => {
            gateway.pair.ensure_running().expect("an engine exited");
            panic!("no answer: {e}");
        }
    };
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    if status >= 500 {
        gateway.pair.ensure_running().expect("an engine exited");
    }
    Reply {
        status,
        headers,
        text,
    }
}

/// Through Envoy.
pub async fn complete(gateway: &Gateway, headers: &[(&str, &str)], body: &Value) -> Reply {
    post(gateway, gateway.envoy.url("/v1/completions"), headers, body).await
}

/// A completion request for the served model, greedy, generating `max_tokens`.
pub fn completion(gateway: &Gateway, prompt: &str, max_tokens: u32) -> Value {
    json!({"model": gateway.pair.served_model_name(), "prompt": prompt, "max_tokens": max_tokens,
           "temperature": 0, "ignore_eos": true})
}

/// The number of tokens the model's tokenizer makes of `prompt` (decode's `/tokenize`).
pub async fn token_count(gateway: &Gateway, prompt: &str) -> u64 {
    let body = json!({"model": gateway.pair.served_model_name(), "prompt": prompt});
    let reply = post(gateway, gateway.pair.decode().url("/tokenize"), &[], &body).await;
    reply.assert_ok("tokenize");
    reply.json()["count"].as_u64().unwrap()
}

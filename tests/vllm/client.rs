//! Requests through the gateway (and, for controls, straight to one engine).

use serde_json::{Value, json};

use crate::Gateway;
pub use crate::reply::Reply;

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
    let reply = Reply::read(response).await;
    if reply.status >= 500 {
        gateway.pair.ensure_running().expect("an engine exited");
    }
    reply
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

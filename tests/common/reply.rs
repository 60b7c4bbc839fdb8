//! A gateway's answer as the end-to-end suites read it (sim workers and real vLLM alike).

use reqwest::header::HeaderMap;
use serde_json::Value;

pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub text: String,
}

impl Reply {
    pub async fn read(response: reqwest::Response) -> Reply {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        Reply {
            status,
            headers,
            text,
        }
    }

    /// The `usage` of the last chunk of an SSE answer that has one.
    pub fn streamed_usage(&self) -> Value {
        self.text
            .lines()
            .rev()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter(|data| *data != "[DONE]")
            .filter_map(|data| serde_json::from_str::<Value>(data).ok())
            .find_map(|chunk| chunk.get("usage").filter(|u| !u.is_null()).cloned())
            .unwrap_or_else(|| panic!("no usage in the stream: {}", self.text))
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// A number in a header (`x-sim-dp-rank`, ...).
    pub fn number(&self, name: &str) -> Option<u64> {
        self.header(name).map(|v| v.parse().unwrap())
    }

    /// The worker that served `hop` (`prefill` or `decode`), from `x-pinroute-<hop>-worker`.
    pub fn worker(&self, hop: &str) -> Option<u64> {
        self.number(&format!("x-pinroute-{hop}-worker"))
    }

    pub fn assert_ok(&self, what: &str) {
        assert_eq!(self.status, 200, "{what}: {}", self.text);
    }

    /// Asserts an OpenAI-shaped pinroute error and returns its message.
    pub fn error(&self, status: u16, code: &str) -> String {
        assert_eq!(self.status, status, "{}", self.text);
        let body = self.json();
        assert_eq!(body["error"]["code"], code, "{}", self.text);
        let kind = if status < 500 {
            "invalid_request_error"
        } else {
            "server_error"
        };
        assert_eq!(body["error"]["type"], kind, "{}", self.text);
        assert_eq!(self.header("x-pinroute-error-code"), Some(code));
        assert_eq!(self.header("content-type"), Some("application/json"));
        let message = body["error"]["message"].as_str().unwrap().to_string();
        assert!(
            !message.contains("127.0.0.1"),
            "an internal address leaked: {message}"
        );
        message
    }
}

//! A call the filter made itself (a prefill hop, a decode hop sent again): its answer as read.

use super::host::{Headers, Host};
use super::intake::header_text;

/// A finished call's answer: its status (none without a response), headers and body.
pub struct CallAnswer {
    pub status: Option<u16>,
    pub headers: Headers,
    /// Its size, as Envoy announced it.
    pub body_size: usize,
    /// Empty when over the reader's limit: not copied into the VM.
    pub body: Vec<u8>,
}

impl CallAnswer {
    /// The answer, its body read only when at most `limit` bytes.
    pub fn read(host: &impl Host, body_size: usize, limit: usize) -> Self {
        let headers = host.call_response_headers().unwrap_or_default();
        let body = match body_size {
            0 => Vec::new(),
            size if size <= limit => host.call_response_body(size).unwrap_or_default(),
            _ => Vec::new(),
        };
        Self {
            status: header_text(&headers, ":status").parse().ok(),
            body_size,
            body,
            headers,
        }
    }
}

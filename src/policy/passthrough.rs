//! Requests on the other paths (`docs/semantics.md` §1) go to a worker as the client sent them, but a
//! client must never steer KV transfer (§4): vLLM also reads
//! `kv_transfer_params` outside the completion paths (`/inference/v1/generate` at the top
//! level and in `sampling_params.extra_args`), so a JSON body that names it anywhere is
//! refused.

use serde_json::Value;

use super::error::RouteError;
use super::rewrite::KV_TRANSFER_PARAMS;

/// Whether a worker's server reads a body of this `content-type` as JSON: FastAPI does when
/// the header is missing or names JSON.
pub fn read_as_json(content_type: &str) -> bool {
    content_type.is_empty() || content_type.to_ascii_lowercase().contains("json")
}

/// Refuses a body that is not JSON, nests deeper than serde_json's 128 levels, or names
/// `kv_transfer_params` at any depth.
pub fn check_body(body: &[u8]) -> Result<(), RouteError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| RouteError::InvalidBody(format!("not valid JSON ({e})")))?;
    if names_key(&value, KV_TRANSFER_PARAMS) {
        return Err(RouteError::InvalidField {
            field: KV_TRANSFER_PARAMS,
            reason: "is set by the gateway, never by a client".into(),
        });
    }
    Ok(())
}

fn names_key(value: &Value, key: &str) -> bool {
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        match value {
            Value::Object(members) => {
                if members.contains_key(key) {
                    return true;
                }
                pending.extend(members.values());
            }
            Value::Array(items) => pending.extend(items),
            _ => {}
        }
    }
    false
}

#[cfg(test)]
#[path = "tests/passthrough.rs"]
mod tests;

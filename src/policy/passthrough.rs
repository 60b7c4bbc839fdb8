//! Requests on the other paths (`docs/semantics.md` §1) go to a worker as the client sent them, but a
//! client must never steer KV transfer (§4): vLLM also reads
//! `kv_transfer_params` outside the completion paths (`/inference/v1/generate` at the top
//! level and in `sampling_params.extra_args`), so a JSON body that names a steering field
//! anywhere is refused (`policy::steering`).

use super::error::RouteError;
use super::steering;

/// Whether a worker's server reads a body of this `content-type` as JSON: FastAPI does when
/// the header is missing or names JSON.
pub fn read_as_json(content_type: &str) -> bool {
    content_type.is_empty() || content_type.to_ascii_lowercase().contains("json")
}

/// Refuses a body that is not JSON, nests deeper than serde_json's 128 levels, or names a
/// steering field at any depth.
pub fn check_body(body: &[u8]) -> Result<(), RouteError> {
    steering::check(body)
}

#[cfg(test)]
#[path = "tests/passthrough.rs"]
mod tests;

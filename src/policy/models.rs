//! The model a request names and the workers that serve it (`docs/semantics.md` §3): with
//! a registry that names models, each hop's candidates are the workers serving the request's.

use serde_json::json;

use super::error::RouteError;
use super::json::{JsonObject, JsonObjectError};
use super::pins::short;
use super::registry::Registry;

/// The body member naming the model, in every API.
pub const FIELD: &str = "model";

/// The model a generation request names, checked against the registry. `None`: the request
/// names none and no worker names its models, so every worker serves it.
pub fn requested(
    request: &JsonObject<'_>,
    registry: &Registry,
) -> Result<Option<String>, RouteError> {
    match named(request)? {
        None if registry.names_models() => Err(RouteError::InvalidField {
            field: FIELD,
            reason: "absent or null: the workers behind this gateway serve different models, \
                     name one (GET /v1/models lists them)"
                .into(),
        }),
        model => served(registry, model),
    }
}

/// The model another path's JSON body names (`/tokenize`, `/v1/embeddings`, ...), read only
/// when the registry names models. Absent, or a body that is not an object: any worker.
pub fn in_other_body(body: &[u8], registry: &Registry) -> Result<Option<String>, RouteError> {
    if !registry.names_models() {
        return Ok(None);
    }
    let object = match JsonObject::parse(body) {
        Ok(object) => object,
        Err(JsonObjectError::NotAnObject) => return Ok(None),
        Err(why) => return Err(RouteError::InvalidBody(why.to_string())),
    };
    served(registry, named(&object)?)
}

fn served(registry: &Registry, model: Option<String>) -> Result<Option<String>, RouteError> {
    match model {
        Some(model) if !is_served(registry, &model) => Err(RouteError::ModelNotFound { model }),
        model => Ok(model),
    }
}

/// The model a body names, if any: a string, or absent or null.
pub fn named(request: &JsonObject<'_>) -> Result<Option<String>, RouteError> {
    let Some(raw) = request.get(FIELD) else {
        return Ok(None);
    };
    serde_json::from_str(raw.get()).map_err(|_| RouteError::InvalidField {
        field: FIELD,
        reason: format!("must be a string, got {}", short(raw)),
    })
}

/// Whether a worker that generates tokens serves `model`, draining or not.
fn is_served(registry: &Registry, model: &str) -> bool {
    registry
        .pool(registry.token_role())
        .any(|worker| worker.serves(model))
}

/// The gateway's answer to `GET /v1/models` in OpenAI's list shape, when the registry names
/// models; `None`: a worker answers it.
pub fn list(registry: &Registry) -> Option<String> {
    if !registry.names_models() {
        return None;
    }
    let data: Vec<_> = registry
        .models()
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "pinroute"}))
        .collect();
    Some(json!({"object": "list", "data": data}).to_string())
}

#[cfg(test)]
#[path = "tests/models.rs"]
mod tests;

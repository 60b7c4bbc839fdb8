//! The model a request names and the workers that serve it (`docs/semantics.md` §3): with
//! a registry that names models, each hop's candidates are the workers serving the request's.

use std::borrow::Cow;
use std::rc::Rc;

use serde_json::json;

use super::error::RouteError;
use super::json::{JsonObject, JsonObjectError};
use super::pins::short;
use super::registry::Registry;

/// The body member naming the model, in every API.
pub const FIELD: &str = "model";

/// The model a generation request names, checked against the registry. `None`: no worker
/// names its models, so every worker serves the request (its `model` is only checked to be
/// a string, and is not kept).
pub fn requested(
    request: &JsonObject<'_>,
    registry: &Registry,
) -> Result<Option<Rc<str>>, RouteError> {
    let model = named(request)?;
    if !registry.names_models() {
        return Ok(None);
    }
    match model {
        None => Err(RouteError::InvalidField {
            field: FIELD,
            reason: "absent or null: the workers behind this gateway serve different models, \
                     name one (GET /v1/models lists them)"
                .into(),
        }),
        Some(model) => served(registry, &model).map(Some),
    }
}

/// The model another path's JSON body names (`/tokenize`, `/v1/embeddings`, ...), read only
/// when the registry names models. Absent, or a body that is not an object: any worker.
pub fn in_other_body(body: &[u8], registry: &Registry) -> Result<Option<Rc<str>>, RouteError> {
    if !registry.names_models() {
        return Ok(None);
    }
    let object = match JsonObject::parse(body) {
        Ok(object) => object,
        Err(JsonObjectError::NotAnObject) => return Ok(None),
        Err(why) => return Err(RouteError::InvalidBody(why.to_string())),
    };
    named(&object)?
        .map(|model| served(registry, &model))
        .transpose()
}

/// The model a body names, if any: a string (borrowed unless it has escapes), or absent or
/// null.
/// The request's `model`, whatever the registry serves: `None` when absent or null.
pub fn named<'a>(request: &JsonObject<'a>) -> Result<Option<Cow<'a, str>>, RouteError> {
    let Some(raw) = request.get(FIELD) else {
        return Ok(None);
    };
    if let Ok(plain) = serde_json::from_str::<Option<&'a str>>(raw.get()) {
        return Ok(plain.map(Cow::Borrowed));
    }
    serde_json::from_str::<Option<String>>(raw.get())
        .map(|model| model.map(Cow::Owned))
        .map_err(|_| RouteError::InvalidField {
            field: FIELD,
            reason: format!("must be a string, got {}", short(raw)),
        })
}

/// `model` as the request keeps it, if a worker generating tokens serves it: the registry's
/// own copy when a worker lists it (no allocation per request), else a copy of its own (only
/// workers naming no models serve it).
fn served(registry: &Registry, model: &str) -> Result<Rc<str>, RouteError> {
    if !registry.generates(model) {
        return Err(RouteError::ModelNotFound {
            model: model.to_owned(),
        });
    }
    Ok(registry
        .listed_model(model)
        .cloned()
        .unwrap_or_else(|| Rc::from(model)))
}

/// The gateway's answer to `GET /v1/models` in OpenAI's list shape, when the registry names
/// models; `None`: a worker answers it.
pub fn list(registry: &Registry) -> Option<String> {
    if !registry.names_models() {
        return None;
    }
    let data: Vec<_> = registry
        .models()
        .iter()
        .map(|id| json!({"id": &**id, "object": "model", "created": 0, "owned_by": "pinroute"}))
        .collect();
    Some(json!({"object": "list", "data": data}).to_string())
}

#[cfg(test)]
#[path = "tests/models.rs"]
mod tests;

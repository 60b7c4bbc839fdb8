//! Body fields that steer KV or encoder-cache transfer (`docs/semantics.md` §4, §7): the
//! gateway sets them, a client never does. vLLM reads `kv_transfer_params` at the top level,
//! in `vllm_xargs` (copied into the engine's `extra_args`), in `sampling_params.extra_args`
//! (`/inference/v1/generate`) and `nvext` is forwarded as it is; `ec_transfer_params` likewise.
//! So a client's copy nested at any depth is refused.
//!
//! The scan streams through the JSON with serde: no parsed copy of the body is held, so a
//! large body costs its nesting depth, not its size.

use std::cell::Cell;
use std::fmt;

use serde::Deserializer;
use serde::de::{DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};

use super::error::RouteError;
use super::json::JsonObject;
use super::rewrite::KV_TRANSFER_PARAMS;

pub const EC_TRANSFER_PARAMS: &str = "ec_transfer_params";

/// The member names a client may never send, at any depth.
pub const STEERING_FIELDS: &[&str] = &[KV_TRANSFER_PARAMS, EC_TRANSFER_PARAMS];

/// Refuses `json` (a whole body, or one member's value) when it is not JSON, nests deeper
/// than serde_json's 128 levels, or names a steering field at any depth.
pub fn check(json: &[u8]) -> Result<(), RouteError> {
    let found = Cell::new(None);
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let scanned = Scan(&found)
        .deserialize(&mut deserializer)
        .and_then(|()| deserializer.end());
    match (found.get(), scanned) {
        (Some(field), _) => Err(refused(field)),
        (None, Ok(())) => Ok(()),
        (None, Err(error)) => Err(RouteError::InvalidBody(format!("not valid JSON ({error})"))),
    }
}

/// Whether `json` can name a steering field: a byte search that lets the exact scan run
/// only where it can find one (a key may be spelled with `\u` escapes).
fn may_name_one(json: &[u8]) -> bool {
    memchr::memmem::find(json, b"transfer_params").is_some()
        || memchr::memmem::find(json, b"\\u").is_some()
}

/// A completion body's members (`docs/semantics.md` §4): its own top-level
/// `kv_transfer_params` is dropped by the rewrites; any other steering field is refused.
pub fn check_completion(request: &JsonObject<'_>) -> Result<(), RouteError> {
    for (key, value) in request.members() {
        if key == EC_TRANSFER_PARAMS {
            return Err(refused(EC_TRANSFER_PARAMS));
        }
        let raw = value.get().as_bytes().trim_ascii_start();
        if matches!(raw.first(), Some(b'{' | b'[')) && may_name_one(raw) {
            check(raw)?;
        }
    }
    Ok(())
}

fn refused(field: &'static str) -> RouteError {
    RouteError::InvalidField {
        field,
        reason: "is set by the gateway, never by a client".into(),
    }
}

/// A JSON value whose members are looked at by name and otherwise skipped; the first
/// steering field found is kept in the cell, and stops the scan.
#[derive(Clone, Copy)]
struct Scan<'f>(&'f Cell<Option<&'static str>>);

impl<'de> DeserializeSeed<'de> for Scan<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Scan<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if let Some(field) = STEERING_FIELDS.iter().find(|f| **f == key) {
                self.0.set(Some(field));
                return Err(A::Error::custom("a steering field"));
            }
            map.next_value_seed(self)?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
#[path = "tests/steering.rs"]
mod tests;

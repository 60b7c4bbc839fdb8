//! A JSON object read once, its values kept as the client's own bytes.
//!
//! Bodies are rewritten by splicing top-level members, so a prompt of any size is copied
//! once and every field pinroute does not own (numbers, unicode escapes, member order)
//! reaches the worker exactly as the client wrote it.

use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// The members of a JSON object, in order, with their raw values.
#[derive(Debug)]
pub struct JsonObject<'a> {
    members: Vec<(String, &'a RawValue)>,
}

/// Why bytes are not a JSON object pinroute accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonObjectError {
    NotJson(String),
    NotAnObject,
    DuplicateKey(String),
}

impl fmt::Display for JsonObjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JsonObjectError::NotJson(why) => write!(f, "not valid JSON ({why})"),
            JsonObjectError::NotAnObject => f.write_str("not a JSON object"),
            JsonObjectError::DuplicateKey(key) => {
                write!(f, "key {} appears more than once", serde_json::Value::String(key.clone()))
            }
        }
    }
}

impl<'a> JsonObject<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<Self, JsonObjectError> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let members = de.deserialize_any(MembersVisitor).map_err(|e| classify(&e))??;
        de.end().map_err(|e| JsonObjectError::NotJson(e.to_string()))?;
        Ok(Self { members })
    }

    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.members.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    pub fn members(&self) -> impl Iterator<Item = (&str, &'a RawValue)> {
        self.members.iter().map(|(k, v)| (k.as_str(), *v))
    }
}

fn classify(error: &serde_json::Error) -> JsonObjectError {
    if error.is_data() && error.to_string().starts_with("invalid type") {
        JsonObjectError::NotAnObject
    } else {
        JsonObjectError::NotJson(error.to_string())
    }
}

type Members<'a> = Result<Vec<(String, &'a RawValue)>, JsonObjectError>;

struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Members<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members: Vec<(String, &'de RawValue)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let value: &'de RawValue = map.next_value()?;
            if members.iter().any(|(k, _)| *k == key) {
                return Ok(Err(JsonObjectError::DuplicateKey(key)));
            }
            members.push((key, value));
        }
        Ok(Ok(members))
    }
}

/// Writes `"key":` with the key escaped as JSON.
pub fn write_key(out: &mut String, key: &str) {
    out.push_str(&serde_json::Value::String(key.to_string()).to_string());
    out.push(':');
}

#[cfg(test)]
#[path = "tests/json.rs"]
mod tests;

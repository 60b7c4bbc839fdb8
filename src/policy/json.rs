//! A JSON object read once, its values kept as the client's own bytes.
//!
//! Bodies are rewritten by splicing top-level members, so a prompt of any size is copied
//! once and every field pinroute does not own (numbers, unicode escapes, member order)
//! reaches the worker exactly as the client wrote it.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

use serde::de::{Deserializer, Error as _, MapAccess, Visitor};
use serde_json::value::RawValue;

/// The members of a JSON object, in order, with their raw values. A key is borrowed from
/// the bytes unless it had escapes to undo.
#[derive(Debug)]
pub struct JsonObject<'a> {
    members: Vec<(Cow<'a, str>, &'a RawValue)>,
}

/// Deepest nesting of arrays and objects accepted, the top-level object included (serde_json's
/// own recursion limit, which raw members would otherwise escape).
pub const MAX_DEPTH: usize = 128;

/// Most top-level members accepted: every request field of vLLM's OpenAI API, twice over. A
/// body of many tiny members is refused as soon as it has one more, before it costs the
/// filter time or memory in proportion to its size.
pub const MAX_MEMBERS: usize = 256;

/// Why bytes are not a JSON object pinroute accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonObjectError {
    NotJson(String),
    NotAnObject,
    DuplicateKey(String),
    TooDeep(String),
    TooManyMembers,
}

impl fmt::Display for JsonObjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JsonObjectError::NotJson(why) => write!(f, "not valid JSON ({why})"),
            JsonObjectError::NotAnObject => f.write_str("not a JSON object"),
            JsonObjectError::DuplicateKey(key) => {
                write!(
                    f,
                    "key {} appears more than once",
                    serde_json::Value::String(key.clone())
                )
            }
            JsonObjectError::TooManyMembers => {
                write!(f, "an object of more than {MAX_MEMBERS} members")
            }
            JsonObjectError::TooDeep(key) => write!(
                f,
                "{} nests arrays and objects deeper than {MAX_DEPTH} levels",
                serde_json::Value::String(key.clone())
            ),
        }
    }
}

impl<'a> JsonObject<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<Self, JsonObjectError> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let too_many = Cell::new(false);
        let members = de
            .deserialize_any(MembersVisitor(&too_many))
            .map_err(|e| match too_many.get() {
                true => JsonObjectError::TooManyMembers,
                false => classify(&e),
            })?;
        de.end()
            .map_err(|e| JsonObjectError::NotJson(e.to_string()))?;
        let members = members?;
        if let Some((key, _)) = members
            .iter()
            .find(|(_, value)| nests_deeper_than(value.get(), MAX_DEPTH - 1))
        {
            return Err(JsonObjectError::TooDeep(key.clone().into_owned()));
        }
        Ok(Self { members })
    }

    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.members.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    pub fn members(&self) -> impl Iterator<Item = (&str, &'a RawValue)> {
        self.members.iter().map(|(k, v)| (k.as_ref(), *v))
    }
}

/// Whether valid JSON `text` nests arrays and objects deeper than `limit`. Scalars (a prompt
/// string, most often) are not scanned at all.
pub fn nests_deeper_than(text: &str, limit: usize) -> bool {
    let bytes = text.as_bytes();
    if !matches!(bytes.first(), Some(b'[' | b'{')) {
        return false;
    }
    let mut depth = 0usize;
    let mut rest = bytes;
    while let Some((&byte, tail)) = rest.split_first() {
        rest = tail;
        match byte {
            b'"' => rest = after_string(rest),
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// The bytes after the closing quote of a string whose opening quote was just read.
fn after_string(mut rest: &[u8]) -> &[u8] {
    while let Some(at) = rest.iter().position(|b| *b == b'"' || *b == b'\\') {
        let tail = rest.get(at..).unwrap_or_default();
        match tail.split_first() {
            Some((b'\\', escaped)) => rest = escaped.get(1..).unwrap_or_default(),
            Some((_, after)) => return after,
            None => return tail,
        }
    }
    &[]
}

fn classify(error: &serde_json::Error) -> JsonObjectError {
    if error.is_data() && error.to_string().starts_with("invalid type") {
        JsonObjectError::NotAnObject
    } else {
        JsonObjectError::NotJson(error.to_string())
    }
}

type Members<'a> = Result<Vec<(Cow<'a, str>, &'a RawValue)>, JsonObjectError>;

/// Reads an object's members; sets the cell and stops at the one past [`MAX_MEMBERS`].
struct MembersVisitor<'c>(&'c Cell<bool>);

impl<'de> Visitor<'de> for MembersVisitor<'_> {
    type Value = Members<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    /// Reads every member, even after a duplicate key: the object must be read to its end
    /// for the rest of the document to be checked.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members: Vec<(Cow<'de, str>, &'de RawValue)> = Vec::new();
        let mut duplicate = None;
        let mut read = 0usize;
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            read += 1;
            if read > MAX_MEMBERS {
                self.0.set(true);
                return Err(A::Error::custom("too many members"));
            }
            let value: &'de RawValue = map.next_value()?;
            if members.iter().any(|(seen, _)| *seen == key) {
                duplicate.get_or_insert(key);
                continue;
            }
            members.push((key, value));
        }
        Ok(match duplicate {
            Some(key) => Err(JsonObjectError::DuplicateKey(key.into_owned())),
            None => Ok(members),
        })
    }
}

/// A member's key: borrowed from the document when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, key: &'de str) -> Result<Self::Value, E> {
        Ok(Key(Cow::Borrowed(key)))
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(Key(Cow::Owned(key.to_owned())))
    }
}

/// Writes `"key":` with the key escaped as JSON.
pub fn write_key(out: &mut String, key: &str) {
    if key.bytes().any(needs_escape) {
        out.push_str(&serde_json::Value::String(key.to_string()).to_string());
    } else {
        out.push('"');
        out.push_str(key);
        out.push('"');
    }
    out.push(':');
}

/// Whether JSON must escape `byte` in a string: a quote, a backslash or a control character.
fn needs_escape(byte: u8) -> bool {
    matches!(byte, b'"' | b'\\' | 0x00..=0x1f)
}

#[cfg(test)]
#[path = "tests/json.rs"]
mod tests;

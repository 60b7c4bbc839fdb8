//! `JsonObject::parse` and `parse_nvext` on arbitrary bytes, against `serde_json::Value`.
//!
//! Properties:
//! - neither panics;
//! - JSON that `serde_json` reads as an object is accepted, or refused only for a key that
//!   really is in it twice; JSON that is not an object is `NotAnObject`;
//! - an object is accepted only if it nests at most 128 levels (the top level included),
//!   and refused as too deep only if it nests deeper;
//! - an accepted object has the members `serde_json` sees, in the client's order, each raw
//!   value reading back to the same value, and it is written back to the same value by
//!   splicing members (what the rewrites do);
//! - `parse_nvext` agrees with a model of docs/semantics.md §2 read off the `Value`: absent or
//!   `null` is no pin, an integer in range is a pin, anything else is an `invalid_field`
//!   error naming that field (or `nvext` itself when it is not an object).

use pinroute::policy::error::RouteError;
use pinroute::policy::json::{JsonObject, JsonObjectError, write_key};
use pinroute::policy::pins::{Pins, parse_nvext};
use serde_json::{Map, Value};

use crate::{is_duplicate_key, violated};

pub fn check(data: &[u8]) {
    let parsed = JsonObject::parse(data);
    check_depth(data, &parsed);
    match serde_json::from_slice::<Value>(data) {
        Ok(Value::Object(map)) => check_object(&parsed, &map),
        Ok(_) => assert_eq!(
            parsed.err(),
            Some(JsonObjectError::NotAnObject),
            "a JSON non-object"
        ),
        // A raw value carries what `Value` cannot hold: numbers beyond f64, nesting beyond 128.
        Err(e) if value_limit(&e) => {}
        Err(e) => {
            if let Ok(object) = &parsed {
                violated(format!("invalid JSON ({e}) accepted as {object:?}"))
            }
        }
    }
}

/// Deepest nesting `JsonObject` accepts, the top-level object included.
const MAX_DEPTH: usize = 128;

fn check_depth(data: &[u8], parsed: &Result<JsonObject<'_>, JsonObjectError>) {
    match parsed {
        Ok(_) => assert!(
            depth(data) <= MAX_DEPTH,
            "accepted nesting {} levels deep",
            depth(data)
        ),
        Err(JsonObjectError::TooDeep(_)) => assert!(depth(data) > MAX_DEPTH, "refused as too deep"),
        Err(_) => {}
    }
}

/// How deep arrays and objects nest in JSON text (strings skipped, escapes honoured).
pub fn depth(text: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for byte in text {
        match (in_string, escaped, byte) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') | (false, _, b'"') => in_string = !in_string,
            (false, _, b'[' | b'{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (false, _, b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Errors of `Value` on text a raw value carries untouched: numbers beyond f64, nesting
/// beyond its recursion limit, and surrogate escapes that decode to no character (the
/// grammar allows them; `JsonObject` decodes only top-level keys).
fn value_limit(error: &serde_json::Error) -> bool {
    let text = error.to_string();
    [
        "number out of range",
        "recursion limit exceeded",
        "lone leading surrogate",
        "unexpected end of hex escape",
        "invalid unicode code point",
    ]
    .iter()
    .any(|limit| text.starts_with(limit))
}

fn check_object(parsed: &Result<JsonObject<'_>, JsonObjectError>, map: &Map<String, Value>) {
    match parsed {
        Ok(object) => {
            check_members(object, map);
            check_nvext(object, map);
        }
        Err(JsonObjectError::DuplicateKey(key)) => {
            assert!(
                map.contains_key(key),
                "duplicate key {key:?} is not a key of the object"
            )
        }
        Err(error) if is_duplicate_key(error, None) => {}
        Err(error) => violated(format!("a JSON object refused: {error}")),
    }
}

fn check_members(object: &JsonObject<'_>, map: &Map<String, Value>) {
    let keys: Vec<&str> = object.members().map(|(k, _)| k).collect();
    assert_eq!(keys.len(), map.len(), "members {keys:?} against {map:?}");
    for (key, raw) in object.members() {
        let Some(value) = map.get(key) else {
            violated(format!("member {key:?} is not in the object"))
        };
        assert_eq!(&read(raw.get()), value, "raw value of {key:?}");
        assert_eq!(
            object.get(key).map(|r| r.get()),
            Some(raw.get()),
            "get({key:?})"
        );
    }
    assert_eq!(
        &read(&splice(object)),
        &Value::Object(map.clone()),
        "object spliced back"
    );
}

/// The object written back member by member, as the rewrites write bodies.
pub fn splice(object: &JsonObject<'_>) -> String {
    let mut out = String::from("{");
    for (i, (key, raw)) in object.members().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_key(&mut out, key);
        out.push_str(raw.get());
    }
    out.push('}');
    out
}

fn read(text: &str) -> Value {
    match serde_json::from_str(text) {
        Ok(value) => value,
        Err(e) => violated(format!("{text:?} does not read back as JSON: {e}")),
    }
}

const NVEXT_FIELDS: [&str; 5] = [
    "backend_instance_id",
    "prefill_worker_id",
    "decode_worker_id",
    "dp_rank",
    "prefill_dp_rank",
];

fn check_nvext(object: &JsonObject<'_>, map: &Map<String, Value>) {
    // `Value` keeps the last of duplicate keys inside `nvext`; SPEC refuses them.
    let expected = if nvext_has_duplicate_keys(object) {
        Err(vec!["nvext"])
    } else {
        expected_nvext(map.get("nvext"))
    };
    match (expected, parse_nvext(object)) {
        (Ok(want), Ok(got)) => assert_eq!(got, want, "nvext pins"),
        (Err(fields), Err(error)) => check_nvext_error(&error, &fields),
        (want, got) => violated(format!("parse_nvext: model {want:?}, core {got:?}")),
    }
}

/// Whether `nvext` is an object with a key twice, by `serde_json`'s own map visitor.
fn nvext_has_duplicate_keys(object: &JsonObject<'_>) -> bool {
    let Some(raw) = object.get("nvext") else {
        return false;
    };
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(raw.get()) else {
        return false;
    };
    let keys = serde_json::from_str::<KeyCount>(raw.get()).map_or(0, |k| k.0);
    keys != map.len()
}

/// The number of keys of a JSON object, duplicates included.
struct KeyCount(usize);

impl<'de> serde::Deserialize<'de> for KeyCount {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(KeyCounter)
    }
}

struct KeyCounter;

impl<'de> serde::de::Visitor<'de> for KeyCounter {
    type Value = KeyCount;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<KeyCount, A::Error> {
        let mut count = 0;
        while map
            .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
            .is_some()
        {
            count += 1;
        }
        Ok(KeyCount(count))
    }
}

pub fn check_nvext_error(error: &RouteError, fields: &[&str]) {
    let RouteError::InvalidField { field, .. } = error else {
        violated(format!(
            "an nvext error must be InvalidField, got {error:?}"
        ))
    };
    assert!(
        fields.contains(field),
        "error names {field}, the wrong fields are {fields:?}"
    );
    assert_eq!((error.status(), error.code()), (400, "invalid_field"));
}

/// The model: the pins, or the field names (`nvext.…`) an error may name.
fn expected_nvext(nvext: Option<&Value>) -> Result<Pins, Vec<&'static str>> {
    let fields = match nvext {
        None | Some(Value::Null) => return Ok(Pins::default()),
        Some(Value::Object(fields)) => fields,
        Some(_) => return Err(vec!["nvext"]),
    };
    let mut values = [None; 5];
    let mut bad = Vec::new();
    for ((name, slot), path) in NVEXT_FIELDS.iter().zip(values.iter_mut()).zip(NVEXT_PATHS) {
        let max = if name.ends_with("rank") {
            u64::from(u32::MAX)
        } else {
            u64::MAX
        };
        match fields.get(*name) {
            None | Some(Value::Null) => {}
            Some(Value::Number(n)) if n.as_u64().is_some_and(|v| v <= max) => *slot = n.as_u64(),
            Some(_) => bad.push(path),
        }
    }
    if !bad.is_empty() {
        return Err(bad);
    }
    Ok(pins_of(values))
}

const NVEXT_PATHS: [&str; 5] = [
    "nvext.backend_instance_id",
    "nvext.prefill_worker_id",
    "nvext.decode_worker_id",
    "nvext.dp_rank",
    "nvext.prefill_dp_rank",
];

/// Pins from the five field values in `NVEXT_FIELDS` order; prefill rank u32::MAX is unset.
pub fn pins_of([b, p, d, r, pr]: [Option<u64>; 5]) -> Pins {
    let rank = |v: Option<u64>| v.and_then(|v| u32::try_from(v).ok());
    Pins {
        backend_instance_id: b,
        prefill_worker_id: p,
        decode_worker_id: d,
        dp_rank: rank(r),
        prefill_dp_rank: rank(pr).filter(|r| *r != u32::MAX),
    }
}

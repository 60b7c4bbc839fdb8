//! `parse_nvext` on structured request bodies whose expected pins are known by construction.
//!
//! The input describes a body: filler members, an `nvext` member (absent, `null`, not an
//! object, or an object of routing and other fields, keys optionally spelled with `\u`
//! escapes, values of every JSON type and number spelling), and whitespace.
//!
//! Properties, beyond those of [`crate::json_object`] (also run on the body):
//! - a body with `nvext` twice is refused as a duplicate key;
//! - routing fields: absent or `null` is no pin; a plain integer in range is that pin
//!   (`prefill_dp_rank` 4294967295 is unset); a negative, fractional, exponent, overflowing
//!   number or any other type is an `invalid_field` error naming a wrong field;
//! - `nvext` not an object, or with a key twice, is an error naming `nvext`;
//! - fields other than the five routing fields never matter.

use arbitrary::Arbitrary;
use pinroute::policy::json::JsonObject;
use pinroute::policy::pins::{Pins, parse_nvext};

use crate::json_object::{check_nvext_error, pins_of};
use crate::{is_duplicate_key, violated};

#[derive(Arbitrary, Debug)]
pub struct Body {
    before: Vec<Filler>,
    nvext: Nvext,
    after: Vec<Filler>,
    nvext_twice: bool,
    space: Space,
}

#[derive(Arbitrary, Debug)]
enum Nvext {
    Absent,
    Null,
    NotAnObject(Scalar),
    Object(Vec<Field>),
}

#[derive(Arbitrary, Debug)]
struct Field {
    key: Key,
    escaped: bool,
    value: Scalar,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Key {
    /// Index into the five routing fields.
    Routing(u8),
    Other(u8),
}

/// A JSON value, spelled in the ways a client might.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Scalar {
    Null,
    Int(u64),
    Small(u8),
    U32Max,
    AboveU32,
    Negative(u32),
    NegativeZero,
    Fraction(u8),
    Exponent(u8),
    BeyondU64,
    Text(u8),
    Bool(bool),
    EmptyArray,
    Object(u8),
}

#[derive(Arbitrary, Debug)]
struct Filler {
    value: Scalar,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Space {
    None,
    One,
    Mixed,
}

const ROUTING: [&str; 5] = [
    "backend_instance_id",
    "prefill_worker_id",
    "decode_worker_id",
    "dp_rank",
    "prefill_dp_rank",
];
const PATHS: [&str; 5] = [
    "nvext.backend_instance_id",
    "nvext.prefill_worker_id",
    "nvext.decode_worker_id",
    "nvext.dp_rank",
    "nvext.prefill_dp_rank",
];
/// Enough members to cover every case; more only slow the fuzzer down.
const MAX_MEMBERS: usize = 12;

fn capped<T>(items: &[T]) -> &[T] {
    items
        .get(..items.len().min(MAX_MEMBERS))
        .unwrap_or_default()
}

const OTHER_KEYS: [&str; 6] = ["annotations", "dp_rank_", "Dp_rank", "", "backend", "nvext"];

pub fn check(body: &Body) {
    let text = body.render();
    crate::json_object::check(text.as_bytes());
    let parsed = JsonObject::parse(text.as_bytes());
    if body.nvext_twice && !matches!(body.nvext, Nvext::Absent) {
        let refused = parsed
            .as_ref()
            .is_err_and(|e| is_duplicate_key(e, Some("nvext")));
        return assert!(
            refused,
            "{text}: nvext twice must be a duplicate key, got {parsed:?}"
        );
    }
    let Ok(object) = parsed else {
        violated(format!("{text}: refused: {parsed:?}"))
    };
    match (body.nvext.expected(), parse_nvext(&object)) {
        (Ok(want), Ok(got)) => assert_eq!(got, want, "{text}"),
        (Err(fields), Err(error)) => check_nvext_error(&error, &fields),
        (want, got) => violated(format!("{text}: model {want:?}, core {got:?}")),
    }
}

impl Body {
    fn render(&self) -> String {
        let mut members: Vec<(String, String)> = Vec::new();
        let filler = |i: usize, f: &Filler| (quote(&format!("f{i}")), f.value.render(self.space));
        let (before, after) = (capped(&self.before), capped(&self.after));
        members.extend(before.iter().enumerate().map(|(i, f)| filler(i, f)));
        if let Some(nvext) = self.nvext.render(self.space) {
            members.push((quote("nvext"), nvext.clone()));
            if self.nvext_twice {
                members.push((quote("nvext"), nvext));
            }
        }
        members.extend(
            after
                .iter()
                .enumerate()
                .map(|(i, f)| filler(before.len() + i, f)),
        );
        object(&members, self.space)
    }
}

impl Nvext {
    fn render(&self, space: Space) -> Option<String> {
        match self {
            Nvext::Absent => None,
            Nvext::Null => Some("null".into()),
            Nvext::NotAnObject(Scalar::Null | Scalar::Object(_)) => Some("[]".into()),
            Nvext::NotAnObject(scalar) => Some(scalar.render(space)),
            Nvext::Object(fields) => {
                let members: Vec<(String, String)> = capped(fields)
                    .iter()
                    .map(|f| (f.key_text(), f.value.render(space)))
                    .collect();
                Some(object(&members, space))
            }
        }
    }

    /// The pins, or the field paths an error may name.
    fn expected(&self) -> Result<Pins, Vec<&'static str>> {
        let fields = match self {
            Nvext::Absent | Nvext::Null => return Ok(Pins::default()),
            Nvext::NotAnObject(_) => return Err(vec!["nvext"]),
            Nvext::Object(fields) => capped(fields),
        };
        let names: Vec<&str> = fields.iter().map(|f| f.key.name()).collect();
        if names
            .iter()
            .enumerate()
            .any(|(i, n)| names.iter().skip(i + 1).any(|m| m == n))
        {
            return Err(vec!["nvext"]);
        }
        let mut values = [None; 5];
        let mut bad = Vec::new();
        for field in fields {
            let Key::Routing(index) = field.key else {
                continue;
            };
            let index = usize::from(index) % ROUTING.len();
            let max = if index >= 3 {
                u64::from(u32::MAX)
            } else {
                u64::MAX
            };
            match field.value.as_pin(max) {
                Ok(value) => values
                    .get_mut(index)
                    .into_iter()
                    .for_each(|slot| *slot = value),
                Err(()) => bad.extend(PATHS.get(index)),
            }
        }
        if bad.is_empty() {
            Ok(pins_of(values))
        } else {
            Err(bad)
        }
    }
}

impl Field {
    fn key_text(&self) -> String {
        let name = self.key.name();
        if !self.escaped {
            return quote(name);
        }
        let escaped: String = name
            .chars()
            .map(|c| format!("\\u{:04x}", u32::from(c)))
            .collect();
        format!("\"{escaped}\"")
    }
}

impl Key {
    fn name(self) -> &'static str {
        let pick = |list: &[&'static str], i: u8| list.get(usize::from(i) % list.len()).copied();
        match self {
            Key::Routing(i) => pick(&ROUTING, i),
            Key::Other(i) => pick(&OTHER_KEYS, i),
        }
        .unwrap_or_default()
    }
}

impl Scalar {
    fn render(self, space: Space) -> String {
        match self {
            Scalar::Null => "null".into(),
            Scalar::Int(v) => v.to_string(),
            Scalar::Small(v) => v.to_string(),
            Scalar::U32Max => u32::MAX.to_string(),
            Scalar::AboveU32 => (u64::from(u32::MAX) + 1).to_string(),
            Scalar::Negative(v) => format!("-{}", u64::from(v) + 1),
            Scalar::NegativeZero => "-0".into(),
            Scalar::Fraction(v) => format!("{v}.0"),
            Scalar::Exponent(v) => format!("{v}e0"),
            Scalar::BeyondU64 => "18446744073709551616".into(),
            Scalar::Text(v) => format!("\"{v}\""),
            Scalar::Bool(b) => b.to_string(),
            Scalar::EmptyArray => "[]".into(),
            Scalar::Object(v) => object(&[(quote("dp_rank"), v.to_string())], space),
        }
    }

    /// docs/semantics.md §2: absent or null is no pin; only a plain integer in `0..=max` is one.
    fn as_pin(self, max: u64) -> Result<Option<u64>, ()> {
        let value = match self {
            Scalar::Null => return Ok(None),
            Scalar::Int(v) => v,
            Scalar::Small(v) => u64::from(v),
            Scalar::U32Max => u64::from(u32::MAX),
            Scalar::AboveU32 => u64::from(u32::MAX) + 1,
            _ => return Err(()),
        };
        if value <= max {
            Ok(Some(value))
        } else {
            Err(())
        }
    }
}

fn quote(text: &str) -> String {
    serde_json::Value::String(text.into()).to_string()
}

fn object(members: &[(String, String)], space: Space) -> String {
    let ws = match space {
        Space::None => "",
        Space::One => " ",
        Space::Mixed => "\n\t ",
    };
    let inner: Vec<String> = members
        .iter()
        .map(|(k, v)| format!("{ws}{k}{ws}:{ws}{v}{ws}"))
        .collect();
    format!("{{{ws}{}{ws}}}", inner.join(","))
}

//! Worker pins a client sends (`docs/semantics.md` §2): headers with their aliases, and `nvext` fields.

use serde_json::Value;
use serde_json::value::RawValue;

use super::error::{RouteError, quoted};
use super::json::JsonObject;
use super::picker::Picked;
use super::registry::WorkerId;

/// `prefill_dp_rank` value that means "no rank pinned".
pub const UNSET_PREFILL_RANK: u32 = u32::MAX;

const SESSION_MAX_BYTES: usize = 256;

/// The pins of one request, before they are resolved per hop.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pins {
    /// B: `backend_instance_id`, the generic token-generating worker.
    pub backend_instance_id: Option<WorkerId>,
    /// P: `prefill_worker_id`.
    pub prefill_worker_id: Option<WorkerId>,
    /// D: `decode_worker_id`.
    pub decode_worker_id: Option<WorkerId>,
    /// r: `dp_rank`, the decode or aggregated worker's rank.
    pub dp_rank: Option<u32>,
    /// pr: `prefill_dp_rank`.
    pub prefill_dp_rank: Option<u32>,
}

impl Pins {
    /// Field by field, `self` (the headers) beats `body`.
    pub fn or(self, body: Pins) -> Pins {
        Pins {
            backend_instance_id: self.backend_instance_id.or(body.backend_instance_id),
            prefill_worker_id: self.prefill_worker_id.or(body.prefill_worker_id),
            decode_worker_id: self.decode_worker_id.or(body.decode_worker_id),
            dp_rank: self.dp_rank.or(body.dp_rank),
            prefill_dp_rank: self.prefill_dp_rank.or(body.prefill_dp_rank),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Pins::default()
    }
}

/// What the headers of a request say.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HeaderHints {
    pub pins: Pins,
    pub session: Option<Vec<u8>>,
    /// An endpoint picker's choices, in picker mode (`super::picker`).
    pub picked: Picked,
    /// The caller the edge named in the identity header, when the operator restricts
    /// callers (`super::callers`).
    pub caller: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Sets B and D.
    WorkerInstance,
    Prefill,
    Rank,
    PrefillRank,
    Session,
}

/// A pin header: its canonical name first, then its aliases, weakest last.
struct PinHeader {
    names: &'static [&'static str],
    slot: Slot,
}

const PIN_HEADERS: &[PinHeader] = &[
    PinHeader {
        names: &["x-dynamo-worker-instance-id", "x-worker-instance-id"],
        slot: Slot::WorkerInstance,
    },
    PinHeader {
        names: &["x-dynamo-prefill-instance-id", "x-prefill-instance-id"],
        slot: Slot::Prefill,
    },
    PinHeader {
        names: &["x-dynamo-dp-rank", "x-dp-rank", "x-data-parallel-rank"],
        slot: Slot::Rank,
    },
    PinHeader {
        names: &["x-dynamo-prefill-dp-rank", "x-prefill-dp-rank"],
        slot: Slot::PrefillRank,
    },
    PinHeader {
        names: &["x-dynamo-session-id"],
        slot: Slot::Session,
    },
];

/// Every pin header's name, canonical names and aliases.
pub fn pin_header_names() -> impl Iterator<Item = &'static str> {
    PIN_HEADERS.iter().flat_map(|h| h.names.iter().copied())
}

/// Whether `name` (lowercase) is one of the pin headers; they are consumed here and never
/// forwarded (vLLM would read a client's `x-data-parallel-rank` itself).
pub fn is_pin_header(name: &str) -> bool {
    PIN_HEADERS.iter().any(|h| h.names.contains(&name))
}

/// Reads the pin headers. Names must be lowercase, as Envoy presents them.
///
/// Each pin header is validated even when a stronger name wins; a name repeated with
/// different values, or aliases that disagree, are refused rather than guessed at.
pub fn parse_headers<'a, I>(headers: I) -> Result<HeaderHints, RouteError>
where
    I: IntoIterator<Item = (&'a str, &'a [u8])> + Clone,
{
    let mut hints = HeaderHints::default();
    for header in PIN_HEADERS {
        match header.slot {
            Slot::Session => hints.session = pick(header, headers.clone(), parse_session)?,
            Slot::WorkerInstance => {
                let id = pick(header, headers.clone(), parse_u64)?;
                hints.pins.backend_instance_id = id;
                hints.pins.decode_worker_id = id;
            }
            Slot::Prefill => {
                hints.pins.prefill_worker_id = pick(header, headers.clone(), parse_u64)?
            }
            Slot::Rank => hints.pins.dp_rank = pick(header, headers.clone(), parse_u32)?,
            Slot::PrefillRank => {
                hints.pins.prefill_dp_rank = pick(header, headers.clone(), parse_u32)?
                    .filter(|rank| *rank != UNSET_PREFILL_RANK);
            }
        }
    }
    Ok(hints)
}

/// The value of the strongest name present, after checking every occurrence of every name.
fn pick<'a, I, T, F>(header: &PinHeader, headers: I, parse: F) -> Result<Option<T>, RouteError>
where
    I: IntoIterator<Item = (&'a str, &'a [u8])>,
    T: PartialEq,
    F: Fn(&[u8]) -> Result<T, String>,
{
    // The first value seen under each name, by the name's strength (0 is canonical).
    let mut found: Vec<(usize, T)> = Vec::new();
    for (name, raw) in headers {
        let Some((strength, name)) = header
            .names
            .iter()
            .copied()
            .enumerate()
            .find(|(_, n)| *n == name)
        else {
            continue;
        };
        let value = parse(raw).map_err(|reason| RouteError::InvalidHeader { name, reason })?;
        match found.iter().find(|(s, _)| *s == strength) {
            Some((_, first)) if *first != value => {
                let reason = "repeated with different values".into();
                return Err(RouteError::InvalidHeader { name, reason });
            }
            Some(_) => {}
            None => found.push((strength, value)),
        }
    }
    found.sort_by_key(|(strength, _)| *strength);
    let mut by_strength = found.into_iter();
    let Some((strength, value)) = by_strength.next() else {
        return Ok(None);
    };
    if strength > 0
        && let Some((other, _)) = by_strength.find(|(_, other)| *other != value)
    {
        let name = header.names.get(strength).copied().unwrap_or("pin header");
        let other = header.names.get(other).copied().unwrap_or("another alias");
        let reason = format!("conflicts with {other}, another alias of the same pin");
        return Err(RouteError::InvalidHeader { name, reason });
    }
    Ok(Some(value))
}

fn parse_u64(raw: &[u8]) -> Result<u64, String> {
    let text = std::str::from_utf8(raw).map_err(|_| "value is not UTF-8".to_string())?;
    if text.is_empty() {
        return Err("value is empty".into());
    }
    if text.starts_with('-') && text.len() > 1 && text[1..].bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{} is negative", quoted(text)));
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{} is not a decimal integer", quoted(text)));
    }
    text.parse::<u64>()
        .map_err(|_| format!("{} does not fit in 64 bits", quoted(text)))
}

fn parse_u32(raw: &[u8]) -> Result<u32, String> {
    let value = parse_u64(raw)?;
    u32::try_from(value).map_err(|_| format!("{value} does not fit in 32 bits"))
}

fn parse_session(raw: &[u8]) -> Result<Vec<u8>, String> {
    match raw.len() {
        0 => Err("value is empty".into()),
        n if n > SESSION_MAX_BYTES => {
            Err(format!("value is {n} bytes, more than {SESSION_MAX_BYTES}"))
        }
        _ => Ok(raw.to_vec()),
    }
}

/// Reads the routing fields of `nvext` in a request body.
pub fn parse_nvext(body: &JsonObject<'_>) -> Result<Pins, RouteError> {
    let Some(raw) = body.get("nvext") else {
        return Ok(Pins::default());
    };
    if raw.get() == "null" {
        return Ok(Pins::default());
    }
    let nvext = JsonObject::parse(raw.get().as_bytes()).map_err(|_| RouteError::InvalidField {
        field: "nvext",
        reason: "must be a JSON object without duplicate keys".into(),
    })?;
    Ok(Pins {
        backend_instance_id: field(&nvext, "nvext.backend_instance_id", u64::MAX)?,
        prefill_worker_id: field(&nvext, "nvext.prefill_worker_id", u64::MAX)?,
        decode_worker_id: field(&nvext, "nvext.decode_worker_id", u64::MAX)?,
        dp_rank: field(&nvext, "nvext.dp_rank", u64::from(u32::MAX))?.map(narrow),
        prefill_dp_rank: field(&nvext, "nvext.prefill_dp_rank", u64::from(u32::MAX))?
            .map(narrow)
            .filter(|rank| *rank != UNSET_PREFILL_RANK),
    })
}

fn narrow(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// A routing field: absent or null is no pin; otherwise an integer in `0..=max`.
fn field(nvext: &JsonObject<'_>, path: &'static str, max: u64) -> Result<Option<u64>, RouteError> {
    let key = path.trim_start_matches("nvext.");
    let Some(raw) = nvext.get(key) else {
        return Ok(None);
    };
    let invalid = |what: &str| RouteError::InvalidField {
        field: path,
        reason: format!("must be an integer in 0..={max}, got {what}"),
    };
    match serde_json::from_str::<Value>(raw.get()) {
        Ok(Value::Null) => Ok(None),
        Ok(Value::Number(n)) => match n.as_u64() {
            Some(v) if v <= max => Ok(Some(v)),
            _ => Err(invalid(&short(raw))),
        },
        Ok(Value::String(_)) => Err(invalid("a string")),
        Ok(Value::Bool(_)) => Err(invalid("a boolean")),
        Ok(Value::Array(_)) => Err(invalid("an array")),
        Ok(Value::Object(_)) => Err(invalid("an object")),
        Err(_) => Err(invalid("a number out of range")),
    }
}

/// A client value as written, cut short for an error message.
pub fn short(raw: &RawValue) -> String {
    let text = raw.get();
    if text.len() <= 40 {
        text.to_string()
    } else {
        format!("{}…", text.chars().take(40).collect::<String>())
    }
}

#[cfg(test)]
#[path = "tests/pins.rs"]
mod tests;

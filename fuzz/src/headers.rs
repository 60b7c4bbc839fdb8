//! `parse_headers` against a model of docs/semantics.md §2.
//!
//! Input: text, one header a line, `name:value` split at the first `:` (the value is the
//! raw bytes after it, untrimmed). Lines without a `:` or with a non-UTF-8 name are skipped.
//!
//! Properties:
//! - it never panics;
//! - it succeeds exactly when the model does, with the same pins and session: every
//!   occurrence of every pin header must parse, a name repeated must repeat its value,
//!   the canonical name wins over its aliases, aliases without the canonical name must
//!   agree; `x-dynamo-worker-instance-id` sets B and D; prefill rank 4294967295 is unset;
//! - an error is `invalid_header` (400) and names a pin header that is present and wrong;
//! - every pin header name is consumed (`is_pin_header`) and stripped (`must_strip`);
//! - picker mode (§9), for each protocol: `picker::parse_headers` never panics; an error is
//!   `invalid_epp_metadata` (502) naming a picker header that is present; a success lists
//!   at most 16 endpoints a header, none with port 0, and for Dynamo one prefill endpoint at
//!   most; every picker header is stripped.

use pinroute::policy::error::RouteError;
use pinroute::policy::headers::must_strip;
use pinroute::policy::picker::{self, MAX_ENDPOINTS, PICKER_HEADERS, Protocol};
use pinroute::policy::pins::{HeaderHints, Pins, is_pin_header, parse_headers};

use crate::violated;

/// What a pin header's value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    U64,
    U32,
    Session,
}

/// Which field(s) a pin header sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sets {
    BackendAndDecode,
    Prefill,
    Rank,
    PrefillRank,
    Session,
}

/// A pin of docs/semantics.md §2: canonical name first, then aliases.
struct Group {
    names: &'static [&'static str],
    kind: Kind,
    sets: Sets,
}

/// The table of docs/semantics.md §2, written out independently of `pins.rs`.
const GROUPS: &[Group] = &[
    Group {
        names: &["x-dynamo-worker-instance-id", "x-worker-instance-id"],
        kind: Kind::U64,
        sets: Sets::BackendAndDecode,
    },
    Group {
        names: &["x-dynamo-prefill-instance-id", "x-prefill-instance-id"],
        kind: Kind::U64,
        sets: Sets::Prefill,
    },
    Group {
        names: &["x-dynamo-dp-rank", "x-dp-rank", "x-data-parallel-rank"],
        kind: Kind::U32,
        sets: Sets::Rank,
    },
    Group {
        names: &["x-dynamo-prefill-dp-rank", "x-prefill-dp-rank"],
        kind: Kind::U32,
        sets: Sets::PrefillRank,
    },
    Group {
        names: &["x-dynamo-session-id"],
        kind: Kind::Session,
        sets: Sets::Session,
    },
];

const UNSET_PREFILL_RANK: u64 = 4_294_967_295;
const SESSION_MAX_BYTES: usize = 256;

/// A parsed pin value: integers as u64, sessions as bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Int(u64),
    Bytes(Vec<u8>),
}

/// Splits the fuzzer's text into header lines.
pub fn decode(data: &[u8]) -> Vec<(&str, &[u8])> {
    data.split(|b| *b == b'\n')
        .filter_map(|line| {
            let colon = line.iter().position(|b| *b == b':')?;
            let (name, rest) = line.split_at(colon);
            let name = std::str::from_utf8(name).ok()?;
            Some((name, rest.get(1..).unwrap_or_default()))
        })
        .collect()
}

pub fn check(data: &[u8]) {
    let headers = decode(data);
    check_names(&headers);
    check_picker(&headers);
    let actual = parse_headers(headers.iter().copied());
    match (expected(&headers), actual) {
        (Ok(want), Ok(got)) => assert_eq!(got, want, "pins of {headers:?}"),
        (Err(bad_names), Err(error)) => check_error(&error, &bad_names),
        (Ok(want), Err(error)) => {
            violated(format!("{headers:?} refused ({error}), model: {want:?}"))
        }
        (Err(bad), Ok(got)) => violated(format!(
            "{headers:?} accepted as {got:?}, model refuses {bad:?}"
        )),
    }
}

fn check_picker(headers: &[(&str, &[u8])]) {
    for protocol in [Protocol::Gie, Protocol::LlmD, Protocol::Dynamo] {
        match picker::parse_headers(protocol, headers.iter().copied()) {
            Ok(picked) => {
                for list in [&picked.token, &picked.prefill] {
                    assert!(list.len() <= MAX_ENDPOINTS && list.iter().all(|a| a.port() != 0));
                }
                if protocol == Protocol::Dynamo {
                    assert!(picked.prefill.len() <= 1, "{picked:?}");
                }
            }
            Err(RouteError::InvalidEppMetadata { header, .. }) => assert!(
                headers.iter().any(|(name, _)| *name == header),
                "error names {header}, absent from {headers:?}"
            ),
            Err(other) => violated(format!(
                "a picker error must be InvalidEppMetadata: {other:?}"
            )),
        }
    }
    for name in PICKER_HEADERS {
        assert!(
            must_strip(name, "x-pinroute-upstream"),
            "{name} must be stripped"
        );
    }
}

fn check_names(headers: &[(&str, &[u8])]) {
    for (name, _) in headers {
        let is_pin = GROUPS.iter().any(|g| g.names.contains(name));
        assert_eq!(is_pin_header(name), is_pin, "is_pin_header({name:?})");
        if is_pin {
            assert!(
                must_strip(name, "x-pinroute-upstream"),
                "pin header {name} must be stripped"
            );
        }
    }
}

fn check_error(error: &RouteError, bad_names: &[&str]) {
    let RouteError::InvalidHeader { name, .. } = error else {
        violated(format!(
            "a header error must be InvalidHeader, got {error:?}"
        ))
    };
    assert!(
        bad_names.contains(name),
        "error names {name}, the wrong headers are {bad_names:?}"
    );
    assert_eq!((error.status(), error.code()), (400, "invalid_header"));
    assert!(
        error.to_string().contains(name),
        "message {error} must name {name}"
    );
}

/// The model's answer: the hints, or the names present in groups that must be refused.
fn expected(headers: &[(&str, &[u8])]) -> Result<HeaderHints, Vec<&'static str>> {
    let mut hints = HeaderHints::default();
    let mut bad = Vec::new();
    for group in GROUPS {
        match group_value(group, headers) {
            Ok(value) => apply(&mut hints, group.sets, value),
            Err(()) => bad.extend(
                group
                    .names
                    .iter()
                    .filter(|n| headers.iter().any(|(h, _)| h == *n)),
            ),
        }
    }
    if bad.is_empty() { Ok(hints) } else { Err(bad) }
}

/// The value a group settles on, `None` when absent, `Err` when the group must be refused.
fn group_value(group: &Group, headers: &[(&str, &[u8])]) -> Result<Option<Value>, ()> {
    // Per name (by strength), every value it was given.
    let mut per_name: Vec<Vec<Value>> = vec![Vec::new(); group.names.len()];
    for (name, raw) in headers {
        let Some(strength) = group.names.iter().position(|n| n == name) else {
            continue;
        };
        let value = parse(group.kind, raw).ok_or(())?;
        if let Some(values) = per_name.get_mut(strength) {
            values.push(value);
        }
    }
    if per_name
        .iter()
        .any(|values| values.windows(2).any(|w| w.first() != w.last()))
    {
        return Err(());
    }
    let firsts: Vec<&Value> = per_name
        .iter()
        .filter_map(|values| values.first())
        .collect();
    let canonical = per_name.first().and_then(|values| values.first());
    match (canonical, firsts.first()) {
        (Some(value), _) => Ok(Some(value.clone())),
        (None, None) => Ok(None),
        (None, Some(first)) if firsts.iter().all(|v| v == first) => Ok(Some((*first).clone())),
        (None, Some(_)) => Err(()),
    }
}

/// docs/semantics.md §2: a decimal integer of the type's range, or a session of 1–256 bytes.
fn parse(kind: Kind, raw: &[u8]) -> Option<Value> {
    if kind == Kind::Session {
        return (1..=SESSION_MAX_BYTES)
            .contains(&raw.len())
            .then(|| Value::Bytes(raw.to_vec()));
    }
    if raw.is_empty() || !raw.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let value: u64 = std::str::from_utf8(raw).ok()?.parse().ok()?;
    let max = if kind == Kind::U32 {
        u64::from(u32::MAX)
    } else {
        u64::MAX
    };
    (value <= max).then_some(Value::Int(value))
}

fn apply(hints: &mut HeaderHints, sets: Sets, value: Option<Value>) {
    let int = match &value {
        Some(Value::Int(v)) => Some(*v),
        _ => None,
    };
    let small = int.and_then(|v| u32::try_from(v).ok());
    let pins: &mut Pins = &mut hints.pins;
    match sets {
        Sets::BackendAndDecode => (pins.backend_instance_id, pins.decode_worker_id) = (int, int),
        Sets::Prefill => pins.prefill_worker_id = int,
        Sets::Rank => pins.dp_rank = small,
        Sets::PrefillRank => {
            pins.prefill_dp_rank = small.filter(|r| u64::from(*r) != UNSET_PREFILL_RANK)
        }
        Sets::Session => {
            hints.session = match value {
                Some(Value::Bytes(bytes)) => Some(bytes),
                _ => None,
            }
        }
    }
}

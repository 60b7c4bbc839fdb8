//! Property checks for pinroute's pure policy core, one module per fuzz target.
//!
//! Each `check` takes one fuzzer input and panics (through [`violated`] or an assertion)
//! when the core breaks a property of docs/semantics.md; a panic is what libFuzzer records as a
//! crash. The targets in `fuzz_targets/` only decode the input and call these.

use pinroute::policy::json::JsonObjectError;

pub mod config;
pub mod headers;
pub mod json_object;
pub mod metrics_page;
pub mod nvext;
pub mod resolve;
pub mod rewrite;
pub mod trace;

/// Reports a broken property: the one place that panics on purpose.
#[allow(clippy::panic)]
#[track_caller]
pub fn violated(what: impl std::fmt::Display) -> ! {
    panic!("property violated: {what}")
}

/// Whether `error` refuses a key that appears twice (that key, when one is given).
pub fn is_duplicate_key(error: &JsonObjectError, key: Option<&str>) -> bool {
    matches!(error, JsonObjectError::DuplicateKey(k) if key.is_none_or(|key| k == key))
}

#[cfg(test)]
mod seeds;

//! Property checks for pinroute's pure policy core, one module per fuzz target.
//!
//! Each `check` takes one fuzzer input and panics (through [`violated`] or an assertion)
//! when the core breaks a property of SPEC.md; a panic is what libFuzzer records as a
//! crash. The targets in `fuzz_targets/` only decode the input and call these.

pub mod headers;
pub mod json_object;
pub mod nvext;
pub mod resolve;
pub mod rewrite;

/// Reports a broken property: the one place that panics on purpose.
#[allow(clippy::panic)]
#[track_caller]
pub fn violated(what: impl std::fmt::Display) -> ! {
    panic!("property violated: {what}")
}

#[cfg(test)]
mod seeds;

//! What the filter tells Envoy's access log about a request (`docs/metrics.md`, "The access
//! log"): how each hop's worker was chosen, the workers that served and their ranks, the
//! model, the prefill hop's time — the fields and their values; `Env::log_field` writes
//! them. Each is a filter-state string `wasm.pinroute.<field>` (the key proxy-wasm's
//! `set_property` makes; the native module writes the same keys), read by the bootstrap's log
//! format with `%FILTER_STATE(wasm.pinroute.<field>:PLAIN)%`. Each is written once, when it is
//! final (Envoy refuses a second write of a native module's key). Never a response header:
//! how a hop was placed (a remembered turn) must not reach the client.

use super::host::Host;
use crate::policy::resolve::{LocalPrefill, PrefillPlan, Route, Target};
use crate::policy::select::Placement;

/// The longest model name logged; a client's `model` is cut there.
const MAX_MODEL_BYTES: usize = 256;

/// A field of the access log the filter fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Model,
    PrefillWorker,
    PrefillRank,
    PrefillChoice,
    PrefillMs,
    DecodeWorker,
    DecodeRank,
    DecodeChoice,
}

impl Field {
    /// The filter-state key.
    pub fn key(self) -> &'static str {
        match self {
            Field::Model => "wasm.pinroute.model",
            Field::PrefillWorker => "wasm.pinroute.prefill_worker",
            Field::PrefillRank => "wasm.pinroute.prefill_rank",
            Field::PrefillChoice => "wasm.pinroute.prefill_choice",
            Field::PrefillMs => "wasm.pinroute.prefill_ms",
            Field::DecodeWorker => "wasm.pinroute.decode_worker",
            Field::DecodeRank => "wasm.pinroute.decode_rank",
            Field::DecodeChoice => "wasm.pinroute.decode_choice",
        }
    }
}

/// Sets `field`; a host that refuses is logged, never an error of the request.
pub fn write(host: &impl Host, field: Field, value: &str) {
    if let Err(e) = host.set_log_field(field.key(), value) {
        log::debug!("pinroute: access log field {}: {e:?}", field.key());
    }
}

/// The model the request names, cut to [`MAX_MODEL_BYTES`].
pub fn model(model: &str) -> &str {
    cut(model, MAX_MODEL_BYTES)
}

/// The fields a route decides: how each hop was chosen (the workers that serve are written
/// when they answer).
pub fn choices(route: &Route) -> [(Field, &'static str); 2] {
    [
        (Field::PrefillChoice, prefill_choice(route)),
        (Field::DecodeChoice, choice(route.decode.placement)),
    ]
}

/// A hop's worker that answered and, when the filter named one, its rank.
pub fn target(target: &Target, worker: Field, rank: Field) -> Vec<(Field, String)> {
    let rank = target.rank.map(|r| (rank, r.to_string()));
    [(worker, target.worker.id.to_string())]
        .into_iter()
        .chain(rank)
        .collect()
}

fn prefill_choice(route: &Route) -> &'static str {
    match route.prefill {
        PrefillPlan::Skip => "none",
        PrefillPlan::Local(LocalPrefill::ShortPrompt) => "local_short_prompt",
        PrefillPlan::Local(LocalPrefill::NextTurn) => "local_next_turn",
        PrefillPlan::Local(LocalPrefill::Picker) => "local_by_picker",
        PrefillPlan::Local(LocalPrefill::Stateful) => "local_stateful",
        PrefillPlan::Pinned(_) => "pin",
        PrefillPlan::Candidates(_) => choice(route.prefill_placement),
    }
}

/// How a hop's worker was chosen: its placement, or `pin` when the client named it.
fn choice(placement: Option<Placement>) -> &'static str {
    match placement {
        None => "pin",
        Some(Placement::Load) => "load",
        Some(Placement::Session) => "session",
        Some(Placement::Remembered) => "remembered",
        Some(Placement::Affinity) => "affinity",
        Some(Placement::Spilled) => "spilled",
        Some(Placement::Picker) => "picker",
    }
}

/// The longest beginning of `text` of at most `max` bytes that ends on a character.
fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_model_is_cut_on_a_character() {
        assert_eq!(cut("abc", 256), "abc");
        assert_eq!(cut("ééé", 3), "é");
        assert_eq!(cut(&"x".repeat(300), MAX_MODEL_BYTES).len(), 256);
    }
}

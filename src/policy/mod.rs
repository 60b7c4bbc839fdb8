//! The pure policy core: every rule of `docs/semantics.md`, with no proxy-wasm dependency.
//!
//! | `docs/semantics.md` | module |
//! |---|---|
//! | §1 Which paths take the two-hop flow | [`paths`] |
//! | §1, §4, §6 The generation APIs: each one's path, prompt, limits and error shape | [`api`] |
//! | §4 State the Responses API keeps on a decode worker | [`responses`] |
//! | §1, §4 Other paths: passed on, never carrying KV transfer parameters | [`passthrough`] |
//! | §1 The in-flight limit, over all Envoy threads | [`inflight`] |
//! | §2 Inputs (headers, `nvext`) | [`pins`], [`json`] |
//! | §3 Per-hop resolution, exact pins | [`resolve`] |
//! | §3 The model a request names; `GET /v1/models` | [`models`] |
//! | §3, §5 Whether a worker can take a request (draining, passive health, panic mode) | [`availability`], [`health`] |
//! | §5 Requests in flight per worker | [`load`] |
//! | §5 Load as the engines report it: the scrape, its table, the load a choice reads | [`engine_load`], [`metrics_text`] |
//! | §1, §5 The byte encoding of the tables threads share | [`words`] |
//! | §4 The two hops and how one fails | [`hop`] |
//! | §4 Who retries a refused decode connection: Envoy on pool members, the filter on the rest | [`retries`] |
//! | §4, §5 A prompt's beginning as block hashes | [`prefix`] |
//! | §4, §5 The turn memory: a conversation's last turn | [`turns`] |
//! | §4 The bodies of the two hops | [`rewrite`] |
//! | §4, §6 Which worker answers are failures of the hop | [`answers`] |
//! | §5 The choice order (session, prefix affinity, load) and each choice | [`select`] |
//! | §5 How far a prompt is read for placement; which placements the turn memory keeps | [`resolve`] |
//! | §6 Errors and their answers | [`error`] |
//! | §4, §7 Body fields a client may not send | [`steering`] |
//! | §4 Trace context on the prefill hop; its span as OTLP | [`trace`], [`otlp`] |
//! | §7 Headers a client may not send | [`headers`] |
//! | §7 Who may pin and who may name a session | [`callers`] |
//! | §8 Registry | [`registry`] |
//! | §8 Plugin configuration | [`config`] |
//! | §9 Picker mode: an endpoint picker's choices, its allowlist | [`picker`] |

pub mod answers;
pub mod api;
pub mod availability;
pub mod callers;
pub mod config;
pub mod engine_load;
pub mod error;
pub mod headers;
pub mod health;
pub mod hop;
pub mod inflight;
pub mod json;
pub mod load;
pub mod metrics_text;
pub mod models;
pub mod otlp;
pub mod passthrough;
pub mod paths;
pub mod picker;
pub mod pins;
pub mod prefix;
pub mod registry;
pub mod resolve;
pub mod responses;
pub mod retries;
pub mod rewrite;
pub mod select;
pub mod steering;
pub mod trace;
pub mod turns;
pub mod words;

/// The attribute the core's unit tests are marked with (`use crate::policy::testing::test;`):
/// libtest's `#[test]` natively and on wasm32-wasip1, wasm-bindgen-test's on
/// wasm32-unknown-unknown, where the same tests run in Node.
#[cfg(test)]
mod testing {
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
    pub(super) use core::prelude::v1::test;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    pub(super) use wasm_bindgen_test::wasm_bindgen_test as test;
}

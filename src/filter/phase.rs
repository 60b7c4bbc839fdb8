//! The phases of a request (`docs/semantics.md` §1–§4), each holding what it needs and doing
//! nothing: [`super::stream`] alone moves a request from one phase to the next, on what the
//! hop modules report.
//!
//! ```text
//! Headers ─┬─ completion path ──► CompletionBody ──► Prefill ──► Routed (─► its retries)
//!          │                             └────────────────────────┘ (no prefill hop)
//!          ├─ other path, JSON body ──► PassthroughBody ──► Routed
//!          └─ other path ──► Routed
//! any phase ──► Answered (the filter answered itself)
//! ```

use std::net::SocketAddr;

use serde_json::value::RawValue;

use super::call_span::CallSpan;
use super::host::Headers;
use crate::policy::api::Api;
use crate::policy::error::RouteError;
use crate::policy::pins::HeaderHints;
use crate::policy::registry::WorkerId;
use crate::policy::resolve::{Target, TokenHop};
use crate::policy::rewrite::DecodeBody;

pub enum Phase {
    Headers,
    /// A completion request whose body is arriving.
    CompletionBody(Box<Completion>),
    /// Another path's JSON body, read whole before its worker is chosen (it may name the
    /// model) and it goes on (`policy::passthrough`).
    PassthroughBody(Box<HeaderHints>),
    /// The prefill call is in flight; the request waits for it.
    Prefill(Box<Prefilling>),
    /// On its way to the token-generating worker; the response side acts on its answer.
    Routed(Box<Routed>),
    /// The filter answered the request itself.
    Answered,
}

/// What the headers of a generation request decided, for its body and its prefill hop.
pub struct Completion {
    pub hints: HeaderHints,
    /// Its API: the plain spelling of its path is the one both hops carry.
    pub api: Api,
    /// Client headers, minus stripped ones, for the prefill hop.
    pub forwarded: Headers,
}

/// A prefill hop to make, and what is needed to retry it or to go on to decode.
pub struct PrefillAttempt {
    pub target: Target,
    /// Unpinned fallbacks still to try, next last.
    pub remaining: Vec<Target>,
    pub api: Api,
    pub forwarded: Headers,
    /// The prefill body, kept only while a retry may need it.
    pub body: String,
    pub decode_body: DecodeBody,
    pub decode: TokenHop,
    /// Size of the request body Envoy holds.
    pub held_body_size: usize,
}

/// A prefill hop in flight: its call, and the attempt it made.
pub struct Prefilling {
    pub token: u32,
    /// When the call was dispatched, in nanoseconds.
    pub dispatched_at: u64,
    pub attempt: PrefillAttempt,
    /// The hop's span, when it has one (`super::call_span`).
    pub span: Option<CallSpan>,
}

/// A request on its way to its token-generating worker.
pub struct Routed {
    pub decode: TokenHop,
    /// Whether Envoy may retry the hop on the alternates (`x-pinroute-pool` was set).
    pub pooled: bool,
    pub prefill: Option<ServedPrefill>,
    /// The request as routed, when only the filter can retry it (`docs/semantics.md` §4).
    pub retry: Option<DecodeRetry>,
    pub answer: Answer,
}

/// The prefill hop that served the request.
pub struct ServedPrefill {
    pub worker: WorkerId,
    pub address: SocketAddr,
    /// What locates its KV, sent with the decode hop: it must never reach the client.
    pub kv_transfer_params: Option<Box<RawValue>>,
}

/// What becomes of the worker's answer on its way to the client.
pub enum Answer {
    /// Its headers have not come yet.
    Awaited,
    AsItIs,
    /// Replaced by this typed error.
    Replaced(RouteError),
    /// Envoy's answer to a refused connection, held while the filter sends the request to
    /// the next candidate; that call's answer replaces it.
    Retrying,
}

/// The routed request, kept for the filter to send again.
pub struct DecodeRetry {
    /// Its headers as routed, but for the steering and hop-by-hop ones.
    pub headers: Headers,
    pub body: Vec<u8>,
    /// The call in flight, if one is.
    pub token: Option<u32>,
}

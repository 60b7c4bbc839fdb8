//! Every error pinroute answers with (`docs/semantics.md` §6).

use thiserror::Error;

use super::api::ErrorShape;
use super::availability::Unavailability;
use super::hop::{Hop, HopFailure};
use super::registry::{Role, WorkerId};

/// A request pinroute refuses or cannot serve. Each maps to one HTTP status and `code`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RouteError {
    #[error("header {name}: {reason}")]
    InvalidHeader { name: &'static str, reason: String },
    #[error("request body: {0}")]
    InvalidBody(String),
    #[error("{field}: {reason}")]
    InvalidField { field: &'static str, reason: String },
    #[error("{method} is not allowed on {path}: it takes {allow}")]
    MethodNotAllowed {
        method: String,
        path: String,
        allow: &'static str,
    },
    #[error("{caller} may not {privilege}")]
    NotPermitted {
        caller: String,
        privilege: Privilege,
    },
    #[error("path {path} is not served by this gateway")]
    UnknownPath { path: String },
    #[error("response {id} is not stored on any worker: {reason}")]
    ResponseNotFound { id: String, reason: &'static str },
    #[error("model {} is not served by any worker of this gateway", quoted(.model))]
    ModelNotFound { model: String },
    #[error("{hop} hop: pinned worker {worker} does not serve model {}", quoted(.model))]
    ModelNotServed {
        hop: Hop,
        worker: WorkerId,
        model: String,
    },
    #[error("request body is larger than the {limit}-byte limit")]
    BodyTooLarge { limit: usize },
    #[error("{hop} hop: a data-parallel rank was pinned without a {hop} worker")]
    RankWithoutWorker { hop: Hop },
    #[error("{hop} hop: pinned worker {worker} is unknown to the registry")]
    UnknownWorker { hop: Hop, worker: WorkerId },
    #[error("{hop} hop: pinned worker {worker} is a {actual} worker, not a {expected} worker")]
    WrongRole {
        hop: Hop,
        worker: WorkerId,
        actual: Role,
        expected: Role,
    },
    #[error("{hop} hop: dp rank {rank} of pinned worker {worker} is outside [0, {dp_size})")]
    RankOutOfRange {
        hop: Hop,
        worker: WorkerId,
        rank: u32,
        dp_size: u32,
    },
    #[error("{hop} hop: pinned worker {worker} is {why}")]
    WorkerUnavailable {
        hop: Hop,
        worker: WorkerId,
        why: Unavailability,
    },
    #[error("{hop} hop: no healthy {role} worker is available")]
    NoWorkerAvailable { hop: Hop, role: Role },
    #[error("{hop} hop: pinned worker {worker} failed: {failure}")]
    PinnedWorkerFailed {
        hop: Hop,
        worker: WorkerId,
        failure: HopFailure,
    },
    #[error("{hop} hop: worker {worker} failed: {failure}")]
    UpstreamFailed {
        hop: Hop,
        worker: WorkerId,
        failure: HopFailure,
    },
    #[error(
        "decode hop: worker {worker} refused the request with HTTP {status}; its answer is \
         withheld, as it may echo the prefill's KV transfer parameters"
    )]
    DecodeRefused { worker: WorkerId, status: u16 },
    #[error(
        "the gateway holds {limit} completion requests already (max_requests_in_flight); retry shortly"
    )]
    Overloaded { limit: u64 },
    #[error("picker header {header}: {reason}")]
    InvalidEppMetadata {
        header: &'static str,
        reason: String,
    },
    #[error("internal error: {0}")]
    Internal(&'static str),
}

/// What a caller asked for that the rules may withhold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    Pin,
    Session,
}

impl std::fmt::Display for Privilege {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Privilege::Pin => "pin workers (callers.may_pin)",
            Privilege::Session => "send x-dynamo-session-id (callers.may_use_sessions)",
        })
    }
}

/// Seconds a client is told to wait before retrying a worker that is out of service.
pub const RETRY_AFTER_SECS: u32 = 5;
/// Seconds a client is told to wait when the gateway holds all the requests it may: a slot
/// frees as soon as any request in flight ends.
pub const OVERLOADED_RETRY_AFTER_SECS: u32 = 1;

impl RouteError {
    pub fn status(&self) -> u16 {
        use RouteError::*;
        match self {
            InvalidHeader { .. }
            | InvalidBody(_)
            | InvalidField { .. }
            | RankWithoutWorker { .. }
            | UnknownWorker { .. }
            | WrongRole { .. }
            | RankOutOfRange { .. }
            | ModelNotServed { .. } => 400,
            NotPermitted { .. } => 403,
            UnknownPath { .. } | ResponseNotFound { .. } | ModelNotFound { .. } => 404,
            MethodNotAllowed { .. } => 405,
            BodyTooLarge { .. } => 413,
            WorkerUnavailable { .. } | NoWorkerAvailable { .. } | Overloaded { .. } => 503,
            PinnedWorkerFailed { failure, .. } | UpstreamFailed { failure, .. } => {
                if *failure == HopFailure::Timeout {
                    504
                } else {
                    502
                }
            }
            DecodeRefused { status, .. } => (*status).clamp(400, 499),
            InvalidEppMetadata { .. } => 502,
            Internal(_) => 500,
        }
    }

    pub fn code(&self) -> &'static str {
        use RouteError::*;
        match self {
            InvalidHeader { .. } => "invalid_header",
            InvalidBody(_) => "invalid_body",
            InvalidField { .. } => "invalid_field",
            MethodNotAllowed { .. } => "method_not_allowed",
            NotPermitted {
                privilege: Privilege::Pin,
                ..
            } => "pin_not_allowed",
            NotPermitted {
                privilege: Privilege::Session,
                ..
            } => "session_not_allowed",
            UnknownPath { .. } => "unknown_path",
            ResponseNotFound { .. } => "response_not_found",
            ModelNotFound { .. } => "model_not_found",
            ModelNotServed { .. } => "model_not_served",
            BodyTooLarge { .. } => "body_too_large",
            RankWithoutWorker { .. } => "rank_without_worker",
            UnknownWorker { .. } => "unknown_worker",
            WrongRole { .. } => "wrong_worker_role",
            RankOutOfRange { .. } => "dp_rank_out_of_range",
            WorkerUnavailable { .. } => "worker_unavailable",
            NoWorkerAvailable { .. } => "no_worker_available",
            PinnedWorkerFailed { .. } => "pinned_worker_failed",
            UpstreamFailed { .. } => "upstream_failed",
            DecodeRefused { .. } => "decode_refused",
            Overloaded { .. } => "overloaded",
            InvalidEppMetadata { .. } => "invalid_epp_metadata",
            Internal(_) => "internal_error",
        }
    }

    /// Every `code`, for metrics defined up front.
    pub const CODES: &[&str] = &[
        "invalid_header",
        "invalid_body",
        "invalid_field",
        "method_not_allowed",
        "pin_not_allowed",
        "session_not_allowed",
        "unknown_path",
        "response_not_found",
        "model_not_found",
        "model_not_served",
        "body_too_large",
        "rank_without_worker",
        "unknown_worker",
        "wrong_worker_role",
        "dp_rank_out_of_range",
        "worker_unavailable",
        "no_worker_available",
        "pinned_worker_failed",
        "upstream_failed",
        "decode_refused",
        "overloaded",
        "invalid_epp_metadata",
        "internal_error",
    ];

    /// The OpenAI error `type`: the client's fault or the server's.
    pub fn kind(&self) -> &'static str {
        if self.status() < 500 {
            "invalid_request_error"
        } else {
            "server_error"
        }
    }

    pub fn retry_after_secs(&self) -> Option<u32> {
        match self {
            RouteError::WorkerUnavailable {
                why: Unavailability::Unhealthy { retry_after_secs },
                ..
            } => Some(*retry_after_secs),
            RouteError::WorkerUnavailable { .. } | RouteError::NoWorkerAvailable { .. } => {
                Some(RETRY_AFTER_SECS)
            }
            RouteError::Overloaded { .. } => Some(OVERLOADED_RETRY_AFTER_SECS),
            _ => None,
        }
    }

    /// The methods a path takes, for the `Allow` header of a 405.
    pub fn allow(&self) -> Option<&'static str> {
        match self {
            RouteError::MethodNotAllowed { allow, .. } => Some(allow),
            _ => None,
        }
    }

    /// The JSON body, in the shape the path's clients read: OpenAI's `{"error": {"message",
    /// "type", "code"}}`, or Anthropic's `{"type": "error", "error": {"type", "message"}}`
    /// with the same `code` beside them.
    pub fn body(&self, shape: ErrorShape) -> String {
        let message = self.to_string();
        match shape {
            ErrorShape::OpenAi => serde_json::json!({
                "error": { "message": message, "type": self.kind(), "code": self.code() }
            }),
            ErrorShape::Anthropic => serde_json::json!({
                "type": "error",
                "error": { "type": self.anthropic_kind(), "message": message, "code": self.code() }
            }),
        }
        .to_string()
    }

    /// Anthropic's error `type` for the status.
    fn anthropic_kind(&self) -> &'static str {
        match self.status() {
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            400..=499 => "invalid_request_error",
            503 => "overloaded_error",
            _ => "api_error",
        }
    }
}

/// Quotes a client value for an error message, cut short so a message stays small.
pub fn quoted(text: &str) -> String {
    const MAX_CHARS: usize = 40;
    let mut cut: String = text.chars().take(MAX_CHARS).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    serde_json::Value::String(cut).to_string()
}

#[cfg(test)]
#[path = "tests/error.rs"]
mod tests;

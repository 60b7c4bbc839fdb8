//! Every error pinroute answers with (SPEC section 3), and configuration errors.

use std::fmt;
use std::net::SocketAddr;

use thiserror::Error;

use super::registry::{Role, WorkerId};

/// A hop of the request: the error message always says which one went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    Prefill,
    Decode,
    /// The single hop of an aggregated deployment, or of an aggregated fallback.
    Aggregated,
}

impl fmt::Display for Hop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hop::Prefill => "prefill",
            Hop::Decode => "decode",
            Hop::Aggregated => "aggregated",
        })
    }
}

/// Why an upstream hop did not produce a usable response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HopFailure {
    /// No response at all: connection refused or reset.
    Connect,
    /// Envoy's own limit for the cluster (circuit breaker) was reached: no connection tried.
    Overloaded,
    Timeout,
    Status(u16),
    /// A 2xx whose body could not be used.
    BadResponse(&'static str),
}

impl fmt::Display for HopFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HopFailure::Connect => f.write_str("the connection failed"),
            HopFailure::Overloaded => {
                f.write_str("the gateway's connection limit for it was reached")
            }
            HopFailure::Timeout => f.write_str("it timed out"),
            HopFailure::Status(status) => write!(f, "it answered HTTP {status}"),
            HopFailure::BadResponse(why) => write!(f, "its response was unusable: {why}"),
        }
    }
}

/// Why a known worker of the right role cannot take a request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailability {
    /// Taken out of service by the operator (registry `draining`).
    Draining,
    /// A recent hop to it failed; back in service after this many seconds at most.
    Unhealthy { retry_after_secs: u32 },
}

impl fmt::Display for Unavailability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailability::Draining => f.write_str("draining"),
            Unavailability::Unhealthy { .. } => f.write_str("unhealthy after a recent failure"),
        }
    }
}

/// A request pinroute refuses or cannot serve. Each maps to one HTTP status and `code`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RouteError {
    #[error("header {name}: {reason}")]
    InvalidHeader { name: &'static str, reason: String },
    #[error("request body: {0}")]
    InvalidBody(String),
    #[error("{field}: {reason}")]
    InvalidField { field: &'static str, reason: String },
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
    #[error("internal error: {0}")]
    Internal(&'static str),
}

/// Seconds a client is told to wait before retrying a worker that is out of service.
pub const RETRY_AFTER_SECS: u32 = 5;

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
            | RankOutOfRange { .. } => 400,
            BodyTooLarge { .. } => 413,
            WorkerUnavailable { .. } | NoWorkerAvailable { .. } => 503,
            PinnedWorkerFailed { failure, .. } | UpstreamFailed { failure, .. } => {
                if *failure == HopFailure::Timeout {
                    504
                } else {
                    502
                }
            }
            Internal(_) => 500,
        }
    }

    pub fn code(&self) -> &'static str {
        use RouteError::*;
        match self {
            InvalidHeader { .. } => "invalid_header",
            InvalidBody(_) => "invalid_body",
            InvalidField { .. } => "invalid_field",
            BodyTooLarge { .. } => "body_too_large",
            RankWithoutWorker { .. } => "rank_without_worker",
            UnknownWorker { .. } => "unknown_worker",
            WrongRole { .. } => "wrong_worker_role",
            RankOutOfRange { .. } => "dp_rank_out_of_range",
            WorkerUnavailable { .. } => "worker_unavailable",
            NoWorkerAvailable { .. } => "no_worker_available",
            PinnedWorkerFailed { .. } => "pinned_worker_failed",
            UpstreamFailed { .. } => "upstream_failed",
            Internal(_) => "internal_error",
        }
    }

    /// Every `code`, for metrics defined up front.
    pub const CODES: &[&str] = &[
        "invalid_header",
        "invalid_body",
        "invalid_field",
        "body_too_large",
        "rank_without_worker",
        "unknown_worker",
        "wrong_worker_role",
        "dp_rank_out_of_range",
        "worker_unavailable",
        "no_worker_available",
        "pinned_worker_failed",
        "upstream_failed",
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
            _ => None,
        }
    }

    /// The OpenAI-shaped JSON body: `{"error": {"message", "type", "code"}}`.
    pub fn body(&self) -> String {
        serde_json::json!({
            "error": { "message": self.to_string(), "type": self.kind(), "code": self.code() }
        })
        .to_string()
    }
}

/// Why a plugin configuration or registry was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("invalid JSON: {0}")]
    Json(serde_json::Error),
    #[error("the \"workers\" list is missing")]
    MissingWorkers,
    #[error("worker id {0} appears more than once")]
    DuplicateId(WorkerId),
    #[error("address {0} is given to more than one worker")]
    DuplicateAddress(SocketAddr),
    #[error("worker {0} has dp_size 0")]
    ZeroDpSize(WorkerId),
    #[error("aggregated workers cannot be mixed with prefill or decode workers")]
    MixedDeployment,
    #[error("no decode or aggregated worker: nothing could generate tokens")]
    NoDecodeWorker,
    #[error("{0}")]
    Setting(&'static str),
}

#[cfg(test)]
#[path = "tests/error.rs"]
mod tests;

//! The two hops of a request and how one can fail (`docs/semantics.md` §4).

use std::fmt;

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
    /// No connection: refused, or not made in time. Nothing reached the worker.
    Connect,
    /// The worker accepted the connection, then reset or closed it before answering: it
    /// may have refused what the client sent (`docs/semantics.md` §5).
    Reset,
    /// Envoy's own limit for the cluster (circuit breaker) was reached: no connection tried.
    Overloaded,
    Timeout,
    Status(u16),
    /// A 2xx whose body could not be used.
    BadResponse(&'static str),
    /// A call's answer that broke off after it started, or that Envoy would not hold whole
    /// (over its limit): the worker was reached, and the request may have caused it.
    Incomplete,
    /// An answer larger than the gateway takes from a worker (`docs/semantics.md` §4).
    TooLarge {
        bytes: usize,
        limit: usize,
    },
}

impl fmt::Display for HopFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HopFailure::Connect => f.write_str("the connection failed"),
            HopFailure::Reset => f.write_str("it reset the connection before answering"),
            HopFailure::Overloaded => {
                f.write_str("the gateway's connection limit for it was reached")
            }
            HopFailure::Timeout => f.write_str("it timed out"),
            HopFailure::Status(status) => write!(f, "it answered HTTP {status}"),
            HopFailure::BadResponse(why) => write!(f, "its response was unusable: {why}"),
            HopFailure::Incomplete => f.write_str("its answer did not arrive whole"),
            HopFailure::TooLarge { bytes, limit } => write!(
                f,
                "its answer of {bytes} bytes is over the gateway's limit of {limit}"
            ),
        }
    }
}

//! Request headers a client may not send (`docs/semantics.md` §7): anything that could choose an
//! upstream, or speak for the filter.

use super::picker::PICKER_HEADERS;
use super::pins::is_pin_header;

/// Prefix of every header the filter itself sets.
pub const INTERNAL_PREFIX: &str = "x-pinroute-";

const UPSTREAM_CHOOSING: &[&str] = &["x-envoy-original-dst-host"];
const UPSTREAM_CHOOSING_PREFIXES: &[&str] = &["x-gateway-destination-endpoint", INTERNAL_PREFIX];

/// `ip:port,...` of an unpinned decode hop's candidates, best first: the bootstrap routes
/// such requests to a cluster whose `override_host` policy tries them in order.
pub const POOL_HEADER: &str = "x-pinroute-pool";

/// The header vLLM reads to choose a data-parallel rank; only the filter sets it.
pub const DP_RANK_HEADER: &str = "x-data-parallel-rank";

/// Whether a request header must be removed before anything is routed: it could steer an
/// upstream, it is the filter's own, it is a pin (consumed by the filter; a client's rank
/// header must never reach a worker unchanged) or a picker's (read first in picker mode,
/// `docs/semantics.md` §9).
pub fn must_strip(name: &str, upstream_header: &str) -> bool {
    name == upstream_header
        || UPSTREAM_CHOOSING.contains(&name)
        || PICKER_HEADERS.contains(&name)
        || UPSTREAM_CHOOSING_PREFIXES
            .iter()
            .any(|p| name.starts_with(p))
        || is_pin_header(name)
}

/// Response headers naming the workers that served.
pub const PREFILL_WORKER_HEADER: &str = "x-pinroute-prefill-worker";
pub const DECODE_WORKER_HEADER: &str = "x-pinroute-decode-worker";
/// Response header marking a worker's answer the filter relayed itself (`prefill`: a prefill
/// worker's refusal; `decode`: a decode hop the filter sent again), so that Envoy's local-reply
/// rewriting leaves it as the worker wrote it, whether or not worker ids are shown.
pub const RELAYED_HEADER: &str = "x-pinroute-relayed";
/// Response header repeating the `code` of an error pinroute answered.
pub const ERROR_CODE_HEADER: &str = "x-pinroute-error-code";

#[cfg(test)]
#[path = "tests/headers.rs"]
mod tests;

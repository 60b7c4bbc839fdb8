//! Who retries a refused decode connection (`docs/semantics.md` §4): Envoy, on the members of
//! the bootstrap's pool cluster that the filter lists; the filter itself, for a first choice
//! only a live registry knows. Pinned hops are never retried elsewhere.

use std::collections::HashSet;
use std::net::SocketAddr;

use super::registry::{Worker, WorkerId};
use super::resolve::TokenHop;

/// The addresses Envoy may try, best first, when the hop's first choice is a pool member:
/// every candidate that is one (a non-member is never dialled by Envoy's pool cluster).
/// `None` when Envoy does not retry the hop.
pub fn pool_candidates(
    decode: &TokenHop,
    members: &HashSet<SocketAddr>,
) -> Option<Vec<SocketAddr>> {
    if decode.target.pinned || !members.contains(&decode.target.worker.address) {
        return None;
    }
    let candidates = std::iter::once(&decode.target.worker).chain(&decode.alternates);
    let listed = candidates
        .map(|w| w.address)
        .filter(|address| members.contains(address))
        .collect();
    Some(listed)
}

/// Whether the filter keeps the request to send it on itself: unpinned, with candidates
/// left, and Envoy not retrying it.
pub fn filter_retries(decode: &TokenHop, pooled: bool) -> bool {
    !pooled && !decode.target.pinned && !decode.alternates.is_empty()
}

/// Which worker served a hop Envoy may have retried, from the address its last attempt went
/// to, and the workers whose connections failed before it (the first choice and the
/// alternates skipped).
pub fn served_worker(
    decode: &TokenHop,
    pooled: bool,
    upstream: Option<&str>,
) -> (WorkerId, Vec<WorkerId>) {
    let first = decode.target.worker.id;
    let alternates: &[Worker] = &decode.alternates;
    let served = upstream
        .filter(|_| pooled)
        .and_then(|s| s.parse::<SocketAddr>().ok());
    let at = served.and_then(|served| alternates.iter().position(|w| w.address == served));
    let Some(at) = at else {
        return (first, Vec::new());
    };
    let skipped = alternates.get(..at).unwrap_or_default();
    let failed = std::iter::once(first)
        .chain(skipped.iter().map(|w| w.id))
        .collect();
    (alternates.get(at).map_or(first, |w| w.id), failed)
}

/// The address of `worker`, the hop's first choice or one of its alternates.
pub fn address_of(decode: &TokenHop, worker: WorkerId) -> SocketAddr {
    decode
        .alternates
        .iter()
        .find(|w| w.id == worker)
        .map_or(decode.target.worker.address, |w| w.address)
}

#[cfg(test)]
#[path = "tests/retries.rs"]
mod tests;

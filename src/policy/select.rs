//! Choosing a worker for a hop that is not pinned (`docs/semantics.md` §5).

use super::registry::Worker;

/// How an unpinned hop picks among healthy workers.
#[derive(Clone, Copy)]
pub enum Choice<'a> {
    /// Rendezvous (highest-random-weight) hashing of the session key: every replica with the
    /// same registry agrees, and a worker leaving moves only the sessions it held.
    Session(&'a [u8]),
    /// Round robin: the caller's running request count.
    Turn(u64),
    /// Power of two choices: of the next two workers in round-robin order, the one with fewer
    /// requests outstanding (as `outstanding` tells) goes first.
    LeastLoaded {
        turn: u64,
        outstanding: &'a dyn Fn(&Worker) -> u64,
    },
}

/// Orders `pool` by preference for this request: the first is tried, the rest are the
/// fallbacks for retries, in order.
pub fn rank_candidates<'w>(mut pool: Vec<&'w Worker>, choice: Choice<'_>) -> Vec<&'w Worker> {
    match choice {
        Choice::Session(key) => {
            pool.sort_by_cached_key(|w| std::cmp::Reverse((session_weight(key, w), w.id)));
        }
        Choice::Turn(turn) => rotate(&mut pool, turn),
        Choice::LeastLoaded { turn, outstanding } => {
            rotate(&mut pool, turn);
            if let [first, second, ..] = pool.as_mut_slice()
                && outstanding(second) < outstanding(first)
            {
                std::mem::swap(first, second);
            }
        }
    }
    pool
}

/// Round-robin order: by id, starting at the `turn`-th worker.
fn rotate(pool: &mut [&Worker], turn: u64) {
    pool.sort_by_key(|w| w.id);
    if !pool.is_empty() {
        let start = usize::try_from(turn % pool.len() as u64).unwrap_or(0);
        pool.rotate_left(start);
    }
}

/// A worker's weight for a session: a stable 64-bit hash of the key seeded by the worker id,
/// the same on every platform and every Envoy replica.
pub fn session_weight(key: &[u8], worker: &Worker) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(key, worker.id)
}

#[cfg(test)]
#[path = "tests/select.rs"]
mod tests;

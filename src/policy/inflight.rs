//! The in-flight limit (`docs/semantics.md` §1): how many completion requests one gateway
//! holds at once, over all its Envoy threads.
//!
//! Each VM (one per Envoy thread) counts the requests it holds and publishes that count, with
//! the time, in one shared table. A VM that stops publishing — it failed and Envoy replaced it
//! — is forgotten after [`STALE_NANOS`], so the requests it held when it died do not count
//! forever.

use super::words;

/// A share not published for this long belongs to a VM that is gone.
pub const STALE_NANOS: u64 = 5_000_000_000;

/// One VM's requests in flight, as it last published them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Share {
    vm: u64,
    held: u64,
    published_at: u64,
}

/// Every live VM's share.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct InFlightTable {
    shares: Vec<Share>,
}

impl InFlightTable {
    /// Requests in flight on the VMs other than `vm` that are still alive at `now`.
    pub fn others(&self, vm: u64, now: u64) -> u64 {
        self.shares
            .iter()
            .filter(|s| s.vm != vm && is_live(s, now))
            .map(|s| s.held)
            .sum()
    }

    /// Records that `vm` holds `held` requests at `now`, and forgets the VMs that are gone.
    pub fn publish(&mut self, vm: u64, held: u64, now: u64) {
        self.shares.retain(|s| s.vm != vm && is_live(s, now));
        self.shares.push(Share {
            vm,
            held,
            published_at: now,
        });
    }

    /// A name for a new VM, no live VM's, and its empty share published.
    pub fn join(&mut self, now: u64) -> u64 {
        let vm = self.shares.iter().map(|s| s.vm).max().unwrap_or(0) + 1;
        self.publish(vm, 0, now);
        vm
    }

    pub fn encode(&self) -> Vec<u8> {
        words::encode(self.shares.iter().map(|s| [s.vm, s.held, s.published_at]))
    }

    /// The table `encode` wrote; anything else reads as empty.
    pub fn decode(bytes: &[u8]) -> Self {
        let shares = words::decode(bytes)
            .map(|[vm, held, published_at]| Share {
                vm,
                held,
                published_at,
            })
            .collect();
        Self { shares }
    }
}

fn is_live(share: &Share, now: u64) -> bool {
    now.saturating_sub(share.published_at) <= STALE_NANOS
}

/// Whether one more request fits under `limit` when this VM holds `own` and the others hold
/// `others`.
pub fn admits(limit: u64, others: u64, own: u64) -> bool {
    others.saturating_add(own) < limit
}

#[cfg(test)]
#[path = "tests/inflight.rs"]
mod tests;

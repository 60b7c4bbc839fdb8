//! Whether a worker can take requests now (`docs/semantics.md` §5): draining comes from
//! the registry, health from the host's observations.

use std::fmt;

use super::health::HealthTable;
use super::registry::{Worker, WorkerId};

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

/// Whether a worker can take requests now. Draining comes from the registry; health from
/// the host's observations.
pub trait Availability {
    fn unavailability(&self, worker: &Worker) -> Option<Unavailability>;

    /// Every worker `unavailability` may call unhealthy, when this knows them (a short list
    /// of ids, some perhaps not in the registry): a hop's choice then asks only of these.
    /// `None` (the default): it asks of every worker of the pool.
    fn unhealthy_ids(&self) -> Option<Vec<WorkerId>> {
        None
    }
}

impl<T: Availability> Availability for &T {
    fn unavailability(&self, worker: &Worker) -> Option<Unavailability> {
        (**self).unavailability(worker)
    }

    fn unhealthy_ids(&self) -> Option<Vec<WorkerId>> {
        (**self).unhealthy_ids()
    }
}

/// Only the registry's own `draining` flag.
pub struct RegistryOnly;

impl Availability for RegistryOnly {
    fn unavailability(&self, worker: &Worker) -> Option<Unavailability> {
        worker.draining.then_some(Unavailability::Draining)
    }

    fn unhealthy_ids(&self) -> Option<Vec<WorkerId>> {
        Some(Vec::new())
    }
}

/// Availability at an instant: draining from the registry, unhealthy from the table.
pub struct Observed<'a> {
    pub table: &'a HealthTable,
    pub now: u64,
}

impl Availability for Observed<'_> {
    fn unavailability(&self, worker: &Worker) -> Option<Unavailability> {
        if worker.draining {
            return Some(Unavailability::Draining);
        }
        let until = self.table.unhealthy_until(worker.id, self.now)?;
        let seconds = until
            .saturating_sub(self.now)
            .div_ceil(1_000_000_000)
            .max(1);
        Some(Unavailability::Unhealthy {
            retry_after_secs: u32::try_from(seconds).unwrap_or(u32::MAX),
        })
    }

    fn unhealthy_ids(&self) -> Option<Vec<WorkerId>> {
        Some(self.table.unhealthy(self.now).collect())
    }
}

/// Envoy's panic mode, per hop pool: when fewer than `threshold_percent` of the pool's
/// serving (non-draining) workers are healthy, passive health is no longer trusted to tell
/// the dead from the busy, and unpinned selection takes the unhealthy workers too, after the
/// healthy ones. 0 disables it. A pool with no serving worker is not in panic: there is
/// nothing to fall back on.
pub fn pool_in_panic(serving: usize, healthy: usize, threshold_percent: u32) -> bool {
    let (serving, healthy) = (serving as u64, healthy as u64);
    healthy.saturating_mul(100) < u64::from(threshold_percent).saturating_mul(serving)
}

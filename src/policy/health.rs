//! Passive health: a worker whose hop failed is out of service for a while, for every Envoy
//! worker thread alike (the host keeps this table in proxy-wasm shared data).

use super::error::Unavailability;
use super::registry::{Worker, WorkerId};
use super::resolve::Availability;

/// Workers out of service, each until an instant in nanoseconds since the Unix epoch.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HealthTable {
    unhealthy: Vec<(WorkerId, u64)>,
}

const ENTRY_BYTES: usize = 16;

impl HealthTable {
    /// Reads the shared-data encoding: `(id, until)` pairs of little-endian u64s. Bytes that
    /// do not form whole entries are ignored.
    pub fn decode(bytes: &[u8]) -> Self {
        let unhealthy = bytes
            .chunks_exact(ENTRY_BYTES)
            .map(|entry| {
                let (id, until) = entry.split_at(8);
                (u64_le(id), u64_le(until))
            })
            .collect();
        Self { unhealthy }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.unhealthy.len() * ENTRY_BYTES);
        for (id, until) in &self.unhealthy {
            bytes.extend_from_slice(&id.to_le_bytes());
            bytes.extend_from_slice(&until.to_le_bytes());
        }
        bytes
    }

    /// Marks `worker` out of service until `until`, forgetting entries that expired by `now`.
    pub fn mark(&mut self, worker: WorkerId, until: u64, now: u64) {
        self.unhealthy.retain(|(id, end)| *id != worker && *end > now);
        self.unhealthy.push((worker, until));
    }

    /// When `worker` returns to service, if it is out of service at `now`.
    pub fn unhealthy_until(&self, worker: WorkerId, now: u64) -> Option<u64> {
        self.unhealthy.iter().find(|(id, until)| *id == worker && *until > now).map(|(_, until)| *until)
    }

    pub fn len(&self) -> usize {
        self.unhealthy.len()
    }

    pub fn is_empty(&self) -> bool {
        self.unhealthy.is_empty()
    }
}

fn u64_le(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(bytes.get(..8).unwrap_or(&[0; 8]));
    u64::from_le_bytes(word)
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
        let seconds = until.saturating_sub(self.now).div_ceil(1_000_000_000).max(1);
        Some(Unavailability::Unhealthy { retry_after_secs: u32::try_from(seconds).unwrap_or(u32::MAX) })
    }
}

#[cfg(test)]
#[path = "tests/health.rs"]
mod tests;

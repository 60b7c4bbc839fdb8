//! Requests in flight per worker (`docs/semantics.md` §5), counted by every Envoy thread in
//! one table the host keeps in proxy-wasm shared data: one read gives every worker's count,
//! and one compare-and-swap applies every change a callback made.

use super::registry::WorkerId;
use super::words;

/// Workers with requests in flight; a worker with none has no entry.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LoadTable {
    entries: Vec<(WorkerId, u64)>,
}

impl LoadTable {
    /// Reads the shared-data encoding: `(id, count)` pairs of little-endian u64s. Bytes that
    /// do not form whole entries are ignored.
    pub fn decode(bytes: &[u8]) -> Self {
        let entries = words::decode(bytes)
            .map(|[id, count]| (id, count))
            .filter(|(_, count)| *count > 0)
            .collect();
        Self { entries }
    }

    pub fn encode(&self) -> Vec<u8> {
        words::encode(self.entries.iter().map(|(id, count)| [*id, *count]))
    }

    pub fn outstanding(&self, worker: WorkerId) -> u64 {
        self.entries
            .iter()
            .find(|(id, _)| *id == worker)
            .map_or(0, |(_, count)| *count)
    }

    /// Adds `delta` to `worker`'s count, never below zero.
    pub fn add(&mut self, worker: WorkerId, delta: i64) {
        let count = self.outstanding(worker).saturating_add_signed(delta);
        self.entries.retain(|(id, _)| *id != worker);
        if count > 0 {
            self.entries.push((worker, count));
        }
    }
}

#[cfg(test)]
#[path = "tests/load.rs"]
mod tests;

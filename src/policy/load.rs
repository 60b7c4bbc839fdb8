//! Requests in flight per worker (`docs/semantics.md` §5), counted by every Envoy thread in
//! one table the host keeps in proxy-wasm shared data: one read gives every worker's count,
//! and one compare-and-swap applies every change a callback made.

use super::registry::WorkerId;

/// Workers with requests in flight; a worker with none has no entry.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LoadTable {
    entries: Vec<(WorkerId, u64)>,
}

const ENTRY_BYTES: usize = 16;

impl LoadTable {
    /// Reads the shared-data encoding: `(id, count)` pairs of little-endian u64s. Bytes that
    /// do not form whole entries are ignored.
    pub fn decode(bytes: &[u8]) -> Self {
        let entries = bytes
            .chunks_exact(ENTRY_BYTES)
            .filter_map(|entry| {
                let (id, count) = entry.split_at_checked(8)?;
                Some((u64_le(id)?, u64_le(count)?))
            })
            .filter(|(_, count)| *count > 0)
            .collect();
        Self { entries }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.entries.len() * ENTRY_BYTES);
        for (id, count) in &self.entries {
            bytes.extend_from_slice(&id.to_le_bytes());
            bytes.extend_from_slice(&count.to_le_bytes());
        }
        bytes
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

fn u64_le(bytes: &[u8]) -> Option<u64> {
    bytes.try_into().ok().map(u64::from_le_bytes)
}

#[cfg(test)]
#[path = "tests/load.rs"]
mod tests;

//! Requests in flight per worker (`docs/semantics.md` §5), counted by every Envoy thread in
//! one table the host keeps in proxy-wasm shared data: one read gives every worker's count,
//! and one compare-and-swap applies every change a callback made.

use super::registry::{Pool, Worker, WorkerId};
use super::select::Loads;
use super::words;

/// Workers with requests in flight; a worker with none has no entry. Sorted by id: a hop's
/// choice looks up every worker of its pool.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LoadTable {
    entries: Vec<(WorkerId, u64)>,
}

impl LoadTable {
    /// Reads the shared-data encoding: `(id, count)` pairs of little-endian u64s. Bytes that
    /// do not form whole entries are ignored.
    pub fn decode(bytes: &[u8]) -> Self {
        let mut entries: Vec<(WorkerId, u64)> = words::decode(bytes)
            .map(|[id, count]| (id, count))
            .filter(|(_, count)| *count > 0)
            .collect();
        entries.sort_unstable();
        entries.dedup_by_key(|(id, _)| *id);
        Self { entries }
    }

    pub fn encode(&self) -> Vec<u8> {
        words::encode(self.entries.iter().map(|(id, count)| [*id, *count]))
    }

    pub fn outstanding(&self, worker: WorkerId) -> u64 {
        self.find(worker)
            .ok()
            .and_then(|at| self.entries.get(at))
            .map_or(0, |(_, count)| *count)
    }

    /// Adds `delta` to `worker`'s count, never below zero.
    pub fn add(&mut self, worker: WorkerId, delta: i64) {
        match self.find(worker) {
            Ok(at) => {
                let Some((_, count)) = self.entries.get_mut(at) else {
                    return;
                };
                *count = count.saturating_add_signed(delta);
                if *count == 0 {
                    self.entries.remove(at);
                }
            }
            Err(at) => {
                let count = 0u64.saturating_add_signed(delta);
                if count > 0 {
                    self.entries.insert(at, (worker, count));
                }
            }
        }
    }

    fn find(&self, worker: WorkerId) -> Result<usize, usize> {
        self.entries.binary_search_by_key(&worker, |(id, _)| *id)
    }
}

impl Loads for LoadTable {
    fn outstanding(&self, worker: &Worker) -> u64 {
        LoadTable::outstanding(self, worker.id)
    }

    /// Sums the table's entries (the workers with requests in flight), not the pool.
    fn total(&self, pool: Pool<'_>, excluded: &[WorkerId]) -> u64 {
        self.entries
            .iter()
            .filter(|(id, _)| pool.position(*id).is_some() && !excluded.contains(id))
            .map(|(_, count)| *count)
            .fold(0, u64::saturating_add)
    }
}

#[cfg(test)]
#[path = "tests/load.rs"]
mod tests;

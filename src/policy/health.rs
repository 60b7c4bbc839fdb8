//! Passive health: a worker whose hop failed is out of service for a while, for every Envoy
//! worker thread alike (the host keeps this table in proxy-wasm shared data).

use super::registry::WorkerId;

/// Workers out of service, each until an instant in nanoseconds since the Unix epoch.
/// A worker that fails again soon after it returned is out twice as long as the time
/// before, up to `2^MAX_DOUBLINGS` periods, so a dead worker is not tried every period.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HealthTable {
    entries: Vec<Outage>,
}

/// Doublings of the unhealthy period for repeated outages.
pub const MAX_DOUBLINGS: u64 = 3;
/// The longest outage, in unhealthy periods.
pub const MAX_OUTAGE_PERIODS: u64 = 1 << MAX_DOUBLINGS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Outage {
    worker: WorkerId,
    until: u64,
    doublings: u64,
}

impl Outage {
    fn length(&self, period: u64) -> u64 {
        period.saturating_mul(1 << self.doublings.min(MAX_DOUBLINGS))
    }

    /// Still counted as recent: out of service, or back for less than its last outage lasted.
    fn remembered(&self, period: u64, now: u64) -> bool {
        self.until.saturating_add(self.length(period)) > now
    }
}

const ENTRY_BYTES: usize = 24;

impl HealthTable {
    /// Reads the shared-data encoding: `(id, until, doublings)` triples of little-endian
    /// u64s. Bytes that do not form whole entries are ignored.
    pub fn decode(bytes: &[u8]) -> Self {
        let entries = bytes
            .chunks_exact(ENTRY_BYTES)
            .map(|entry| Outage {
                worker: u64_le(entry.get(..8)),
                until: u64_le(entry.get(8..16)),
                doublings: u64_le(entry.get(16..)).min(MAX_DOUBLINGS),
            })
            .collect();
        Self { entries }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.entries.len() * ENTRY_BYTES);
        for outage in &self.entries {
            for word in [outage.worker, outage.until, outage.doublings] {
                bytes.extend_from_slice(&word.to_le_bytes());
            }
        }
        bytes
    }

    /// Takes `worker` out of service at `now` for `period` nanoseconds, or twice as long as
    /// its last outage if it failed again soon after returning; forgets old outages.
    /// Returns when it comes back.
    pub fn mark(&mut self, worker: WorkerId, period: u64, now: u64) -> u64 {
        let previous = self.entries.iter().find(|o| o.worker == worker).copied();
        self.entries
            .retain(|o| o.worker != worker && o.remembered(period, now));
        let doublings = match previous.filter(|o| o.remembered(period, now)) {
            None => 0,
            Some(current) if current.until > now => current.doublings,
            Some(returned) => returned.doublings.saturating_add(1).min(MAX_DOUBLINGS),
        };
        let mut outage = Outage {
            worker,
            until: 0,
            doublings,
        };
        outage.until = now.saturating_add(outage.length(period));
        if let Some(current) = previous.filter(|o| o.until > now) {
            outage.until = outage.until.max(current.until);
        }
        self.entries.push(outage);
        outage.until
    }

    /// When `worker` returns to service, if it is out of service at `now`.
    pub fn unhealthy_until(&self, worker: WorkerId, now: u64) -> Option<u64> {
        self.entries
            .iter()
            .find(|o| o.worker == worker && o.until > now)
            .map(|o| o.until)
    }

    /// Outages remembered, past ones included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn u64_le(bytes: Option<&[u8]>) -> u64 {
    bytes
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

#[cfg(test)]
#[path = "tests/health.rs"]
mod tests;

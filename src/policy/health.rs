//! Passive health (`docs/semantics.md` §5): a worker whose connections fail several times in
//! a row is out of service for a while, for every Envoy worker thread alike (the host keeps
//! this table in proxy-wasm shared data).

use super::registry::WorkerId;
use super::words;

/// Per worker: the connection failures in a row not yet answered by a success, and the
/// outage they caused, each until an instant in nanoseconds since the Unix epoch.
/// A worker that is taken out again soon after it returned is out twice as long as the
/// time before, up to `2^MAX_DOUBLINGS` periods, so a dead worker is not tried every period.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HealthTable {
    entries: Vec<Entry>,
}

/// Doublings of the unhealthy period for repeated outages.
pub const MAX_DOUBLINGS: u64 = 3;
/// The longest outage, in unhealthy periods.
pub const MAX_OUTAGE_PERIODS: u64 = 1 << MAX_DOUBLINGS;

/// When connection failures take a worker out of service, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ejection {
    /// The first outage, in nanoseconds; also how long a failure counts towards the next.
    pub period: u64,
    /// Connection failures in a row, each within `period` of the one before, that take a
    /// worker out (at least 1).
    pub after_failures: u64,
}

/// What one connection failure did to its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Counted: this many failures in a row, not yet enough to take it out.
    Counted(u64),
    /// It took the worker out of service until this instant.
    TakenOut { until: u64 },
    /// The worker was already out: its outage now lasts until this instant.
    StillOut { until: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    worker: WorkerId,
    /// Out of service until this instant; 0 when never taken out.
    until: u64,
    doublings: u64,
    /// Connection failures since its last success or outage.
    failures: u64,
    last_failure: u64,
}

impl Entry {
    fn new(worker: WorkerId) -> Self {
        Self {
            worker,
            until: 0,
            doublings: 0,
            failures: 0,
            last_failure: 0,
        }
    }

    fn outage_length(&self, period: u64) -> u64 {
        period.saturating_mul(1 << self.doublings.min(MAX_DOUBLINGS))
    }

    /// Still counted as recent: out of service, or back for less than its last outage lasted.
    fn outage_remembered(&self, period: u64, now: u64) -> bool {
        self.until != 0 && self.until.saturating_add(self.outage_length(period)) > now
    }

    /// Failures that still count: the last one less than a period ago.
    fn recent_failures(&self, period: u64, now: u64) -> u64 {
        if self.last_failure.saturating_add(period) > now {
            self.failures
        } else {
            0
        }
    }

    fn remembered(&self, period: u64, now: u64) -> bool {
        self.outage_remembered(period, now) || self.recent_failures(period, now) > 0
    }

    /// Takes the worker out at `now`: for a period, twice as long as its last outage if it
    /// returned from it recently, or a period from now if it is out already.
    fn take_out(&mut self, period: u64, now: u64) -> u64 {
        if self.until > now {
            self.until = self
                .until
                .max(now.saturating_add(self.outage_length(period)));
            return self.until;
        }
        self.doublings = if self.outage_remembered(period, now) {
            self.doublings.saturating_add(1).min(MAX_DOUBLINGS)
        } else {
            0
        };
        self.until = now.saturating_add(self.outage_length(period));
        self.failures = 0;
        self.until
    }
}

impl HealthTable {
    /// Reads the shared-data encoding: `(id, until, doublings, failures, last_failure)`
    /// tuples of little-endian u64s. Bytes that do not form whole entries are ignored.
    pub fn decode(bytes: &[u8]) -> Self {
        let entries = words::decode(bytes)
            .map(|[worker, until, doublings, failures, last_failure]| Entry {
                worker,
                until,
                doublings: doublings.min(MAX_DOUBLINGS),
                failures,
                last_failure,
            })
            .collect();
        Self { entries }
    }

    pub fn encode(&self) -> Vec<u8> {
        words::encode(
            self.entries
                .iter()
                .map(|e| [e.worker, e.until, e.doublings, e.failures, e.last_failure]),
        )
    }

    /// Counts a failed connection to `worker` at `now`. The `after_failures`-th in a row
    /// takes it out of service for a period, or twice as long as its last outage if it
    /// returned from that recently; one during an outage extends it to a period from now.
    /// Forgets what no longer counts.
    pub fn record_failure(&mut self, worker: WorkerId, rule: Ejection, now: u64) -> Recorded {
        let period = rule.period;
        let mut entry = self.take_entry(worker, period, now);
        let recorded = if entry.until > now {
            Recorded::StillOut {
                until: entry.take_out(period, now),
            }
        } else {
            let failures = entry.recent_failures(period, now).saturating_add(1);
            if failures >= rule.after_failures {
                Recorded::TakenOut {
                    until: entry.take_out(period, now),
                }
            } else {
                entry.failures = failures;
                entry.last_failure = now;
                Recorded::Counted(failures)
            }
        };
        self.entries.push(entry);
        recorded
    }

    /// A hop to `worker` succeeded: its failures no longer count. An outage stays: one
    /// success does not show a worker that failed in a row is well again.
    pub fn record_success(&mut self, worker: WorkerId, period: u64, now: u64) {
        let mut entry = self.take_entry(worker, period, now);
        entry.failures = 0;
        if entry.remembered(period, now) {
            self.entries.push(entry);
        }
    }

    /// Removes `worker`'s entry (a fresh one if it has none) and forgets the others' that no
    /// longer count.
    fn take_entry(&mut self, worker: WorkerId, period: u64, now: u64) -> Entry {
        let entry = self
            .entries
            .iter()
            .find(|e| e.worker == worker)
            .copied()
            .unwrap_or(Entry::new(worker));
        self.entries
            .retain(|e| e.worker != worker && e.remembered(period, now));
        entry
    }

    /// Failures of `worker` in a row that its next success must clear, as last written.
    pub fn failures(&self, worker: WorkerId) -> u64 {
        self.entries
            .iter()
            .find(|e| e.worker == worker)
            .map_or(0, |e| e.failures)
    }

    /// When `worker` returns to service, if it is out of service at `now`.
    pub fn unhealthy_until(&self, worker: WorkerId, now: u64) -> Option<u64> {
        self.entries
            .iter()
            .find(|e| e.worker == worker && e.until > now)
            .map(|e| e.until)
    }

    /// The workers out of service at `now`.
    pub fn unhealthy(&self, now: u64) -> impl Iterator<Item = WorkerId> + '_ {
        self.entries
            .iter()
            .filter(move |e| e.until > now)
            .map(|e| e.worker)
    }

    /// Workers remembered: out of service, back recently, or with failures that count.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
#[path = "tests/health.rs"]
mod tests;

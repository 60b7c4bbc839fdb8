//! Load as the engines report it (`docs/semantics.md` §5): where it is scraped from, the
//! table every thread shares, and the load a choice reads — the engine's figures plus what
//! this gateway sent since they were taken, or this gateway's own counts where they are
//! stale.

use std::time::Duration;

use serde::Deserialize;

use super::metrics_text::RankLoad;
use super::registry::{Worker, WorkerId};
use super::select::Loads;
use super::words;

/// Where and how often the engines' metrics are scraped, and when their figures make a
/// worker busy (`docs/semantics.md` §8, `engine_load`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineLoadSource {
    /// The Envoy cluster scrapes go through, ORIGINAL_DST like the prefill hop's; empty:
    /// `prefill_cluster`.
    #[serde(default)]
    pub cluster: String,
    #[serde(default = "default_path")]
    pub path: String,
    #[serde(default = "default_period_ms")]
    pub period_ms: u64,
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Figures older than this are not used: the worker's load is this gateway's own count.
    #[serde(default = "default_stale_ms")]
    pub stale_ms: u64,
    /// The largest metrics page read; a larger one fails the scrape.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: usize,
    /// A rank with this many requests waiting is full; `None` (the default): the number
    /// waiting alone never makes it full — it changes from one moment to the next, and two
    /// replicas reading it moments apart would judge a worker busy differently.
    #[serde(default)]
    pub busy_waiting: Option<u64>,
    /// A rank with this much of its KV cache in use (percent) is full; `None` (the default):
    /// KV use alone never makes it full — vLLM fills its KV cache by design, and makes
    /// requests wait once it is full.
    #[serde(default)]
    pub busy_kv_percent: Option<u64>,
}

fn default_path() -> String {
    "/metrics".into()
}

fn default_period_ms() -> u64 {
    500
}

fn default_timeout_ms() -> u64 {
    250
}

fn default_stale_ms() -> u64 {
    2_000
}

fn default_max_bytes() -> usize {
    1 << 20
}

/// The largest `max_bytes` an operator may set: a page is read whole into the VM.
pub const MAX_PAGE_BYTES: usize = 16 << 20;
/// The shortest scrape period.
pub const MIN_PERIOD_MS: u64 = 50;
/// The shortest wait between two looks at whether a scrape is due.
const MIN_LOOK: Duration = Duration::from_millis(20);

impl EngineLoadSource {
    pub fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms)
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// How often each thread looks whether a scrape is due and takes the newest figures: a
    /// tenth of the period, so that replicas scrape, and threads read a scrape, within that
    /// of one another.
    pub fn look_period(&self) -> Duration {
        (self.period() / 10).max(MIN_LOOK)
    }

    /// The time from `now` (host clock, nanoseconds) to the next multiple of `look` (at
    /// least a millisecond): threads that look then, on replicas whose clocks agree, scrape
    /// at the same moment and take a round's figures at the same moment.
    pub fn until_next_look(now: u64, look: Duration) -> Duration {
        let look = u64::try_from(look.as_nanos()).unwrap_or(u64::MAX).max(1);
        Duration::from_nanos(look - now % look).max(Duration::from_millis(1))
    }

    /// `cluster`, or the prefill hop's.
    pub fn cluster<'a>(&'a self, prefill_cluster: &'a str) -> &'a str {
        if self.cluster.is_empty() {
            prefill_cluster
        } else {
            &self.cluster
        }
    }

    pub fn rule(&self) -> FullRule {
        FullRule {
            stale_nanos: self.stale_ms.saturating_mul(1_000_000),
            waiting: self.busy_waiting,
            kv_permille: self.busy_kv_percent.map(|p| p.saturating_mul(10)),
        }
    }

    /// What is wrong with these settings, if anything.
    pub fn invalid(&self) -> Option<&'static str> {
        if !self.path.starts_with('/') {
            return Some("engine_load.path must start with /");
        }
        if !(MIN_PERIOD_MS..=3_600_000).contains(&self.period_ms) {
            return Some("engine_load.period_ms must be in 50..=3600000");
        }
        if self.timeout_ms == 0 || self.timeout_ms > self.period_ms.max(1_000) {
            return Some("engine_load.timeout_ms must be positive and at most period_ms (or 1000)");
        }
        if self.stale_ms < self.period_ms {
            return Some("engine_load.stale_ms must be at least period_ms");
        }
        if self.max_bytes == 0 || self.max_bytes > MAX_PAGE_BYTES {
            return Some("engine_load.max_bytes must be in 1..=16777216");
        }
        if self.busy_waiting == Some(0) {
            return Some("engine_load.busy_waiting must be at least 1");
        }
        if self
            .busy_kv_percent
            .is_some_and(|p| !(1..=100).contains(&p))
        {
            return Some("engine_load.busy_kv_percent must be in 1..=100");
        }
        None
    }
}

/// When the engines' figures are used, and when they say a rank is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FullRule {
    pub stale_nanos: u64,
    pub waiting: Option<u64>,
    pub kv_permille: Option<u64>,
}

impl FullRule {
    pub fn is_full(&self, rank: &RankLoad) -> bool {
        self.waiting.is_some_and(|w| rank.waiting >= w)
            || self.kv_permille.is_some_and(|kv| rank.kv_permille >= kv)
    }
}

/// One worker's figures from one scrape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineReport {
    pub worker: WorkerId,
    /// When its answer came (host clock, nanoseconds).
    pub scraped_at: u64,
    /// This gateway's requests in flight to the worker when the scrape was sent: the
    /// engine's figures count them already.
    pub sent: u64,
    /// The ranks it reported, by rank.
    pub ranks: Vec<RankLoad>,
    /// Its requests averaged over its scrapes, in thousandths: set by [`EngineTable::merge`].
    pub average_milli: u64,
}

/// How much of a worker's average the newest scrape makes, in percent: the figures two
/// replicas scrape moments apart differ, and their averages less.
const NEWEST_WEIGHT_PERCENT: i128 = 25;

impl EngineReport {
    /// Requests the engine holds over all its ranks.
    pub fn requests(&self) -> u64 {
        self.ranks
            .iter()
            .map(RankLoad::requests)
            .fold(0, u64::saturating_add)
    }
}

/// Every worker's last report, in the byte encoding threads share: one entry per rank of
/// `[worker, rank, waiting, running, kv_permille, scraped_at, sent, average_milli]`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EngineTable {
    /// Sorted by worker.
    reports: Vec<EngineReport>,
}

impl EngineTable {
    /// Reads the encoding `encode` wrote; entries out of order or repeated are dropped.
    pub fn decode(bytes: &[u8]) -> Self {
        let mut reports: Vec<EngineReport> = Vec::new();
        for [
            worker,
            rank,
            waiting,
            running,
            kv_permille,
            scraped_at,
            sent,
            average_milli,
        ] in words::decode(bytes)
        {
            let Ok(rank) = u32::try_from(rank) else {
                continue;
            };
            let load = RankLoad {
                rank,
                waiting,
                running,
                kv_permille,
            };
            match reports.last_mut() {
                Some(last) if last.worker == worker => {
                    if last.ranks.last().is_some_and(|r| r.rank < rank) {
                        last.ranks.push(load);
                    }
                }
                Some(last) if last.worker > worker => {}
                _ => reports.push(EngineReport {
                    worker,
                    scraped_at,
                    sent,
                    ranks: vec![load],
                    average_milli,
                }),
            }
        }
        Self { reports }
    }

    pub fn encode(&self) -> Vec<u8> {
        words::encode(self.reports.iter().flat_map(|report| {
            report.ranks.iter().map(|r| {
                [
                    report.worker,
                    u64::from(r.rank),
                    r.waiting,
                    r.running,
                    r.kv_permille,
                    report.scraped_at,
                    report.sent,
                    report.average_milli,
                ]
            })
        }))
    }

    pub fn report(&self, worker: WorkerId) -> Option<&EngineReport> {
        let at = self
            .reports
            .binary_search_by_key(&worker, |r| r.worker)
            .ok()?;
        self.reports.get(at)
    }

    pub fn len(&self) -> usize {
        self.reports.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reports.is_empty()
    }

    /// Takes `fresh` reports over older ones of the same workers, each averaged with the
    /// one it replaces unless that one is `stale_nanos` older, and forgets the workers
    /// `listed` no longer names.
    pub fn merge(
        &mut self,
        fresh: Vec<EngineReport>,
        listed: impl Fn(WorkerId) -> bool,
        stale_nanos: u64,
    ) {
        for mut report in fresh {
            let newest = u64::try_from(u128::from(report.requests()) * 1000).unwrap_or(u64::MAX);
            report.average_milli = newest;
            match self
                .reports
                .binary_search_by_key(&report.worker, |r| r.worker)
            {
                Ok(at) => {
                    if let Some(old) = self.reports.get_mut(at)
                        && old.scraped_at <= report.scraped_at
                    {
                        if report.scraped_at.saturating_sub(old.scraped_at) <= stale_nanos {
                            report.average_milli = averaged(old.average_milli, newest);
                        }
                        *old = report;
                    }
                }
                Err(at) => self.reports.insert(at, report),
            }
        }
        self.reports.retain(|r| listed(r.worker));
    }
}

/// `average` moved towards `newest` by [`NEWEST_WEIGHT_PERCENT`].
fn averaged(average: u64, newest: u64) -> u64 {
    let (average, newest) = (i128::from(average), i128::from(newest));
    let moved = average + (newest - average) * NEWEST_WEIGHT_PERCENT / 100;
    u64::try_from(moved.max(0)).unwrap_or(u64::MAX)
}

/// The load a choice reads when the engines' figures are on: a worker with a fresh report
/// holds what its engine reported plus the change in this gateway's requests in flight to
/// it since the scrape was sent (more when it sent more, fewer when its requests ended);
/// any other holds what this gateway counts in flight.
pub struct EngineLoads<'a> {
    /// This gateway's requests in flight per worker.
    pub sent: &'a dyn Loads,
    pub table: &'a EngineTable,
    pub rule: FullRule,
    pub now: u64,
    /// Which two ranks a multi-rank worker's request chooses between.
    pub rotation: u64,
}

impl EngineLoads<'_> {
    fn fresh(&self, worker: &Worker) -> Option<&EngineReport> {
        self.table
            .report(worker.id)
            .filter(|r| self.now.saturating_sub(r.scraped_at) <= self.rule.stale_nanos)
    }
}

impl Loads for EngineLoads<'_> {
    fn outstanding(&self, worker: &Worker) -> u64 {
        let sent = self.sent.outstanding(worker);
        match self.fresh(worker) {
            Some(report) => {
                let since = i128::from(sent) - i128::from(report.sent);
                let load = i128::from(report.requests()) + since;
                u64::try_from(load.max(0)).unwrap_or(u64::MAX)
            }
            None => sent,
        }
    }

    fn sent_since(&self, worker: &Worker) -> u64 {
        self.fresh(worker).map_or(0, |report| {
            self.sent.outstanding(worker).saturating_sub(report.sent)
        })
    }

    /// The engine's averaged figures where fresh, else this gateway's own count.
    fn reported_milli(&self, worker: &Worker) -> u64 {
        match self.fresh(worker) {
            Some(report) => report.average_milli,
            None => self.sent.outstanding(worker).saturating_mul(1000),
        }
    }

    /// Every rank past a threshold, by fresh figures.
    fn full(&self, worker: &Worker) -> bool {
        let full = |rank: &RankLoad| self.rule.is_full(rank);
        self.fresh(worker)
            .is_some_and(|report| !report.ranks.is_empty() && report.ranks.iter().all(full))
    }

    /// Of the two ranks in rotation, the one whose engine holds fewer requests (then uses
    /// less KV cache); `None` unless the worker has several ranks and reported both.
    fn rank(&self, worker: &Worker) -> Option<u32> {
        if worker.dp_size < 2 {
            return None;
        }
        let report = self.fresh(worker)?;
        let size = u64::from(worker.dp_size);
        let first = self.rotation % size;
        let candidates = [first, (first + 1) % size].map(|rank| {
            report
                .ranks
                .iter()
                .find(|r| u64::from(r.rank) == rank)
                .copied()
        });
        let [Some(a), Some(b)] = candidates else {
            return None;
        };
        let key = |r: &RankLoad| (r.requests(), r.kv_permille);
        Some(if key(&b) < key(&a) { b.rank } else { a.rank })
    }
}

#[cfg(test)]
#[path = "tests/engine_load.rs"]
mod tests;

//! Counting judged requests: by expected and actual class, and by kind of request.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::Serialize;

use super::mix::Kind;
use super::outcome::{Judgement, Verdict};

/// Problems kept for the report (the first ones, distinct).
const KEPT_PROBLEMS: usize = 20;

/// One cell of the expected × actual table.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Cell {
    pub expected: String,
    pub actual: String,
    pub judgement: Judgement,
}

/// How the requests of one kind ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KindCounts {
    pub sent: u64,
    pub as_expected: u64,
    pub cut_by_kill: u64,
    pub kv_lost: u64,
    pub mismatched: u64,
    pub no_answer: u64,
    /// Clients that left before their answer was complete, as planned.
    pub left: u64,
}

impl KindCounts {
    fn add(&mut self, judgement: Judgement) {
        let counter = match judgement {
            Judgement::AsExpected => &mut self.as_expected,
            Judgement::CutByKill => &mut self.cut_by_kill,
            Judgement::KvLost => &mut self.kv_lost,
            Judgement::Mismatch => &mut self.mismatched,
            Judgement::NoAnswer => &mut self.no_answer,
            Judgement::Left => &mut self.left,
        };
        *counter += 1;
    }

    /// Requests judged by their end: answered, or left as planned (not those without answer).
    pub fn answered(&self) -> u64 {
        self.as_expected + self.cut_by_kill + self.kv_lost + self.mismatched + self.left
    }

    pub fn merge(&mut self, other: &KindCounts) {
        self.sent += other.sent;
        self.as_expected += other.as_expected;
        self.cut_by_kill += other.cut_by_kill;
        self.kv_lost += other.kv_lost;
        self.mismatched += other.mismatched;
        self.no_answer += other.no_answer;
        self.left += other.left;
    }
}

#[derive(Debug, Default)]
struct Counts {
    cells: BTreeMap<Cell, u64>,
    kinds: BTreeMap<Kind, KindCounts>,
    problems: Vec<String>,
    /// Verdicts waiting for Envoy's access log: `(request id, kind, verdict)`.
    deferred: Vec<(String, Kind, Verdict)>,
}

impl Counts {
    fn count(&mut self, kind: Kind, verdict: &Verdict) {
        self.kinds.entry(kind).or_default().add(verdict.judgement);
        let cell = Cell {
            expected: verdict.expected.clone(),
            actual: verdict.actual.clone(),
            judgement: verdict.judgement,
        };
        *self.cells.entry(cell).or_default() += 1;
        if let Some(problem) = &verdict.problem
            && self.problems.len() < KEPT_PROBLEMS
            && !self.problems.contains(problem)
        {
            log::warn!("soak: {problem}");
            self.problems.push(problem.clone());
        }
    }
}

/// Counts shared by every virtual user.
#[derive(Debug, Default)]
pub struct Tally {
    counts: Mutex<Counts>,
}

/// What the tally holds at the end of a run.
#[derive(Debug, Clone, Default)]
pub struct TallySnapshot {
    pub cells: Vec<(Cell, u64)>,
    pub kinds: Vec<(Kind, KindCounts)>,
    pub problems: Vec<String>,
}

impl Tally {
    pub fn sent(&self, kind: Kind) {
        self.lock().kinds.entry(kind).or_default().sent += 1;
    }

    /// Counts the verdict of a request, or keeps it for [`Tally::settle`] when it needs
    /// Envoy's access log.
    pub fn record(&self, kind: Kind, verdict: Verdict, request_id: String) {
        let mut counts = self.lock();
        if verdict.confirm_reset {
            counts.deferred.push((request_id, kind, verdict));
        } else {
            counts.count(kind, &verdict);
        }
    }

    /// The request ids whose verdict waits for the access log.
    pub fn deferred_ids(&self) -> Vec<String> {
        self.lock()
            .deferred
            .iter()
            .map(|(id, _, _)| id.clone())
            .collect()
    }

    /// Counts the deferred verdicts, confirmed or not by `flags` (request id → Envoy's
    /// response flags).
    pub fn settle(&self, flags: &HashMap<String, String>) {
        let mut counts = self.lock();
        for (request_id, kind, verdict) in std::mem::take(&mut counts.deferred) {
            let verdict =
                verdict.confirmed_by(&request_id, flags.get(&request_id).map(String::as_str));
            counts.count(kind, &verdict);
        }
    }

    pub fn snapshot(&self) -> TallySnapshot {
        let counts = self.lock();
        TallySnapshot {
            cells: counts
                .cells
                .iter()
                .map(|(cell, n)| (cell.clone(), *n))
                .collect(),
            kinds: counts
                .kinds
                .iter()
                .map(|(kind, c)| (*kind, c.clone()))
                .collect(),
            problems: counts.problems.clone(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

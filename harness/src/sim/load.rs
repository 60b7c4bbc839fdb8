//! The engine load a worker publishes per data-parallel rank, as vLLM's scheduler counts
//! it: a rank's requests wait until the engine schedules them (a prefill once the compute
//! ahead of it fits in one step, [`super::engine`]; a request with nothing to compute at
//! once), then run until the end of their answer, at most `max_num_seqs` (vLLM's
//! `--max-num-seqs`) at a time, the rest waiting; the share of the KV cache the running
//! requests hold (as vLLM counts it: cached blocks no request holds are free); plus the
//! figures `POST /sim/engine-load` adds to them for deterministic tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::state::lock;

/// Body of `POST /sim/engine-load`: `waiting` and `running` are added to the rank's real
/// counts, `kv_cache_usage` replaces its real usage; every rank's without `rank`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EngineLoadOverride {
    pub waiting: u64,
    pub running: u64,
    pub kv_cache_usage: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

/// The figures one rank publishes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct RankLoad {
    pub(crate) running: u64,
    pub(crate) waiting: u64,
    pub(crate) kv_cache_usage: f64,
}

#[derive(Default)]
struct RankCounts {
    waiting: AtomicU64,
    running: AtomicU64,
    /// Prompt blocks the running requests hold.
    held_blocks: AtomicU64,
}

/// Requests per rank waiting for or running on its engine, and the overrides of each rank.
pub(crate) struct EngineLoad {
    ranks: Vec<RankCounts>,
    /// Requests one rank's batch holds.
    max_num_seqs: u64,
    overrides: Mutex<Vec<Option<EngineLoadOverride>>>,
}

impl EngineLoad {
    pub(crate) fn new(dp_size: u32, max_num_seqs: u64) -> Self {
        let ranks = dp_size as usize;
        EngineLoad {
            ranks: (0..ranks).map(|_| RankCounts::default()).collect(),
            max_num_seqs,
            overrides: Mutex::new(vec![None; ranks]),
        }
    }

    /// Counts a request as waiting on `rank` until the guard runs it, then as running until
    /// the guard is dropped.
    pub(crate) fn arrive(self: &Arc<Self>, rank: u32) -> LoadGuard {
        let guard = LoadGuard {
            load: self.clone(),
            rank: rank as usize,
            running: false,
            blocks: 0,
        };
        guard.enter();
        guard
    }

    /// Sets the override of its rank (of every rank without one); an unknown rank is refused.
    pub(crate) fn set_override(&self, update: EngineLoadOverride) -> Result<(), String> {
        let mut overrides = lock(&self.overrides);
        match update.rank {
            None => overrides.iter_mut().for_each(|slot| *slot = Some(update)),
            Some(rank) => match overrides.get_mut(rank as usize) {
                Some(slot) => *slot = Some(update),
                None => {
                    return Err(format!(
                        "rank {rank} is out of range [0, {})",
                        self.ranks.len()
                    ));
                }
            },
        }
        Ok(())
    }

    pub(crate) fn clear_overrides(&self) {
        lock(&self.overrides)
            .iter_mut()
            .for_each(|slot| *slot = None);
    }

    /// What each rank publishes, its KV-cache usage out of `capacity_blocks` (none: no
    /// cache, no usage).
    pub(crate) fn ranks(&self, capacity_blocks: Option<usize>) -> Vec<RankLoad> {
        let overrides = lock(&self.overrides);
        self.ranks
            .iter()
            .zip(overrides.iter())
            .map(|(counts, extra)| {
                let held = counts.held_blocks.load(Ordering::Relaxed) as f64;
                let kv_cache_usage = capacity_blocks.map_or(0.0, |c| (held / c as f64).min(1.0));
                let scheduled = counts.running.load(Ordering::Relaxed);
                let running = scheduled.min(self.max_num_seqs);
                let real = RankLoad {
                    running,
                    waiting: counts.waiting.load(Ordering::Relaxed) + scheduled - running,
                    kv_cache_usage,
                };
                match extra {
                    Some(extra) => RankLoad {
                        running: real.running.saturating_add(extra.running),
                        waiting: real.waiting.saturating_add(extra.waiting),
                        kv_cache_usage: extra.kv_cache_usage,
                    },
                    None => real,
                }
            })
            .collect()
    }
}

/// One request's place in its rank's counts: waiting, then running, until dropped (a
/// cancelled request leaves them too).
pub(crate) struct LoadGuard {
    load: Arc<EngineLoad>,
    rank: usize,
    running: bool,
    /// The prompt blocks it holds while running.
    blocks: u64,
}

impl LoadGuard {
    /// Its compute starts: running rather than waiting, holding `blocks` of the KV cache.
    pub(crate) fn run(&mut self, blocks: u64) {
        if !self.running {
            self.leave();
            self.running = true;
            self.blocks = blocks;
            self.enter();
        }
    }

    fn held_blocks(&self) -> Option<&AtomicU64> {
        let counts = self.load.ranks.get(self.rank)?;
        self.running.then_some(&counts.held_blocks)
    }

    fn counter(&self) -> Option<&AtomicU64> {
        let counts = self.load.ranks.get(self.rank)?;
        Some(if self.running {
            &counts.running
        } else {
            &counts.waiting
        })
    }

    fn enter(&self) {
        if let Some(counter) = self.counter() {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(held) = self.held_blocks() {
            held.fetch_add(self.blocks, Ordering::Relaxed);
        }
    }

    fn leave(&self) {
        if let Some(counter) = self.counter() {
            counter.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(held) = self.held_blocks() {
            held.fetch_sub(self.blocks, Ordering::Relaxed);
        }
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn counts(load: &EngineLoad) -> Vec<(u64, u64)> {
        let ranks = load.ranks(None);
        ranks.iter().map(|r| (r.waiting, r.running)).collect()
    }

    #[test]
    fn a_rank_runs_a_batch_of_max_num_seqs_and_the_rest_wait_until_dropped() {
        let load = Arc::new(EngineLoad::new(2, 1));
        let mut first = load.arrive(1);
        let mut second = load.arrive(1);
        assert_eq!(counts(&load), [(0, 0), (2, 0)], "waiting until scheduled");
        first.run(2);
        first.run(5);
        assert_eq!(counts(&load), [(0, 0), (1, 1)]);
        second.run(0);
        assert_eq!(counts(&load), [(0, 0), (1, 1)], "one in the batch");
        let usage = |load: &EngineLoad| {
            load.ranks(Some(8))
                .iter()
                .map(|r| r.kv_cache_usage)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            usage(&load),
            [0.0, 0.25],
            "the computing request's 2 blocks of 8"
        );
        drop(second);
        assert_eq!(counts(&load), [(0, 0), (0, 1)]);
        drop(first);
        assert_eq!(counts(&load), [(0, 0), (0, 0)]);
        assert_eq!(usage(&load), [0.0, 0.0], "released with it");
    }

    #[test]
    fn overrides_add_counts_and_replace_the_cache_usage() {
        let load = Arc::new(EngineLoad::new(2, 256));
        let _running = {
            let mut guard = load.arrive(1);
            guard.run(4);
            guard
        };
        let extra = EngineLoadOverride {
            waiting: 3,
            running: 2,
            kv_cache_usage: 0.75,
            rank: Some(0),
        };
        load.set_override(extra).unwrap();
        let ranks = load.ranks(Some(8));
        assert_eq!((ranks[0].waiting, ranks[0].running), (3, 2));
        assert_eq!(ranks[0].kv_cache_usage, 0.75);
        assert_eq!(ranks[1].kv_cache_usage, 0.5, "rank 1 untouched");

        load.set_override(EngineLoadOverride {
            rank: None,
            ..extra
        })
        .unwrap();
        assert_eq!(load.ranks(Some(8))[1].waiting, 3, "every rank");
        let refused = load.set_override(EngineLoadOverride {
            rank: Some(2),
            ..extra
        });
        assert_eq!(refused.unwrap_err(), "rank 2 is out of range [0, 2)");
        load.clear_overrides();
        assert_eq!(counts(&load), [(0, 0), (0, 1)]);
    }
}

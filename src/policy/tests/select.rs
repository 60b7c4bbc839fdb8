#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;
use crate::policy::engine_load::{EngineLoads, EngineReport, EngineTable, FullRule};
use crate::policy::load::LoadTable;
use crate::policy::metrics_text::RankLoad;
use crate::policy::registry::{Registry, Role};
use crate::policy::testing::test;

fn workers(n: u64) -> Vec<Worker> {
    (0..n)
        .map(|i| Worker {
            id: 100 + i,
            role: Role::Decode,
            address: format!("127.0.0.1:{}", 9000 + i).parse().unwrap(),
            dp_size: 1,
            draining: false,
            models: None,
            unlisted: false,
        })
        .collect()
}

fn rank<'w>(pool: Vec<&'w Worker>, choice: Choice<'_>) -> Vec<&'w Worker> {
    rank_candidates(pool, choice).order
}

fn ids(ranked: &[&Worker]) -> Vec<u64> {
    ranked.iter().map(|w| w.id).collect()
}

#[test]
fn turns_rotate_over_the_pool() {
    let pool = workers(3);
    let firsts: Vec<u64> = (0..6)
        .map(|t| rank(pool.iter().collect(), Choice::RoundRobin(t))[0].id)
        .collect();
    assert_eq!(firsts, vec![100, 101, 102, 100, 101, 102]);
    assert_eq!(
        ids(&rank(pool.iter().collect(), Choice::RoundRobin(1))),
        vec![101, 102, 100]
    );
    assert!(rank(Vec::new(), Choice::RoundRobin(5)).is_empty());
}

#[test]
fn a_session_always_gets_the_same_order_whatever_the_pool_order() {
    let pool = workers(5);
    let forward = ids(&rank(pool.iter().collect(), Choice::Session(b"chat-42")));
    let backward = ids(&rank(
        pool.iter().rev().collect(),
        Choice::Session(b"chat-42"),
    ));
    assert_eq!(forward, backward);
    assert_eq!(forward.len(), 5);
}

#[test]
fn removing_a_worker_moves_only_its_sessions() {
    let pool = workers(5);
    let removed = 102;
    for i in 0..500 {
        let key = format!("session-{i}");
        let before = rank(pool.iter().collect(), Choice::Session(key.as_bytes()))[0].id;
        let smaller: Vec<&Worker> = pool.iter().filter(|w| w.id != removed).collect();
        let after = rank(smaller, Choice::Session(key.as_bytes()))[0].id;
        if before != removed {
            assert_eq!(before, after, "{key} moved although its worker stayed");
        }
    }
}

#[test]
fn sessions_spread_over_the_pool() {
    let pool = workers(4);
    let mut counts = [0u32; 4];
    for i in 0..4000 {
        let key = format!("s{i}");
        let first = rank(pool.iter().collect(), Choice::Session(key.as_bytes()))[0].id;
        counts[usize::try_from(first - 100).unwrap()] += 1;
    }
    assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
}

#[test]
fn the_session_weight_is_a_fixed_function() {
    // Replicas on any platform must agree: pin the hash to known values.
    let worker = &workers(1)[0];
    assert_eq!(
        session_weight(b"abc", worker),
        xxhash_rust::xxh3::xxh3_64_with_seed(b"abc", 100)
    );
    assert_ne!(
        session_weight(b"abc", worker),
        session_weight(b"abd", worker)
    );
}

#[test]
fn the_less_loaded_of_the_next_two_goes_first() {
    let pool = workers(3);
    let loads = |w: &Worker| if w.id == 100 { 5 } else { 1 };
    let order = |rotation| {
        ids(&rank(
            pool.iter().collect(),
            Choice::LeastLoaded {
                rotation,
                outstanding: &loads,
            },
        ))
    };
    assert_eq!(order(0), vec![101, 100, 102], "100 is busier than 101");
    assert_eq!(
        order(1),
        vec![101, 102, 100],
        "101 and 102 tie: round robin decides"
    );
    assert_eq!(order(2), vec![102, 100, 101]);
    let busy_share = (0..300).filter(|t| order(*t)[0] == 100).count();
    assert_eq!(
        busy_share, 0,
        "a busier worker never goes first while a pair partner is idler"
    );
    let one = workers(1);
    assert_eq!(
        ids(&rank(
            one.iter().collect(),
            Choice::LeastLoaded {
                rotation: 7,
                outstanding: &loads
            }
        )),
        vec![100]
    );
}

const BUSY: Busy = Busy {
    excess: 2,
    percent: 150,
    graded: false,
};

/// The prefix-affinity ranking of `pool` for these depths, loads and remembered workers.
fn affinity(
    pool: &[Worker],
    depths: &[u64],
    remembered: &[WorkerId],
    loads: &dyn Loads,
) -> (Vec<u64>, Placement) {
    let ranked = rank_candidates(
        pool.iter().collect(),
        Choice::Prefix(Affinity {
            depths,
            remembered,
            busy: BUSY,
            rotation: 0,
            outstanding: loads,
            draw_key: depths.last().copied().unwrap_or(0),
        }),
    );
    (ids(&ranked.order), ranked.placement)
}

fn idle(_: &Worker) -> u64 {
    0
}

/// The worker `hash` weighs highest, among `pool` less `skipped`.
fn top(pool: &[Worker], hash: u64, skipped: &[u64]) -> u64 {
    pool.iter()
        .filter(|w| !skipped.contains(&w.id))
        .max_by_key(|w| (prefix_weight(hash, w), w.id))
        .unwrap()
        .id
}

#[test]
fn a_busy_worker_is_one_far_above_its_share() {
    // 150 % of the mean plus 2: four workers with 40 in flight have a mean of 10.
    assert!(
        !BUSY.is_busy(17, 40, 4),
        "at 150 % of the mean plus the excess"
    );
    assert!(BUSY.is_busy(18, 40, 4));
    assert!(!BUSY.is_busy(2, 2, 4), "within the excess of an idle pool");
    assert!(BUSY.is_busy(4, 4, 4));
    assert!(!BUSY.is_busy(7, 7, 1), "a pool of one is never busy");
    for (load, total, workers) in [(0, 0, 3), (5, 21, 4), (u64::MAX, u64::MAX, 2)] {
        let least_possible = total / workers as u64;
        assert!(
            !BUSY.is_busy(least_possible.min(load), total, workers),
            "a worker at or below the mean is never busy"
        );
    }
    assert!(
        !Busy {
            excess: u64::MAX,
            percent: u64::MAX,
            graded: false,
        }
        .is_busy(u64::MAX, u64::MAX, 9)
    );
}

const GRADED: Busy = Busy {
    graded: true,
    ..BUSY
};

#[test]
fn a_graded_bound_sends_past_a_worker_a_share_growing_with_its_load() {
    // 150 % of the mean plus 2: four workers with 40 in flight have a bound of 17, and every
    // prompt goes past a worker at one and a half times that.
    let share = |load| GRADED.spill_share(load, 40, 4) as f64 / 4_294_967_296.0;
    assert_eq!(share(17), 0.0, "none up to the bound");
    assert!((share(21) - 0.47).abs() < 0.01, "{}", share(21));
    assert_eq!(share(26), 1.0);
    assert_eq!(share(u64::MAX), 1.0);
    let huge = Busy {
        percent: u64::MAX,
        ..GRADED
    };
    // A bound near 2^101 in the function's scale (load × 100 × workers), and a load a quarter
    // over it: half way to one and a half times it.
    let past_96_bits = huge.spill_share(u64::MAX, 100 * (1 << 31) * 4 / 5, 1 << 31);
    assert!(
        (past_96_bits as f64 / 4_294_967_296.0 - 0.5).abs() < 0.01,
        "{past_96_bits}"
    );
    assert_eq!(huge.spill_share(u64::MAX, u64::MAX, 9), 0);
    assert_eq!(
        GRADED.spill_share(7, 7, 1),
        0,
        "a pool of one is never busy"
    );
    let loads: Vec<f64> = (17..40).map(share).collect();
    assert!(loads.windows(2).all(|pair| pair[0] <= pair[1]));
}

/// Which of 2,000 conversations sharing their first depth go past its worker, `home`, when it
/// holds `home_load` requests and each other worker one.
fn spilled(busy: Busy, pool: &[Worker], home: u64, home_load: u64) -> Vec<u64> {
    let loads = |w: &Worker| if w.id == home { home_load } else { 1 };
    spilled_turns(busy, pool, home, &loads, 0)
}

/// [`spilled`] with these loads, for the conversations' turn `turn` (each turn a deeper hash,
/// the draw key the first turn's).
fn spilled_turns(busy: Busy, pool: &[Worker], home: u64, loads: &dyn Loads, turn: u64) -> Vec<u64> {
    (0..2000u64)
        .filter(|conversation| {
            let depths = [7, 1000 + conversation, 1_000_000 * turn + conversation];
            let ranked = rank_candidates(
                pool.iter().collect(),
                Choice::Prefix(Affinity {
                    depths: &depths[..if turn == 0 { 2 } else { 3 }],
                    remembered: &[],
                    busy,
                    rotation: 0,
                    outstanding: loads,
                    draw_key: 1000 + conversation,
                }),
            );
            ranked.order[0].id != home
        })
        .collect()
}

/// Loads whose engines' figures and whose counts with this replica's own requests differ:
/// `home` holds `reported` by the engines and `counted` with them, `since` of them sent since
/// the scrape; every other worker one.
struct Split {
    home: u64,
    reported: u64,
    counted: u64,
    since: u64,
}

impl Loads for Split {
    fn outstanding(&self, worker: &Worker) -> u64 {
        if worker.id == self.home {
            self.counted
        } else {
            1
        }
    }

    fn reported_milli(&self, worker: &Worker) -> u64 {
        1000 * if worker.id == self.home {
            self.reported
        } else {
            1
        }
    }

    fn sent_since(&self, worker: &Worker) -> u64 {
        if worker.id == self.home {
            self.since
        } else {
            0
        }
    }
}

#[test]
fn a_conversation_draws_once_for_all_its_turns() {
    let pool = workers(4);
    let home = top(&pool, 7, &[]);
    let loads = |w: &Worker| if w.id == home { 7 } else { 1 };
    let first = spilled_turns(GRADED, &pool, home, &loads, 0);
    assert!((750..1000).contains(&first.len()), "{}", first.len());
    for turn in 1..4 {
        assert_eq!(
            spilled_turns(GRADED, &pool, home, &loads, turn),
            first,
            "turn {turn}"
        );
    }
}

#[test]
fn a_graded_share_reads_the_engines_figures_and_this_replicas_own_requests_only_in_a_burst() {
    let pool = workers(4);
    let home = top(&pool, 7, &[]);
    let split = |counted, since| Split {
        home,
        reported: 7,
        counted,
        since,
    };
    // The engines report 7 of 10 (the bound 5.75): 43 % of the way to every prompt.
    let engines = spilled_turns(GRADED, &pool, home, &split(7, 0), 0);
    assert!((750..1000).contains(&engines.len()), "{}", engines.len());
    for (counted, since) in [(0, 0), (5, 0), (12, 5)] {
        let replica = spilled_turns(GRADED, &pool, home, &split(counted, since), 0);
        assert_eq!(
            replica, engines,
            "this replica's count {counted}, {since} since"
        );
    }
    let burst = spilled_turns(GRADED, &pool, home, &split(13, 6), 0);
    assert_eq!(
        burst.len(),
        2000,
        "6 sent since the scrape: more than the bound"
    );
}

#[test]
fn a_graded_bound_passes_over_a_busy_worker_for_a_share_of_its_conversations() {
    let pool = workers(4);
    let home = top(&pool, 7, &[]);
    // 7 + 3 in flight: the bound is 150 % of 2.5 plus 2 (5.75), and 7 is 43 % of the way
    // to one and a half times it.
    let half = spilled(GRADED, &pool, home, 7);
    assert!((750..1000).contains(&half.len()), "{}", half.len());
    assert_eq!(half, spilled(GRADED, &pool, home, 7), "by its draw alone");
    let more = spilled(GRADED, &pool, home, 8);
    assert!(more.len() > half.len());
    assert!(
        half.iter().all(|c| more.contains(c)),
        "a conversation that went past at a load goes past at a higher one"
    );
    assert_eq!(
        spilled(BUSY, &pool, home, 7).len(),
        2000,
        "ungraded: all of them"
    );
    assert!(spilled(GRADED, &pool, home, 5).is_empty(), "at the bound");
}

#[test]
fn the_same_prefix_goes_to_the_same_worker_whatever_the_pool_order() {
    let pool = workers(5);
    let depths = [11, 22, 33];
    let (order, placement) = affinity(&pool, &depths, &[], &idle);
    assert_eq!(placement, Placement::Affinity);
    assert_eq!(
        order[0],
        top(&pool, 11, &[]),
        "the shallowest depth decides"
    );
    let reversed: Vec<Worker> = pool.iter().rev().cloned().collect();
    assert_eq!(affinity(&reversed, &depths, &[], &idle).0, order);
    let deeper = [11, 22, 33, 44, 55];
    assert_eq!(
        affinity(&pool, &deeper, &[], &idle).0[0],
        order[0],
        "a longer prompt with the same beginning goes along"
    );
}

#[test]
fn prefixes_spread_over_the_pool() {
    let pool = workers(4);
    let mut counts = [0u32; 4];
    for hash in 0..4000u64 {
        let first = affinity(
            &pool,
            &[hash.wrapping_mul(0x9e37_79b9_7f4a_7c15)],
            &[],
            &idle,
        )
        .0[0];
        counts[usize::try_from(first - 100).unwrap()] += 1;
    }
    assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
}

#[test]
fn a_busy_worker_passes_its_prefix_down_the_depths() {
    let pool = workers(4);
    let depths = [7, 8, 9];
    let home = top(&pool, 7, &[]);
    let second = top(&pool, 8, &[home]);
    let busy_home = |w: &Worker| if w.id == home { 8 } else { 1 };
    let (order, placement) = affinity(&pool, &depths, &[], &busy_home);
    assert_eq!((order[0], placement), (second, Placement::Spilled));
    let third = top(&pool, 9, &[home, second]);
    let both_busy = |w: &Worker| if [home, second].contains(&w.id) { 9 } else { 0 };
    assert_eq!(affinity(&pool, &depths, &[], &both_busy).0[0], third);
    let (order, placement) = affinity(&pool, &[7], &[], &busy_home);
    assert_eq!(
        (order[0], placement),
        (top(&pool, 7, &[home]), Placement::Spilled),
        "past the last depth, the first worker that is not busy in the deepest order"
    );
    let mild = |w: &Worker| if w.id == home { 3 } else { 1 };
    assert_eq!(
        affinity(&pool, &depths, &[], &mild).0[0],
        home,
        "a little busier is not busy"
    );
}

#[test]
fn a_remembered_worker_goes_first_unless_busy() {
    let pool = workers(4);
    let depths = [7, 8];
    let home = top(&pool, 7, &[]);
    let other = pool.iter().map(|w| w.id).find(|id| *id != home).unwrap();
    assert_eq!(
        affinity(&pool, &depths, &[999, other], &idle),
        (
            affinity(&pool, &depths, &[999, other], &idle).0,
            Placement::Remembered
        )
    );
    assert_eq!(affinity(&pool, &depths, &[other], &idle).0[0], other);
    let busy_other = |w: &Worker| if w.id == other { 9 } else { 0 };
    assert_eq!(
        affinity(&pool, &depths, &[other], &busy_other),
        (
            affinity(&pool, &depths, &[], &busy_other).0,
            Placement::Affinity
        ),
        "a busy remembered worker is passed over"
    );
}

#[test]
fn without_depths_affinity_is_least_loaded() {
    let pool = workers(3);
    let loads = |w: &Worker| if w.id == 100 { 5 } else { 1 };
    let (order, placement) = affinity(&pool, &[], &[], &loads);
    assert_eq!(placement, Placement::Load);
    assert_eq!(order, vec![101, 100, 102]);
}

#[test]
fn the_order_is_every_worker_once() {
    let pool = workers(6);
    let loads = |w: &Worker| w.id % 4;
    for depths in [&[1u64][..], &[1, 2, 3, 4, 5, 6, 7, 8]] {
        for remembered in [&[][..], &[104u64][..]] {
            let (mut order, _) = affinity(&pool, depths, remembered, &loads);
            order.sort_unstable();
            assert_eq!(order, (100..106).collect::<Vec<u64>>());
        }
    }
    assert!(affinity(&[], &[1], &[], &idle).0.is_empty());
}

#[test]
fn the_prefix_weight_is_a_fixed_function() {
    let worker = &workers(1)[0];
    assert_eq!(
        prefix_weight(42, worker),
        xxhash_rust::xxh3::xxh3_64_with_seed(&42u64.to_le_bytes(), 100)
    );
}

#[test]
fn a_session_beats_prefix_affinity_and_affinity_beats_load() {
    let outstanding = |_: &Worker| 0;
    let affinity = Affinity {
        depths: &[1, 2],
        remembered: &[],
        busy: Busy {
            excess: 8,
            percent: 200,
            graded: false,
        },
        rotation: 0,
        outstanding: &outstanding,
        draw_key: 2,
    };
    let placed = |choice: Choice<'_>| match choice {
        Choice::Session(key) => format!("session {}", String::from_utf8_lossy(key)),
        Choice::Prefix(_) => "affinity".to_string(),
        Choice::LeastLoaded { .. } => "load".to_string(),
        Choice::RoundRobin(_) => "round robin".to_string(),
    };
    let key = b"s1".as_slice();
    assert_eq!(
        placed(unpinned_choice(Some(key), Some(affinity), 0, &outstanding)),
        "session s1"
    );
    assert_eq!(
        placed(unpinned_choice(Some(key), None, 0, &outstanding)),
        "session s1"
    );
    assert_eq!(
        placed(unpinned_choice(None, Some(affinity), 0, &outstanding)),
        "affinity"
    );
    assert_eq!(placed(unpinned_choice(None, None, 0, &outstanding)), "load");
}

/// A pseudo-random number for case `seed`, draw `n`: the same on every platform.
fn draw(seed: u64, n: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(&n.to_le_bytes(), seed)
}

/// A registry of up to 11 workers of both roles, some draining, listed in no order.
fn random_registry(seed: u64) -> Registry {
    let size = 1 + draw(seed, 0) % 11;
    let mut workers: Vec<Worker> = (0..size)
        .map(|i| Worker {
            id: 100 + 3 * i + draw(seed, 10 + i) % 3,
            role: if i == 0 || !draw(seed, 30 + i).is_multiple_of(3) {
                Role::Decode
            } else {
                Role::Prefill
            },
            address: format!("127.0.0.1:{}", 9000 + i).parse().unwrap(),
            dp_size: 1,
            draining: draw(seed, 50 + i).is_multiple_of(5),
            models: None,
            unlisted: false,
        })
        .collect();
    workers.sort_by_key(|w| draw(seed, w.id));
    Registry::new(workers).unwrap()
}

#[test]
fn ranking_a_pool_is_ranking_its_workers_cut_to_the_limit() {
    for seed in 0..3000u64 {
        let registry = random_registry(seed);
        let role = if seed % 4 == 0 {
            Role::Prefill
        } else {
            Role::Decode
        };
        let pool = registry.serving(role, None);
        let excluded: Vec<WorkerId> = (100..135)
            .filter(|id| draw(seed, *id).is_multiple_of(4))
            .collect();
        let remembered: Vec<WorkerId> = (100..135)
            .filter(|id| draw(seed, 200 + *id).is_multiple_of(6))
            .collect();
        let depths: Vec<u64> = (0..draw(seed, 1) % 4)
            .map(|d| draw(seed, 300 + d))
            .collect();
        let closure = |w: &Worker| draw(seed, 400 + w.id) % 6;
        // Or a table, as the filter reads it: it sums its own entries for a pool's total, and
        // lists a worker the registry does not.
        let mut table = LoadTable::default();
        for id in (100..135).chain([7]) {
            table.add(id, i64::try_from(draw(seed, 400 + id) % 6).unwrap());
        }
        // Or the engines' figures, some workers full, in some cases every one.
        let mut engine = EngineTable::default();
        let reports = (100..135).map(|id| EngineReport {
            worker: id,
            scraped_at: 0,
            sent: 0,
            ranks: vec![RankLoad {
                rank: 0,
                waiting: if seed % 7 == 0 {
                    9
                } else {
                    draw(seed, 500 + id) % 10
                },
                running: 1,
                kv_permille: 0,
            }],
            average_milli: 0,
        });
        engine.merge(reports.collect(), |_| true, 0);
        let engine_loads = EngineLoads {
            sent: &table,
            table: &engine,
            rule: FullRule {
                stale_nanos: u64::MAX,
                waiting: Some(8),
                kv_permille: None,
            },
            now: 0,
            rotation: 0,
        };
        let loads: &dyn Loads = match seed % 4 {
            0 => &table,
            1 => &engine_loads,
            _ => &closure,
        };
        let busy = if seed % 2 == 0 {
            BUSY
        } else {
            Busy {
                excess: 0,
                percent: 100,
                graded: seed % 3 == 0,
            }
        };
        let key = seed.to_le_bytes();
        let rotation = draw(seed, 2) % 50;
        let limit = usize::try_from(draw(seed, 3) % 6).unwrap();
        let choice = match seed % 5 {
            0 => Choice::Session(&key),
            1 => Choice::RoundRobin(rotation),
            2 => Choice::LeastLoaded {
                rotation,
                outstanding: loads,
            },
            _ => Choice::Prefix(Affinity {
                depths: &depths,
                remembered: &remembered,
                busy,
                rotation,
                outstanding: loads,
                draw_key: depths.last().copied().unwrap_or(0),
            }),
        };
        let workers = registry
            .workers()
            .iter()
            .filter(|w| w.role == role && !w.draining && !excluded.contains(&w.id))
            .collect();
        let whole = rank_candidates(workers, choice);
        let cut = rank_pool(pool, &excluded, limit, choice);
        let expected: Vec<u64> = ids(&whole.order).into_iter().take(limit).collect();
        assert_eq!(ids(&cut.order), expected, "case {seed}");
        assert_eq!(cut.placement, whole.placement, "case {seed}");
    }
}

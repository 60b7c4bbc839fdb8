#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;
use crate::policy::load::LoadTable;
use crate::policy::registry::Role;
use crate::policy::testing::test;

fn worker(id: WorkerId, dp_size: u32) -> Worker {
    Worker {
        id,
        role: Role::Prefill,
        address: format!("127.0.0.1:{}", 9000 + id).parse().unwrap(),
        dp_size,
        draining: false,
        models: None,
        unlisted: false,
    }
}

fn rank(rank: u32, waiting: u64, running: u64, kv_permille: u64) -> RankLoad {
    RankLoad {
        rank,
        waiting,
        running,
        kv_permille,
    }
}

fn report(worker: WorkerId, scraped_at: u64, sent: u64, ranks: Vec<RankLoad>) -> EngineReport {
    EngineReport {
        worker,
        scraped_at,
        sent,
        ranks,
        average_milli: 0,
    }
}

const SECOND: u64 = 1_000_000_000;

fn rule() -> FullRule {
    FullRule {
        stale_nanos: 2 * SECOND,
        waiting: Some(8),
        kv_permille: Some(950),
    }
}

fn table(reports: Vec<EngineReport>) -> EngineTable {
    let mut table = EngineTable::default();
    table.merge(reports, |_| true, 2 * SECOND);
    table
}

#[test]
fn reports_survive_encoding_and_torn_or_disordered_entries_are_dropped() {
    let written = table(vec![
        report(7, 10, 1, vec![rank(0, 1, 2, 300), rank(1, 0, 4, 10)]),
        report(3, 11, 0, vec![rank(0, 5, 5, 999)]),
    ]);
    let mut bytes = written.encode();
    assert_eq!(EngineTable::decode(&bytes), written);
    assert_eq!(written.report(3).unwrap().requests(), 10);
    bytes.extend_from_slice(&bytes.clone()[..64]);
    bytes.extend_from_slice(&[1, 2, 3]);
    assert_eq!(
        EngineTable::decode(&bytes),
        written,
        "a repeated worker and torn bytes"
    );
}

#[test]
fn a_newer_report_replaces_an_older_one_and_unlisted_workers_are_forgotten() {
    let mut shared = table(vec![
        report(1, 20, 0, vec![rank(0, 1, 0, 0)]),
        report(2, 20, 0, vec![rank(0, 2, 0, 0)]),
    ]);
    shared.merge(
        vec![
            report(1, 10, 0, vec![rank(0, 9, 0, 0)]),
            report(2, 30, 0, vec![rank(0, 3, 0, 0)]),
            report(4, 30, 0, vec![rank(0, 4, 0, 0)]),
        ],
        |id| id != 4,
        2 * SECOND,
    );
    assert_eq!(
        shared.report(1).unwrap().ranks[0].waiting,
        1,
        "older kept out"
    );
    assert_eq!(shared.report(2).unwrap().ranks[0].waiting, 3);
    assert_eq!(shared.report(4), None);
}

/// The loads a choice reads at 11 s with these own counts and figures.
fn loads_at_11_s<'a>(sent: &'a LoadTable, engine: &'a EngineTable) -> EngineLoads<'a> {
    EngineLoads {
        sent,
        table: engine,
        rule: rule(),
        now: 11 * SECOND,
        rotation: 0,
    }
}

#[test]
fn a_fresh_report_counts_the_engine_plus_what_was_sent_since() {
    let mut sent = LoadTable::default();
    sent.add(1, 5);
    sent.add(2, 5);
    let engine = table(vec![report(1, 10 * SECOND, 3, vec![rank(0, 4, 6, 0)])]);
    let loads = loads_at_11_s(&sent, &engine);
    assert_eq!(
        loads.outstanding(&worker(1, 1)),
        10 + 2,
        "engine 10, 2 sent since"
    );
    let drained = table(vec![report(1, 10 * SECOND, 8, vec![rank(0, 1, 1, 0)])]);
    let after_drain = EngineLoads {
        table: &drained,
        ..loads
    };
    assert_eq!(
        after_drain.outstanding(&worker(1, 1)),
        0,
        "engine 2, and 3 of this gateway's ended since: never below 0"
    );
    assert_eq!(loads.outstanding(&worker(2, 1)), 5, "no report: own count");
    let stale = EngineLoads {
        now: 13 * SECOND,
        ..loads
    };
    assert_eq!(stale.outstanding(&worker(1, 1)), 5, "stale: own count");
    let queued = table(vec![report(1, 10 * SECOND, 3, vec![rank(0, 9, 6, 0)])]);
    let full = EngineLoads {
        table: &queued,
        ..loads
    };
    assert!(full.full(&worker(1, 1)), "9 waiting of 8");
    let stale = EngineLoads {
        now: 13 * SECOND,
        ..full
    };
    assert!(!stale.full(&worker(1, 1)), "stale: the share alone judges");
}

#[test]
fn two_replicas_with_different_own_counts_read_one_scrape_alike() {
    let engine = table(vec![
        report(1, SECOND, 0, vec![rank(0, 20, 8, 0)]),
        report(2, SECOND, 0, vec![rank(0, 0, 2, 0)]),
    ]);
    let [mut a, mut b] = [LoadTable::default(), LoadTable::default()];
    a.add(2, 3);
    b.add(1, 3);
    for sent in [&a, &b] {
        let loads = EngineLoads {
            sent,
            table: &engine,
            rule: rule(),
            now: SECOND,
            rotation: 0,
        };
        let (busy, idle) = (
            loads.outstanding(&worker(1, 1)),
            loads.outstanding(&worker(2, 1)),
        );
        assert!(busy > idle, "{busy} > {idle}");
    }
}

#[test]
fn a_worker_is_full_when_every_rank_is_past_a_threshold() {
    let engine = table(vec![
        report(1, SECOND, 0, vec![rank(0, 8, 0, 0), rank(1, 0, 0, 950)]),
        report(2, SECOND, 0, vec![rank(0, 8, 0, 0), rank(1, 7, 0, 949)]),
    ]);
    let sent = LoadTable::default();
    let loads = EngineLoads {
        sent: &sent,
        table: &engine,
        rule: rule(),
        now: SECOND,
        rotation: 0,
    };
    assert!(loads.full(&worker(1, 2)));
    assert!(!loads.full(&worker(2, 2)), "rank 1 has room");
}

#[test]
fn a_multi_rank_worker_gets_the_less_loaded_of_two_ranks_in_rotation() {
    let engine = table(vec![report(
        1,
        SECOND,
        0,
        vec![
            rank(0, 4, 0, 0),
            rank(1, 1, 0, 0),
            rank(2, 1, 0, 500),
            rank(3, 0, 0, 0),
        ],
    )]);
    let sent = LoadTable::default();
    let chosen = |rotation| {
        EngineLoads {
            sent: &sent,
            table: &engine,
            rule: rule(),
            now: SECOND,
            rotation,
        }
        .rank(&worker(1, 4))
    };
    assert_eq!(
        (0..5).map(chosen).collect::<Vec<_>>(),
        vec![Some(1), Some(1), Some(3), Some(3), Some(1)],
        "0 vs 1, 1 vs 2 (less KV), 2 vs 3, 3 vs 0, again"
    );
    let single = EngineLoads {
        sent: &sent,
        table: &engine,
        rule: rule(),
        now: SECOND,
        rotation: 0,
    };
    assert_eq!(single.rank(&worker(1, 1)), None, "one rank: none named");
    assert_eq!(single.rank(&worker(2, 4)), None, "no report: vLLM balances");
}

#[test]
fn settings_out_of_range_are_refused() {
    let valid: EngineLoadSource = serde_json::from_str("{}").unwrap();
    assert_eq!(valid.invalid(), None);
    assert_eq!(valid.cluster("pinroute_prefill"), "pinroute_prefill");
    for (json, why) in [
        (r#"{"path":"metrics"}"#, "path"),
        (r#"{"period_ms":10}"#, "period_ms"),
        (r#"{"timeout_ms":0}"#, "timeout_ms"),
        (r#"{"period_ms":1000,"stale_ms":500}"#, "stale_ms"),
        (r#"{"max_bytes":0}"#, "max_bytes"),
        (r#"{"max_bytes":100000000}"#, "max_bytes"),
        (r#"{"busy_waiting":0}"#, "busy_waiting"),
        (r#"{"busy_kv_percent":101}"#, "busy_kv_percent"),
    ] {
        let source: EngineLoadSource = serde_json::from_str(json).unwrap();
        assert!(source.invalid().is_some_and(|w| w.contains(why)), "{json}");
    }
    assert!(serde_json::from_str::<EngineLoadSource>(r#"{"perod_ms":1}"#).is_err());
}

#[test]
fn affinity_passes_over_a_full_worker_unless_every_worker_is_full() {
    use crate::policy::select::{Affinity, Busy, Choice, Placement, rank_candidates};
    let pool: Vec<Worker> = (1..=3).map(|id| worker(id, 1)).collect();
    let depths = [42u64];
    let place = |engine: &EngineTable| {
        let sent = LoadTable::default();
        let loads = EngineLoads {
            sent: &sent,
            table: engine,
            rule: rule(),
            now: SECOND,
            rotation: 0,
        };
        let choice = Choice::Prefix(Affinity {
            depths: &depths,
            remembered: &[],
            busy: Busy {
                excess: 8,
                percent: 200,
                graded: false,
            },
            rotation: 0,
            outstanding: &loads,
            draw_key: 42,
        });
        let ranked = rank_candidates(pool.iter().collect(), choice);
        (ranked.order[0].id, ranked.placement)
    };
    let waiting = |full: &[WorkerId]| {
        let reports = (1..=3).map(|id| {
            let queued = if full.contains(&id) { 8 } else { 0 };
            report(id, SECOND, 0, vec![rank(0, queued, 1, 0)])
        });
        table(reports.collect())
    };
    let (home, placement) = place(&waiting(&[]));
    assert_eq!(placement, Placement::Affinity);
    let (moved, placement) = place(&waiting(&[home]));
    assert_ne!(moved, home);
    assert_eq!(placement, Placement::Spilled);
    assert_eq!(
        place(&waiting(&[1, 2, 3])),
        (home, Placement::Affinity),
        "every worker full: moving would lose the prefix for nothing"
    );
}

#[test]
fn an_average_moves_a_quarter_of_the_way_to_each_scrape_and_starts_again_after_a_stale_gap() {
    let average = |table: &EngineTable| table.report(1).unwrap().average_milli;
    let mut shared = table(vec![report(1, SECOND, 0, vec![rank(0, 2, 6, 0)])]);
    assert_eq!(average(&shared), 8000, "a first scrape is its own average");
    let next = |at, requests| vec![report(1, at, 0, vec![rank(0, 0, requests, 0)])];
    shared.merge(next(2 * SECOND, 0), |_| true, 2 * SECOND);
    assert_eq!(average(&shared), 6000);
    shared.merge(next(3 * SECOND, 4), |_| true, 2 * SECOND);
    assert_eq!(average(&shared), 5500);
    shared.merge(next(6 * SECOND, 4), |_| true, 2 * SECOND);
    assert_eq!(average(&shared), 4000, "3 s after the last: a new average");
    assert_eq!(EngineTable::decode(&shared.encode()), shared);
}

#[test]
fn the_graded_share_reads_the_engines_average_and_a_worker_without_fresh_figures_its_own_count() {
    let mut sent = LoadTable::default();
    sent.add(1, 5);
    sent.add(2, 7);
    let mut engine = table(vec![report(1, 10 * SECOND, 3, vec![rank(0, 0, 8, 0)])]);
    engine.merge(
        vec![report(1, 11 * SECOND, 3, vec![rank(0, 0, 4, 0)])],
        |_| true,
        2 * SECOND,
    );
    let loads = loads_at_11_s(&sent, &engine);
    assert_eq!(loads.reported_milli(&worker(1, 1)), 7000, "8 then 4");
    assert_eq!(
        loads.outstanding(&worker(1, 1)),
        4 + 2,
        "the last scrape, 2 sent since"
    );
    assert_eq!(loads.sent_since(&worker(1, 1)), 2);
    assert_eq!(
        loads.reported_milli(&worker(2, 1)),
        7000,
        "no report: own count"
    );
    assert_eq!(loads.sent_since(&worker(2, 1)), 0);
    let stale = EngineLoads {
        now: 14 * SECOND,
        ..loads
    };
    assert_eq!(
        stale.reported_milli(&worker(1, 1)),
        5000,
        "stale: own count"
    );
}

#[test]
fn every_thread_looks_on_the_clocks_multiples_of_its_look_period() {
    let look = Duration::from_millis(50);
    let until = |now| EngineLoadSource::until_next_look(now, look);
    assert_eq!(until(SECOND), look, "on a multiple: the next one");
    assert_eq!(until(SECOND + 30_000_000), Duration::from_millis(20));
    assert_eq!(
        until(SECOND + 49_999_999),
        Duration::from_millis(1),
        "at least 1 ms"
    );
    assert_eq!(
        EngineLoadSource::until_next_look(u64::MAX, Duration::ZERO),
        Duration::from_millis(1)
    );
}

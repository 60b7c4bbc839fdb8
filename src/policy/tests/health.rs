use super::*;
use crate::policy::availability::{Availability, Observed, Unavailability};
use crate::policy::registry::{Role, Worker};
use crate::policy::testing::test;

const SECOND: u64 = 1_000_000_000;

fn worker(id: WorkerId, draining: bool) -> Worker {
    Worker {
        id,
        role: Role::Decode,
        address: ([127, 0, 0, 1], 9000).into(),
        dp_size: 1,
        draining,
    }
}

#[test]
fn a_marked_worker_is_unhealthy_until_its_time_then_returns() {
    let mut table = HealthTable::default();
    table.mark(7, 10 * SECOND, 0);
    let at = |now| Observed { table: &table, now }.unavailability(&worker(7, false));
    assert_eq!(
        at(0),
        Some(Unavailability::Unhealthy {
            retry_after_secs: 10
        })
    );
    assert_eq!(
        at(9 * SECOND + 1),
        Some(Unavailability::Unhealthy {
            retry_after_secs: 1
        })
    );
    assert_eq!(at(10 * SECOND), None);
    assert_eq!(
        Observed {
            table: &table,
            now: 0
        }
        .unavailability(&worker(8, false)),
        None
    );
}

#[test]
fn draining_wins_over_health() {
    let table = HealthTable::default();
    assert_eq!(
        Observed {
            table: &table,
            now: 0
        }
        .unavailability(&worker(7, true)),
        Some(Unavailability::Draining)
    );
}

#[test]
fn marking_again_during_an_outage_extends_it_without_lengthening_later_ones() {
    let mut table = HealthTable::default();
    assert_eq!(table.mark(1, 5 * SECOND, 0), 5 * SECOND);
    assert_eq!(
        table.mark(1, 5 * SECOND, 2 * SECOND),
        7 * SECOND,
        "a burst of failures is one outage"
    );
    assert_eq!(table.mark(1, 5 * SECOND, 3 * SECOND), 8 * SECOND);
    assert_eq!(
        table.mark(1, 5 * SECOND, 9 * SECOND),
        19 * SECOND,
        "failed again on return: twice as long"
    );
}

#[test]
fn a_worker_failing_each_time_it_returns_stays_out_longer_up_to_eight_periods() {
    let mut table = HealthTable::default();
    let mut now = 0;
    let mut outages = Vec::new();
    for _ in 0..6 {
        let until = table.mark(3, SECOND, now);
        outages.push((until - now) / SECOND);
        now = until;
    }
    assert_eq!(outages, [1, 2, 4, 8, 8, 8]);
    assert_eq!(table.len(), 1);
}

#[test]
fn a_worker_that_stayed_up_starts_again_from_one_period_and_old_outages_are_forgotten() {
    let mut table = HealthTable::default();
    table.mark(1, 5 * SECOND, 0);
    table.mark(1, 5 * SECOND, 5 * SECOND);
    assert_eq!(
        table.unhealthy_until(1, 5 * SECOND),
        Some(15 * SECOND),
        "second outage: 10 s"
    );
    table.mark(2, 5 * SECOND, 0);
    assert_eq!(
        table.mark(1, 5 * SECOND, 25 * SECOND),
        30 * SECOND,
        "up for as long as it was out"
    );
    assert_eq!(table.len(), 1, "worker 2's outage is forgotten: {table:?}");
}

#[test]
fn the_encoding_round_trips_and_tolerates_garbage() {
    let mut table = HealthTable::default();
    table.mark(u64::MAX, 3, 0);
    table.mark(42, u64::MAX, 0);
    table.mark(42, u64::MAX, u64::MAX);
    assert_eq!(HealthTable::decode(&table.encode()), table);
    let mut bytes = table.encode();
    bytes.extend_from_slice(&[1, 2, 3]);
    assert_eq!(HealthTable::decode(&bytes), table);
    assert!(HealthTable::decode(&[9; 23]).is_empty());
}

#[test]
fn a_corrupt_doubling_count_is_capped() {
    let bytes = [7u64, 5 * SECOND, u64::MAX].map(u64::to_le_bytes).concat();
    let mut table = HealthTable::decode(&bytes);
    assert_eq!(
        table.mark(7, SECOND, 6 * SECOND),
        14 * SECOND,
        "at most 8 periods"
    );
}

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
        models: None,
        unlisted: false,
    }
}

fn rule(period: u64, after_failures: u64) -> Ejection {
    Ejection {
        period,
        after_failures,
    }
}

/// Today's rule before counting: the first failure takes the worker out.
fn mark(table: &mut HealthTable, worker: WorkerId, period: u64, now: u64) -> u64 {
    match table.record_failure(worker, rule(period, 1), now) {
        Recorded::TakenOut { until } | Recorded::StillOut { until } => until,
        Recorded::Counted(n) => panic!("one failure must take it out, counted {n}"),
    }
}

#[test]
fn a_worker_is_taken_out_by_the_third_failure_in_a_row_not_the_first() {
    let mut table = HealthTable::default();
    let three = rule(10 * SECOND, 3);
    assert_eq!(table.record_failure(7, three, 0), Recorded::Counted(1));
    assert_eq!(table.unhealthy_until(7, 0), None);
    assert_eq!(table.record_failure(7, three, SECOND), Recorded::Counted(2));
    assert_eq!(table.unhealthy_until(7, SECOND), None);
    assert_eq!(
        table.record_failure(7, three, 2 * SECOND),
        Recorded::TakenOut { until: 12 * SECOND }
    );
    assert_eq!(table.unhealthy_until(7, 2 * SECOND), Some(12 * SECOND));
    assert_eq!(table.failures(7), 0, "the outage starts a new count");
    assert_eq!(
        table.record_failure(7, three, 3 * SECOND),
        Recorded::StillOut { until: 13 * SECOND },
        "a failure during the outage extends it"
    );
}

#[test]
fn a_success_between_failures_starts_the_count_again() {
    let mut table = HealthTable::default();
    let three = rule(10 * SECOND, 3);
    table.record_failure(7, three, 0);
    table.record_failure(7, three, 0);
    assert_eq!(table.failures(7), 2);
    table.record_success(7, three.period, 0);
    assert_eq!(table.failures(7), 0);
    assert!(table.is_empty(), "nothing left to remember: {table:?}");
    assert_eq!(table.record_failure(7, three, 0), Recorded::Counted(1));
    assert_eq!(table.record_failure(7, three, 0), Recorded::Counted(2));
    assert!(matches!(
        table.record_failure(7, three, 0),
        Recorded::TakenOut { .. }
    ));
}

#[test]
fn a_success_during_an_outage_does_not_end_it() {
    let mut table = HealthTable::default();
    let until = mark(&mut table, 7, 10 * SECOND, 0);
    table.record_success(7, 10 * SECOND, SECOND);
    assert_eq!(table.unhealthy_until(7, SECOND), Some(until));
}

#[test]
fn failures_more_than_a_period_apart_do_not_add_up_and_are_forgotten() {
    let mut table = HealthTable::default();
    let three = rule(10 * SECOND, 3);
    table.record_failure(7, three, 0);
    table.record_failure(7, three, 5 * SECOND);
    assert_eq!(
        table.record_failure(7, three, 15 * SECOND),
        Recorded::Counted(1),
        "the last failure was a period ago"
    );
    table.record_failure(8, three, 30 * SECOND);
    assert_eq!(table.len(), 1, "worker 7's count is forgotten: {table:?}");
}

#[test]
fn counts_from_every_thread_add_up_through_the_shared_encoding() {
    let three = rule(10 * SECOND, 3);
    let mut first_thread = HealthTable::default();
    first_thread.record_failure(7, three, 0);
    first_thread.record_failure(7, three, 0);
    let mut second_thread = HealthTable::decode(&first_thread.encode());
    assert_eq!(second_thread.failures(7), 2);
    assert!(matches!(
        second_thread.record_failure(7, three, SECOND),
        Recorded::TakenOut { .. }
    ));
}

#[test]
fn a_marked_worker_is_unhealthy_until_its_time_then_returns() {
    let mut table = HealthTable::default();
    mark(&mut table, 7, 10 * SECOND, 0);
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
    assert_eq!(mark(&mut table, 1, 5 * SECOND, 0), 5 * SECOND);
    assert_eq!(
        mark(&mut table, 1, 5 * SECOND, 2 * SECOND),
        7 * SECOND,
        "a burst of failures is one outage"
    );
    assert_eq!(mark(&mut table, 1, 5 * SECOND, 3 * SECOND), 8 * SECOND);
    assert_eq!(
        mark(&mut table, 1, 5 * SECOND, 9 * SECOND),
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
        let until = mark(&mut table, 3, SECOND, now);
        outages.push((until - now) / SECOND);
        now = until;
    }
    assert_eq!(outages, [1, 2, 4, 8, 8, 8]);
    assert_eq!(table.len(), 1);
}

#[test]
fn a_worker_taken_out_again_after_its_count_is_refilled_soon_after_returning_is_out_longer() {
    let mut table = HealthTable::default();
    let three = rule(SECOND, 3);
    for _ in 0..3 {
        table.record_failure(3, three, 0);
    }
    assert_eq!(table.unhealthy_until(3, 0), Some(SECOND));
    table.record_failure(3, three, SECOND);
    table.record_failure(3, three, SECOND);
    assert_eq!(
        table.record_failure(3, three, SECOND),
        Recorded::TakenOut { until: 3 * SECOND },
        "the second outage in a row: two periods"
    );
}

#[test]
fn a_worker_that_stayed_up_starts_again_from_one_period_and_old_outages_are_forgotten() {
    let mut table = HealthTable::default();
    mark(&mut table, 1, 5 * SECOND, 0);
    mark(&mut table, 1, 5 * SECOND, 5 * SECOND);
    assert_eq!(
        table.unhealthy_until(1, 5 * SECOND),
        Some(15 * SECOND),
        "second outage: 10 s"
    );
    mark(&mut table, 2, 5 * SECOND, 0);
    assert_eq!(
        mark(&mut table, 1, 5 * SECOND, 25 * SECOND),
        30 * SECOND,
        "up for as long as it was out"
    );
    assert_eq!(table.len(), 1, "worker 2's outage is forgotten: {table:?}");
}

#[test]
fn the_encoding_round_trips_and_tolerates_garbage() {
    let mut table = HealthTable::default();
    mark(&mut table, u64::MAX, 3, 0);
    mark(&mut table, 42, u64::MAX, 0);
    mark(&mut table, 42, u64::MAX, u64::MAX);
    table.record_failure(9, rule(u64::MAX, 5), 1);
    assert_eq!(HealthTable::decode(&table.encode()), table);
    assert_eq!(HealthTable::decode(&table.encode()).failures(9), 1);
    let mut bytes = table.encode();
    bytes.extend_from_slice(&[1, 2, 3]);
    assert_eq!(HealthTable::decode(&bytes), table);
    assert!(HealthTable::decode(&[9; 39]).is_empty());
}

#[test]
fn a_corrupt_doubling_count_is_capped() {
    let bytes = [7u64, 5 * SECOND, u64::MAX, 0, 0]
        .map(u64::to_le_bytes)
        .concat();
    let mut table = HealthTable::decode(&bytes);
    assert_eq!(
        mark(&mut table, 7, SECOND, 6 * SECOND),
        14 * SECOND,
        "at most 8 periods"
    );
}

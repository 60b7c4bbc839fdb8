use super::*;
use crate::policy::registry::Role;

const SECOND: u64 = 1_000_000_000;

fn worker(id: WorkerId, draining: bool) -> Worker {
    Worker { id, role: Role::Decode, address: ([127, 0, 0, 1], 9000).into(), dp_size: 1, draining }
}

#[test]
fn a_marked_worker_is_unhealthy_until_its_time_then_returns() {
    let mut table = HealthTable::default();
    table.mark(7, 10 * SECOND, 0);
    let at = |now| Observed { table: &table, now }.unavailability(&worker(7, false));
    assert_eq!(at(0), Some(Unavailability::Unhealthy { retry_after_secs: 10 }));
    assert_eq!(at(9 * SECOND + 1), Some(Unavailability::Unhealthy { retry_after_secs: 1 }));
    assert_eq!(at(10 * SECOND), None);
    assert_eq!(Observed { table: &table, now: 0 }.unavailability(&worker(8, false)), None);
}

#[test]
fn draining_wins_over_health() {
    let table = HealthTable::default();
    assert_eq!(Observed { table: &table, now: 0 }.unavailability(&worker(7, true)), Some(Unavailability::Draining));
}

#[test]
fn marking_again_extends_and_expired_entries_are_dropped() {
    let mut table = HealthTable::default();
    table.mark(1, 5 * SECOND, 0);
    table.mark(2, 5 * SECOND, 0);
    table.mark(1, 20 * SECOND, 6 * SECOND);
    assert_eq!(table.len(), 1, "2 expired, 1 was replaced: {table:?}");
    assert_eq!(table.unhealthy_until(1, 6 * SECOND), Some(20 * SECOND));
}

#[test]
fn the_encoding_round_trips_and_tolerates_garbage() {
    let mut table = HealthTable::default();
    table.mark(u64::MAX, 3, 0);
    table.mark(42, u64::MAX, 0);
    assert_eq!(HealthTable::decode(&table.encode()), table);
    let mut bytes = table.encode();
    bytes.extend_from_slice(&[1, 2, 3]);
    assert_eq!(HealthTable::decode(&bytes), table);
    assert!(HealthTable::decode(&[9; 7]).is_empty());
}

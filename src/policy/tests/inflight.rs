#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;
use crate::policy::testing::test;

const SECOND: u64 = 1_000_000_000;

#[test]
fn the_limit_counts_every_live_vm() {
    let mut table = InFlightTable::default();
    let (a, b) = (table.join(SECOND), table.join(SECOND));
    assert_ne!(a, b);
    table.publish(a, 3, 2 * SECOND);
    table.publish(b, 4, 2 * SECOND);
    assert_eq!(table.others(a, 2 * SECOND), 4);
    assert_eq!(table.others(b, 2 * SECOND), 3);
    assert!(admits(8, table.others(a, 2 * SECOND), 3));
    assert!(!admits(7, table.others(a, 2 * SECOND), 3));
    assert!(
        !admits(0, 0, 0),
        "a limit of 0 would admit nothing: the filter reads 0 as off"
    );
}

#[test]
fn a_vm_that_stopped_publishing_is_forgotten_with_its_requests() {
    let mut table = InFlightTable::default();
    let (dead, alive) = (table.join(0), table.join(0));
    table.publish(dead, 100, SECOND);
    table.publish(alive, 1, SECOND);
    assert_eq!(table.others(alive, SECOND + STALE_NANOS), 100);
    assert_eq!(table.others(alive, SECOND + STALE_NANOS + 1), 0);
    table.publish(alive, 1, SECOND + STALE_NANOS + 1);
    assert_eq!(InFlightTable::decode(&table.encode()).shares.len(), 1);
    assert_eq!(
        table.join(10 * SECOND),
        alive + 1,
        "no live VM's name is reused"
    );
}

#[test]
fn the_table_reads_back_what_it_wrote_and_nothing_else() {
    let mut table = InFlightTable::default();
    let vm = table.join(7);
    table.publish(vm, u64::MAX, 9);
    assert_eq!(InFlightTable::decode(&table.encode()), table);
    assert_eq!(InFlightTable::decode(b"short"), InFlightTable::default());
}

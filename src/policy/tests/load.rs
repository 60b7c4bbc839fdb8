use super::*;
use crate::policy::testing::test;

#[test]
fn counts_survive_encoding_and_a_worker_without_requests_has_no_entry() {
    let mut table = LoadTable::default();
    table.add(101, 1);
    table.add(202, 1);
    table.add(202, 1);
    table.add(101, -1);
    let decoded = LoadTable::decode(&table.encode());
    assert_eq!(decoded, table);
    assert_eq!((decoded.outstanding(101), decoded.outstanding(202)), (0, 2));
    assert_eq!(decoded.encode().len(), 16, "only worker 202 is listed");
}

#[test]
fn a_count_never_goes_below_zero() {
    let mut table = LoadTable::default();
    table.add(7, -1);
    assert_eq!(table.outstanding(7), 0);
    table.add(7, 2);
    table.add(7, -5);
    assert_eq!(table.outstanding(7), 0);
    assert_eq!(table, LoadTable::default());
}

#[test]
fn torn_or_foreign_bytes_read_as_whole_entries_only() {
    let mut bytes = LoadTable::default().encode();
    bytes.extend_from_slice(&5u64.to_le_bytes());
    bytes.extend_from_slice(&3u64.to_le_bytes());
    bytes.extend_from_slice(&[1, 2, 3]);
    let table = LoadTable::decode(&bytes);
    assert_eq!(table.outstanding(5), 3);
    assert_eq!(LoadTable::decode(&[9; 15]), LoadTable::default());
}

#[test]
fn entries_written_in_any_order_read_alike() {
    let bytes: Vec<u8> = [(9u64, 1u64), (3, 2), (9, 4), (5, 0)]
        .iter()
        .flat_map(|(id, count)| [id.to_le_bytes(), count.to_le_bytes()])
        .flatten()
        .collect();
    let table = LoadTable::decode(&bytes);
    assert_eq!(
        (
            table.outstanding(3),
            table.outstanding(5),
            table.outstanding(9)
        ),
        (2, 0, 1),
        "a worker listed twice (never written so) keeps its smaller count; one with no requests has none"
    );
    let mut written = LoadTable::default();
    written.add(9, 1);
    written.add(3, 2);
    assert_eq!(table, written);
}

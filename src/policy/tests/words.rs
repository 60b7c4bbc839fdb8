use super::*;
use crate::policy::testing::test;

#[test]
fn entries_survive_encoding_and_a_torn_tail_is_ignored() {
    let entries = [[1, u64::MAX, 3], [4, 5, 6]];
    let mut bytes = encode(entries.into_iter());
    assert_eq!(bytes.len(), 48);
    bytes.extend_from_slice(&[7; 23]);
    assert_eq!(decode::<3>(&bytes).collect::<Vec<_>>(), entries);
    assert_eq!(decode::<2>(&[0; 15]).count(), 0);
}

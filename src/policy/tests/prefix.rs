#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;
use crate::policy::testing::test;

/// `len` bytes of text that differ from block to block.
fn text(len: usize, salt: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 32);
    let mut i = 0;
    while out.len() < len {
        out.extend_from_slice(format!("{salt}-{i} ").as_bytes());
        i += 1;
    }
    out.truncate(len);
    out
}

#[test]
fn only_whole_blocks_of_the_window_are_hashed() {
    let prompt = text(10 * BLOCK_BYTES + 17, "a");
    let prefix = PromptPrefix::new(&prompt, 4 * BLOCK_BYTES);
    assert_eq!(prefix.depths(BLOCK_BYTES).len(), 4);
    assert_eq!(prefix.bytes, prompt.len());
    let short = PromptPrefix::new(&prompt[..3 * BLOCK_BYTES - 1], 4 * BLOCK_BYTES);
    assert_eq!(
        short.depths(BLOCK_BYTES).len(),
        2,
        "the partial block is not hashed"
    );
    let huge = PromptPrefix::new(&text(4 * MAX_WINDOW_BYTES, "b"), usize::MAX);
    assert_eq!(
        huge.depths(BLOCK_BYTES).len(),
        MAX_WINDOW_BYTES / BLOCK_BYTES,
        "the window is capped"
    );
}

#[test]
fn a_depth_hash_stands_for_every_byte_before_it() {
    let base = text(8 * BLOCK_BYTES, "shared");
    let mut changed_late = base.clone();
    changed_late[6 * BLOCK_BYTES + 3] ^= 1;
    let mut changed_early = base.clone();
    changed_early[5] ^= 1;
    let window = 8 * BLOCK_BYTES;
    let (a, late, early) = (
        PromptPrefix::new(&base, window),
        PromptPrefix::new(&changed_late, window),
        PromptPrefix::new(&changed_early, window),
    );
    let (a, late, early) = (
        a.depths(BLOCK_BYTES),
        late.depths(BLOCK_BYTES),
        early.depths(BLOCK_BYTES),
    );
    assert_eq!(a[..6], late[..6], "the same first 6 blocks");
    assert!(a[6..].iter().zip(&late[6..]).all(|(x, y)| x != y));
    assert!(
        a.iter().zip(early).all(|(x, y)| x != y),
        "a change in block 0 changes all"
    );
}

#[test]
fn a_longer_prompt_keeps_the_hashes_of_its_beginning() {
    let long = text(12 * BLOCK_BYTES, "turns");
    let window = 16 * BLOCK_BYTES;
    let first = PromptPrefix::new(&long[..5 * BLOCK_BYTES + 9], window);
    let next = PromptPrefix::new(&long, window);
    assert_eq!(
        first.depths(BLOCK_BYTES),
        &next.depths(BLOCK_BYTES)[..5],
        "the next turn extends the chain"
    );
}

#[test]
fn depths_start_at_the_minimum_length() {
    let prompt = text(10 * BLOCK_BYTES, "m");
    let prefix = PromptPrefix::new(&prompt, 8 * BLOCK_BYTES);
    let all = prefix.depths(BLOCK_BYTES);
    assert_eq!(prefix.depths(4 * BLOCK_BYTES), &all[3..]);
    assert_eq!(
        prefix.depths(4 * BLOCK_BYTES - 10),
        &all[3..],
        "rounded up to a block"
    );
    assert!(
        PromptPrefix::new(&prompt[..3 * BLOCK_BYTES], 8 * BLOCK_BYTES)
            .depths(4 * BLOCK_BYTES)
            .is_empty(),
        "a prompt below the minimum has none"
    );
    assert!(
        PromptPrefix::unhashed(99_999)
            .depths(BLOCK_BYTES)
            .is_empty()
    );
}

#[test]
fn memory_keys_double_in_depth() {
    let prompt = text(64 * BLOCK_BYTES, "k");
    let window = MAX_WINDOW_BYTES;
    let full = PromptPrefix::new(&prompt, window);
    let all = full.depths(BLOCK_BYTES).to_vec();
    let keys = |len: usize| PromptPrefix::new(&prompt[..len], window).memory_keys(4 * BLOCK_BYTES);
    assert_eq!(keys(3 * BLOCK_BYTES), (None, None));
    assert_eq!(keys(4 * BLOCK_BYTES), (Some(all[3]), None));
    assert_eq!(keys(7 * BLOCK_BYTES + 5), (Some(all[3]), None));
    assert_eq!(keys(8 * BLOCK_BYTES), (Some(all[7]), Some(all[3])));
    assert_eq!(keys(40 * BLOCK_BYTES), (Some(all[31]), Some(all[15])));
    assert_eq!(
        full.memory_keys(4 * BLOCK_BYTES),
        (Some(all[63]), Some(all[31])),
        "the window's end is a key"
    );
}

#[test]
fn the_tail_hash_ignores_the_closing_byte() {
    let first = br#"[{"role":"user","content":"hello"}]"#.repeat(20);
    let mut next = first[..first.len() - 1].to_vec();
    next.extend_from_slice(br#",{"role":"assistant","content":"hi"}]"#);
    assert_eq!(
        tail_hash(&next, first.len()),
        tail_hash(&first, first.len())
    );
    assert!(tail_hash(&first, first.len()).is_some());
    assert_eq!(tail_hash(&first, BLOCK_BYTES), None, "too short");
    assert_eq!(tail_hash(&first, first.len() + 2), None, "past the end");
    let mut edited = next.clone();
    edited[first.len() - 10] ^= 1;
    assert_ne!(
        tail_hash(&edited, first.len()),
        tail_hash(&first, first.len())
    );
}

#[test]
fn hashes_are_fixed_values() {
    // Replicas on every platform must agree: the first block's hash is pinned.
    let prompt = [b'x'; BLOCK_BYTES];
    let prefix = PromptPrefix::new(&prompt, BLOCK_BYTES);
    assert_eq!(
        prefix.depths(BLOCK_BYTES),
        &[xxhash_rust::xxh3::xxh3_64_with_seed(&prompt, SEED)]
    );
}

#[test]
fn one_prompt_for_two_models_hashes_apart_and_alike_for_one() {
    let prompt = vec![b'x'; 4 * BLOCK_BYTES];
    let base = PromptPrefix::of_model(&prompt, 1024, Some("base"));
    let adapter = PromptPrefix::of_model(&prompt, 1024, Some("base-lora"));
    assert_eq!(base.depths(0).len(), 4);
    assert!(
        base.depths(0)
            .iter()
            .zip(adapter.depths(0))
            .all(|(a, b)| a != b)
    );
    assert_eq!(base, PromptPrefix::of_model(&prompt, 1024, Some("base")));
    assert_eq!(
        PromptPrefix::new(&prompt, 1024),
        PromptPrefix::of_model(&prompt, 1024, None)
    );
}

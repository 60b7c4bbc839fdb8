#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;
use crate::policy::prefix::BLOCK_BYTES;
use crate::policy::testing::test;

const MIN: usize = 4 * BLOCK_BYTES;
const WINDOW: usize = 16 * BLOCK_BYTES;
const SECOND: u64 = 1_000_000_000;

/// A chat prompt of `turns` user/assistant exchanges, as a client resends it.
fn conversation(turns: usize) -> Vec<u8> {
    let messages: Vec<String> = (0..turns)
        .map(|i| {
            format!(
                r#"{{"role":"user","content":"question {i} {}"}},{{"role":"assistant","content":"answer {i}"}}"#,
                "words ".repeat(40)
            )
        })
        .collect();
    format!("[{}]", messages.join(",")).into_bytes()
}

fn remembered(prompt: &[u8], at: u64) -> Turn {
    let prefix = PromptPrefix::new(prompt, WINDOW);
    Turn::of(&prefix, prompt, MIN, (Some(101), 201), (at, 77)).unwrap()
}

fn key(prompt: &[u8]) -> (Option<u64>, Option<u64>) {
    PromptPrefix::new(prompt, WINDOW).memory_keys(MIN)
}

#[test]
fn the_next_turn_continues_the_last_one() {
    let last = conversation(5);
    let turn = remembered(&last, 10 * SECOND);
    let next = conversation(6);
    let (deepest, _) = key(&next);
    assert_eq!(
        deepest,
        Some(turn.key),
        "the same key while the prompt has not doubled"
    );
    let found = turn
        .continued_by(turn.key, &next, 11 * SECOND, 30 * SECOND)
        .unwrap();
    assert_eq!(
        found,
        LastTurn {
            prefill: Some(101),
            decode: 201,
            added_bytes: (next.len() - last.len()) as u64,
            draw_key: 77,
        }
    );
}

#[test]
fn a_prompt_that_doubles_finds_its_last_turn_under_the_previous_key() {
    let last = conversation(6);
    let next = conversation(12);
    let turn = remembered(&last, 0);
    let (deepest, previous) = key(&next);
    assert_ne!(deepest, Some(turn.key));
    assert_eq!(previous, Some(turn.key));
    assert!(
        turn.continued_by(previous.unwrap(), &next, 1, SECOND)
            .is_some()
    );
}

#[test]
fn anything_else_is_not_a_continuation() {
    let last = conversation(5);
    let turn = remembered(&last, 10 * SECOND);
    let next = conversation(6);
    let memory = 30 * SECOND;
    assert_eq!(
        turn.continued_by(turn.key ^ 1, &next, 11 * SECOND, memory),
        None,
        "another key"
    );
    assert_eq!(
        turn.continued_by(turn.key, &last, 11 * SECOND, memory),
        None,
        "not longer"
    );
    assert_eq!(
        turn.continued_by(turn.key, &next, 40 * SECOND, memory),
        None,
        "remembered too long ago"
    );
    assert_eq!(
        turn.continued_by(turn.key, &next, 9 * SECOND, memory),
        None,
        "from the future"
    );
    let mut edited = next.clone();
    edited[last.len() - 20] ^= 1;
    assert_eq!(
        turn.continued_by(turn.key, &edited, 11 * SECOND, memory),
        None,
        "the history was edited where the last turn ended"
    );
}

#[test]
fn a_short_prompt_is_not_remembered() {
    let prompt = vec![b'x'; MIN - 1];
    let prefix = PromptPrefix::new(&prompt, WINDOW);
    assert_eq!(Turn::of(&prefix, &prompt, MIN, (None, 201), (0, 0)), None);
}

#[test]
fn turns_round_trip_and_garbage_is_none() {
    let turn = Turn {
        key: u64::MAX,
        prompt_bytes: 12_345,
        tail: 7,
        prefill: Some(u64::MAX),
        decode: 0,
        at: 99,
        draw_key: u64::MAX - 1,
    };
    assert_eq!(Turn::decode(&turn.encode()), Some(turn));
    let without = Turn {
        prefill: None,
        ..turn
    };
    assert_eq!(Turn::decode(&without.encode()), Some(without));
    assert_eq!(Turn::decode(&turn.encode()[1..]), None);
    assert_eq!(Turn::decode(b""), None);
    assert!(Turn::slot(u64::MAX) < SLOTS);
}

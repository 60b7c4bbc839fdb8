#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;
use crate::policy::registry::Role;
use crate::policy::testing::test;

fn workers(n: u64) -> Vec<Worker> {
    (0..n)
        .map(|i| Worker {
            id: 100 + i,
            role: Role::Decode,
            address: format!("127.0.0.1:{}", 9000 + i).parse().unwrap(),
            dp_size: 1,
            draining: false,
        })
        .collect()
}

fn ids(ranked: &[&Worker]) -> Vec<u64> {
    ranked.iter().map(|w| w.id).collect()
}

#[test]
fn turns_rotate_over_the_pool() {
    let pool = workers(3);
    let firsts: Vec<u64> = (0..6)
        .map(|t| rank_candidates(pool.iter().collect(), Choice::Turn(t))[0].id)
        .collect();
    assert_eq!(firsts, vec![100, 101, 102, 100, 101, 102]);
    assert_eq!(
        ids(&rank_candidates(pool.iter().collect(), Choice::Turn(1))),
        vec![101, 102, 100]
    );
    assert!(rank_candidates(Vec::new(), Choice::Turn(5)).is_empty());
}

#[test]
fn a_session_always_gets_the_same_order_whatever_the_pool_order() {
    let pool = workers(5);
    let forward = ids(&rank_candidates(
        pool.iter().collect(),
        Choice::Session(b"chat-42"),
    ));
    let backward = ids(&rank_candidates(
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
        let before = rank_candidates(pool.iter().collect(), Choice::Session(key.as_bytes()))[0].id;
        let smaller: Vec<&Worker> = pool.iter().filter(|w| w.id != removed).collect();
        let after = rank_candidates(smaller, Choice::Session(key.as_bytes()))[0].id;
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
        let first = rank_candidates(pool.iter().collect(), Choice::Session(key.as_bytes()))[0].id;
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
    let order = |turn| {
        ids(&rank_candidates(
            pool.iter().collect(),
            Choice::LeastLoaded {
                turn,
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
        ids(&rank_candidates(
            one.iter().collect(),
            Choice::LeastLoaded {
                turn: 7,
                outstanding: &loads
            }
        )),
        vec![100]
    );
}

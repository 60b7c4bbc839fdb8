use std::collections::HashSet;

use super::*;
use crate::policy::hop::Hop;
use crate::policy::registry::Role;
use crate::policy::resolve::Target;
use crate::policy::testing::test;

fn worker(id: u64) -> Worker {
    Worker {
        id,
        role: Role::Decode,
        address: SocketAddr::from(([10, 0, 0, 1], u16::try_from(id).unwrap_or(0))),
        dp_size: 1,
        draining: false,
        models: None,
        unlisted: false,
    }
}

fn hop(first: u64, alternates: &[u64], pinned: bool) -> TokenHop {
    TokenHop {
        target: Target {
            worker: worker(first),
            rank: None,
            pinned,
        },
        hop: Hop::Decode,
        alternates: alternates.iter().map(|id| worker(*id)).collect(),
        panic: false,
        placement: None,
    }
}

#[test]
fn envoy_retries_on_pool_members_only_and_never_a_pin() {
    let members = HashSet::from([worker(1).address, worker(3).address]);
    assert_eq!(
        pool_candidates(&hop(1, &[2, 3], false), &members),
        Some(vec![worker(1).address, worker(3).address]),
        "2 is no member: Envoy never dials it"
    );
    assert_eq!(pool_candidates(&hop(2, &[1, 3], false), &members), None);
    assert_eq!(pool_candidates(&hop(1, &[3], true), &members), None);
}

#[test]
fn the_filter_retries_what_envoy_cannot() {
    assert!(filter_retries(&hop(2, &[1], false), false));
    assert!(!filter_retries(&hop(2, &[1], false), true), "Envoy does");
    assert!(
        !filter_retries(&hop(2, &[1], true), false),
        "a pin stays exact"
    );
    assert!(!filter_retries(&hop(2, &[], false), false), "nobody left");
}

#[test]
fn the_served_worker_is_where_envoys_last_attempt_went() {
    let decode = hop(1, &[2, 3], false);
    let third = worker(3).address.to_string();
    assert_eq!(served_worker(&decode, true, Some(&third)), (3, vec![1, 2]));
    assert_eq!(
        served_worker(&decode, true, Some("10.9.9.9:1")),
        (1, vec![])
    );
    assert_eq!(
        served_worker(&decode, false, Some(&third)),
        (1, vec![]),
        "not pooled"
    );
    assert_eq!(served_worker(&decode, true, None), (1, vec![]));
}

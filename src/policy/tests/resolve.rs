#![allow(clippy::unwrap_used, clippy::panic)]

use super::*;
use crate::policy::availability::{RegistryOnly, Unavailability, pool_in_panic};
use crate::policy::registry::Role;
use crate::policy::select::Placement;
use crate::policy::testing::test;
use crate::policy::turns::LastTurn;

/// Prefill 101 (dp 1), 102 (dp 2); decode 201 (dp 1), 202 (dp 2), 203 (draining).
const DISAGGREGATED: &str = r#"{"workers": [
    {"id": 101, "role": "prefill", "address": "127.0.0.1:8101"},
    {"id": 102, "role": "prefill", "address": "127.0.0.1:8102", "dp_size": 2},
    {"id": 201, "role": "decode", "address": "127.0.0.1:8201"},
    {"id": 202, "role": "decode", "address": "127.0.0.1:8202", "dp_size": 2},
    {"id": 203, "role": "decode", "address": "127.0.0.1:8203", "draining": true}
]}"#;

const AGGREGATED: &str = r#"{"workers": [
    {"id": 301, "role": "aggregated", "address": "127.0.0.1:8301", "dp_size": 2},
    {"id": 302, "role": "aggregated", "address": "127.0.0.1:8302"}
]}"#;

fn registry(json: &str) -> Registry {
    Registry::from_json(json.as_bytes()).unwrap()
}

fn resolve_with(
    json: &str,
    settings: &Settings,
    choice: Choice<'_>,
    pins: &Pins,
) -> Result<Route, RouteError> {
    let registry = registry(json);
    Resolver {
        registry: &registry,
        settings,
        availability: &RegistryOnly,
        choice,
        prompt: PromptFacts::default(),
        picked: &picker::NOTHING,
        model: None,
        rank_loads: None,
    }
    .resolve(pins)
}

fn resolve(json: &str, pins: Pins) -> Result<Route, RouteError> {
    resolve_with(json, &Settings::default(), Choice::RoundRobin(0), &pins)
}

fn pinned(id: WorkerId, rank: Option<u32>) -> (WorkerId, Option<u32>, bool) {
    (id, rank, true)
}

fn summary(target: &Target) -> (WorkerId, Option<u32>, bool) {
    (target.worker.id, target.rank, target.pinned)
}

fn prefill_ids(route: &Route) -> Vec<WorkerId> {
    match &route.prefill {
        PrefillPlan::Candidates(targets) => targets.iter().map(|t| t.worker.id).collect(),
        other => panic!("expected unpinned prefill candidates, got {other:?}"),
    }
}

fn decode_pin(id: WorkerId) -> Pins {
    Pins {
        backend_instance_id: Some(id),
        decode_worker_id: Some(id),
        ..Pins::default()
    }
}

#[test]
fn the_original_bug_a_decode_pin_alone_leaves_prefill_free() {
    let route = resolve(DISAGGREGATED, decode_pin(201)).unwrap();
    assert_eq!(summary(&route.decode.target), pinned(201, Some(0)));
    assert_eq!(route.decode.hop, Hop::Decode);
    let candidates = prefill_ids(&route);
    assert!(!candidates.is_empty());
    assert!(candidates.iter().all(|id| [101, 102].contains(id)));
}

#[test]
fn the_generic_pin_and_decode_rank_never_reach_the_prefill_hop() {
    let pins = Pins {
        backend_instance_id: Some(202),
        dp_rank: Some(1),
        ..Pins::default()
    };
    let route = resolve(DISAGGREGATED, pins).unwrap();
    assert_eq!(summary(&route.decode.target), pinned(202, Some(1)));
    match route.prefill {
        PrefillPlan::Candidates(targets) => {
            assert!(targets.iter().all(|t| t.rank.is_none() && !t.pinned))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_prefill_pin_alone_leaves_decode_free() {
    let pins = Pins {
        prefill_worker_id: Some(101),
        ..Pins::default()
    };
    let route = resolve(DISAGGREGATED, pins).unwrap();
    assert_eq!(
        route.prefill,
        PrefillPlan::Pinned(Target {
            worker: registry(DISAGGREGATED).get(101).unwrap().clone(),
            rank: Some(0),
            pinned: true,
        })
    );
    assert!(!route.decode.target.pinned);
    assert_ne!(
        route.decode.target.worker.id, 203,
        "a draining worker is never chosen"
    );
}

#[test]
fn both_pins_with_both_ranks() {
    let pins = Pins {
        prefill_worker_id: Some(102),
        prefill_dp_rank: Some(1),
        decode_worker_id: Some(202),
        dp_rank: Some(0),
        ..Pins::default()
    };
    let route = resolve(DISAGGREGATED, pins).unwrap();
    let PrefillPlan::Pinned(prefill) = &route.prefill else {
        panic!("{:?}", route.prefill)
    };
    assert_eq!(summary(prefill), pinned(102, Some(1)));
    assert_eq!(summary(&route.decode.target), pinned(202, Some(0)));
}

#[test]
fn multi_rank_workers_pinned_without_a_rank_get_no_rank_and_single_rank_ones_get_zero() {
    let pins = Pins {
        prefill_worker_id: Some(102),
        decode_worker_id: Some(202),
        ..Pins::default()
    };
    let route = resolve(DISAGGREGATED, pins).unwrap();
    let PrefillPlan::Pinned(prefill) = &route.prefill else {
        panic!()
    };
    assert_eq!(summary(prefill), pinned(102, None));
    assert_eq!(summary(&route.decode.target), pinned(202, None));
    let pins = Pins {
        prefill_worker_id: Some(101),
        ..decode_pin(201)
    };
    let route = resolve(DISAGGREGATED, pins).unwrap();
    let PrefillPlan::Pinned(prefill) = &route.prefill else {
        panic!()
    };
    assert_eq!(summary(prefill), pinned(101, Some(0)));
    assert_eq!(summary(&route.decode.target), pinned(201, Some(0)));
}

#[test]
fn decode_worker_id_beats_backend_instance_id() {
    let pins = Pins {
        backend_instance_id: Some(201),
        decode_worker_id: Some(202),
        ..Pins::default()
    };
    assert_eq!(
        resolve(DISAGGREGATED, pins)
            .unwrap()
            .decode
            .target
            .worker
            .id,
        202
    );
    let pins = Pins {
        backend_instance_id: Some(201),
        ..Pins::default()
    };
    assert_eq!(
        resolve(DISAGGREGATED, pins)
            .unwrap()
            .decode
            .target
            .worker
            .id,
        201
    );
}

#[test]
fn a_rank_without_a_worker_for_its_hop_is_refused() {
    let pins = Pins {
        dp_rank: Some(0),
        ..Pins::default()
    };
    assert_eq!(
        resolve(DISAGGREGATED, pins),
        Err(RouteError::RankWithoutWorker { hop: Hop::Decode })
    );
    let pins = Pins {
        prefill_dp_rank: Some(0),
        ..decode_pin(201)
    };
    assert_eq!(
        resolve(DISAGGREGATED, pins),
        Err(RouteError::RankWithoutWorker { hop: Hop::Prefill })
    );
    // A decode pin does not lend itself to the prefill rank.
    let pins = Pins {
        prefill_dp_rank: Some(0),
        prefill_worker_id: None,
        ..decode_pin(202)
    };
    assert!(matches!(
        resolve(DISAGGREGATED, pins),
        Err(RouteError::RankWithoutWorker { hop: Hop::Prefill })
    ));
}

#[test]
fn unknown_workers_are_refused_per_hop() {
    assert_eq!(
        resolve(DISAGGREGATED, decode_pin(999)),
        Err(RouteError::UnknownWorker {
            hop: Hop::Decode,
            worker: 999
        })
    );
    let pins = Pins {
        prefill_worker_id: Some(999),
        ..Pins::default()
    };
    assert_eq!(
        resolve(DISAGGREGATED, pins),
        Err(RouteError::UnknownWorker {
            hop: Hop::Prefill,
            worker: 999
        })
    );
}

#[test]
fn with_no_worker_at_all_a_pin_is_503_not_the_clients_fault() {
    let registry = Registry::empty();
    let settings = Settings::default();
    let resolver = Resolver {
        registry: &registry,
        settings: &settings,
        availability: &RegistryOnly,
        choice: Choice::RoundRobin(0),
        prompt: PromptFacts::default(),
        picked: &picker::NOTHING,
        model: None,
        rank_loads: None,
    };
    assert_eq!(
        resolver.resolve(&decode_pin(201)),
        Err(RouteError::NoWorkerAvailable {
            hop: Hop::Decode,
            role: Role::Decode
        })
    );
    let pins = Pins {
        prefill_worker_id: Some(101),
        ..Pins::default()
    };
    assert!(matches!(
        resolver.resolve(&pins),
        Err(RouteError::NoWorkerAvailable {
            hop: Hop::Prefill,
            ..
        })
    ));
}

#[test]
fn a_worker_of_the_other_pool_is_the_wrong_role() {
    assert_eq!(
        resolve(DISAGGREGATED, decode_pin(101)),
        Err(RouteError::WrongRole {
            hop: Hop::Decode,
            worker: 101,
            actual: Role::Prefill,
            expected: Role::Decode
        })
    );
    let pins = Pins {
        prefill_worker_id: Some(201),
        ..Pins::default()
    };
    assert_eq!(
        resolve(DISAGGREGATED, pins),
        Err(RouteError::WrongRole {
            hop: Hop::Prefill,
            worker: 201,
            actual: Role::Decode,
            expected: Role::Prefill
        })
    );
}

#[test]
fn ranks_outside_the_workers_dp_size_are_refused() {
    let pins = Pins {
        dp_rank: Some(2),
        ..decode_pin(202)
    };
    assert_eq!(
        resolve(DISAGGREGATED, pins),
        Err(RouteError::RankOutOfRange {
            hop: Hop::Decode,
            worker: 202,
            rank: 2,
            dp_size: 2
        })
    );
    let pins = Pins {
        dp_rank: Some(1),
        ..decode_pin(201)
    };
    assert!(matches!(
        resolve(DISAGGREGATED, pins),
        Err(RouteError::RankOutOfRange { dp_size: 1, .. })
    ));
    let pins = Pins {
        prefill_worker_id: Some(102),
        prefill_dp_rank: Some(2),
        ..Pins::default()
    };
    assert!(matches!(
        resolve(DISAGGREGATED, pins),
        Err(RouteError::RankOutOfRange {
            hop: Hop::Prefill,
            worker: 102,
            ..
        })
    ));
}

#[test]
fn a_draining_pinned_worker_is_unavailable() {
    assert_eq!(
        resolve(DISAGGREGATED, decode_pin(203)),
        Err(RouteError::WorkerUnavailable {
            hop: Hop::Decode,
            worker: 203,
            why: Unavailability::Draining
        })
    );
}

#[test]
fn unhealthy_workers_are_unavailable_when_pinned_and_skipped_when_not() {
    struct Down(WorkerId);
    impl Availability for Down {
        fn unavailability(&self, worker: &Worker) -> Option<Unavailability> {
            (worker.id == self.0).then_some(Unavailability::Unhealthy {
                retry_after_secs: 3,
            })
        }
    }
    let registry = registry(DISAGGREGATED);
    let settings = Settings {
        prefill_retries: 5,
        ..Settings::default()
    };
    let resolver = |down| Resolver {
        registry: &registry,
        settings: &settings,
        availability: down,
        choice: Choice::RoundRobin(0),
        prompt: PromptFacts::default(),
        picked: &picker::NOTHING,
        model: None,
        rank_loads: None,
    };
    let down = Down(101);
    let pins = Pins {
        prefill_worker_id: Some(101),
        ..Pins::default()
    };
    assert_eq!(
        resolver(&down).resolve(&pins),
        Err(RouteError::WorkerUnavailable {
            hop: Hop::Prefill,
            worker: 101,
            why: Unavailability::Unhealthy {
                retry_after_secs: 3
            }
        })
    );
    assert_eq!(
        prefill_ids(&resolver(&down).resolve(&Pins::default()).unwrap()),
        vec![102]
    );
}

#[test]
fn unpinned_prefill_gets_the_first_plus_the_retries() {
    let settings = Settings {
        prefill_retries: 0,
        ..Settings::default()
    };
    let route = resolve_with(
        DISAGGREGATED,
        &settings,
        Choice::RoundRobin(1),
        &Pins::default(),
    )
    .unwrap();
    assert_eq!(prefill_ids(&route), vec![102]);
    let settings = Settings {
        prefill_retries: 9,
        ..Settings::default()
    };
    let route = resolve_with(
        DISAGGREGATED,
        &settings,
        Choice::RoundRobin(1),
        &Pins::default(),
    )
    .unwrap();
    assert_eq!(prefill_ids(&route), vec![102, 101]);
}

#[test]
fn no_prefill_worker_falls_back_to_one_hop_unless_disabled() {
    let only_decode =
        r#"{"workers": [{"id": 201, "role": "decode", "address": "127.0.0.1:8201"}]}"#;
    let route = resolve(only_decode, Pins::default()).unwrap();
    assert_eq!(route.prefill, PrefillPlan::Skip);
    assert_eq!(route.decode.hop, Hop::Decode);
    let settings = Settings {
        aggregated_fallback: false,
        ..Settings::default()
    };
    assert_eq!(
        resolve_with(
            only_decode,
            &settings,
            Choice::RoundRobin(0),
            &Pins::default()
        ),
        Err(RouteError::NoWorkerAvailable {
            hop: Hop::Prefill,
            role: Role::Prefill
        })
    );
    let draining_prefill = r#"{"workers": [
        {"id": 101, "role": "prefill", "address": "127.0.0.1:8101", "draining": true},
        {"id": 201, "role": "decode", "address": "127.0.0.1:8201"}]}"#;
    assert_eq!(
        resolve(draining_prefill, Pins::default()).unwrap().prefill,
        PrefillPlan::Skip
    );
}

#[test]
fn no_available_decode_worker_is_503() {
    let json = r#"{"workers": [{"id": 203, "role": "decode", "address": "127.0.0.1:8203", "draining": true}]}"#;
    assert_eq!(
        resolve(json, Pins::default()),
        Err(RouteError::NoWorkerAvailable {
            hop: Hop::Decode,
            role: Role::Decode
        })
    );
}

#[test]
fn an_aggregated_deployment_is_one_hop_pinned_by_the_generic_pins() {
    let pins = Pins {
        dp_rank: Some(1),
        ..decode_pin(301)
    };
    let route = resolve(AGGREGATED, pins).unwrap();
    assert_eq!(route.prefill, PrefillPlan::Skip);
    assert_eq!(route.decode.hop, Hop::Aggregated);
    assert_eq!(summary(&route.decode.target), pinned(301, Some(1)));
    let route = resolve(AGGREGATED, Pins::default()).unwrap();
    assert_eq!(route.prefill, PrefillPlan::Skip);
    assert!(!route.decode.target.pinned);
}

#[test]
fn prefill_pins_in_an_aggregated_deployment_cannot_be_honoured() {
    let pins = Pins {
        prefill_worker_id: Some(301),
        ..Pins::default()
    };
    assert_eq!(
        resolve(AGGREGATED, pins),
        Err(RouteError::WrongRole {
            hop: Hop::Prefill,
            worker: 301,
            actual: Role::Aggregated,
            expected: Role::Prefill
        })
    );
    let pins = Pins {
        prefill_worker_id: Some(9),
        ..Pins::default()
    };
    assert_eq!(
        resolve(AGGREGATED, pins),
        Err(RouteError::UnknownWorker {
            hop: Hop::Prefill,
            worker: 9
        })
    );
    let pins = Pins {
        prefill_dp_rank: Some(0),
        ..Pins::default()
    };
    assert_eq!(
        resolve(AGGREGATED, pins),
        Err(RouteError::RankWithoutWorker { hop: Hop::Prefill })
    );
    let pins = Pins {
        dp_rank: Some(0),
        ..Pins::default()
    };
    assert_eq!(
        resolve(AGGREGATED, pins),
        Err(RouteError::RankWithoutWorker {
            hop: Hop::Aggregated
        })
    );
}

#[test]
fn a_session_picks_the_same_workers_and_a_pin_beats_it() {
    let settings = Settings::default();
    let session = Choice::Session(b"conversation-7");
    let first = resolve_with(DISAGGREGATED, &settings, session, &Pins::default()).unwrap();
    for _ in 0..3 {
        let again = resolve_with(DISAGGREGATED, &settings, session, &Pins::default()).unwrap();
        assert_eq!(again, first);
    }
    let other = first.decode.target.worker.id ^ 201 ^ 202; // the other available decode worker
    let pinned_route = resolve_with(DISAGGREGATED, &settings, session, &decode_pin(other)).unwrap();
    assert_eq!(pinned_route.decode.target.worker.id, other);
}

#[test]
fn the_token_hop_alone_ignores_prefill_pins() {
    let registry = registry(DISAGGREGATED);
    let settings = Settings::default();
    let resolver = Resolver {
        registry: &registry,
        settings: &settings,
        availability: &RegistryOnly,
        choice: Choice::RoundRobin(0),
        prompt: PromptFacts::default(),
        picked: &picker::NOTHING,
        model: None,
        rank_loads: None,
    };
    let pins = Pins {
        prefill_worker_id: Some(999),
        ..decode_pin(202)
    };
    let token_hop = resolver.token_hop(&pins).unwrap();
    assert_eq!(
        (token_hop.target.worker.id, token_hop.hop),
        (202, Hop::Decode)
    );
    assert!(token_hop.alternates.is_empty(), "a pin has no alternates");
}

#[test]
fn an_unpinned_decode_hop_offers_its_next_best_workers_for_a_failed_connection() {
    let route = resolve(DISAGGREGATED, Pins::default()).unwrap();
    let mut offered: Vec<WorkerId> = route.decode.alternates.iter().map(|w| w.id).collect();
    offered.insert(0, route.decode.target.worker.id);
    offered.sort_unstable();
    assert_eq!(
        offered,
        vec![201, 202],
        "every available decode worker, the draining one never"
    );
    let many = format!(
        r#"{{"workers": [{}]}}"#,
        (1..=9)
            .map(|i| format!(
                r#"{{"id": {i}, "role": "decode", "address": "127.0.0.1:{}"}}"#,
                9000 + i
            ))
            .collect::<Vec<_>>()
            .join(",")
    );
    let route = resolve(&many, Pins::default()).unwrap();
    assert_eq!(route.decode.alternates.len(), DECODE_ATTEMPTS - 1);
}

/// Workers out of service after failures.
struct Down(&'static [WorkerId]);

impl Availability for Down {
    fn unavailability(&self, worker: &Worker) -> Option<Unavailability> {
        if worker.draining {
            return Some(Unavailability::Draining);
        }
        self.0
            .contains(&worker.id)
            .then_some(Unavailability::Unhealthy {
                retry_after_secs: 4,
            })
    }
}

fn resolve_down(down: &Down, threshold: u32, pins: &Pins) -> Result<Route, RouteError> {
    let registry = registry(DISAGGREGATED);
    let settings = Settings {
        panic_threshold_percent: threshold,
        prefill_retries: 5,
        ..Settings::default()
    };
    Resolver {
        registry: &registry,
        settings: &settings,
        availability: down,
        choice: Choice::RoundRobin(0),
        prompt: PromptFacts::default(),
        picked: &picker::NOTHING,
        model: None,
        rank_loads: None,
    }
    .resolve(pins)
}

fn decode_ids(route: &Route) -> Vec<WorkerId> {
    let decode = &route.decode;
    std::iter::once(decode.target.worker.id)
        .chain(decode.alternates.iter().map(|w| w.id))
        .collect()
}

#[test]
fn the_panic_rule_compares_healthy_workers_with_the_serving_ones() {
    assert!(!pool_in_panic(2, 1, 50), "half healthy is enough");
    assert!(pool_in_panic(3, 1, 50));
    assert!(pool_in_panic(1, 0, 50));
    assert!(!pool_in_panic(0, 0, 50), "nothing to fall back on");
    assert!(!pool_in_panic(4, 0, 0), "0 turns it off");
    assert!(pool_in_panic(2, 1, 100));
    assert!(!pool_in_panic(2, 2, 100));
}

#[test]
fn a_pool_in_panic_offers_its_unhealthy_workers_after_the_healthy_ones() {
    let route = resolve_down(&Down(&[201, 202]), 50, &Pins::default()).unwrap();
    assert_eq!(
        decode_ids(&route),
        vec![201, 202],
        "every serving decode worker, the draining 203 never"
    );
    assert!(route.decode.panic);
    assert!(!route.prefill_panic, "the prefill pool is healthy");

    let route = resolve_down(&Down(&[201]), 50, &Pins::default()).unwrap();
    assert_eq!(
        decode_ids(&route),
        vec![202],
        "one of two serving workers healthy: no panic (203 drains)"
    );
    assert!(!route.decode.panic);

    let route = resolve_down(&Down(&[201]), 100, &Pins::default()).unwrap();
    assert_eq!(decode_ids(&route), vec![202, 201], "healthy first");
    assert!(route.decode.panic);

    assert_eq!(
        resolve_down(&Down(&[201, 202]), 0, &Pins::default()),
        Err(RouteError::NoWorkerAvailable {
            hop: Hop::Decode,
            role: Role::Decode
        }),
        "panic mode off"
    );
}

#[test]
fn a_prefill_pool_in_panic_is_tried_before_decode_prefills_itself() {
    let route = resolve_down(&Down(&[101, 102]), 50, &Pins::default()).unwrap();
    assert_eq!(prefill_ids(&route), vec![101, 102]);
    assert!(route.prefill_panic);
    assert!(!route.decode.panic);
    let route = resolve_down(&Down(&[101, 102]), 0, &Pins::default()).unwrap();
    assert_eq!(route.prefill, PrefillPlan::Skip);
    assert!(!route.prefill_panic);
}

#[test]
fn a_pin_to_an_unhealthy_worker_is_tried_while_its_pool_is_in_panic() {
    let pins = Pins {
        prefill_worker_id: Some(101),
        ..decode_pin(201)
    };
    let route = resolve_down(&Down(&[101, 102, 201, 202]), 50, &pins).unwrap();
    assert_eq!(route.prefill, PrefillPlan::Pinned(route_target(101)));
    assert!(route.prefill_panic);
    assert_eq!(summary(&route.decode.target), pinned(201, Some(0)));
    assert!(route.decode.panic);

    assert_eq!(
        resolve_down(&Down(&[101]), 50, &pins),
        Err(RouteError::WorkerUnavailable {
            hop: Hop::Prefill,
            worker: 101,
            why: Unavailability::Unhealthy {
                retry_after_secs: 4
            }
        }),
        "half the prefill pool is healthy: the pin is refused"
    );
    assert_eq!(
        resolve_down(&Down(&[201, 202]), 50, &decode_pin(203)),
        Err(RouteError::WorkerUnavailable {
            hop: Hop::Decode,
            worker: 203,
            why: Unavailability::Draining
        }),
        "panic never brings back a draining worker"
    );
}

fn route_target(id: WorkerId) -> Target {
    Target {
        worker: registry(DISAGGREGATED).get(id).unwrap().clone(),
        rank: Some(0),
        pinned: true,
    }
}

/// Prefill 101, 102, 103; decode 201, 202: room for affinity to choose.
const WIDE: &str = r#"{"workers": [
    {"id": 101, "role": "prefill", "address": "127.0.0.1:8101"},
    {"id": 102, "role": "prefill", "address": "127.0.0.1:8102"},
    {"id": 103, "role": "prefill", "address": "127.0.0.1:8103"},
    {"id": 201, "role": "decode", "address": "127.0.0.1:8201"},
    {"id": 202, "role": "decode", "address": "127.0.0.1:8202"}
]}"#;

fn idle(_: &Worker) -> u64 {
    0
}

fn by_prefix<'a>(depths: &'a [u64], remembered: &'a [WorkerId]) -> Choice<'a> {
    Choice::Prefix(crate::policy::select::Affinity {
        depths,
        remembered,
        busy: Settings::default().busy(),
        rotation: 0,
        outstanding: &idle,
        draw_key: depths.last().copied().unwrap_or(0),
    })
}

fn resolve_prompt(
    settings: &Settings,
    choice: Choice<'_>,
    prompt: PromptFacts,
    pins: &Pins,
) -> Route {
    let registry = registry(WIDE);
    Resolver {
        registry: &registry,
        settings,
        availability: &RegistryOnly,
        choice,
        prompt,
        picked: &picker::NOTHING,
        model: None,
        rank_loads: None,
    }
    .resolve(pins)
    .unwrap()
}

fn last_turn(decode: WorkerId, added_bytes: u64) -> Option<LastTurn> {
    Some(LastTurn {
        prefill: Some(102),
        decode,
        added_bytes,
        draw_key: 0,
    })
}

#[test]
fn unpinned_hops_report_how_their_worker_was_chosen() {
    let settings = Settings::default();
    let route = resolve_prompt(
        &settings,
        by_prefix(&[5, 6], &[]),
        PromptFacts::default(),
        &Pins::default(),
    );
    assert_eq!(route.prefill_placement, Some(Placement::Affinity));
    assert_eq!(route.decode.placement, Some(Placement::Affinity));
    // 101 and 102 far busier than their share: the remembered 103 stands in for them.
    let strict = Settings {
        affinity_busy_excess: 0,
        affinity_busy_percent: 100,
        ..Settings::default()
    };
    let loads = |w: &Worker| if [101, 102].contains(&w.id) { 10 } else { 0 };
    let pool = registry(WIDE);
    let home = |hash: u64| {
        pool.pool(Role::Prefill)
            .max_by_key(|w| (crate::policy::select::prefix_weight(hash, w), w.id))
            .unwrap()
            .id
    };
    let hash = (0..).find(|h| home(*h) != 103).unwrap();
    let depths = [hash];
    let choice = Choice::Prefix(crate::policy::select::Affinity {
        depths: &depths,
        remembered: &[103],
        busy: strict.busy(),
        rotation: 0,
        outstanding: &loads,
        draw_key: hash,
    });
    let route = resolve_prompt(&strict, choice, PromptFacts::default(), &Pins::default());
    assert_eq!(prefill_ids(&route)[0], 103);
    assert_eq!(route.prefill_placement, Some(Placement::Remembered));
    let pinned = Pins {
        prefill_worker_id: Some(101),
        ..decode_pin(201)
    };
    let route = resolve_prompt(
        &settings,
        by_prefix(&[5], &[]),
        PromptFacts::default(),
        &pinned,
    );
    assert_eq!(
        (route.prefill_placement, route.decode.placement),
        (None, None)
    );
    let route = resolve_prompt(
        &settings,
        Choice::Session(b"s"),
        PromptFacts::default(),
        &Pins::default(),
    );
    assert_eq!(route.decode.placement, Some(Placement::Session));
}

#[test]
fn a_short_prompt_skips_an_unpinned_prefill_hop() {
    let settings = Settings {
        local_prefill_max_bytes: 2048,
        ..Settings::default()
    };
    let short = PromptFacts {
        bytes: 2048,
        last_turn: None,
    };
    let route = resolve_prompt(&settings, Choice::RoundRobin(0), short, &Pins::default());
    assert_eq!(route.prefill, PrefillPlan::Local(LocalPrefill::ShortPrompt));
    assert_eq!(route.prefill_placement, None);
    let longer = PromptFacts {
        bytes: 2049,
        ..short
    };
    let route = resolve_prompt(&settings, Choice::RoundRobin(0), longer, &Pins::default());
    assert!(matches!(route.prefill, PrefillPlan::Candidates(_)));
    let prefill_pin = Pins {
        prefill_worker_id: Some(103),
        ..Pins::default()
    };
    let route = resolve_prompt(&settings, Choice::RoundRobin(0), short, &prefill_pin);
    assert!(
        matches!(route.prefill, PrefillPlan::Pinned(_)),
        "a pinned prefill hop is always taken"
    );
    let off = Settings::default();
    let route = resolve_prompt(&off, Choice::RoundRobin(0), short, &Pins::default());
    assert!(
        matches!(route.prefill, PrefillPlan::Candidates(_)),
        "off by default"
    );
    let none = PromptFacts::default();
    let route = resolve_prompt(&settings, Choice::RoundRobin(0), none, &Pins::default());
    assert!(
        matches!(route.prefill, PrefillPlan::Candidates(_)),
        "no prompt, no skip"
    );
}

#[test]
fn the_next_turn_on_the_decode_worker_that_served_the_last_skips_prefill() {
    let settings = Settings {
        local_prefill_suffix_bytes: 1000,
        ..Settings::default()
    };
    let facts = |decode, added| PromptFacts {
        bytes: 50_000,
        last_turn: last_turn(decode, added),
    };
    let pinned_201 = decode_pin(201);
    let route = resolve_prompt(
        &settings,
        Choice::RoundRobin(0),
        facts(201, 1000),
        &pinned_201,
    );
    assert_eq!(route.prefill, PrefillPlan::Local(LocalPrefill::NextTurn));
    assert_eq!(route.decode.target.worker.id, 201);
    for (facts, why) in [
        (facts(201, 1001), "too much added"),
        (facts(202, 10), "another decode worker served the last turn"),
        (
            PromptFacts {
                bytes: 50_000,
                last_turn: None,
            },
            "no last turn",
        ),
    ] {
        let route = resolve_prompt(&settings, Choice::RoundRobin(0), facts, &pinned_201);
        assert!(matches!(route.prefill, PrefillPlan::Candidates(_)), "{why}");
    }
    let route = resolve_prompt(
        &settings,
        by_prefix(&[1], &[]),
        facts(0, 10),
        &Pins::default(),
    );
    let decode = route.decode.target.worker.id;
    let route = resolve_prompt(
        &settings,
        by_prefix(&[1], &[decode]),
        facts(decode, 10),
        &Pins::default(),
    );
    assert_eq!(
        (route.decode.target.worker.id, &route.prefill),
        (decode, &PrefillPlan::Local(LocalPrefill::NextTurn)),
        "the decode worker the prefix goes to served the last turn, and holds the conversation"
    );
    let off = Settings::default();
    let route = resolve_prompt(&off, Choice::RoundRobin(0), facts(201, 10), &pinned_201);
    assert!(
        matches!(route.prefill, PrefillPlan::Candidates(_)),
        "off by default"
    );
}

#[test]
fn an_aggregated_deployment_is_never_local_by_choice() {
    let settings = Settings {
        local_prefill_max_bytes: usize::MAX,
        ..Settings::default()
    };
    let registry = registry(AGGREGATED);
    let route = Resolver {
        registry: &registry,
        settings: &settings,
        availability: &RegistryOnly,
        choice: Choice::RoundRobin(0),
        prompt: PromptFacts {
            bytes: 10,
            last_turn: None,
        },
        picked: &picker::NOTHING,
        model: None,
        rank_loads: None,
    }
    .resolve(&Pins::default())
    .unwrap();
    assert_eq!(route.prefill, PrefillPlan::Skip);
}

#[test]
fn a_prompt_is_read_only_as_far_as_its_placement_needs() {
    let settings = Settings::default();
    let long = settings.prefix_min_bytes;
    let both = Pins {
        prefill_worker_id: Some(101),
        decode_worker_id: Some(201),
        ..Pins::default()
    };
    let prefill_only = Pins {
        prefill_worker_id: Some(101),
        ..Pins::default()
    };
    assert_eq!(prompt_use(&settings, &both, long), PromptUse::Unread);
    assert_eq!(
        prompt_use(&settings, &prefill_only, long),
        PromptUse::Hashed
    );
    assert_eq!(
        prompt_use(&settings, &Pins::default(), long - 1),
        PromptUse::Length
    );
    let off = Settings {
        prefix_affinity_bytes: 0,
        ..Settings::default()
    };
    assert_eq!(prompt_use(&off, &Pins::default(), long), PromptUse::Length);
}

#[path = "resolve_picker.rs"]
mod picker_mode;

/// Prefill 101 and 103 serve `a`, 102 `b`; decode 201 and 203 `a`, 202 `b` and `b-lora`;
/// decode 204 serves every model. Only 202 (and 204) can decode `b-lora`, and no prefill
/// worker has it loaded.
const TWO_MODELS: &str = r#"{"workers": [
    {"id": 101, "role": "prefill", "address": "127.0.0.1:8101", "models": ["a"]},
    {"id": 102, "role": "prefill", "address": "127.0.0.1:8102", "models": ["b"]},
    {"id": 103, "role": "prefill", "address": "127.0.0.1:8103", "models": ["a"]},
    {"id": 201, "role": "decode", "address": "127.0.0.1:8201", "models": ["a"]},
    {"id": 202, "role": "decode", "address": "127.0.0.1:8202", "models": ["b", "b-lora"]},
    {"id": 203, "role": "decode", "address": "127.0.0.1:8203", "models": ["a"]},
    {"id": 204, "role": "decode", "address": "127.0.0.1:8204"}
]}"#;

fn resolve_model<A: Availability>(
    model: &str,
    settings: &Settings,
    availability: A,
    choice: Choice<'_>,
    pins: &Pins,
) -> Result<Route, RouteError> {
    let registry = registry(TWO_MODELS);
    Resolver {
        registry: &registry,
        settings,
        availability,
        choice,
        prompt: PromptFacts::default(),
        picked: &picker::NOTHING,
        model: Some(model),
        rank_loads: None,
    }
    .resolve(pins)
}

#[test]
fn unpinned_hops_choose_among_the_workers_serving_the_model() {
    let settings = Settings {
        prefill_retries: 9,
        ..Settings::default()
    };
    for rotation in 0..4 {
        let choice = Choice::RoundRobin(rotation);
        let a = resolve_model("a", &settings, &RegistryOnly, choice, &Pins::default()).unwrap();
        let mut prefill = prefill_ids(&a);
        prefill.sort_unstable();
        assert_eq!(prefill, [101, 103]);
        let mut decode = decode_ids(&a);
        decode.sort_unstable();
        assert_eq!(decode, [201, 203, 204]);
        let b = resolve_model("b", &settings, &RegistryOnly, choice, &Pins::default()).unwrap();
        assert_eq!(prefill_ids(&b), [102]);
        let mut decode = decode_ids(&b);
        decode.sort_unstable();
        assert_eq!(decode, [202, 204]);
    }
    let session = Choice::Session(b"conversation");
    let lora = resolve_model(
        "b-lora",
        &settings,
        &RegistryOnly,
        session,
        &Pins::default(),
    );
    let mut decode = decode_ids(&lora.unwrap());
    decode.sort_unstable();
    assert_eq!(decode, [202, 204]);
}

#[test]
fn a_model_no_prefill_worker_serves_follows_the_fallback_rules_within_its_workers() {
    let route = resolve_model(
        "b-lora",
        &Settings::default(),
        &RegistryOnly,
        Choice::RoundRobin(0),
        &Pins::default(),
    )
    .unwrap();
    assert_eq!(
        route.prefill,
        PrefillPlan::Skip,
        "one hop on a worker serving it"
    );
    let strict = Settings {
        aggregated_fallback: false,
        ..Settings::default()
    };
    assert_eq!(
        resolve_model(
            "b-lora",
            &strict,
            &RegistryOnly,
            Choice::RoundRobin(0),
            &Pins::default()
        ),
        Err(RouteError::NoWorkerAvailable {
            hop: Hop::Prefill,
            role: Role::Prefill
        })
    );
}

#[test]
fn a_pin_to_a_worker_not_serving_the_model_is_refused_not_replaced() {
    let cases = [
        (decode_pin(202), Hop::Decode, 202),
        (
            Pins {
                prefill_worker_id: Some(102),
                ..Pins::default()
            },
            Hop::Prefill,
            102,
        ),
    ];
    for (pins, hop, worker) in cases {
        assert_eq!(
            resolve_model(
                "a",
                &Settings::default(),
                &RegistryOnly,
                Choice::RoundRobin(0),
                &pins
            ),
            Err(RouteError::ModelNotServed {
                hop,
                worker,
                model: "a".into()
            })
        );
    }
    let served = resolve_model(
        "a",
        &Settings::default(),
        &RegistryOnly,
        Choice::RoundRobin(0),
        &decode_pin(204),
    )
    .unwrap();
    assert_eq!(summary(&served.decode.target), pinned(204, Some(0)));
}

#[test]
fn panic_mode_is_judged_within_the_models_workers() {
    struct Down(&'static [WorkerId]);
    impl Availability for Down {
        fn unavailability(&self, worker: &Worker) -> Option<Unavailability> {
            self.0
                .contains(&worker.id)
                .then_some(Unavailability::Unhealthy {
                    retry_after_secs: 3,
                })
        }
    }
    // Model `a`'s prefill workers are both down: its pool is in panic and tries them; model
    // `b`'s is whole, though two of the three prefill workers of the gateway are down.
    let down = Down(&[101, 103]);
    let settings = Settings {
        prefill_retries: 9,
        ..Settings::default()
    };
    let a = resolve_model(
        "a",
        &settings,
        &down,
        Choice::RoundRobin(0),
        &Pins::default(),
    )
    .unwrap();
    assert!(a.prefill_panic);
    let mut prefill = prefill_ids(&a);
    prefill.sort_unstable();
    assert_eq!(prefill, [101, 103]);
    let b = resolve_model(
        "b",
        &settings,
        &down,
        Choice::RoundRobin(0),
        &Pins::default(),
    )
    .unwrap();
    assert!(!b.prefill_panic);
    assert_eq!(prefill_ids(&b), [102]);
}

//! Picker mode (`docs/semantics.md` §9): the picker's endpoints decide the hops it names.

use super::*;
use crate::policy::picker::{Allowed, Picked, PickerSettings, Protocol, RoutingMode};
use crate::policy::testing::test;

fn picker_settings(allow: Vec<Allowed>) -> Settings {
    Settings {
        picker: Some(PickerSettings {
            protocol: Protocol::LlmD,
            allow,
            address: None,
        }),
        local_prefill_max_bytes: usize::MAX,
        ..Settings::default()
    }
}

fn addresses(list: &[&str]) -> Vec<std::net::SocketAddr> {
    list.iter().map(|a| a.parse().unwrap()).collect()
}

fn resolve_picked(settings: &Settings, picked: &Picked, pins: &Pins) -> Result<Route, RouteError> {
    let registry = registry(DISAGGREGATED);
    Resolver {
        registry: &registry,
        settings,
        availability: &RegistryOnly,
        choice: Choice::RoundRobin(0),
        prompt: PromptFacts {
            bytes: 10,
            last_turn: None,
        },
        picked,
        model: None,
        rank_loads: None,
    }
    .resolve(pins)
}

fn registry_picker() -> Settings {
    picker_settings(vec![Allowed::Registry])
}

#[test]
fn the_destination_is_the_decode_hop_with_its_fallbacks_in_order() {
    let picked = Picked {
        token: addresses(&["127.0.0.1:8202", "127.0.0.1:8201"]),
        ..Picked::default()
    };
    let route = resolve_picked(&registry_picker(), &picked, &Pins::default()).unwrap();
    assert_eq!(route.decode.target.worker.id, 202);
    assert!(!route.decode.target.pinned);
    assert_eq!(route.decode.placement, Some(Placement::Picker));
    let alternates: Vec<_> = route.decode.alternates.iter().map(|w| w.id).collect();
    assert_eq!(alternates, [201]);
    // The picker left the prefill hop open: pinroute's own rules chose it, a short prompt
    // included (local_prefill_max_bytes).
    assert_eq!(route.prefill, PrefillPlan::Local(LocalPrefill::ShortPrompt));
    assert_eq!(
        route.remembered_workers(),
        None,
        "a picker's choice is not a placement to remember"
    );
}

#[test]
fn the_prefiller_is_the_prefill_hop_and_no_local_prefill_overrides_it() {
    let picked = Picked {
        token: addresses(&["127.0.0.1:8201"]),
        prefill: addresses(&["127.0.0.1:8102", "127.0.0.1:8101", "127.0.0.1:8101"]),
        mode: None,
    };
    let pins = Pins {
        dp_rank: Some(0),
        prefill_dp_rank: Some(1),
        ..Pins::default()
    };
    let route = resolve_picked(&registry_picker(), &picked, &pins).unwrap();
    assert_eq!(route.prefill_placement, Some(Placement::Picker));
    let PrefillPlan::Candidates(targets) = &route.prefill else {
        panic!("{:?}", route.prefill);
    };
    let summary: Vec<_> = targets.iter().map(|t| (t.worker.id, t.rank)).collect();
    assert_eq!(
        summary,
        [(102, Some(1)), (101, Some(0))],
        "first plus prefill_retries (1)"
    );
    assert_eq!(route.decode.target.rank, Some(0));
}

#[test]
fn a_rank_beyond_the_picked_workers_dp_size_is_refused() {
    let picked = Picked {
        token: addresses(&["127.0.0.1:8201"]),
        ..Picked::default()
    };
    let pins = Pins {
        dp_rank: Some(1),
        ..Pins::default()
    };
    let error = resolve_picked(&registry_picker(), &picked, &pins).unwrap_err();
    assert_eq!(error.code(), "dp_rank_out_of_range");
}

#[test]
fn the_routing_mode_decides_one_or_two_hops() {
    let aggregated = Picked {
        mode: Some(RoutingMode::Aggregated),
        ..Picked::default()
    };
    let route = resolve_picked(&registry_picker(), &aggregated, &Pins::default()).unwrap();
    assert_eq!(route.prefill, PrefillPlan::Local(LocalPrefill::Picker));
    let disaggregated = Picked {
        mode: Some(RoutingMode::Disaggregated),
        ..Picked::default()
    };
    let route = resolve_picked(&registry_picker(), &disaggregated, &Pins::default()).unwrap();
    assert!(
        matches!(route.prefill, PrefillPlan::Candidates(_)),
        "a short prompt is not prefilled locally when the picker asked for two hops: {:?}",
        route.prefill
    );
}

#[test]
fn pins_beat_the_picker_for_their_hop() {
    let picked = Picked {
        token: addresses(&["127.0.0.1:8202"]),
        prefill: addresses(&["127.0.0.1:8102"]),
        mode: None,
    };
    let pins = Pins {
        decode_worker_id: Some(201),
        prefill_worker_id: Some(101),
        ..Pins::default()
    };
    let route = resolve_picked(&registry_picker(), &picked, &pins).unwrap();
    assert_eq!(summary(&route.decode.target), pinned(201, Some(0)));
    assert!(matches!(&route.prefill, PrefillPlan::Pinned(t) if t.worker.id == 101));
}

#[test]
fn endpoints_outside_the_allowlist_or_of_the_wrong_role_are_invalid_epp_metadata() {
    let cases = [
        (addresses(&["127.0.0.1:9999"]), Vec::new()),
        (addresses(&["127.0.0.1:8101"]), Vec::new()),
        (Vec::new(), addresses(&["127.0.0.1:8201"])),
        (addresses(&["127.0.0.1:8201", "10.0.0.1:80"]), Vec::new()),
    ];
    for (token, prefill) in cases {
        let picked = Picked {
            token,
            prefill,
            mode: None,
        };
        let error = resolve_picked(&registry_picker(), &picked, &Pins::default()).unwrap_err();
        assert_eq!(
            (error.code(), error.status()),
            ("invalid_epp_metadata", 502),
            "{picked:?}"
        );
    }
}

#[test]
fn an_address_in_an_allowed_range_is_served_unlisted() {
    let settings = picker_settings(vec![
        Allowed::Registry,
        Allowed::Range("10.0.0.0/8".parse().unwrap()),
    ]);
    let picked = Picked {
        token: addresses(&["10.1.2.3:8000", "127.0.0.1:8201"]),
        prefill: addresses(&["10.1.2.4:8000"]),
        mode: None,
    };
    let pins = Pins {
        dp_rank: Some(7),
        ..Pins::default()
    };
    let route = resolve_picked(&settings, &picked, &pins).unwrap();
    let target = &route.decode.target;
    assert!(target.worker.unlisted);
    assert_eq!(
        (target.worker.address, target.rank),
        ("10.1.2.3:8000".parse().unwrap(), Some(7))
    );
    assert_eq!(route.decode.alternates.first().map(|w| w.id), Some(201));
    assert!(matches!(&route.prefill, PrefillPlan::Candidates(t) if t[0].worker.unlisted));
}

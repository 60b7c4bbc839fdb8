#![allow(clippy::unwrap_used)]

use super::*;
use crate::policy::resolve::PrefillPlan;
use crate::policy::testing::test;

fn registry() -> Registry {
    Registry::from_json(
        br#"{"workers": [
            {"id": 101, "role": "prefill", "address": "127.0.0.1:8101"},
            {"id": 201, "role": "decode", "address": "127.0.0.1:8201"},
            {"id": 202, "role": "decode", "address": "127.0.0.1:8202"}]}"#,
    )
    .unwrap()
}

fn read(body: &str) -> Result<ResponsesRequest, RouteError> {
    ResponsesRequest::read(&JsonObject::parse(body.as_bytes()).unwrap(), &registry())
}

#[test]
fn a_response_id_names_its_worker_and_nothing_else_does() {
    let id = response_id(201, 0xabc);
    assert_eq!(id, "resp_w201_00000000000000000000000000000abc");
    assert_eq!(stored_on(&id), Some(201));
    assert_eq!(stored_on(&response_id(0, u128::MAX)), Some(0));
    for foreign in [
        "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b",
        "resp_w_00000000000000000000000000000abc",
        "resp_w0201_00000000000000000000000000000abc",
        "resp_w+201_00000000000000000000000000000abc",
        "resp_w201_abc",
        "resp_w201_0000000000000000000000000000zabc",
        "resp_w99999999999999999999999_00000000000000000000000000000abc",
        "resp_w201",
        "",
    ] {
        assert_eq!(stored_on(foreign), None, "{foreign}");
    }
}

#[test]
fn a_follow_up_goes_to_the_worker_holding_its_previous_response() {
    let follows = format!(
        r#"{{"input": "and?", "previous_response_id": "{}"}}"#,
        response_id(202, 7)
    );
    let request = read(&follows).unwrap();
    assert_eq!(
        request,
        ResponsesRequest {
            follows: Some(202),
            background: false,
            stored: true
        }
    );
    assert!(request.one_hop());
    let pins = request.pin(Pins::default(), PREVIOUS_RESPONSE_ID).unwrap();
    assert_eq!(pins.decode_worker_id, Some(202));
    let same = Pins {
        backend_instance_id: Some(202),
        ..Pins::default()
    };
    assert!(request.pin(same, PREVIOUS_RESPONSE_ID).is_ok());
    let other = Pins {
        decode_worker_id: Some(201),
        ..Pins::default()
    };
    let prefill = Pins {
        prefill_worker_id: Some(101),
        ..Pins::default()
    };
    for pins in [other, prefill] {
        assert!(matches!(
            request.pin(pins, PREVIOUS_RESPONSE_ID),
            Err(RouteError::InvalidField {
                field: PREVIOUS_RESPONSE_ID,
                ..
            })
        ));
    }
}

#[test]
fn a_previous_response_no_worker_can_hold_is_not_found() {
    for id in ["resp_from_elsewhere", &response_id(999, 1)] {
        let body = format!(r#"{{"input": "x", "previous_response_id": "{id}"}}"#);
        let error = read(&body).unwrap_err();
        assert!(matches!(error, RouteError::ResponseNotFound { .. }), "{id}");
        assert_eq!((error.status(), error.code()), (404, "response_not_found"));
    }
    let not_a_string = read(r#"{"input": "x", "previous_response_id": 7}"#).unwrap_err();
    assert!(matches!(
        not_a_string,
        RouteError::InvalidField {
            field: PREVIOUS_RESPONSE_ID,
            ..
        }
    ));
    assert_eq!(
        read(r#"{"input": "x", "previous_response_id": null}"#)
            .unwrap()
            .follows,
        None
    );
}

#[test]
fn the_request_id_is_the_gateways() {
    assert!(matches!(
        read(r#"{"input": "x", "request_id": "mine"}"#),
        Err(RouteError::InvalidField {
            field: REQUEST_ID,
            ..
        })
    ));
}

#[test]
fn store_and_background_are_read_as_vllm_reads_them() {
    let cases = [
        (r#"{"input": "x"}"#, true, false),
        (r#"{"input": "x", "store": null}"#, true, false),
        (r#"{"input": "x", "store": false}"#, false, false),
        (
            r#"{"input": "x", "store": true, "background": true}"#,
            true,
            true,
        ),
        (r#"{"input": "x", "background": false}"#, true, false),
    ];
    for (body, stored, background) in cases {
        let request = read(body).unwrap();
        assert_eq!(
            (request.stored, request.background),
            (stored, background),
            "{body}"
        );
        assert_eq!(request.one_hop(), background, "{body}");
    }
    let background = read(r#"{"input": "x", "background": true}"#).unwrap();
    let prefill = Pins {
        prefill_worker_id: Some(101),
        ..Pins::default()
    };
    assert!(matches!(
        background.pin(prefill, PREVIOUS_RESPONSE_ID),
        Err(RouteError::InvalidField {
            field: "background",
            ..
        })
    ));
}

#[test]
fn a_stored_response_is_made_in_one_hop_only_when_its_state_needs_it() {
    use crate::policy::resolve::{LocalPrefill, Target, TokenHop};
    let registry = registry();
    let target = |id| Target {
        worker: registry.get(id).unwrap().clone(),
        rank: None,
        pinned: false,
    };
    let route = Route {
        prefill: PrefillPlan::Candidates(vec![target(101)]),
        decode: TokenHop {
            target: target(201),
            hop: crate::policy::hop::Hop::Decode,
            alternates: vec![registry.get(202).unwrap().clone()],
            panic: false,
            placement: None,
        },
        prefill_panic: false,
        prefill_placement: None,
    };
    let stored = read(r#"{"input": "x"}"#).unwrap().route(route.clone());
    assert!(matches!(stored.prefill, PrefillPlan::Candidates(_)));
    assert!(
        stored.decode.alternates.is_empty(),
        "its id names the first worker"
    );
    let unstored = read(r#"{"input": "x", "store": false}"#)
        .unwrap()
        .route(route.clone());
    assert_eq!(unstored, route);
    let background = read(r#"{"input": "x", "background": true}"#)
        .unwrap()
        .route(route);
    assert_eq!(
        background.prefill,
        PrefillPlan::Local(LocalPrefill::Stateful)
    );
}

#[test]
fn a_path_about_a_response_goes_to_its_worker() {
    let about = ResponsesRequest::about(&response_id(201, 3), &registry()).unwrap();
    assert_eq!(about.follows, Some(201));
    assert!(matches!(
        ResponsesRequest::about("resp_abc", &registry()),
        Err(RouteError::ResponseNotFound { .. })
    ));
}

use super::*;
use crate::policy::testing::test;

fn parse(protocol: Protocol, headers: &[(&str, &str)]) -> Result<Picked, RouteError> {
    parse_headers(protocol, headers.iter().map(|(n, v)| (*n, v.as_bytes())))
}

fn address(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

fn code_and_header(error: RouteError) -> (&'static str, &'static str) {
    match error {
        RouteError::InvalidEppMetadata { header, .. } => ("invalid_epp_metadata", header),
        other => panic!("not invalid_epp_metadata: {other}"),
    }
}

#[test]
fn the_destination_lists_the_choice_then_its_fallbacks_in_order() {
    let picked = parse(
        Protocol::Gie,
        &[(
            DESTINATION_HEADER,
            "10.0.0.2:8000, 10.0.0.3:8000,[fd00::1]:9000",
        )],
    )
    .unwrap();
    assert_eq!(
        picked.token,
        [
            address("10.0.0.2:8000"),
            address("10.0.0.3:8000"),
            address("[fd00::1]:9000")
        ]
    );
    assert!(picked.prefill.is_empty());
    assert_eq!(picked.mode, None);
}

#[test]
fn no_picker_header_chooses_nothing() {
    let picked = parse(Protocol::LlmD, &[("x-request-id", "a")]).unwrap();
    assert_eq!(picked, Picked::default());
}

#[test]
fn malformed_endpoints_are_refused_naming_the_header() {
    for value in [
        "",
        "10.0.0.1",
        "10.0.0.1:0",
        "pod-a:8000",
        "10.0.0.1:8000,",
        "::1:80",
    ] {
        let error = parse(Protocol::LlmD, &[(PREFILLER_HEADER, value)]).unwrap_err();
        assert_eq!(
            code_and_header(error),
            ("invalid_epp_metadata", PREFILLER_HEADER),
            "{value:?}"
        );
    }
    let long = vec!["10.0.0.1:80"; MAX_ENDPOINTS + 1].join(",");
    let error = parse(Protocol::Gie, &[(DESTINATION_HEADER, &long)]).unwrap_err();
    assert_eq!(code_and_header(error).1, DESTINATION_HEADER);
}

#[test]
fn a_header_set_twice_is_refused() {
    let headers = [
        (DESTINATION_HEADER, "10.0.0.1:80"),
        (DESTINATION_HEADER, "10.0.0.1:80"),
    ];
    let error = parse(Protocol::Gie, &headers).unwrap_err();
    assert!(error.to_string().contains("more than once"), "{error}");
}

#[test]
fn dynamo_names_exactly_one_prefill_endpoint_llm_d_a_list() {
    let two = [(PREFILLER_HEADER, "10.0.0.1:80,10.0.0.2:80")];
    assert_eq!(parse(Protocol::LlmD, &two).unwrap().prefill.len(), 2);
    let error = parse(Protocol::Dynamo, &two).unwrap_err();
    assert!(error.to_string().contains("exactly one"), "{error}");
    let one = [(PREFILLER_HEADER, "10.0.0.1:80")];
    assert_eq!(
        parse(Protocol::Dynamo, &one).unwrap().prefill,
        [address("10.0.0.1:80")]
    );
}

#[test]
fn the_routing_mode_is_aggregated_or_disaggregated() {
    let mode = |value| parse(Protocol::Dynamo, &[(ROUTING_MODE_HEADER, value)]).map(|p| p.mode);
    assert_eq!(mode("aggregated").unwrap(), Some(RoutingMode::Aggregated));
    assert_eq!(
        mode("disaggregated").unwrap(),
        Some(RoutingMode::Disaggregated)
    );
    assert_eq!(
        code_and_header(mode("Aggregated").unwrap_err()).1,
        ROUTING_MODE_HEADER
    );
    let both = [
        (ROUTING_MODE_HEADER, "aggregated"),
        (PREFILLER_HEADER, "10.0.0.1:80"),
    ];
    assert_eq!(
        code_and_header(parse(Protocol::Dynamo, &both).unwrap_err()).1,
        PREFILLER_HEADER
    );
}

fn registry() -> Registry {
    Registry::from_json(
        br#"{"workers": [
            {"id": 1, "role": "prefill", "address": "10.0.0.1:8000"},
            {"id": 2, "role": "decode", "address": "10.0.0.2:8000", "dp_size": 2}
        ]}"#,
    )
    .unwrap()
}

fn allow(entries: &[&str]) -> Vec<Allowed> {
    entries
        .iter()
        .map(|e| serde_json::from_value(serde_json::json!(e)).unwrap())
        .collect()
}

/// The workers behind `endpoints` for a hop of `role`, against [`registry`] and `allowed`.
fn resolved(
    header: &'static str,
    endpoints: &[&str],
    role: Role,
    allowed: &[&str],
) -> Result<Vec<Worker>, RouteError> {
    let endpoints: Vec<SocketAddr> = endpoints.iter().map(|e| address(e)).collect();
    workers(header, &endpoints, role, &registry(), &allow(allowed))
}

#[test]
fn registry_endpoints_are_their_workers() {
    let workers = resolved(
        DESTINATION_HEADER,
        &["10.0.0.2:8000"],
        Role::Decode,
        &["registry"],
    )
    .unwrap();
    assert_eq!(workers.len(), 1);
    assert_eq!((workers[0].id, workers[0].dp_size), (2, 2));
    assert!(!workers[0].unlisted);
}

#[test]
fn an_endpoint_outside_the_allowlist_is_refused() {
    let outside = |allowed| {
        resolved(
            DESTINATION_HEADER,
            &["10.0.0.9:8000"],
            Role::Decode,
            allowed,
        )
    };
    let error = outside(&["registry"]).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("entry 1 is outside the allowlist"),
        "{error}"
    );
    assert_eq!(outside(&["10.1.0.0/16"]).unwrap_err().status(), 502);
    // A registry address is not allowed by a list without "registry" unless a range holds it.
    let listed = |allowed| {
        resolved(
            DESTINATION_HEADER,
            &["10.0.0.2:8000"],
            Role::Decode,
            allowed,
        )
    };
    assert!(listed(&["10.1.0.0/16"]).is_err());
    assert!(listed(&["10.0.0.0/24"]).is_ok());
}

#[test]
fn an_address_in_a_range_is_an_unlisted_worker_of_the_hop() {
    let endpoints = ["10.0.7.7:8000", "[::ffff:10.0.7.8]:8000"];
    let found = resolved(
        PREFILLER_HEADER,
        &endpoints,
        Role::Prefill,
        &["10.0.0.0/16"],
    )
    .unwrap();
    assert!(found.iter().all(|w| w.unlisted && w.role == Role::Prefill));
    assert_ne!(found[0].id, found[1].id);
    assert_eq!(
        found[0],
        Worker::unlisted(Role::Prefill, address(endpoints[0])),
        "one id per address"
    );
}

#[test]
fn a_registry_worker_of_another_role_is_refused() {
    let allowed = ["registry", "10.0.0.0/8"];
    let error = resolved(
        PREFILLER_HEADER,
        &["10.0.0.2:8000"],
        Role::Prefill,
        &allowed,
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("entry 1 is decode worker 2, not a prefill worker"),
        "{error}"
    );
}

#[test]
fn an_allowlist_entry_is_registry_or_a_range() {
    let error = serde_json::from_value::<Allowed>(serde_json::json!("10.0.0.0/33")).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("neither \"registry\" nor a CIDR range"),
        "{error}"
    );
    let settings: PickerSettings =
        serde_json::from_value(serde_json::json!({"protocol": "llm-d"})).unwrap();
    assert_eq!(settings.allow, [Allowed::Registry]);
    assert!(
        serde_json::from_value::<PickerSettings>(serde_json::json!({"protocol": "epp"})).is_err()
    );
}

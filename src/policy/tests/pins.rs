#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;
use crate::policy::testing::test;

fn headers(pairs: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static [u8])> {
    pairs.iter().map(|(n, v)| (*n, v.as_bytes())).collect()
}

fn parse(pairs: &[(&'static str, &'static str)]) -> Result<HeaderHints, RouteError> {
    parse_headers(headers(pairs))
}

fn invalid_header(result: Result<HeaderHints, RouteError>) -> (&'static str, String) {
    match result {
        Err(RouteError::InvalidHeader { name, reason }) => (name, reason),
        other => panic!("expected an invalid header, got {other:?}"),
    }
}

#[test]
fn worker_instance_id_sets_backend_and_decode() {
    let hints = parse(&[("x-dynamo-worker-instance-id", "201")]).unwrap();
    assert_eq!(hints.pins.backend_instance_id, Some(201));
    assert_eq!(hints.pins.decode_worker_id, Some(201));
    assert_eq!(hints.pins.prefill_worker_id, None);
}

#[test]
fn every_canonical_header_and_alias_sets_its_field() {
    type Getter = fn(&Pins) -> Option<u64>;
    let cases: &[(&str, Getter)] = &[
        ("x-dynamo-worker-instance-id", |p| p.decode_worker_id),
        ("x-worker-instance-id", |p| p.backend_instance_id),
        ("x-dynamo-prefill-instance-id", |p| p.prefill_worker_id),
        ("x-prefill-instance-id", |p| p.prefill_worker_id),
        ("x-dynamo-dp-rank", |p| p.dp_rank.map(u64::from)),
        ("x-dp-rank", |p| p.dp_rank.map(u64::from)),
        ("x-data-parallel-rank", |p| p.dp_rank.map(u64::from)),
        ("x-dynamo-prefill-dp-rank", |p| {
            p.prefill_dp_rank.map(u64::from)
        }),
        ("x-prefill-dp-rank", |p| p.prefill_dp_rank.map(u64::from)),
    ];
    for (name, get) in cases {
        let hints = parse_headers(vec![(*name, b"7".as_slice())]).unwrap();
        assert_eq!(get(&hints.pins), Some(7), "{name}");
        assert!(is_pin_header(name));
    }
}

#[test]
fn canonical_beats_alias() {
    let hints = parse(&[
        ("x-worker-instance-id", "1"),
        ("x-dynamo-worker-instance-id", "2"),
    ])
    .unwrap();
    assert_eq!(hints.pins.decode_worker_id, Some(2));
    let hints = parse(&[("x-data-parallel-rank", "1"), ("x-dynamo-dp-rank", "0")]).unwrap();
    assert_eq!(hints.pins.dp_rank, Some(0));
    let hints = parse(&[
        ("x-prefill-instance-id", "5"),
        ("x-dynamo-prefill-instance-id", "6"),
    ])
    .unwrap();
    assert_eq!(hints.pins.prefill_worker_id, Some(6));
}

#[test]
fn agreeing_aliases_are_accepted_and_disagreeing_ones_refused() {
    let hints = parse(&[("x-dp-rank", "1"), ("x-data-parallel-rank", "1")]).unwrap();
    assert_eq!(hints.pins.dp_rank, Some(1));
    let (name, reason) =
        invalid_header(parse(&[("x-dp-rank", "1"), ("x-data-parallel-rank", "2")]));
    assert_eq!(name, "x-dp-rank");
    assert!(
        reason.contains("conflicts with x-data-parallel-rank"),
        "{reason}"
    );
}

#[test]
fn a_repeated_header_with_different_values_is_refused() {
    let (name, reason) = invalid_header(parse(&[
        ("x-dynamo-worker-instance-id", "1"),
        ("x-dynamo-worker-instance-id", "2"),
    ]));
    assert_eq!(name, "x-dynamo-worker-instance-id");
    assert!(reason.contains("repeated"), "{reason}");
    let same = parse(&[
        ("x-dynamo-worker-instance-id", "1"),
        ("x-dynamo-worker-instance-id", "1"),
    ]);
    assert_eq!(same.unwrap().pins.decode_worker_id, Some(1));
}

#[test]
fn malformed_values_are_400_with_the_reason() {
    let cases = [
        ("", "empty"),
        ("abc", "not a decimal integer"),
        ("-1", "negative"),
        ("+5", "not a decimal integer"),
        (" 5", "not a decimal integer"),
        ("1.0", "not a decimal integer"),
        ("0x10", "not a decimal integer"),
        ("18446744073709551616", "64 bits"),
    ];
    for (value, why) in cases {
        let result = parse_headers(vec![("x-dynamo-worker-instance-id", value.as_bytes())]);
        let (name, reason) = invalid_header(result);
        assert_eq!(name, "x-dynamo-worker-instance-id");
        assert!(reason.contains(why), "{value:?}: {reason}");
    }
    let (_, reason) = invalid_header(parse(&[("x-dynamo-dp-rank", "4294967296")]));
    assert!(reason.contains("32 bits"), "{reason}");
    let (_, reason) = invalid_header(parse_headers(vec![(
        "x-dynamo-dp-rank",
        b"\xff\xfe".as_slice(),
    )]));
    assert!(reason.contains("UTF-8"), "{reason}");
}

#[test]
fn the_largest_values_parse() {
    let hints = parse(&[
        ("x-dynamo-worker-instance-id", "18446744073709551615"),
        ("x-dynamo-dp-rank", "4294967295"),
    ])
    .unwrap();
    assert_eq!(hints.pins.decode_worker_id, Some(u64::MAX));
    assert_eq!(hints.pins.dp_rank, Some(u32::MAX));
}

#[test]
fn a_malformed_alias_is_refused_even_when_the_canonical_name_wins() {
    let (name, _) = invalid_header(parse(&[("x-dynamo-dp-rank", "1"), ("x-dp-rank", "x")]));
    assert_eq!(name, "x-dp-rank");
}

#[test]
fn prefill_rank_u32_max_means_unset() {
    let hints = parse(&[("x-dynamo-prefill-dp-rank", "4294967295")]).unwrap();
    assert_eq!(hints.pins.prefill_dp_rank, None);
    let body = object(r#"{"nvext": {"prefill_dp_rank": 4294967295}}"#);
    assert_eq!(
        parse_nvext(&JsonObject::parse(body.as_bytes()).unwrap())
            .unwrap()
            .prefill_dp_rank,
        None
    );
}

#[test]
fn session_id_is_1_to_256_bytes() {
    let hints = parse(&[("x-dynamo-session-id", "abc")]).unwrap();
    assert_eq!(hints.session.as_deref(), Some(b"abc".as_slice()));
    let (_, reason) = invalid_header(parse(&[("x-dynamo-session-id", "")]));
    assert!(reason.contains("empty"));
    let long = "s".repeat(257);
    let (_, reason) = invalid_header(parse_headers(vec![(
        "x-dynamo-session-id",
        long.as_bytes(),
    )]));
    assert!(reason.contains("257 bytes"), "{reason}");
    let max = "s".repeat(256);
    assert!(parse_headers(vec![("x-dynamo-session-id", max.as_bytes())]).is_ok());
}

#[test]
fn unrelated_headers_are_ignored() {
    let hints = parse(&[("x-dynamo-something", "x"), ("authorization", "Bearer k")]).unwrap();
    assert_eq!(hints, HeaderHints::default());
}

fn object(text: &str) -> String {
    text.to_string()
}

fn nvext(text: &str) -> Result<Pins, RouteError> {
    parse_nvext(&JsonObject::parse(text.as_bytes()).unwrap())
}

#[test]
fn nvext_fields_set_their_pins() {
    let pins = nvext(
        r#"{"nvext": {"backend_instance_id": 1, "prefill_worker_id": 2, "decode_worker_id": 3,
            "dp_rank": 4, "prefill_dp_rank": 5, "annotations": ["x"]}}"#,
    )
    .unwrap();
    assert_eq!(
        pins,
        Pins {
            backend_instance_id: Some(1),
            prefill_worker_id: Some(2),
            decode_worker_id: Some(3),
            dp_rank: Some(4),
            prefill_dp_rank: Some(5),
        }
    );
}

#[test]
fn absent_or_null_nvext_and_null_fields_pin_nothing() {
    assert!(nvext(r#"{"prompt": "x"}"#).unwrap().is_empty());
    assert!(nvext(r#"{"nvext": null}"#).unwrap().is_empty());
    assert!(
        nvext(r#"{"nvext": {"decode_worker_id": null}}"#)
            .unwrap()
            .is_empty()
    );
    assert!(
        nvext(r#"{"nvext": {"other": "field"}}"#)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn routing_fields_of_the_wrong_type_are_400() {
    let cases = [
        (
            r#"{"nvext": {"decode_worker_id": "201"}}"#,
            "nvext.decode_worker_id",
            "a string",
        ),
        (
            r#"{"nvext": {"backend_instance_id": -1}}"#,
            "nvext.backend_instance_id",
            "-1",
        ),
        (
            r#"{"nvext": {"prefill_worker_id": 1.5}}"#,
            "nvext.prefill_worker_id",
            "1.5",
        ),
        (
            r#"{"nvext": {"prefill_worker_id": 1.0}}"#,
            "nvext.prefill_worker_id",
            "1.0",
        ),
        (
            r#"{"nvext": {"dp_rank": 4294967296}}"#,
            "nvext.dp_rank",
            "4294967296",
        ),
        (
            r#"{"nvext": {"dp_rank": true}}"#,
            "nvext.dp_rank",
            "a boolean",
        ),
        (
            r#"{"nvext": {"prefill_dp_rank": [1]}}"#,
            "nvext.prefill_dp_rank",
            "an array",
        ),
        (
            r#"{"nvext": {"decode_worker_id": {}}}"#,
            "nvext.decode_worker_id",
            "an object",
        ),
        (
            r#"{"nvext": {"decode_worker_id": 18446744073709551616}}"#,
            "nvext.decode_worker_id",
            "18446744073709551616",
        ),
    ];
    for (body, path, got) in cases {
        match nvext(body) {
            Err(RouteError::InvalidField { field, reason }) => {
                assert_eq!(field, path, "{body}");
                assert!(reason.contains(got), "{body}: {reason}");
            }
            other => panic!("{body}: expected an invalid field, got {other:?}"),
        }
    }
}

#[test]
fn nvext_must_be_an_object_without_duplicate_keys() {
    for body in [
        r#"{"nvext": 5}"#,
        r#"{"nvext": "x"}"#,
        r#"{"nvext": {"dp_rank": 1, "dp_rank": 2}}"#,
    ] {
        assert!(
            matches!(
                nvext(body),
                Err(RouteError::InvalidField { field: "nvext", .. })
            ),
            "{body}"
        );
    }
}

#[test]
fn headers_beat_the_body_field_by_field() {
    let header = Pins {
        decode_worker_id: Some(1),
        backend_instance_id: Some(1),
        ..Pins::default()
    };
    let body = Pins {
        decode_worker_id: Some(2),
        prefill_worker_id: Some(3),
        dp_rank: Some(1),
        ..Pins::default()
    };
    let merged = header.or(body);
    assert_eq!(merged.decode_worker_id, Some(1));
    assert_eq!(merged.prefill_worker_id, Some(3));
    assert_eq!(merged.dp_rank, Some(1));
}

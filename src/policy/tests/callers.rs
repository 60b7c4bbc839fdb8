#![allow(clippy::unwrap_used)]

use super::*;
use crate::policy::config::Config;
use crate::policy::config::tests::refused;
use crate::policy::testing::test;

fn rules(json: &str) -> CallerRules {
    serde_json::from_str(json).unwrap()
}

fn pinned() -> Pins {
    Pins {
        decode_worker_id: Some(201),
        ..Pins::default()
    }
}

fn code(result: Result<(), RouteError>) -> &'static str {
    result.map_or_else(|e| e.code(), |()| "allowed")
}

#[test]
fn absent_lists_allow_every_caller_even_an_unnamed_one() {
    let rules = rules("{}");
    assert_eq!(rules.header, "x-client-id");
    assert_eq!(code(rules.check(None, &pinned(), true)), "allowed");
}

#[test]
fn only_listed_callers_may_pin() {
    let rules = rules(r#"{"may_pin": ["ops"]}"#);
    assert_eq!(code(rules.check(Some("ops"), &pinned(), false)), "allowed");
    assert_eq!(
        code(rules.check(Some("bob"), &pinned(), false)),
        "pin_not_allowed"
    );
    assert_eq!(code(rules.check(None, &pinned(), false)), "pin_not_allowed");
    assert_eq!(
        code(rules.check(Some("bob"), &Pins::default(), true)),
        "allowed",
        "a request without pins is anyone's, and sessions are not restricted here"
    );
}

#[test]
fn every_kind_of_pin_counts_ranks_included() {
    let rules = rules(r#"{"may_pin": []}"#);
    let rank_only = Pins {
        dp_rank: Some(0),
        ..Pins::default()
    };
    let prefill_only = Pins {
        prefill_worker_id: Some(101),
        ..Pins::default()
    };
    for pins in [rank_only, prefill_only, pinned()] {
        assert_eq!(
            code(rules.check(Some("ops"), &pins, false)),
            "pin_not_allowed"
        );
    }
}

#[test]
fn only_listed_callers_may_name_a_session() {
    let rules = rules(r#"{"may_use_sessions": ["chat"]}"#);
    assert_eq!(code(rules.check(Some("chat"), &pinned(), true)), "allowed");
    assert_eq!(
        code(rules.check(Some("bob"), &Pins::default(), true)),
        "session_not_allowed"
    );
    assert_eq!(code(rules.check(Some("bob"), &pinned(), false)), "allowed");
}

#[test]
fn a_name_is_compared_exactly_and_quoted_in_the_message() {
    let rules = rules(r#"{"may_pin": ["ops"]}"#);
    let error = rules.check(Some("Ops"), &pinned(), false).unwrap_err();
    assert_eq!(error.status(), 403);
    assert_eq!(
        error.to_string(),
        "caller \"Ops\" may not pin workers (callers.may_pin)"
    );
    let error = rules.check(None, &pinned(), false).unwrap_err();
    assert_eq!(
        error.to_string(),
        "an unnamed caller may not pin workers (callers.may_pin)"
    );
}

const WORKERS: &str = r#""workers": [{"id": 201, "role": "decode", "address": "127.0.0.1:8201"}]"#;

#[test]
fn the_configuration_carries_the_rules() {
    let json = format!(r#"{{{WORKERS}, "callers": {{"header": "x-tenant", "may_pin": ["ops"]}}}}"#);
    let config = Config::from_json(json.as_bytes()).unwrap();
    let rules = config.settings.callers.unwrap();
    assert_eq!(rules.header, "x-tenant");
    assert_eq!(rules.may_pin, Some(vec!["ops".to_string()]));
    assert_eq!(rules.may_use_sessions, None);
}

#[test]
fn rules_that_cannot_work_are_refused_at_load() {
    for (callers, why) in [
        (r#"{"header": "X-Tenant"}"#, "lowercase header name"),
        (r#"{"header": "x-pinroute-caller"}"#, "the filter removes"),
        (r#"{"header": "x-dynamo-session-id"}"#, "the filter removes"),
        (r#"{"may_pin": "ops"}"#, "invalid type"),
        (r#"{"may_pinn": ["ops"]}"#, "unknown field"),
    ] {
        let json = format!(r#"{{{WORKERS}, "callers": {callers}}}"#);
        let reason = refused(&json);
        assert!(reason.contains(why), "{callers}: {reason}");
    }
    let with_picker = format!(
        r#"{{{WORKERS}, "picker": {{"protocol": "gie"}}, "callers": {{"may_pin": ["ops"]}}}}"#
    );
    assert!(refused(&with_picker).contains("cannot be used with a picker"));
    let sessions_with_picker = format!(
        r#"{{{WORKERS}, "picker": {{"protocol": "gie"}}, "callers": {{"may_use_sessions": []}}}}"#
    );
    assert!(Config::from_json(sessions_with_picker.as_bytes()).is_ok());
}

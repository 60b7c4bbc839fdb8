#![allow(clippy::unwrap_used)]

use super::*;
use crate::policy::testing::test;

fn body_of(error: &RouteError) -> serde_json::Value {
    serde_json::from_str(&error.body(ErrorShape::OpenAi)).unwrap()
}

#[test]
fn each_error_has_its_status_code_and_type() {
    let cases: Vec<(RouteError, u16, &str)> = vec![
        (
            RouteError::InvalidHeader {
                name: "x-dynamo-dp-rank",
                reason: "x".into(),
            },
            400,
            "invalid_header",
        ),
        (RouteError::InvalidBody("x".into()), 400, "invalid_body"),
        (
            RouteError::InvalidField {
                field: "nvext.dp_rank",
                reason: "x".into(),
            },
            400,
            "invalid_field",
        ),
        (
            RouteError::UnknownPath {
                path: "\"/x\"".into(),
            },
            404,
            "unknown_path",
        ),
        (
            RouteError::ResponseNotFound {
                id: "\"resp_x\"".into(),
                reason: "x",
            },
            404,
            "response_not_found",
        ),
        (
            RouteError::ModelNotFound { model: "m".into() },
            404,
            "model_not_found",
        ),
        (
            RouteError::ModelNotServed {
                hop: Hop::Prefill,
                worker: 9,
                model: "m".into(),
            },
            400,
            "model_not_served",
        ),
        (
            RouteError::MethodNotAllowed {
                method: "\"GET\"".into(),
                path: "/v1/completions".into(),
                allow: "POST",
            },
            405,
            "method_not_allowed",
        ),
        (
            RouteError::BodyTooLarge { limit: 10 },
            413,
            "body_too_large",
        ),
        (RouteError::Overloaded { limit: 4 }, 503, "overloaded"),
        (
            RouteError::RankWithoutWorker { hop: Hop::Decode },
            400,
            "rank_without_worker",
        ),
        (
            RouteError::UnknownWorker {
                hop: Hop::Decode,
                worker: 9,
            },
            400,
            "unknown_worker",
        ),
        (
            RouteError::WrongRole {
                hop: Hop::Prefill,
                worker: 9,
                actual: Role::Decode,
                expected: Role::Prefill,
            },
            400,
            "wrong_worker_role",
        ),
        (
            RouteError::RankOutOfRange {
                hop: Hop::Decode,
                worker: 9,
                rank: 2,
                dp_size: 2,
            },
            400,
            "dp_rank_out_of_range",
        ),
        (
            RouteError::WorkerUnavailable {
                hop: Hop::Decode,
                worker: 9,
                why: Unavailability::Draining,
            },
            503,
            "worker_unavailable",
        ),
        (
            RouteError::NoWorkerAvailable {
                hop: Hop::Decode,
                role: Role::Decode,
            },
            503,
            "no_worker_available",
        ),
        (
            RouteError::PinnedWorkerFailed {
                hop: Hop::Prefill,
                worker: 9,
                failure: HopFailure::Connect,
            },
            502,
            "pinned_worker_failed",
        ),
        (
            RouteError::PinnedWorkerFailed {
                hop: Hop::Decode,
                worker: 9,
                failure: HopFailure::Timeout,
            },
            504,
            "pinned_worker_failed",
        ),
        (
            RouteError::UpstreamFailed {
                hop: Hop::Prefill,
                worker: 9,
                failure: HopFailure::Status(500),
            },
            502,
            "upstream_failed",
        ),
        (
            RouteError::DecodeRefused {
                worker: 9,
                status: 422,
            },
            422,
            "decode_refused",
        ),
        (
            RouteError::InvalidEppMetadata {
                header: "x-gateway-destination-endpoint",
                reason: "x".into(),
            },
            502,
            "invalid_epp_metadata",
        ),
        (RouteError::Internal("x"), 500, "internal_error"),
        (
            RouteError::NotPermitted {
                caller: "caller \"bob\"".into(),
                privilege: Privilege::Pin,
            },
            403,
            "pin_not_allowed",
        ),
        (
            RouteError::NotPermitted {
                caller: "an unnamed caller".into(),
                privilege: Privilege::Session,
            },
            403,
            "session_not_allowed",
        ),
    ];
    assert_eq!(
        cases
            .iter()
            .map(|c| c.2)
            .collect::<std::collections::HashSet<_>>()
            .len(),
        RouteError::CODES.len()
    );
    for (error, status, code) in cases {
        assert!(
            RouteError::CODES.contains(&code),
            "{code} is missing from CODES"
        );
        assert_eq!(error.status(), status, "{error}");
        assert_eq!(error.code(), code, "{error}");
        let body = body_of(&error);
        assert_eq!(body["error"]["code"], code);
        assert_eq!(body["error"]["message"], error.to_string());
        let kind = if status < 500 {
            "invalid_request_error"
        } else {
            "server_error"
        };
        assert_eq!(body["error"]["type"], kind);
    }
}

#[test]
fn messages_name_the_worker_the_hop_and_the_reason() {
    let error = RouteError::WrongRole {
        hop: Hop::Prefill,
        worker: 201,
        actual: Role::Decode,
        expected: Role::Prefill,
    };
    assert_eq!(
        error.to_string(),
        "prefill hop: pinned worker 201 is a decode worker, not a prefill worker"
    );
    let error = RouteError::RankOutOfRange {
        hop: Hop::Decode,
        worker: 201,
        rank: 5,
        dp_size: 2,
    };
    assert_eq!(
        error.to_string(),
        "decode hop: dp rank 5 of pinned worker 201 is outside [0, 2)"
    );
    let error = RouteError::PinnedWorkerFailed {
        hop: Hop::Prefill,
        worker: 101,
        failure: HopFailure::Status(500),
    };
    assert_eq!(
        error.to_string(),
        "prefill hop: pinned worker 101 failed: it answered HTTP 500"
    );
    let why = Unavailability::Unhealthy {
        retry_after_secs: 3,
    };
    let error = RouteError::WorkerUnavailable {
        hop: Hop::Aggregated,
        worker: 7,
        why,
    };
    assert_eq!(
        error.to_string(),
        "aggregated hop: pinned worker 7 is unhealthy after a recent failure"
    );
    assert_eq!(error.retry_after_secs(), Some(3));
}

#[test]
fn retry_after_only_on_unavailability_and_overload() {
    let unavailable = RouteError::WorkerUnavailable {
        hop: Hop::Decode,
        worker: 1,
        why: Unavailability::Draining,
    };
    assert_eq!(unavailable.retry_after_secs(), Some(RETRY_AFTER_SECS));
    let none_left = RouteError::NoWorkerAvailable {
        hop: Hop::Decode,
        role: Role::Decode,
    };
    assert_eq!(none_left.retry_after_secs(), Some(RETRY_AFTER_SECS));
    let overloaded = RouteError::Overloaded { limit: 4 };
    assert_eq!(
        overloaded.retry_after_secs(),
        Some(OVERLOADED_RETRY_AFTER_SECS)
    );
    assert_eq!(
        RouteError::UnknownWorker {
            hop: Hop::Decode,
            worker: 1
        }
        .retry_after_secs(),
        None
    );
}

#[test]
fn the_body_escapes_what_a_client_sent() {
    let error = RouteError::InvalidHeader {
        name: "x-dynamo-dp-rank",
        reason: "\"a\\\"}\" is bad".into(),
    };
    let body = body_of(&error);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"a\\\"}\"")
    );
}

#[test]
fn anthropic_clients_read_the_same_error_in_their_own_shape() {
    let cases = [
        (RouteError::InvalidBody("x".into()), "invalid_request_error"),
        (
            RouteError::ResponseNotFound {
                id: "\"r\"".into(),
                reason: "x",
            },
            "not_found_error",
        ),
        (RouteError::BodyTooLarge { limit: 1 }, "request_too_large"),
        (RouteError::Overloaded { limit: 1 }, "overloaded_error"),
        (RouteError::Internal("x"), "api_error"),
    ];
    for (error, kind) in cases {
        let body: serde_json::Value =
            serde_json::from_str(&error.body(ErrorShape::Anthropic)).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "type": "error",
                "error": {"type": kind, "message": error.to_string(), "code": error.code()}
            })
        );
    }
}

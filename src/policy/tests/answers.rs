use super::*;
use crate::policy::testing::test;

const MAX_KV: usize = 4096;

fn judged(status: Option<u16>, body: &str) -> String {
    match prefill_answer(status, body.len(), body.as_bytes(), MAX_KV) {
        PrefillAnswer::Ready(params) => format!(
            "ready {}",
            params.map_or("-".into(), |p| p.get().to_string())
        ),
        PrefillAnswer::Refused(status) => format!("refused {status}"),
        PrefillAnswer::Failed(failure) => format!("failed: {failure}"),
    }
}

#[test]
fn a_2xx_goes_on_to_decode_with_the_workers_kv_transfer_params() {
    assert_eq!(
        judged(Some(200), r#"{"kv_transfer_params": {"a": 1}}"#),
        r#"ready {"a": 1}"#
    );
    assert_eq!(
        judged(Some(200), r#"{"kv_transfer_params": null}"#),
        "ready -"
    );
    assert_eq!(
        judged(Some(200), "not json"),
        "failed: its response was unusable: the body is not a JSON object"
    );
}

#[test]
fn a_4xx_is_the_clients_to_read_not_a_failure_of_the_worker() {
    for status in [400, 404, 413, 422, 429] {
        assert_eq!(
            judged(Some(status), r#"{"error": {"message": "too long"}}"#),
            format!("refused {status}")
        );
    }
}

#[test]
fn kv_transfer_params_over_their_bound_are_no_usable_answer() {
    let params = |bytes: usize| {
        format!(
            r#"{{"kv_transfer_params": {{"p": "{}"}}}}"#,
            "x".repeat(bytes)
        )
    };
    assert!(judged(Some(200), &params(MAX_KV - 16)).starts_with("ready"));
    let over = r#"{"p": ""}"#.len() + MAX_KV;
    assert_eq!(
        judged(Some(200), &params(MAX_KV)),
        format!("failed: its answer of {over} bytes is over the gateway's limit of {MAX_KV}")
    );
}

#[test]
fn an_answer_over_the_limit_fails_unread_whatever_its_status() {
    let limit = prefill_answer_limit(MAX_KV);
    for status in [200, 400, 500] {
        let judged = prefill_answer(Some(status), limit + 1, b"", MAX_KV);
        assert!(
            matches!(judged, PrefillAnswer::Failed(HopFailure::TooLarge { bytes, limit: l }) if bytes == limit + 1 && l == limit),
            "{status}: {judged:?}"
        );
    }
    assert!(matches!(
        prefill_answer(Some(200), limit, br#"{}"#, MAX_KV),
        PrefillAnswer::Ready(None)
    ));
}

#[test]
fn a_call_with_no_whole_answer_was_reached_so_it_is_no_connection_failure() {
    let failed = judged(None, "");
    assert_eq!(failed, "failed: its answer did not arrive whole");
    assert!(!takes_worker_out(&HopFailure::Incomplete));
    assert!(!takes_worker_out(&HopFailure::TooLarge {
        bytes: 1,
        limit: 0
    }));
}

#[test]
fn connect_errors_timeouts_and_5xx_are_failures() {
    let reset = |reason: &str| {
        let body = format!(
            "upstream connect error or disconnect/reset before headers. reset reason: {reason}"
        );
        judged(Some(503), &body)
    };
    assert_eq!(reset("connection failure"), "failed: the connection failed");
    assert_eq!(
        reset("remote connection failure, transport failure reason: delayed connect error: 111"),
        "failed: the connection failed"
    );
    assert_eq!(reset("connection timeout"), "failed: the connection failed");
    for reason in ["remote reset", "connection termination"] {
        assert_eq!(
            reset(reason),
            "failed: it reset the connection before answering"
        );
    }
    assert_eq!(
        judged(Some(503), "overloaded"),
        "failed: it answered HTTP 503"
    );
    assert_eq!(judged(Some(504), ""), "failed: it timed out");
    let overflow =
        "upstream connect error or disconnect/reset before headers. reset reason: overflow";
    assert_eq!(
        judged(Some(503), overflow),
        "failed: the gateway's connection limit for it was reached"
    );
    assert_eq!(judged(Some(500), ""), "failed: it answered HTTP 500");
    assert_eq!(judged(Some(302), ""), "failed: it answered HTTP 302");
}

#[test]
fn a_decode_5xx_is_a_failure_and_says_whose() {
    assert_eq!(decode_failure(200, None), None);
    assert_eq!(decode_failure(429, Some("via_upstream")), None);
    assert_eq!(
        decode_failure(500, Some("via_upstream")),
        Some(HopFailure::Status(500))
    );
    assert_eq!(
        decode_failure(
            503,
            Some("upstream_reset_before_response_started{connection_failure}")
        ),
        Some(HopFailure::Connect)
    );
    assert_eq!(
        decode_failure(504, Some("upstream_response_timeout")),
        Some(HopFailure::Timeout)
    );
    for accepted_then_reset in ["remote_reset", "connection_termination"] {
        let details = format!("upstream_reset_before_response_started{{{accepted_then_reset}}}");
        assert_eq!(decode_failure(503, Some(&details)), Some(HopFailure::Reset));
    }
    assert_eq!(
        decode_failure(
            503,
            Some("upstream_reset_before_response_started{overflow}")
        ),
        Some(HopFailure::Overloaded)
    );
}

#[test]
fn only_a_failed_connection_takes_a_worker_out() {
    assert!(takes_worker_out(&HopFailure::Connect));
    for failure in [
        HopFailure::Reset,
        HopFailure::Overloaded,
        HopFailure::Timeout,
        HopFailure::Status(500),
        HopFailure::BadResponse("the body is not a JSON object"),
    ] {
        assert!(!takes_worker_out(&failure), "{failure}");
    }
}

#[test]
fn a_decode_call_fails_as_a_prefill_call_does_but_passes_anything_below_500() {
    for status in [200, 302, 400, 429] {
        assert_eq!(decode_call_failure(Some(status), b"{}"), None, "{status}");
    }
    assert_eq!(decode_call_failure(None, b""), Some(HopFailure::Incomplete));
    let refused = b"upstream connect error or disconnect/reset before headers. reset reason: connection failure";
    assert_eq!(
        decode_call_failure(Some(503), refused),
        Some(HopFailure::Connect)
    );
    assert_eq!(
        decode_call_failure(Some(504), b""),
        Some(HopFailure::Timeout)
    );
    assert_eq!(
        decode_call_failure(Some(500), b"engine error"),
        Some(HopFailure::Status(500))
    );
}

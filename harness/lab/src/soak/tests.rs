use std::collections::HashSet;
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::{Value, json};

use super::chaos::Outages;
use super::mix::{self, Expect, Kind, MIX, Planned};
use super::outcome::{Answer, Judgement, Timing, Verdict, judge};
use crate::load::Exchange;

const AFTERMATH: Duration = Duration::from_secs(3);

fn killed(outages: &Outages, worker: u64, began: Instant, ended: Instant) {
    outages.kill_begins(worker, began);
    outages.kill_ended(worker, ended);
}

/// Outages in which `worker` was killed and restarted while the request of `t` ran.
fn killed_during(t: Timing, worker: u64) -> Outages {
    let outages = Outages::default();
    killed(
        &outages,
        worker,
        t.started + Duration::from_millis(5),
        t.started + Duration::from_millis(6),
    );
    outages
}

fn exchange(status: u16, headers: &[(&'static str, &str)], body: &str) -> Exchange {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.insert(*name, HeaderValue::from_str(value).unwrap());
    }
    let bytes = body.as_bytes().to_vec();
    let tail = bytes[bytes.len().saturating_sub(64)..].to_vec();
    Exchange {
        status: StatusCode::from_u16(status).unwrap(),
        headers: map,
        first_byte: None,
        last_byte: Instant::now(),
        body_len: bytes.len() as u64,
        body: bytes,
        tail,
    }
}

fn error_body(code: &str) -> String {
    json!({"error": {"message": "m", "type": "t", "code": code}}).to_string()
}

/// The first planned request of this kind.
fn planned(kind: Kind, accept: impl Fn(&Planned) -> bool) -> Planned {
    (0..100_000u64)
        .map(|seq| mix::plan(7, seq, 8))
        .find(|p| p.kind == kind && accept(p))
        .unwrap()
}

fn timing() -> Timing {
    let started = Instant::now();
    Timing {
        started,
        ended: started + Duration::from_millis(50),
    }
}

/// `answer` to `planned`, judged as if no worker had been killed.
fn judged_without_faults(planned: &Planned, answer: &Exchange) -> Verdict {
    judge(
        planned,
        &Answer::Complete(answer),
        timing(),
        &Outages::default(),
        AFTERMATH,
    )
}

const COMPLETION_OK: &str = r#"{"choices":[{"text":"hi"}],"sim":{"kv_from":null}}"#;

#[test]
fn the_mix_draws_every_kind_reproducibly() {
    let kinds: HashSet<Kind> = (0..5_000).map(|seq| mix::plan(3, seq, 8).kind).collect();
    assert_eq!(kinds.len(), MIX.len());
    let again = mix::plan(3, 42, 8);
    assert_eq!(format!("{:?}", mix::plan(3, 42, 8)), format!("{again:?}"));
}

#[test]
fn valid_requests_have_json_bodies_and_the_others_expect_a_typed_refusal() {
    for seq in 0..2_000 {
        let planned = mix::plan(1, seq, 8);
        match planned.expect {
            Expect::Success => {
                if let Some(body) = &planned.body {
                    let body: Value = serde_json::from_slice(body).unwrap();
                    assert_eq!(body["stream"].as_bool().unwrap(), planned.stream);
                }
            }
            Expect::Rejected { status: 502, code } => {
                assert_eq!(
                    (planned.kind, code),
                    (Kind::HostilePrefillPin, "pinned_worker_failed")
                );
                assert_eq!(
                    planned.headers,
                    [("x-dynamo-prefill-instance-id", "103".to_string())]
                );
            }
            Expect::Rejected { status, .. } => {
                assert!([400, 404, 405, 413].contains(&status), "{planned:?}")
            }
        }
    }
}

#[test]
fn hostile_requests_are_what_their_kind_says() {
    let request = |kind| planned(kind, |_| true).request("r");
    let guess = planned(Kind::KvGuess, |_| true);
    let body: Value = serde_json::from_slice(guess.body.as_ref().unwrap()).unwrap();
    assert!(
        body["stream_options"]["include_usage"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:")
    );
    let nested = planned(Kind::NestedSteering, |_| true);
    let body = String::from_utf8(nested.body.unwrap().to_vec()).unwrap();
    assert!(body.contains("transfer_params"), "{body}");
    let wrong_method = request(Kind::WrongMethod);
    assert_ne!(wrong_method.method(), http::Method::POST);
    assert!([mix::COMPLETIONS, mix::CHAT].contains(&wrong_method.uri().path()));
    let control = request(Kind::ControlPath);
    assert!(![mix::COMPLETIONS, mix::CHAT, mix::MODELS].contains(&control.uri().path()));
    let oversized = request(Kind::OversizedBody);
    let length: usize = oversized.headers()["content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(length > mix::MAX_BODY_BYTES);
    assert_eq!(
        oversized.headers().get_all("content-type").iter().count(),
        1
    );
    let underscore = request(Kind::UnderscoreHeader);
    assert!(
        underscore
            .headers()
            .keys()
            .any(|name| name.as_str().contains('_'))
    );
}

#[test]
fn an_error_naming_a_worker_address_is_a_mismatch() {
    let planned = planned(Kind::KvGuess, |_| true);
    let withheld = exchange(
        400,
        &[("x-pinroute-error-code", "decode_refused")],
        &error_body("decode_refused"),
    );
    assert_eq!(
        judged_without_faults(&planned, &withheld).judgement,
        Judgement::AsExpected
    );
    let echo = json!({"error": {"message": "bad include_usage 127.0.0.1:8101", "type": "t",
        "code": "decode_refused"}});
    let leaked = exchange(
        400,
        &[("x-pinroute-error-code", "decode_refused")],
        &echo.to_string(),
    );
    let verdict = judged_without_faults(&planned, &leaked);
    assert_eq!(verdict.judgement, Judgement::Mismatch);
    assert!(verdict.problem.unwrap().contains("worker address"));
}

#[test]
fn a_complete_stream_is_as_expected() {
    let planned = planned(Kind::UnpinnedStream, |_| true);
    let stream = "data: {\"choices\":[]}\n\ndata: {\"sim\":{\"kv_from\":101}}\n\ndata: [DONE]\n\n";
    let headers = [
        ("x-pinroute-decode-worker", "201"),
        ("x-sim-worker-id", "201"),
        ("x-pinroute-prefill-worker", "101"),
    ];
    let answer = exchange(200, &headers, stream);
    let verdict = judged_without_faults(&planned, &answer);
    assert_eq!(verdict.judgement, Judgement::AsExpected, "{verdict:?}");
    assert_eq!(verdict.expected, "2xx");
}

#[test]
fn kv_from_another_prefill_worker_than_named_is_a_mismatch() {
    let planned = planned(Kind::Unpinned, |_| true);
    let headers = [
        ("x-pinroute-decode-worker", "201"),
        ("x-sim-worker-id", "201"),
        ("x-pinroute-prefill-worker", "101"),
    ];
    let answer = exchange(
        200,
        &headers,
        r#"{"choices":[{"text":"hi"}],"sim":{"kv_from":102}}"#,
    );
    let verdict = judged_without_faults(&planned, &answer);
    assert_eq!(verdict.judgement, Judgement::Mismatch);
    assert!(verdict.problem.unwrap().contains("KV of Some(102)"));
}

#[test]
fn a_pin_routed_elsewhere_is_a_mismatch() {
    let planned = planned(Kind::DecodePinHeader, |p| {
        p.pins.decode == Some(201) && !p.stream && p.pins.decode_rank.is_none()
    });
    let answer = exchange(
        200,
        &[
            ("x-pinroute-decode-worker", "203"),
            ("x-sim-worker-id", "203"),
        ],
        COMPLETION_OK,
    );
    let verdict = judged_without_faults(&planned, &answer);
    assert_eq!(verdict.judgement, Judgement::Mismatch);
    assert!(
        verdict
            .problem
            .unwrap()
            .contains("decode pinned to Some(201)")
    );
}

#[test]
fn an_invalid_request_needs_its_exact_code() {
    let planned = planned(Kind::BadJson, |_| true);
    let right = exchange(
        400,
        &[("x-pinroute-error-code", "invalid_body")],
        &error_body("invalid_body"),
    );
    let wrong = exchange(
        400,
        &[("x-pinroute-error-code", "invalid_field")],
        &error_body("invalid_field"),
    );
    let outages = Outages::default();
    assert_eq!(
        judge(
            &planned,
            &Answer::Complete(&right),
            timing(),
            &outages,
            AFTERMATH
        )
        .judgement,
        Judgement::AsExpected
    );
    let verdict = judge(
        &planned,
        &Answer::Complete(&wrong),
        timing(),
        &outages,
        AFTERMATH,
    );
    assert_eq!(
        (
            verdict.judgement,
            verdict.expected.as_str(),
            verdict.actual.as_str()
        ),
        (Judgement::Mismatch, "400 invalid_body", "400 invalid_field")
    );
}

#[test]
fn a_pin_to_a_worker_that_was_down_may_get_a_typed_error_but_not_an_untyped_one() {
    let planned = planned(Kind::DecodePinHeader, |p| p.pins.decode == Some(202));
    let t = timing();
    let outages = Outages::default();
    killed(
        &outages,
        202,
        t.started - Duration::from_millis(10),
        t.started - Duration::from_millis(9),
    );
    let typed = exchange(
        503,
        &[
            ("x-pinroute-error-code", "worker_unavailable"),
            ("retry-after", "1"),
        ],
        &error_body("worker_unavailable"),
    );
    let verdict = judge(&planned, &Answer::Complete(&typed), t, &outages, AFTERMATH);
    assert_eq!(verdict.judgement, Judgement::AsExpected, "{verdict:?}");
    assert!(verdict.expected.starts_with("2xx or typed"));
    let no_retry_after = exchange(
        503,
        &[("x-pinroute-error-code", "worker_unavailable")],
        &error_body("worker_unavailable"),
    );
    assert_eq!(
        judge(
            &planned,
            &Answer::Complete(&no_retry_after),
            t,
            &outages,
            AFTERMATH
        )
        .judgement,
        Judgement::Mismatch
    );
    let untyped = exchange(503, &[], "upstream connect error");
    let verdict = judge(
        &planned,
        &Answer::Complete(&untyped),
        t,
        &outages,
        AFTERMATH,
    );
    assert_eq!(
        (verdict.judgement, verdict.actual.as_str()),
        (Judgement::Mismatch, "503 untyped")
    );
}

#[test]
fn a_restarted_worker_is_expected_back_after_the_aftermath() {
    let planned = planned(Kind::DecodePinHeader, |p| p.pins.decode == Some(202));
    let t = timing();
    let outages = Outages::default();
    let long_ago = t.started - Duration::from_secs(10);
    killed(&outages, 202, long_ago, long_ago);
    outages.restarted(202, long_ago + Duration::from_secs(1));
    let typed = exchange(
        502,
        &[("x-pinroute-error-code", "pinned_worker_failed")],
        &error_body("pinned_worker_failed"),
    );
    let verdict = judge(&planned, &Answer::Complete(&typed), t, &outages, AFTERMATH);
    assert_eq!(
        (verdict.judgement, verdict.expected.as_str()),
        (Judgement::Mismatch, "2xx")
    );
}

#[test]
fn a_stream_cut_is_counted_apart_only_when_its_decode_worker_was_killed_meanwhile() {
    let planned = planned(Kind::ChatStream, |_| true);
    let t = timing();
    let mut headers = HeaderMap::new();
    headers.insert("x-pinroute-decode-worker", HeaderValue::from_static("202"));
    let error = crate::load::TransportError::Connect(
        "127.0.0.1:1".parse().unwrap(),
        std::io::ErrorKind::ConnectionReset.into(),
    );
    let cut = Answer::Cut {
        status: StatusCode::OK,
        headers: &headers,
        error: &error,
    };
    assert_eq!(
        judge(&planned, &cut, t, &Outages::default(), AFTERMATH).judgement,
        Judgement::Mismatch
    );
    let outages = killed_during(t, 202);
    assert_eq!(
        judge(&planned, &cut, t, &outages, AFTERMATH).judgement,
        Judgement::CutByKill
    );
}

/// An unpinned request that ran while decode worker 202 was killed, answered a typed 502
/// `upstream_failed` naming `decode_worker`, judged.
fn unpinned_502_during_a_kill_of_202(decode_worker: &str) -> Verdict {
    let planned = planned(Kind::Unpinned, |_| true);
    let t = timing();
    let outages = killed_during(t, 202);
    let failed = exchange(
        502,
        &[
            ("x-pinroute-error-code", "upstream_failed"),
            ("x-pinroute-decode-worker", decode_worker),
        ],
        &error_body("upstream_failed"),
    );
    judge(&planned, &Answer::Complete(&failed), t, &outages, AFTERMATH)
}

#[test]
fn an_unpinned_decode_cut_before_its_answer_is_a_typed_502_counted_apart() {
    let verdict = unpinned_502_during_a_kill_of_202("202");
    assert_eq!(verdict.judgement, Judgement::CutByKill, "{verdict:?}");
    assert_eq!(
        unpinned_502_during_a_kill_of_202("201").judgement,
        Judgement::Mismatch
    );
}

#[test]
fn a_decode_refusal_with_no_prefill_hop_is_the_workers_own_answer() {
    let planned = planned(Kind::KvGuess, |_| true);
    let body = json!({"error": {"message": "`include_usage` must be a boolean", "code": 400}});
    let own = exchange(
        400,
        &[("x-pinroute-decode-worker", "203")],
        &body.to_string(),
    );
    assert_eq!(
        judged_without_faults(&planned, &own).judgement,
        Judgement::AsExpected,
        "no KV to withhold: an aggregated fallback"
    );
    let after_a_prefill = exchange(
        400,
        &[
            ("x-pinroute-prefill-worker", "101"),
            ("x-pinroute-decode-worker", "203"),
        ],
        &body.to_string(),
    );
    assert_eq!(
        judged_without_faults(&planned, &after_a_prefill).judgement,
        Judgement::Mismatch
    );
}

#[test]
fn kv_lost_with_a_killed_prefill_worker_is_counted_apart() {
    let planned = planned(Kind::Unpinned, |_| true);
    let t = timing();
    let outages = killed_during(t, 102);
    let body = json!({"error": {"message": "kv_transfer_params do not match any prefill: could not fetch KV", "code": 400}}).to_string();
    let lost = exchange(
        400,
        &[
            ("x-pinroute-prefill-worker", "102"),
            ("x-sim-worker-id", "201"),
        ],
        &body,
    );
    let verdict = judge(&planned, &Answer::Complete(&lost), t, &outages, AFTERMATH);
    assert_eq!(
        (verdict.judgement, verdict.actual.as_str()),
        (Judgement::KvLost, "400 from decode worker: KV not found")
    );
    let other = exchange(
        400,
        &[
            ("x-pinroute-prefill-worker", "101"),
            ("x-sim-worker-id", "201"),
        ],
        &body,
    );
    assert_eq!(
        judge(&planned, &Answer::Complete(&other), t, &outages, AFTERMATH).judgement,
        Judgement::Mismatch
    );
}

#[test]
fn a_withheld_decode_refusal_with_a_killed_prefill_worker_is_kv_lost() {
    let planned = planned(Kind::Unpinned, |_| true);
    let t = timing();
    let outages = killed_during(t, 102);
    let body = json!({"error": {"message": "decode hop: worker 201 refused the request with HTTP 400", "type": "invalid_request_error", "code": "decode_refused"}}).to_string();
    let refused = |prefill| {
        exchange(
            400,
            &[
                ("x-pinroute-prefill-worker", prefill),
                ("x-pinroute-error-code", "decode_refused"),
            ],
            &body,
        )
    };
    let lost = refused("102");
    assert_eq!(
        judge(&planned, &Answer::Complete(&lost), t, &outages, AFTERMATH).judgement,
        Judgement::KvLost
    );
    let other = refused("101");
    assert_eq!(
        judge(&planned, &Answer::Complete(&other), t, &outages, AFTERMATH).judgement,
        Judgement::Mismatch,
        "its prefill worker was not killed"
    );
}

#[test]
fn every_outage_outlasts_the_passive_health_period() {
    assert!(super::chaos::MIN_DOWNTIME > super::deployment::UNHEALTHY_PERIOD);
}

#[test]
fn a_502_cut_by_kill_needs_envoy_to_have_seen_the_connection_reset() {
    let verdict = unpinned_502_during_a_kill_of_202("202");
    assert!(verdict.confirm_reset);
    let reset = verdict.clone().confirmed_by("soak-1-1", Some("UC"));
    assert_eq!(
        (reset.judgement, reset.confirm_reset),
        (Judgement::CutByKill, false)
    );
    let refused = verdict.clone().confirmed_by("soak-1-1", Some("UO,UF"));
    assert_eq!(refused.judgement, Judgement::Mismatch);
    assert!(refused.problem.unwrap().contains("soak-1-1"));
    assert_eq!(
        verdict.confirmed_by("soak-1-1", None).judgement,
        Judgement::Mismatch
    );
}

#[test]
fn the_access_log_gives_flags_by_request_id() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    std::fs::write(
        &path,
        concat!(
            r#"{"start_time":"2026-11-30T11:22:04.705Z","method":"POST","path":"/v1/chat/completions","status":502,"flags":"UO,UF","upstream":"127.0.0.1:46127","request_id":"soak-54-130"}"#,
            "\n",
            r#"{"start_time":"2026-11-30T11:22:04.705Z","method":"GET","path":"/v1/models","status":200,"flags":"-","upstream":"127.0.0.1:1","request_id":"soak-1-2"}"#,
            "\n",
            r#"{"request_id":"forged\" 200 - upstream=10.9.9.9:80 note=FAKE","flags":"-"}"#,
            "\n",
        ),
    )
    .unwrap();
    let flags = super::probe::access_log_flags(&path).unwrap();
    assert_eq!(flags["soak-54-130"], "UO,UF");
    assert_eq!(flags["soak-1-2"], "-");
    assert_eq!(flags["forged\" 200 - upstream=10.9.9.9:80 note=FAKE"], "-");
}

#[test]
fn a_kill_in_progress_counts_for_requests_that_end_meanwhile() {
    let t = timing();
    let outages = Outages::default();
    outages.kill_begins(202, t.started + Duration::from_millis(10));
    assert!(outages.killed_during(202, t.started, t.ended));
    assert!(!outages.killed_during(201, t.started, t.ended));
    outages.kill_ended(202, t.started + Duration::from_millis(20));
    let after = t.started + super::chaos::STALE_CONNECTION_GRACE;
    assert!(
        outages.killed_during(202, after, after + Duration::from_millis(5)),
        "a pooled connection to the dead worker can still fail a request just after"
    );
    let later = after + Duration::from_millis(100);
    assert!(!outages.killed_during(202, later, later + Duration::from_millis(5)));
    assert!(!outages.killed_during(202, t.started, t.started + Duration::from_millis(5)));
}

/// The soak's kill is abrupt: a stream in flight is cut, the port refuses connections, and a
/// worker restarts on the same address.
#[tokio::test]
async fn a_killed_sim_worker_cuts_its_streams_and_restarts_on_its_address() {
    use pinroute_harness::sim::{SimConfig, SimRole, SimWorker};
    let config =
        SimConfig::new(7, SimRole::Aggregated).with_token_latency(Duration::from_millis(100));
    let worker = SimWorker::start(config.clone(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = worker.addr();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let body = json!({"model": "sim-model", "prompt": "x", "max_tokens": 50, "stream": true});
    let mut response = client
        .post(format!("http://{addr}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.chunk().await.unwrap().is_some(), "the first token");
    worker.kill().await;
    let rest = async {
        loop {
            match response.chunk().await {
                Ok(Some(_)) => continue,
                other => return other.map(|_| ()),
            }
        }
    };
    assert!(rest.await.is_err(), "the stream is cut, not ended");
    assert!(
        client
            .get(format!("http://{addr}/health"))
            .send()
            .await
            .is_err(),
        "the port refuses"
    );
    let again = SimWorker::start(config, addr).await.unwrap();
    assert!(
        client
            .get(format!("http://{addr}/health"))
            .send()
            .await
            .unwrap()
            .status()
            .is_success()
    );
    again.stop().await;
}

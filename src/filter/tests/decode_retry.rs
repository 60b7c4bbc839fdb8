//! The filter's own retry of a refused decode hop to a worker known only from the live
//! registry, which the pool cluster does not list (`docs/semantics.md` §4).

use super::*;
use crate::policy::registry::Registry;

/// The static list: the pool cluster's only decode member is 201.
const STATIC: &str = r#"{"registry": {"cluster": "pinroute_registry"}, "workers": [
    {"id": 101, "role": "prefill", "address": "10.0.0.11:8000"},
    {"id": 201, "role": "decode", "address": "10.0.0.21:8000"}
]}"#;

/// The live registry: three decode workers the pool cluster does not list.
const LIVE: &str = r#"{"workers": [
    {"id": 101, "role": "prefill", "address": "10.0.0.11:8000"},
    {"id": 211, "role": "decode", "address": "10.0.1.11:8000"},
    {"id": 212, "role": "decode", "address": "10.0.1.12:8000"},
    {"id": 213, "role": "decode", "address": "10.0.1.13:8000"}
]}"#;

const CONNECT_FAILURE: &str = "upstream_reset_before_response_started{connection_failure}";

fn live_config() -> Config {
    let config = Config::from_json(STATIC.as_bytes()).unwrap();
    config.with_registry(Registry::from_json(LIVE.as_bytes()).unwrap())
}

/// The live worker at `address`.
fn worker_at(address: &str) -> u64 {
    match address {
        "10.0.1.11:8000" => 211,
        "10.0.1.12:8000" => 212,
        "10.0.1.13:8000" => 213,
        other => panic!("not a live decode worker: {other}"),
    }
}

/// A request with `extra` headers under the live registry, its headers sent.
fn live_request(headers: &[(&str, &str)], end_of_stream: bool) -> Request {
    let mut request =
        Request::with_config(FakeHost::default(), Rc::default(), live_config(), headers);
    request.headers(end_of_stream);
    request
}

/// A completion whose prefill answered with `KV`, routed to a live decode worker.
fn routed(extra: &[(&str, &str)]) -> Request {
    let mut request = live_request(&[COMPLETION_HEADERS, extra].concat(), false);
    assert_eq!(request.body(PROMPT), Flow::Pause);
    let call = request.prefill_call();
    let prefill_answer = format!(r#"{{"kv_transfer_params": {KV}}}"#);
    request.answer(&call, Some(200), &prefill_answer);
    request
}

impl Request {
    /// The worker the request is routed to.
    fn routed_to(&self) -> u64 {
        worker_at(&self.host.request_header("x-pinroute-upstream").unwrap())
    }

    /// Envoy's own 503 for a connection the worker refused: the actions on its headers and
    /// its body.
    fn refused(&mut self) -> (Flow, Flow) {
        let mut state = self.host.state();
        state.code_details = Some(CONNECT_FAILURE.into());
        state.response_headers = [(":status", "503")].into_iter().collect();
        state.response_body = REFUSED.as_bytes().to_vec();
        drop(state);
        let headers = self.response_headers(false);
        (headers, self.response_chunk(REFUSED.len(), true))
    }

    /// The only decode call in flight and the worker it goes to.
    fn decode_call(&self) -> (Call, u64) {
        let call = self.prefill_call();
        assert_eq!(call.cluster, "pinroute_decode");
        let worker = worker_at(call.header("x-pinroute-upstream").unwrap());
        (call, worker)
    }

    /// Answers `call` with `status` (none: no response), `headers` and `body`.
    fn answer_with(
        &mut self,
        call: &Call,
        status: Option<u16>,
        headers: &[(&str, &str)],
        body: &str,
    ) {
        let status = status.map(|s| (":status".to_string(), s.to_string().into_bytes()));
        let headers = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()));
        self.host.state().call_answer = (
            status.into_iter().chain(headers).collect(),
            body.as_bytes().to_vec(),
        );
        self.call_answer(call.token, body.len());
    }

    fn only_sent(&self) -> fake_host::Sent {
        let mut sent = self.host.take_sent();
        assert_eq!(sent.len(), 1, "{sent:?}");
        sent.remove(0)
    }
}

#[test]
fn a_refused_connection_goes_on_to_the_next_candidate_with_the_routed_request() {
    let mut request = routed(&[("authorization", "Bearer t")]);
    let first = request.routed_to();
    assert_eq!(request.host.request_header("x-pinroute-pool"), None);
    let routed_body = request.request_body();
    assert!(routed_body.contains("engine-101"), "{routed_body}");

    assert_eq!(
        request.refused(),
        (Flow::Pause, Flow::Pause),
        "Envoy's 503 is held"
    );
    let (call, next) = request.decode_call();
    assert_ne!(next, first);
    assert_eq!(String::from_utf8(call.body.clone()).unwrap(), routed_body);
    assert_eq!(call.header(":method"), Some("POST"));
    assert_eq!(call.header(":path"), Some("/v1/completions"));
    assert_eq!(call.header("x-request-id"), Some("req-1"));
    assert_eq!(call.header("authorization"), Some("Bearer t"));
    assert_eq!(call.header("content-type"), Some("application/json"));
    assert_eq!(call.header("content-length"), None);
    assert_eq!(call.timeout, std::time::Duration::from_secs(300));
    assert_eq!(
        (request.outstanding(first), request.outstanding(next)),
        (0, 1)
    );

    let events = "data: {\"text\": \"hi\"}\n\ndata: [DONE]\n\n";
    let answer_headers = [
        ("content-type", "text/event-stream"),
        ("content-length", "999"),
        ("x-pinroute-error-code", "forged"),
    ];
    request.answer_with(&call, Some(200), &answer_headers, events);
    let sent = request.only_sent();
    assert_eq!(sent.status, 200);
    assert_eq!(String::from_utf8(sent.body.clone()).unwrap(), events);
    assert_eq!(sent.header("content-type"), Some("text/event-stream"));
    assert_eq!(sent.header("content-length"), None, "Envoy frames it anew");
    assert_eq!(sent.header("x-pinroute-error-code"), None);
    let served = next.to_string();
    assert_eq!(
        sent.header("x-pinroute-decode-worker"),
        Some(served.as_str())
    );
    assert_eq!(sent.header("x-pinroute-prefill-worker"), Some("101"));
    assert_eq!(request.host.metric("pinroute.workers.connect_failed"), 1);
    assert_eq!(request.host.metric("pinroute.decode.retried"), 1);
    assert_eq!(request.host.metric("pinroute.decode.failed"), 0);
    request.end();
    assert_eq!(request.outstanding(next), 0);
}

#[test]
fn when_every_candidate_refuses_the_client_gets_upstream_failed() {
    let mut request = routed(&[]);
    let first = request.routed_to();
    request.refused();
    let (call, second) = request.decode_call();
    request.answer_with(&call, Some(503), &[], REFUSED);
    let (call, third) = request.decode_call();
    let tried = std::collections::HashSet::from([first, second, third]);
    assert_eq!(tried.len(), 3, "three candidates, each once");
    request.answer_with(&call, Some(503), &[], REFUSED);
    let sent = request.only_sent();
    assert_eq!(sent.status, 502);
    assert_eq!(sent.json()["error"]["code"], "upstream_failed");
    assert!(request.host.take_calls().is_empty(), "no fourth attempt");
    assert_eq!(request.host.metric("pinroute.workers.connect_failed"), 3);
    assert_eq!(request.host.metric("pinroute.decode.retried"), 2);
    assert_eq!(request.host.metric("pinroute.decode.failed"), 1);
    assert_eq!(request.host.metric("pinroute.errors.upstream_failed"), 1);
    request.end();
    assert!(tried.iter().all(|w| request.outstanding(*w) == 0));
}

#[test]
fn a_retried_call_that_broke_off_is_no_connection_failure_and_goes_no_further() {
    let mut request = routed(&[]);
    request.refused();
    let (call, _) = request.decode_call();
    request.answer_with(&call, None, &[], "");
    let sent = request.only_sent();
    assert_eq!(sent.status, 502);
    assert_eq!(sent.json()["error"]["code"], "upstream_failed");
    assert!(request.host.take_calls().is_empty(), "not sent again");
    assert_eq!(
        request.host.metric("pinroute.workers.connect_failed"),
        1,
        "only the refused connection counts"
    );
}

#[test]
fn a_retried_workers_own_answers_are_judged_as_the_routed_hops_are() {
    let mut failing = routed(&[]);
    failing.refused();
    let (call, _) = failing.decode_call();
    failing.answer_with(&call, Some(500), &[], "engine error");
    let sent = failing.only_sent();
    assert_eq!(sent.json()["error"]["code"], "upstream_failed");
    assert!(
        failing.host.take_calls().is_empty(),
        "something reached that worker: not tried elsewhere"
    );

    let mut refusing = routed(&[]);
    refusing.refused();
    let (call, _) = refusing.decode_call();
    let echo = r#"{"error": "bad field near 10.0.0.11 engine-101"}"#;
    refusing.answer_with(&call, Some(400), &[], echo);
    let sent = refusing.only_sent();
    assert_eq!(sent.status, 400);
    assert_eq!(sent.json()["error"]["code"], "decode_refused");
    assert!(!String::from_utf8(sent.body).unwrap().contains("engine-101"));
}

#[test]
fn a_pinned_hop_is_never_retried_elsewhere() {
    let mut request = routed(&[("x-dynamo-worker-instance-id", "212")]);
    assert_eq!(request.routed_to(), 212);
    let (headers, _) = request.refused();
    assert_eq!(headers, Flow::Continue);
    assert!(request.host.take_calls().is_empty());
    let code = request.host.response_header("x-pinroute-error-code");
    assert_eq!(code.as_deref(), Some("pinned_worker_failed"));
}

#[test]
fn another_path_without_a_body_is_retried_without_one() {
    let mut request = live_request(&[(":method", "GET"), (":path", "/v1/models")], true);
    let first = request.routed_to();
    request.refused();
    let (call, next) = request.decode_call();
    assert_ne!(next, first);
    assert_eq!(call.header(":method"), Some("GET"));
    assert!(call.body.is_empty());
    request.answer_with(
        &call,
        Some(200),
        &[("content-type", "application/json")],
        "{}",
    );
    assert_eq!(request.only_sent().status, 200);
}

#[test]
fn the_filters_own_decode_retry_names_envoys_request_span() {
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let headers = [
        ("x-pinroute-trace", &*format!("{trace}/b7ad6b7169203331")),
        ("traceparent", &*format!("00-{trace}-00f067aa0ba902b7-01")),
    ];
    let mut request = routed(&headers);
    request.refused();
    let (call, _) = request.decode_call();
    assert_eq!(
        call.header("traceparent"),
        Some(&*format!("00-{trace}-b7ad6b7169203331-01")),
        "not the client's span"
    );
    assert_eq!(call.header("x-pinroute-trace"), None);
}

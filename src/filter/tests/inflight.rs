//! The in-flight limit (`docs/semantics.md` §1): a completion over it is refused before its
//! body is read, and every request gives its slot back once, however its stream ends.

use super::*;
use crate::policy::inflight::STALE_NANOS;

const LIMIT: &str = r#""max_requests_in_flight": 2"#;

/// A VM of a gateway: its requests in flight, named in the shared table of `host`.
fn vm(host: &FakeHost) -> Rc<Slots> {
    let slots = Rc::new(Slots::default());
    super::super::shared::initialize(host);
    slots.join(host);
    slots
}

/// A completion whose headers arrived on `slots`' VM: admitted (paused for its body) or not.
fn arrive(host: &FakeHost, slots: &Rc<Slots>) -> Request {
    let mut request = Request::on_vm(
        host.clone(),
        slots.clone(),
        &config_with(LIMIT),
        COMPLETION_HEADERS,
    );
    assert_eq!(request.headers(false), Flow::Pause);
    request
}

/// A completion admitted and waiting for its prefill.
fn prefilling(host: &FakeHost, slots: &Rc<Slots>) -> (Request, Call) {
    let mut request = arrive(host, slots);
    assert!(host.take_sent().is_empty(), "admitted");
    assert_eq!(request.body(PROMPT), Flow::Pause);
    let call = request.prefill_call();
    (request, call)
}

/// Whether a new completion is admitted now; it leaves at once (its slot, if any, given back).
fn admits_one_more(host: &FakeHost, slots: &Rc<Slots>) -> bool {
    let mut request = arrive(host, slots);
    let refused = host.take_sent();
    request.end();
    refused.is_empty()
}

#[test]
fn a_completion_over_the_limit_is_a_typed_503_before_its_body_is_read() {
    let host = FakeHost::default();
    let slots = vm(&host);
    let _held = [prefilling(&host, &slots), prefilling(&host, &slots)];

    let mut request = arrive(&host, &slots);
    let sent = host.take_sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status, 503);
    assert_eq!(sent[0].json()["error"]["code"], "overloaded");
    assert_eq!(sent[0].header("x-pinroute-error-code"), Some("overloaded"));
    assert_eq!(sent[0].header("retry-after"), Some("1"));
    host.state().request_body = PROMPT.as_bytes().to_vec();
    assert_eq!(
        request.body_chunk(PROMPT.len(), true),
        Flow::Pause,
        "the body of a refused request is not read"
    );
    assert!(host.take_calls().is_empty(), "no hop");
    assert_eq!(host.metric("pinroute.errors.overloaded"), 1);
    request.end();
    assert!(
        !admits_one_more(&host, &slots),
        "a refused request held no slot"
    );
}

#[test]
fn other_paths_take_no_slot() {
    let host = FakeHost::default();
    let slots = vm(&host);
    let _held = [prefilling(&host, &slots), prefilling(&host, &slots)];
    let headers = [(":method", "GET"), (":path", "/v1/models")];
    let mut request = Request::on_vm(host.clone(), slots, &config_with(LIMIT), &headers);
    assert_eq!(request.headers(true), Flow::Continue);
}

#[test]
fn the_slot_is_given_back_once_however_the_stream_ends() {
    type Ending = fn(&FakeHost, &Rc<Slots>) -> Request;
    let endings: [(&str, Ending); 4] = [
        ("served", |host, slots| {
            let (mut request, call) = prefilling(host, slots);
            request.answer(
                &call,
                Some(200),
                &format!(r#"{{"kv_transfer_params": {KV}}}"#),
            );
            assert_eq!(request.respond(200, Some("{}")), Flow::Continue);
            request
        }),
        ("refused by the filter", |host, slots| {
            let mut request = arrive(host, slots);
            request.body("not json");
            assert_eq!(host.take_sent()[0].status, 400);
            request
        }),
        ("the client gone during its prefill", |host, slots| {
            prefilling(host, slots).0
        }),
        ("every hop failed", |host, slots| {
            let (mut request, call) = prefilling(host, slots);
            request.answer(&call, Some(500), "");
            let retry = request.prefill_call();
            request.answer(&retry, None, "");
            host.state().code_details =
                Some("upstream_reset_before_response_started{connection_termination}".into());
            request.respond(503, Some("upstream connect error"));
            request
        }),
    ];
    for (how, end) in endings {
        let host = FakeHost::default();
        let slots = vm(&host);
        let mut first = end(&host, &slots);
        let mut second = end(&host, &slots);
        assert!(
            !admits_one_more(&host, &slots),
            "{how}: the limit is reached"
        );
        first.end();
        first.end();
        let mut third = arrive(&host, &slots);
        assert!(host.take_sent().is_empty(), "{how}: a slot is free again");
        assert!(
            !admits_one_more(&host, &slots),
            "{how}: only one slot was given back"
        );
        second.end();
        third.end();
        let (a, b) = (
            admits_one_more(&host, &slots),
            admits_one_more(&host, &slots),
        );
        assert!(a && b, "{how}: both slots are free");
        let _ = arrive(&host, &slots);
        let _ = arrive(&host, &slots);
        assert!(
            !admits_one_more(&host, &slots),
            "{how}: and the limit still holds"
        );
    }
}

#[test]
fn the_limit_is_the_gateways_over_every_thread_and_forgets_a_vm_that_died() {
    let host = FakeHost::default();
    let (first, second) = (vm(&host), vm(&host));
    let _on_first = prefilling(&host, &first);
    let dying = prefilling(&host, &second);
    assert!(
        !admits_one_more(&host, &first),
        "the second thread's request counts"
    );
    assert!(!admits_one_more(&host, &second));

    drop(dying); // its VM failed: no on_log, no more ticks
    host.state().now += STALE_NANOS / 2;
    first.publish(&host);
    assert!(!admits_one_more(&host, &first), "not forgotten yet");
    host.state().now += STALE_NANOS;
    assert!(
        admits_one_more(&host, &first),
        "the dead VM's request no longer counts"
    );
    let replacement = vm(&host);
    let _on_replacement = prefilling(&host, &replacement);
    assert!(!admits_one_more(&host, &first));
}

#[test]
fn with_the_limit_off_nothing_is_counted() {
    let host = FakeHost::default();
    let slots = vm(&host);
    let config = config_with(r#""max_requests_in_flight": 0"#);
    for _ in 0..3 {
        let mut request = Request::on_vm(host.clone(), slots.clone(), &config, COMPLETION_HEADERS);
        assert_eq!(request.headers(false), Flow::Pause);
        assert!(host.take_sent().is_empty());
    }
}

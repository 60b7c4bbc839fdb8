//! The SDK's call bookkeeping (`src/vendor/proxy-wasm/PATCHES.md`): a host that cancels the
//! calls of a stream that ends without answering them (this host does), a late answer for a
//! forgotten call (Envoy's way), and call ids reused once Envoy's counter wraps.

use pinroute_tests::Host;

use crate::{PROMPT, REGISTRY, host, send_completion};

const PREFILL_ANSWER: &str = r#"{"id": "cmpl-1", "choices": [{"text": "x"}], "kv_transfer_params": {"remote_engine_id": "e-101", "remote_block_ids": [1, 2]}}"#;

/// A completion whose client leaves during its prefill hop; returns the call's token.
fn cancelled_prefill(host: &mut Host) -> u32 {
    let ctx = send_completion(host, &[], PROMPT);
    let calls = host.take_http_calls();
    assert_eq!(calls.len(), 1, "one prefill hop dispatched");
    host.done(ctx).unwrap();
    assert!(host.pending_http_calls().is_empty(), "Envoy cancelled it");
    calls[0].token
}

#[test]
fn a_token_reused_after_its_stream_ended_reaches_the_new_stream() {
    let mut host = host(REGISTRY);
    let token = cancelled_prefill(&mut host);

    host.set_next_http_call_token(token);
    let ctx = send_completion(&mut host, &[], PROMPT);
    let calls = host.take_http_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].token, token, "the host reused the id");
    host.http_call_response(token, &[(":status", "200")], PREFILL_ANSWER.as_bytes())
        .unwrap();

    let stream = host.stream(ctx).unwrap();
    assert!(
        stream.request_resumed && stream.request_forwarded,
        "the answer reached the stream that owns the token now"
    );
    assert!(host.failure().is_none(), "{:?}", host.failure());
}

#[test]
fn an_answer_for_a_forgotten_or_unknown_token_is_ignored() {
    let mut host = host(REGISTRY);
    let forgotten = cancelled_prefill(&mut host);

    host.stray_http_call_response(forgotten).unwrap();
    host.stray_http_call_response(forgotten.wrapping_add(1000))
        .unwrap();

    let ctx = send_completion(&mut host, &[], PROMPT);
    let call = host.take_http_calls().remove(0);
    host.http_call_response(call.token, &[(":status", "200")], PREFILL_ANSWER.as_bytes())
        .unwrap();
    assert!(host.stream(ctx).unwrap().request_forwarded);
    assert!(host.failure().is_none(), "{:?}", host.failure());
}

/// Memory, and the filter's gauge of it, once a new stream made the filter report.
fn reported_memory(host: &mut Host) -> (u64, Option<i64>) {
    let ctx = host.new_http_stream().unwrap();
    host.done(ctx).unwrap();
    (host.memory_bytes(), host.gauge("pinroute.vm.memory_bytes"))
}

#[test]
fn ended_streams_leave_no_call_behind() {
    let mut host = host(REGISTRY);
    for _ in 0..500 {
        cancelled_prefill(&mut host);
    }
    let (warm, warm_gauge) = reported_memory(&mut host);
    for _ in 0..10_000 {
        cancelled_prefill(&mut host);
    }
    let (end, end_gauge) = reported_memory(&mut host);

    assert_eq!(warm_gauge, Some(i64::try_from(warm).unwrap()));
    assert_eq!(end_gauge, Some(i64::try_from(end).unwrap()));
    assert_eq!(
        end, warm,
        "10 000 cancelled prefill hops grew the VM's memory"
    );
    assert!(host.failure().is_none(), "{:?}", host.failure());
}

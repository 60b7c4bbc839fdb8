//! Prefix affinity, the turn memory and the prefill hops skipped by choice, through the
//! request path (`docs/semantics.md` §4, §5).

use super::*;

/// A chat body: a long system prompt, `turns` exchanges, and the next question (so that
/// `chat(n + 1)` continues `chat(n)`, as a client resends a conversation).
fn chat(turns: usize) -> String {
    let mut messages = vec![format!(
        r#"{{"role":"system","content":"{}"}}"#,
        "You are a careful assistant. ".repeat(60)
    )];
    for i in 0..turns {
        messages.push(format!(r#"{{"role":"user","content":"question {i}"}}"#));
        messages.push(format!(r#"{{"role":"assistant","content":"answer {i}"}}"#));
    }
    messages.push(format!(r#"{{"role":"user","content":"question {turns}"}}"#));
    format!(
        r#"{{"model":"m","messages":[{}],"max_tokens":4}}"#,
        messages.join(",")
    )
}

/// A completion request that its body sends on at once, without a prefill hop.
fn routed_at_once(host: FakeHost, config: &str, extra: &[(&str, &str)], body: &str) -> Request {
    let headers = [extra, COMPLETION_HEADERS].concat();
    let mut request = Request::on(host, config, &headers);
    assert_eq!(request.headers(false), Flow::Pause);
    assert_eq!(request.body(body), Flow::Continue, "routed at once");
    request
}

const CHAT_HEADERS: &[(&str, &str)] = &[(":path", "/v1/chat/completions")];

/// Serves one chat request on `host` through both hops; returns its prefill and decode worker.
fn serve(host: &FakeHost, config: &str, body: &str) -> (u64, u64) {
    serve_on(host, config, CHAT_HEADERS, body)
}

/// [`serve`] on the path `headers` name.
fn serve_on(host: &FakeHost, config: &str, headers: &[(&str, &str)], body: &str) -> (u64, u64) {
    let mut request = Request::completion_on(host.clone(), config, headers, body);
    let call = request.prefill_call();
    let prefill = match call.header(":authority") {
        Some("10.0.0.11:8000") => 101,
        Some("10.0.0.12:8000") => 102,
        other => panic!("prefill sent to {other:?}"),
    };
    request.answer(
        &call,
        Some(200),
        &format!(r#"{{"kv_transfer_params": {KV}}}"#),
    );
    let decode = match request
        .host
        .request_header("x-pinroute-upstream")
        .as_deref()
    {
        Some("10.0.0.21:8000") => 201,
        Some("10.0.0.22:8000") => 202,
        other => panic!("decode routed to {other:?}"),
    };
    request.respond(200, Some("{}"));
    request.end();
    (prefill, decode)
}

#[test]
fn a_long_system_prompt_kept_apart_from_the_messages_places_them() {
    let messages_api: &[(&str, &str)] = &[(":path", "/v1/messages")];
    let responses_api: &[(&str, &str)] = &[(":path", "/v1/responses")];
    let placed = |system: usize, question: usize| {
        let system_text = format!("System prompt {system}. ").repeat(80);
        let messages = format!(
            r#"{{"model":"m","max_tokens":4,"system":"{system_text}","messages":[{{"role":"user","content":"question {question}"}}]}}"#
        );
        let responses = format!(
            r#"{{"model":"m","store":false,"instructions":"{system_text}","input":"question {question}"}}"#
        );
        let host = FakeHost::default();
        let by_messages = serve_on(&host, REGISTRY, messages_api, &messages).0;
        let by_responses = serve_on(&host, REGISTRY, responses_api, &responses).0;
        (by_messages, by_responses)
    };
    for system in 0..8 {
        let first = placed(system, 0);
        for question in 1..4 {
            assert_eq!(placed(system, question), first, "system prompt {system}");
        }
    }
    let workers: std::collections::HashSet<u64> =
        (0..8).map(|system| placed(system, 0).0).collect();
    assert_eq!(
        workers.len(),
        2,
        "the system prompt, not the load, places them"
    );
}

#[test]
fn the_same_long_prompt_goes_to_the_same_workers_and_is_remembered() {
    let host = FakeHost::default();
    let first = serve(&host, REGISTRY, &chat(1));
    assert_eq!(host.metric("pinroute.placement.prefill.affinity"), 1);
    assert_eq!(host.metric("pinroute.placement.decode.affinity"), 1);
    let remembered = (0..4096).any(|slot| host.shared(&format!("pinroute.turn.{slot}")).is_some());
    assert!(remembered, "the turn is remembered");
    for _ in 0..3 {
        assert_eq!(
            serve(&FakeHost::default(), REGISTRY, &chat(1)),
            first,
            "a fresh replica agrees"
        );
    }
    let next = serve(&host, REGISTRY, &chat(2));
    assert_eq!(next, first, "the next turn goes back to the same workers");
    assert_eq!(host.metric("pinroute.placement.prefill.remembered"), 1);
}

#[test]
fn the_next_turn_on_the_same_decode_worker_skips_the_prefill_hop() {
    let config = config_with(r#""local_prefill_suffix_bytes": 512"#);
    let host = FakeHost::default();
    let (_, decode) = serve(&host, &config, &chat(1));
    let next = chat(2);
    let mut request = routed_at_once(host.clone(), &config, CHAT_HEADERS, &next);
    assert!(host.take_calls().is_empty(), "no prefill hop");
    assert_eq!(
        request.request_body(),
        next,
        "the body goes as the client sent it"
    );
    let upstream = host.request_header("x-pinroute-upstream");
    let expected = if decode == 201 {
        "10.0.0.21:8000"
    } else {
        "10.0.0.22:8000"
    };
    assert_eq!(upstream.as_deref(), Some(expected));
    assert_eq!(host.metric("pinroute.prefill.local_next_turn"), 1);
    assert_eq!(host.metric("pinroute.prefill.aggregated_fallback"), 0);
    request.respond(200, Some("{}"));
    assert_eq!(host.response_header("x-pinroute-prefill-worker"), None);
    request.end();
    let far = chat(40);
    Request::completion_on(host.clone(), &config, CHAT_HEADERS, &far);
    assert_eq!(
        host.take_calls().len(),
        1,
        "a prompt that adds more takes both hops"
    );
}

#[test]
fn a_short_prompt_skips_the_prefill_hop_when_asked() {
    let config = config_with(r#""local_prefill_max_bytes": 64"#);
    let mut request = routed_at_once(FakeHost::default(), &config, &[], PROMPT);
    assert!(request.host.take_calls().is_empty());
    assert_eq!(request.request_body(), PROMPT);
    assert_eq!(
        request.host.metric("pinroute.prefill.local_short_prompt"),
        1
    );
    request.respond(200, Some("{}"));
    let pinned = [("x-dynamo-prefill-instance-id", "102")];
    let request = Request::completion(&config, &pinned, PROMPT);
    assert_eq!(
        request.host.take_calls().len(),
        1,
        "a pinned prefill hop is taken whatever the prompt"
    );
}

#[test]
fn both_hops_pinned_reads_no_prompt_and_remembers_nothing() {
    let host = FakeHost::default();
    let pins = [
        (":path", "/v1/chat/completions"),
        ("x-dynamo-prefill-instance-id", "102"),
        ("x-dynamo-worker-instance-id", "201"),
    ];
    let request = Request::completion_on(host.clone(), REGISTRY, &pins, &chat(3));
    assert_eq!(request.host.take_calls().len(), 1);
    let remembered = (0..4096).any(|slot| host.shared(&format!("pinroute.turn.{slot}")).is_some());
    assert!(!remembered);
    assert_eq!(host.metric("pinroute.placement.prefill.affinity"), 0);
}

#[test]
fn a_clients_pin_or_session_never_becomes_another_requests_placement() {
    let remembered = |host: &FakeHost| {
        (0..4096).any(|slot| host.shared(&format!("pinroute.turn.{slot}")).is_some())
    };
    for steering in [
        ("x-dynamo-worker-instance-id", "202"),
        ("x-dynamo-prefill-instance-id", "102"),
        ("x-dynamo-session-id", "attacker"),
    ] {
        let host = FakeHost::default();
        let headers = [CHAT_HEADERS, &[steering]].concat();
        let mut first = Request::completion_on(host.clone(), REGISTRY, &headers, &chat(1));
        let call = first.prefill_call();
        first.answer(
            &call,
            Some(200),
            &format!(r#"{{"kv_transfer_params": {KV}}}"#),
        );
        first.respond(200, Some("{}"));
        first.end();
        assert!(
            !remembered(&host),
            "{steering:?} placed nothing in the memory"
        );
        serve(&host, REGISTRY, &chat(2));
        assert_eq!(
            host.metric("pinroute.placement.decode.remembered"),
            0,
            "{steering:?}"
        );
        assert_eq!(
            host.metric("pinroute.placement.prefill.remembered"),
            0,
            "{steering:?}"
        );
    }
}

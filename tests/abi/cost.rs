//! What one streamed completion costs in crossings between Envoy and the VM: every entry into
//! the VM (callbacks, and the allocator the host calls to hand data over) and every host
//! call. In V8 each crossing costs far more than the same work inside the VM, so these are
//! the counts `docs/benchmarks.md` explains the filter's CPU with, and the bounds below keep
//! a change from adding crossings unnoticed.

use pinroute_tests::{CallCounts, Host, HostOptions};

use crate::{REGISTRY, engine_load, send_completion, wasm};

const PREFILL_ANSWER: &str = r#"{"id": "cmpl-1", "choices": [{"text": "x"}], "kv_transfer_params": {"remote_engine_id": "e-101", "remote_block_ids": [1, 2]}}"#;
/// A 1 KB completion, as `pinroute-lab bench` sends at its smallest size.
const PROMPT_BYTES: usize = 1024;
/// Streamed chunks of the decode answer (8 tokens and `[DONE]`, as the bench's sims send).
const CHUNKS: usize = 9;

/// The host call that writes an access-log field (`docs/metrics.md`, "The access log").
const LOG_FIELD_CALL: &str = "proxy_set_property";

fn counting_host(config: &str) -> Host {
    let options = HostOptions {
        allow_on_headers_stop_iteration: true,
        clusters: Some(vec!["pinroute_prefill".into()]),
        count_calls: true,
        ..HostOptions::default()
    };
    Host::with_options(&wasm(), config, options).unwrap()
}

fn body() -> String {
    let head = r#"{"model": "m", "max_tokens": 8, "stream": true, "prompt": ""#;
    let tail = r#""}"#;
    let words = "a ".repeat((PROMPT_BYTES - head.len() - tail.len()) / 2);
    format!("{head}{words}{tail}")
}

/// One request from its headers to `proxy_on_delete`; returns what it crossed.
fn one_request(host: &mut Host, pins: &[(&str, &str)]) -> CallCounts {
    host.reset_call_counts();
    let ctx = send_completion(host, pins, &body());
    let calls = host.take_http_calls();
    assert_eq!(calls.len(), 1, "one prefill hop");
    host.http_call_response(
        calls[0].token,
        &[(":status", "200")],
        PREFILL_ANSWER.as_bytes(),
    )
    .unwrap();
    assert!(host.stream(ctx).unwrap().request_forwarded);
    host.response_headers(
        ctx,
        &[(":status", "200"), ("content-type", "text/event-stream")],
        false,
    )
    .unwrap();
    for chunk in 0..CHUNKS {
        let data = format!("data: {{\"choices\": [{{\"text\": \"t{chunk}\"}}]}}\n\n");
        host.response_body(ctx, data.as_bytes(), chunk + 1 == CHUNKS)
            .unwrap();
    }
    host.done(ctx).unwrap();
    assert!(host.failure().is_none(), "{:?}", host.failure());
    host.call_counts().clone()
}

fn report(label: &str, counts: &CallCounts) {
    println!(
        "{label}: {} VM entries, {} host calls",
        counts.vm_entries_total(),
        counts.host_calls_total()
    );
    for (name, n) in &counts.vm_entries {
        println!("  into the VM  {n:>3} {name}");
    }
    for (name, n) in &counts.host_calls {
        println!("  to the host  {n:>3} {name}");
    }
}

/// Measured for the filter as it is (the in-flight limit on, its default); raise a bound
/// only with the reason in the commit.
struct Bound {
    vm_entries: u64,
    /// Host calls of the request path, the access log's fields apart.
    host_calls: u64,
    /// The access log's fields, one host call each (none with `access_log_fields: false`).
    log_fields: u64,
}

/// Requests before the measured one: the VM's heap has grown to what a request needs (a
/// growth is reported to the memory gauge, one host call, not a cost of every request).
const WARM_UP_REQUESTS: usize = 3;

fn check(label: &str, config: &str, pins: &[(&str, &str)], bound: Bound) -> CallCounts {
    check_on(counting_host(config), label, pins, bound)
}

/// [`check`] on `host`, configured and prepared already.
fn check_on(mut host: Host, label: &str, pins: &[(&str, &str)], bound: Bound) -> CallCounts {
    for _ in 0..WARM_UP_REQUESTS {
        one_request(&mut host, pins);
    }
    let counts = one_request(&mut host, pins);
    report(label, &counts);
    assert!(
        counts.vm_entries_total() <= bound.vm_entries,
        "{label}: {} VM entries, more than {}",
        counts.vm_entries_total(),
        bound.vm_entries
    );
    let log_fields = counts.host_calls.get(LOG_FIELD_CALL).copied().unwrap_or(0);
    let path_calls = counts.host_calls_total() - log_fields;
    assert!(
        path_calls <= bound.host_calls,
        "{label}: {path_calls} host calls, more than {}",
        bound.host_calls
    );
    assert!(
        log_fields <= bound.log_fields,
        "{label}: {log_fields} access-log fields written, more than {}",
        bound.log_fields
    );
    let callbacks = counts.vm_entries.get("proxy_on_response_body").copied();
    assert_eq!(
        callbacks,
        Some(CHUNKS as u64),
        "one response-body callback per streamed chunk"
    );
    counts
}

#[test]
fn an_unpinned_streamed_completion_crosses_into_the_vm_and_out_a_bounded_number_of_times() {
    check(
        "unpinned",
        REGISTRY,
        &[],
        Bound {
            vm_entries: 26,
            host_calls: 39,
            log_fields: 6,
        },
    );
}

#[test]
fn the_engines_load_costs_a_request_no_crossing() {
    let bound = || Bound {
        vm_entries: 26,
        host_calls: 39,
        log_fields: 6,
    };
    let without = check("unpinned, engine load off", REGISTRY, &[], bound());
    let mut host = counting_host(&engine_load::engine_config());
    let scraped = engine_load::scrape_round(&mut host, |_| {
        Some(("200", engine_load::page(2, 1).into_bytes()))
    });
    assert_eq!(scraped, 4);
    assert_eq!(host.counter("pinroute.engine.scraped"), Some(4));
    let with = check_on(host, "unpinned, engine load on", &[], bound());
    assert_eq!(
        (with.vm_entries_total(), with.host_calls_total()),
        (without.vm_entries_total(), without.host_calls_total()),
        "the figures are read from the thread's copy"
    );
}

#[test]
fn without_access_log_fields_a_request_writes_none() {
    let config = REGISTRY.replacen('{', r#"{"access_log_fields": false, "#, 1);
    let counts = check(
        "unpinned, no access-log fields",
        &config,
        &[],
        Bound {
            vm_entries: 26,
            host_calls: 39,
            log_fields: 0,
        },
    );
    assert_eq!(counts.host_calls.get(LOG_FIELD_CALL), None);
}

#[test]
fn a_pinned_streamed_completion_crosses_into_the_vm_and_out_a_bounded_number_of_times() {
    check(
        "pinned",
        REGISTRY,
        &[
            ("x-dynamo-prefill-instance-id", "101"),
            ("x-dynamo-worker-instance-id", "201"),
        ],
        Bound {
            vm_entries: 26,
            host_calls: 39,
            log_fields: 8,
        },
    );
}

//! What one streamed completion costs in crossings between Envoy and the VM: every entry into
//! the VM (callbacks, and the allocator the host calls to hand data over) and every host
//! call. In V8 each crossing costs far more than the same work inside the VM, so these are
//! the counts `docs/benchmarks.md` explains the filter's CPU with, and the bounds below keep
//! a change from adding crossings unnoticed.

use pinroute_tests::streamed::{self, CHUNKS, WARM_UP_REQUESTS};
use pinroute_tests::{CallCounts, Host, HostOptions};

use crate::{REGISTRY, engine_load, wasm};

/// A 1 KB completion, as `pinroute-lab bench` sends at its smallest size.
const PROMPT_BYTES: usize = 1024;

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

/// One request from its headers to `proxy_on_delete`; returns what it crossed.
fn one_request(host: &mut Host, pins: &[(&str, &str)]) -> CallCounts {
    host.reset_call_counts();
    streamed::complete(host, pins, &streamed::body(PROMPT_BYTES)).unwrap();
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

/// A registry of `per_pool` prefill and as many decode workers.
fn registry_of(per_pool: usize) -> String {
    let worker = |id: usize, role: &str| {
        format!(
            r#"{{"id": {id}, "role": "{role}", "address": "10.{}.{}.{}:8000"}}"#,
            id >> 16,
            (id >> 8) & 0xff,
            id & 0xff
        )
    };
    let workers: Vec<String> = (1..=per_pool)
        .map(|n| worker(n, "prefill"))
        .chain((1..=per_pool).map(|n| worker(100_000 + n, "decode")))
        .collect();
    format!(r#"{{"workers": [{}]}}"#, workers.join(", "))
}

#[test]
fn an_unpinned_request_takes_as_many_instructions_with_thousands_of_workers_as_with_two() {
    let count = |per_pool| {
        let mut host = counting_host(&registry_of(per_pool));
        streamed::instructions_per_request(&mut host, PROMPT_BYTES, 20).unwrap()
    };
    let (few, many) = (count(1), count(1000));
    println!("instructions per request: {few} with 1+1 workers, {many} with 1000+1000");
    assert!(
        many * 10 <= few * 11,
        "{many} instructions with 1000+1000 workers, over 10 % more than {few} with 1+1"
    );
}

//! Load as the engines report it, under wasmtime through the real ABI (`docs/semantics.md`
//! §5): the scrape round from the root's timer, workers that answer garbage, a 100 MB page
//! or nothing, and no trap whatever they send.

use pinroute_tests::Host;

use crate::{REGISTRY, host, send_completion};

pub const ENGINE_LOAD: &str = r#""engine_load": {"period_ms": 500, "max_bytes": 65536}, "#;

pub fn engine_config() -> String {
    REGISTRY.replacen('{', &format!("{{{ENGINE_LOAD}"), 1)
}

/// A page as vLLM prints it, with `waiting` requests queued on each of `ranks` ranks.
pub fn page(ranks: u32, waiting: u64) -> String {
    let mut page = String::from("# TYPE vllm:num_requests_waiting gauge\n");
    for rank in 0..ranks {
        page.push_str(&format!(
            "vllm:num_requests_waiting{{engine=\"{rank}\",model_name=\"m\"}} {waiting}.0\nvllm:num_requests_running{{engine=\"{rank}\",model_name=\"m\"}} 1.0\nvllm:kv_cache_usage_perc{{engine=\"{rank}\",model_name=\"m\"}} 0.5\n"
        ));
    }
    page
}

/// Fires the timer and answers each scrape it sent with `answer(address)`: a status and
/// page, or none (the call failed).
pub fn scrape_round(
    host: &mut Host,
    answer: impl Fn(&str) -> Option<(&'static str, Vec<u8>)>,
) -> usize {
    host.tick().unwrap();
    let calls = host.take_http_calls();
    for call in &calls {
        assert_eq!(call.upstream, "pinroute_prefill");
        assert_eq!(call.headers.get_str(":path"), Some("/metrics"));
        let address = call.headers.get_str("x-envoy-original-dst-host").unwrap();
        match answer(address) {
            Some((status, body)) => host
                .http_call_response(call.token, &[(":status", status)], &body)
                .unwrap(),
            None => host.http_call_failure(call.token).unwrap(),
        }
    }
    calls.len()
}

#[test]
fn the_timer_scrapes_every_worker_and_the_figures_are_counted() {
    let mut host = host(&engine_config());
    assert_eq!(
        host.tick_period(),
        Some(std::time::Duration::from_millis(50)),
        "a tenth of the scrape period"
    );
    let scraped = scrape_round(&mut host, |_| Some(("200", page(2, 1).into_bytes())));
    assert_eq!(scraped, 4);
    assert_eq!(host.counter("pinroute.engine.scraped"), Some(4));
    assert!(host.shared_data("pinroute.engine.v1").is_some());
    assert!(host.failure().is_none(), "{:?}", host.failure());
}

#[test]
fn no_answer_a_worker_sends_traps_the_vm_or_marks_it_unhealthy() {
    let mut host = host(&engine_config());
    let mut huge = page(1, 1).into_bytes();
    huge.resize(100 << 20, b'\n');
    let garbage: Vec<u8> = (0..5000u32).map(|i| (i * 7919 % 256) as u8).collect();
    let scraped = scrape_round(&mut host, |address| match address {
        "10.0.0.11:8000" => Some(("200", huge.clone())),
        "10.0.0.12:8000" => Some(("200", garbage.clone())),
        "10.0.0.21:8000" => Some(("500", page(1, 1).into_bytes())),
        _ => None,
    });
    assert_eq!(scraped, 4);
    assert!(host.failure().is_none(), "{:?}", host.failure());
    assert_eq!(host.counter("pinroute.engine.scrape_failed"), Some(4));
    assert_eq!(host.counter("pinroute.engine.scraped").unwrap_or(0), 0);
    assert!(
        host.memory_bytes() < 32 << 20,
        "the 100 MB page never entered the VM: {} bytes",
        host.memory_bytes()
    );
    let ctx = send_completion(
        &mut host,
        &[],
        r#"{"model": "m", "prompt": "hi", "max_tokens": 1}"#,
    );
    let calls = host.take_http_calls();
    assert_eq!(calls.len(), 1, "the request still takes its prefill hop");
    assert_eq!(
        host.counter("pinroute.workers.marked_unhealthy")
            .unwrap_or(0),
        0
    );
    host.done(ctx).unwrap();
}

//! Load as the engines report it, through a root and the request path (`docs/semantics.md`
//! §5): the scrape round, hostile or silent workers, and the choices the figures change.

use super::*;
use crate::filter::host::Headers;
use crate::policy::engine_load::EngineTable;

const SECOND: u64 = 1_000_000_000;

/// [`REGISTRY`]'s workers with the engines' load scraped every second.
fn config(extra: &str) -> String {
    REGISTRY.replacen(
        "{",
        &format!(r#"{{"engine_load": {{"period_ms": 1000, "max_bytes": 4096{extra}}},"#),
        1,
    )
}

/// `busy_waiting`: a rank with 8 requests waiting is full.
const FULL_AT_8: &str = r#", "busy_waiting": 8"#;

fn page(waiting: u64, running: u64) -> String {
    format!(
        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} {waiting}.0\nvllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} {running}.0\nvllm:num_requests_waiting{{engine=\"1\",model_name=\"m\"}} {waiting}.0\nvllm:num_requests_running{{engine=\"1\",model_name=\"m\"}} 0.0\n"
    )
}

/// A configured root on `host` at time `now`.
fn root(host: &FakeHost, config: &str, now: u64) -> Root<FakeHost> {
    let mut state = host.state();
    state.plugin_configuration = Some(config.as_bytes().to_vec());
    state.now = now;
    drop(state);
    let mut root = Root::new(host.clone());
    assert!(root.configure());
    root
}

/// Answers every call in flight: `answer` gives each worker's status and page by address.
fn answer_all(
    root: &mut Root<FakeHost>,
    host: &FakeHost,
    answer: impl Fn(&str) -> Option<(u16, String)>,
) {
    for call in host.take_calls() {
        let address = call.header("x-envoy-original-dst-host").unwrap().to_owned();
        let (headers, body) = match answer(&address) {
            Some((status, page)) => (
                [(":status", status.to_string())].into_iter().collect(),
                page,
            ),
            None => (Headers::default(), String::new()),
        };
        let size = body.len();
        host.state().call_answer = (headers, body.into_bytes());
        root.on_call_answer(call.token, size);
    }
}

fn shared_table(host: &FakeHost) -> EngineTable {
    EngineTable::decode(&host.shared("pinroute.engine.v1").unwrap_or_default())
}

#[test]
fn one_round_scrapes_every_worker_through_the_prefill_cluster_once_a_period() {
    let host = FakeHost::default();
    let mut root = root(&host, &config(""), 10 * SECOND);
    root.tick();
    let calls = host.take_calls();
    assert_eq!(calls.len(), 4, "one scrape per worker");
    for call in &calls {
        assert_eq!(call.cluster, "pinroute_prefill");
        assert_eq!(call.header(":method"), Some("GET"));
        assert_eq!(call.header(":path"), Some("/metrics"));
        assert_eq!(
            call.header(":authority"),
            call.header("x-envoy-original-dst-host")
        );
        assert_eq!(call.timeout, std::time::Duration::from_millis(250));
    }
    for call in calls {
        host.state().call_answer = (
            [(":status", "200")].into_iter().collect(),
            page(1, 2).into_bytes(),
        );
        root.on_call_answer(call.token, page(1, 2).len());
    }
    let table = shared_table(&host);
    assert_eq!(table.len(), 4);
    let two_ranks = table.report(202).unwrap();
    assert_eq!(
        (two_ranks.ranks.len(), two_ranks.requests()),
        (2, 1 + 2 + 1)
    );
    assert_eq!(
        table.report(101).unwrap().ranks.len(),
        1,
        "dp_size 1: rank 0 only"
    );
    assert_eq!(host.metric("pinroute.engine.scraped"), 4);

    host.state().now += SECOND / 2;
    root.tick();
    assert!(host.take_calls().is_empty(), "not due yet");
    let mut other_thread = Root::new(host.clone());
    assert!(other_thread.configure());
    other_thread.tick();
    assert!(host.take_calls().is_empty(), "one thread at a time");
    host.state().now += SECOND;
    root.tick();
    assert_eq!(host.take_calls().len(), 4, "the next round");
}

#[test]
fn a_worker_that_answers_garbage_an_error_too_much_or_nothing_keeps_no_figure() {
    let host = FakeHost::default();
    let mut root = root(&host, &config(""), SECOND);
    root.tick();
    let garbage: String = (0..3000)
        .map(|i| char::from(b'!' + (i % 90) as u8))
        .collect();
    answer_all(&mut root, &host, |address| match address {
        "10.0.0.11:8000" => Some((200, garbage.clone())),
        "10.0.0.12:8000" => Some((500, page(1, 1))),
        "10.0.0.21:8000" => Some((200, page(1, 1).repeat(100))),
        _ => None,
    });
    assert_eq!(host.metric("pinroute.engine.scrape_failed"), 4);
    assert_eq!(host.metric("pinroute.engine.scraped"), 0);
    assert_eq!(
        host.state().call_body_reads,
        1,
        "only the garbage page was read"
    );
    assert!(shared_table(&host).is_empty());
}

#[test]
fn a_worker_whose_scrape_fails_keeps_its_last_figures_until_they_are_stale() {
    let host = FakeHost::default();
    let mut root = root(&host, &config(r#", "stale_ms": 2000"#), SECOND);
    root.tick();
    answer_all(&mut root, &host, |_| Some((200, page(3, 0))));
    host.state().now += SECOND;
    root.tick();
    answer_all(&mut root, &host, |_| None);
    let table = shared_table(&host);
    assert_eq!(table.len(), 4, "the failed round changed nothing");
    assert_eq!(table.report(101).unwrap().scraped_at, SECOND);
}

/// Prefill worker 101 is where affinity sends [`chat`]-like prompts of this test; what a
/// request's prefill hop goes to, on `root`'s thread.
fn prefill_worker(root: &Root<FakeHost>, host: &FakeHost, body: &str) -> (String, Option<String>) {
    let headers = [&[(":path", "/v1/chat/completions")][..], COMPLETION_HEADERS].concat();
    let mut request = Request::on_root(root, host.clone(), &headers);
    assert_eq!(request.headers(false), Flow::Pause);
    assert_eq!(request.body(body), Flow::Pause);
    let call = request.prefill_call();
    let worker = call.header("x-envoy-original-dst-host").unwrap().to_owned();
    request.answer(
        &call,
        Some(200),
        &format!(r#"{{"kv_transfer_params": {KV}}}"#),
    );
    let rank = request.host.request_header("x-data-parallel-rank");
    (worker, rank)
}

fn long_chat(salt: usize) -> String {
    let system = format!("Conversation {salt}. ").repeat(120);
    format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}}],"max_tokens":4}}"#
    )
}

#[test]
fn affinity_passes_over_a_worker_its_engine_reports_full_and_takes_it_back_when_stale() {
    let host = FakeHost::default();
    let mut root = root(&host, &config(FULL_AT_8), SECOND);
    let body = long_chat(1);
    let (home, _) = prefill_worker(&root, &host, &body);
    root.tick();
    answer_all(&mut root, &host, |address| {
        Some((
            200,
            if address == home {
                page(8, 1)
            } else {
                page(0, 1)
            },
        ))
    });
    let (before_look, _) = prefill_worker(&root, &host, &body);
    assert_eq!(
        before_look, home,
        "figures are taken at the thread's next look"
    );
    root.tick();
    let (moved, _) = prefill_worker(&root, &host, &body);
    assert_ne!(moved, home, "8 waiting on each rank: full");
    assert_eq!(host.metric("pinroute.placement.prefill.spilled"), 1);
    let new_thread = self::root(&host, &config(FULL_AT_8), SECOND);
    let (first_request, _) = prefill_worker(&new_thread, &host, &body);
    assert_eq!(
        first_request, moved,
        "a root made later reads the figures at once"
    );

    host.state().now += 3 * SECOND;
    let (back, _) = prefill_worker(&root, &host, &body);
    assert_eq!(back, home, "stale figures: the gateway's own counts");
}

/// The prefill worker long prompt `salt` goes to once its first worker's engine reports
/// `running` requests and the other's none, with the busy bound at the mean plus 8.
fn prefill_worker_after_share(running: u64, salt: usize) -> (String, String) {
    let host = FakeHost::default();
    let config = config("").replacen('{', r#"{"affinity_busy_percent": 100, "#, 1);
    let mut root = root(&host, &config, SECOND);
    let body = long_chat(salt);
    let (home, _) = prefill_worker(&root, &host, &body);
    root.tick();
    answer_all(&mut root, &host, |address| {
        Some((200, page(0, if address == home { running } else { 0 })))
    });
    root.tick();
    (home, prefill_worker(&root, &host, &body).0)
}

/// Of 16 prompts, those that go past their first worker when it holds `running` requests.
fn moved_after_share(running: u64) -> Vec<usize> {
    (0..16)
        .filter(|salt| {
            let (home, next) = prefill_worker_after_share(running, *salt);
            next != home
        })
        .collect()
}

#[test]
fn affinity_passes_over_a_worker_whose_engine_holds_more_than_its_share_for_a_share_of_prompts() {
    assert!(
        moved_after_share(14).is_empty(),
        "14 of 14 running: not over the mean (7) plus 8"
    );
    // 24 of 24: 4 over the bound of 20, of the 10 that take every prompt past it.
    let moved = moved_after_share(24);
    assert!((2..=11).contains(&moved.len()), "{moved:?}");
    assert_eq!(moved_after_share(24), moved, "every gateway alike");
    let more = moved_after_share(400);
    assert!(moved.iter().all(|salt| more.contains(salt)), "{more:?}");
    assert!(more.len() > moved.len());
}

/// The rank an unpinned request's decode hop names when decode worker 202's two ranks
/// report `ranks` and worker 201 (one rank, its fallback) is loaded.
fn decode_rank(ranks: &'static str) -> Option<String> {
    let host = FakeHost::default();
    let mut root = root(&host, &config(FULL_AT_8), SECOND);
    root.tick();
    answer_all(&mut root, &host, |address| match address {
        "10.0.0.21:8000" => Some((200, page(50, 50))),
        "10.0.0.22:8000" => Some((200, ranks.to_owned())),
        _ => Some((200, page(0, 0))),
    });
    root.tick();
    let (_, rank) = prefill_worker(&root, &host, &long_chat(2));
    assert_eq!(
        host.request_header("x-pinroute-upstream").as_deref(),
        Some("10.0.0.22:8000")
    );
    rank
}

#[test]
fn an_unpinned_multi_rank_worker_gets_the_rank_its_engine_reports_less_loaded() {
    let rank_1_busy =
        "vllm:num_requests_waiting{engine=\"1\"} 5\nvllm:num_requests_running{engine=\"0\"} 1\n";
    assert_eq!(decode_rank(rank_1_busy).as_deref(), Some("0"));
    let rank_0_busy =
        "vllm:num_requests_waiting{engine=\"0\"} 5\nvllm:num_requests_running{engine=\"1\"} 1\n";
    assert_eq!(
        decode_rank(rank_0_busy),
        None,
        "a retry on worker 201, which has no rank 1, would carry the header"
    );
}

#[test]
fn without_engine_load_no_scrape_is_made_and_no_rank_is_named() {
    let host = FakeHost::default();
    let mut root = root(&host, REGISTRY, SECOND);
    root.tick();
    assert!(host.take_calls().is_empty());
    let (_, rank) = prefill_worker(&root, &host, &long_chat(3));
    if host.request_header("x-pinroute-upstream").as_deref() == Some("10.0.0.22:8000") {
        assert_eq!(rank, None);
    }
}

//! Tests of the host against a small proxy-wasm filter built with the same SDK
//! (`tests/testfilter`). The compiled filter is `PW_TEST_FILTER`, else its default release
//! path; `pinroute-harness test` builds it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{Action, Host, HostOptions, LogLevel, Metric};

fn filter_path() -> Option<PathBuf> {
    let default = || {
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        repo.join("target/wasm32-wasip1/release/pinroute_testfilter.wasm")
    };
    let path = std::env::var_os("PW_TEST_FILTER").map_or_else(default, PathBuf::from);
    assert!(
        path.exists(),
        "{} is missing: run `pinroute-harness test`",
        path.display()
    );
    Some(path)
}

macro_rules! host {
    ($config:expr) => {
        host!($config, HostOptions::default())
    };
    ($config:expr, $options:expr) => {{
        let Some(path) = filter_path() else { return };
        Host::with_options(&path, $config, $options).unwrap()
    }};
}

fn allow_stop() -> HostOptions {
    HostOptions {
        allow_on_headers_stop_iteration: true,
        ..HostOptions::default()
    }
}

fn request(mode: &str) -> Vec<(&'static str, String)> {
    vec![
        (":method", "POST".to_string()),
        (":path", "/v1/x".to_string()),
        (":authority", "example".to_string()),
        ("x-mode", mode.to_string()),
    ]
}

fn has_log(host: &Host, level: LogLevel, needle: &str) -> bool {
    host.logs()
        .iter()
        .any(|(l, m)| *l == level && m.contains(needle))
}

#[test]
fn starts_like_envoy() {
    let host = host!("hello");
    assert!(has_log(&host, LogLevel::Info, "vm start"));
    assert!(has_log(&host, LogLevel::Info, "configured with \"hello\""));
    assert_eq!(host.counter("test_requests"), Some(0));
    assert_eq!(host.root_context_id(), 1);
    let missing = host.unimplemented_imports();
    assert!(
        missing.contains(&"env.proxy_grpc_call".to_string()),
        "{missing:?}"
    );
    assert!(!missing.iter().any(|m| m == "env.proxy_log"));
    assert!(host.tick_period().is_none());
}

#[test]
fn configure_false_is_an_error() {
    let Some(path) = filter_path() else { return };
    let err = Host::new(&path, "fail").err().unwrap().to_string();
    assert!(err.contains("proxy_on_configure returned false"), "{err}");
    assert!(err.contains("refusing configuration"), "{err}");
}

#[test]
fn panic_in_configure_is_a_trap_with_the_message() {
    let Some(path) = filter_path() else { return };
    let err = format!("{:?}", Host::new(&path, "panic").err().unwrap());
    assert!(
        err.contains("proxy_on_configure(context 1) trapped"),
        "{err}"
    );
    assert!(err.contains("configuration panic"), "{err}");
}

#[test]
fn reconfigure() {
    let mut host = host!("one");
    assert!(host.configure("two").unwrap());
    assert!(!host.configure("fail").unwrap());
}

#[test]
fn header_edits_time_and_properties() {
    let mut host = host!("");
    let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    host.set_time(t);
    host.set_property(&["source", "address"], b"10.0.0.1:5555");
    let ctx = host.new_http_stream().unwrap();
    let mut headers = request("passthrough");
    headers.push(("X-Remove-Me", "1".to_string()));
    headers.push(("x-multi", "a".to_string()));
    let action = host.request_headers(ctx, &headers, true).unwrap();
    assert_eq!(action, Action::Continue);
    let s = host.stream(ctx).unwrap();
    assert_eq!(s.request_header("x-added"), Some("yes"));
    assert_eq!(
        s.request_headers.get_all("x-multi"),
        vec![&b"a"[..], &b"b"[..]]
    );
    assert_eq!(s.request_header("x-remove-me"), None);
    assert_eq!(s.request_header("x-absent-was"), Some("None"));
    assert_eq!(s.request_header("x-time"), Some("1700000000"));
    assert_eq!(s.request_header("x-source"), Some("10.0.0.1:5555"));
    assert!(s.request_forwarded);
    assert_eq!(s.request_headers.entries()[0].0, ":method");
    assert_eq!(host.counter("test_requests"), Some(1));
    assert_eq!(host.gauge("test_inflight"), Some(1));

    assert_eq!(
        host.response_headers(ctx, &[(":status", "200")], false)
            .unwrap(),
        Action::Continue
    );
    assert_eq!(
        host.response_body(ctx, b"ok", true).unwrap(),
        Action::Continue
    );
    let s = host.stream(ctx).unwrap();
    assert_eq!(s.response_header("x-filter-saw-status"), Some("200"));
    assert_eq!(s.response_body(), b"ok");
    host.done(ctx).unwrap();
    assert!(has_log(&host, LogLevel::Info, "path Some(\"/v1/x\")"));
    assert_eq!(host.gauge("test_inflight"), Some(0));
    assert!(host.stream(ctx).unwrap().done);
}

#[test]
fn set_all_headers() {
    let mut host = host!("");
    let ctx = host.new_http_stream().unwrap();
    host.request_headers(ctx, &request("replace-all"), true)
        .unwrap();
    let strings = host.stream(ctx).unwrap().request_headers.to_strings();
    let names: Vec<&str> = strings.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, vec![":path", ":method", "x-only"]);
}

#[test]
fn body_buffered_while_paused_then_rewritten() {
    let mut host = host!("", allow_stop());
    let ctx = host.new_http_stream().unwrap();
    let mut headers = request("pause-headers");
    headers.push(("content-length", "11".to_string()));
    assert_eq!(
        host.request_headers(ctx, &headers, false).unwrap(),
        Action::Pause
    );
    assert!(host.stream(ctx).unwrap().request_paused());
    assert_eq!(
        host.request_body(ctx, b"hello", false).unwrap(),
        Action::Pause
    );
    assert_eq!(host.stream(ctx).unwrap().request_body_buffered, b"hello");
    assert_eq!(
        host.request_body(ctx, b" world", true).unwrap(),
        Action::Continue
    );
    let s = host.stream(ctx).unwrap();
    assert_eq!(s.request_body_sent, b"rewritten:hello world");
    assert!(s.request_body_buffered.is_empty());
    assert_eq!(s.request_header("x-body-len"), Some("11"));
    assert_eq!(s.request_header("content-length"), None);
    assert!(s.request_forwarded);
    assert_eq!(host.histogram("test_body_size"), Some(vec![11]));
    assert!(has_log(&host, LogLevel::Debug, "request body 11 eos true"));
}

#[test]
fn pause_then_continue_releases_headers_with_the_body() {
    let mut host = host!("", allow_stop());
    let ctx = host.new_http_stream().unwrap();
    assert_eq!(
        host.request_headers(ctx, &request("body-pause-continue"), false)
            .unwrap(),
        Action::Pause
    );
    assert_eq!(host.request_body(ctx, b"ab", false).unwrap(), Action::Pause);
    assert_eq!(
        host.request_body(ctx, b"cd", false).unwrap(),
        Action::Continue
    );
    assert_eq!(host.stream(ctx).unwrap().request_body_sent, b"abcd");
    assert_eq!(
        host.request_body(ctx, b"e", true).unwrap(),
        Action::Continue
    );
    let s = host.stream(ctx).unwrap();
    assert_eq!(s.request_body_sent, b"abcde");
    assert!(s.request_forwarded);
}

#[test]
fn without_allow_on_headers_stop_iteration_the_body_is_held_back() {
    let mut host = host!("");
    let ctx = host.new_http_stream().unwrap();
    assert_eq!(
        host.request_headers(ctx, &request("pause-headers"), false)
            .unwrap(),
        Action::Pause
    );
    assert_eq!(
        host.request_body(ctx, b"hello", true).unwrap(),
        Action::Pause
    );
    assert!(!has_log(&host, LogLevel::Debug, "request body"));
    assert!(
        host.diagnostics()
            .iter()
            .any(|d| d.contains("allow_on_headers_stop_iteration"))
    );
    let s = host.stream(ctx).unwrap();
    assert!(s.request_paused());
    let err = host
        .response_headers(ctx, &[(":status", "200")], true)
        .unwrap_err();
    assert!(err.to_string().contains("never went upstream"), "{err}");
}

#[test]
fn header_write_after_the_headers_went_upstream_traps() {
    let mut host = host!("", allow_stop());
    let ctx = host.new_http_stream().unwrap();
    host.request_headers(ctx, &request("late-header"), false)
        .unwrap();
    assert_eq!(
        host.request_body(ctx, b"a", false).unwrap(),
        Action::Continue
    );
    let err = format!("{:?}", host.request_body(ctx, b"b", true).unwrap_err());
    assert!(
        err.contains("proxy_on_request_body(context 2) trapped"),
        "{err}"
    );
    assert!(err.contains("unexpected status: 2"), "{err}");
    assert!(err.contains("already went on"), "{err}");
    assert!(host.failure().is_some());
    let again = host.new_http_stream().unwrap_err().to_string();
    assert!(again.contains("failed earlier"), "{again}");
}

#[test]
fn header_write_in_body_phase_after_continue_traps() {
    let mut host = host!("");
    let ctx = host.new_http_stream().unwrap();
    assert_eq!(
        host.request_headers(ctx, &request("body-header"), false)
            .unwrap(),
        Action::Continue
    );
    let err = format!("{:?}", host.request_body(ctx, b"x", true).unwrap_err());
    assert!(err.contains("not available in this phase"), "{err}");
}

#[test]
fn response_headers_are_not_reachable_in_the_request_path() {
    let mut host = host!("");
    let ctx = host.new_http_stream().unwrap();
    let err = format!(
        "{:?}",
        host.request_headers(ctx, &request("read-response-early"), true)
            .unwrap_err()
    );
    assert!(err.contains("ResponseHeaders"), "{err}");
}

#[test]
fn http_call_round_trip() {
    let mut host = host!("");
    let ctx = host.new_http_stream().unwrap();
    assert_eq!(
        host.request_headers(ctx, &request("call"), true).unwrap(),
        Action::Pause
    );
    let calls = host.take_http_calls();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(call.upstream, "lookup");
    assert_eq!(call.context_id, ctx);
    assert_eq!(call.timeout_ms, 1500);
    assert_eq!(call.body, b"question");
    assert_eq!(call.headers.get_str(":authority"), Some("lookup.svc"));
    assert_eq!(call.headers.get_str("x-upper"), Some("v"));
    assert_eq!(call.headers.get_str("content-length"), Some("8"));
    assert_eq!(host.pending_http_calls(), vec![call.token]);
    let s = host.stream(ctx).unwrap();
    assert_eq!(
        s.request_header("x-token"),
        Some(call.token.to_string().as_str())
    );
    assert!(s.request_paused());

    host.http_call_response(call.token, &[(":status", "200")], b"answer")
        .unwrap();
    let s = host.stream(ctx).unwrap();
    assert_eq!(s.request_header("x-lookup"), Some("answer"));
    assert_eq!(s.request_header("x-lookup-status"), Some("200"));
    assert!(s.request_resumed);
    assert!(s.request_forwarded);
    assert!(host.pending_http_calls().is_empty());
    assert!(
        host.http_call_response(call.token, &[(":status", "200")], b"")
            .is_err()
    );
    host.response_headers(ctx, &[(":status", "204")], true)
        .unwrap();
    host.done(ctx).unwrap();
}

#[test]
fn missing_header_of_a_call_response_is_not_found() {
    let mut host = host!("");
    let ctx = host.new_http_stream().unwrap();
    host.request_headers(ctx, &request("call-read-missing"), true)
        .unwrap();
    let token = host.take_http_calls()[0].token;
    host.http_call_response(token, &[(":status", "200")], b"")
        .unwrap();
    assert!(has_log(&host, LogLevel::Info, "missing header: None"));
    // An empty body reads as None, which the filter turns into "".
    assert_eq!(
        host.stream(ctx).unwrap().request_header("x-lookup"),
        Some("")
    );
}

#[test]
fn request_map_is_gone_right_after_resume() {
    let mut host = host!("");
    let ctx = host.new_http_stream().unwrap();
    host.request_headers(ctx, &request("call-touch-after-resume"), true)
        .unwrap();
    let token = host.take_http_calls()[0].token;
    let err = format!(
        "{:?}",
        host.http_call_response(token, &[(":status", "200")], b"x")
            .unwrap_err()
    );
    assert!(err.contains("proxy_on_http_call_response"), "{err}");
    assert!(err.contains("not available in this phase"), "{err}");
}

#[test]
fn failed_call_and_local_reply_through_the_filter() {
    let mut host = host!("");
    let ctx = host.new_http_stream().unwrap();
    host.request_headers(ctx, &request("call"), true).unwrap();
    let token = host.take_http_calls()[0].token;
    host.http_call_failure(token).unwrap();
    let s = host.stream(ctx).unwrap();
    let reply = s.local_reply.as_ref().unwrap();
    assert_eq!(reply.status, 503);
    assert_eq!(reply.body, b"call failed");
    assert_eq!(reply.headers.get_str("x-call"), Some("failed"));
    assert!(!s.request_forwarded);
    // The reply went through the filter's own response callbacks.
    assert_eq!(s.response_header(":status"), Some("503"));
    assert_eq!(s.response_header("x-filter-saw-status"), Some("503"));
    assert_eq!(s.response_header("content-type"), Some("text/plain"));
    assert_eq!(s.response_header("content-length"), Some("11"));
    assert_eq!(s.response_body(), b"call failed");
    assert!(s.response_forwarded);
    assert!(
        host.response_headers(ctx, &[(":status", "200")], true)
            .is_err()
    );
}

#[test]
fn local_reply_from_request_headers() {
    let mut host = host!("");
    let ctx = host.new_http_stream().unwrap();
    assert_eq!(
        host.request_headers(ctx, &request("reply"), false).unwrap(),
        Action::Pause
    );
    let s = host.stream(ctx).unwrap();
    assert_eq!(s.local_reply.as_ref().unwrap().status, 403);
    assert_eq!(s.response_header("x-reason"), Some("denied"));
    assert_eq!(s.response_body(), b"forbidden");
    assert!(host.request_body(ctx, b"late", true).is_err());
    host.done(ctx).unwrap();
}

#[test]
fn unknown_cluster_and_incomplete_call_headers_are_bad_arguments() {
    let options = HostOptions {
        clusters: Some(vec!["lookup".to_string()]),
        ..HostOptions::default()
    };
    let mut host = host!("", options);
    let ctx = host.new_http_stream().unwrap();
    host.request_headers(ctx, &request("call-bad"), true)
        .unwrap();
    let s = host.stream(ctx).unwrap();
    let reply = s.local_reply.as_ref().unwrap();
    assert_eq!(
        reply.headers.get_str("x-r"),
        Some("Err(BadArgument) Err(BadArgument)")
    );
    assert!(host.take_http_calls().is_empty());
    let notes = host.diagnostics();
    assert!(
        notes.iter().any(|d| d.contains("unknown cluster")),
        "{notes:?}"
    );
    assert!(
        notes.iter().any(|d| d.contains("no :authority")),
        "{notes:?}"
    );
}

#[test]
fn done_cancels_pending_calls() {
    let mut host = host!("");
    let ctx = host.new_http_stream().unwrap();
    host.request_headers(ctx, &request("call"), true).unwrap();
    let token = host.take_http_calls()[0].token;
    host.done(ctx).unwrap();
    assert!(
        host.http_call_response(token, &[(":status", "200")], b"")
            .is_err()
    );
}

#[test]
fn panics_and_unreachable_surface_as_errors() {
    let mut host = host!("");
    let ctx = host.new_http_stream().unwrap();
    let err = format!(
        "{:?}",
        host.request_headers(ctx, &request("panic"), true)
            .unwrap_err()
    );
    assert!(err.contains("boom in request headers"), "{err}");
    assert!(err.contains("Critical"), "{err}");

    let mut host = host!("");
    let ctx = host.new_http_stream().unwrap();
    let err = format!(
        "{:?}",
        host.request_headers(ctx, &request("unreachable"), true)
            .unwrap_err()
    );
    assert!(err.contains("unreachable"), "{err}");
}

#[test]
fn shared_data_with_cas() {
    let mut host = host!("");
    let ctx = host.new_http_stream().unwrap();
    host.request_headers(ctx, &request("shared"), true).unwrap();
    let s = host.stream(ctx).unwrap();
    assert_eq!(s.request_header("x-shared-before"), Some("None None"));
    assert_eq!(
        s.request_header("x-shared-cas"),
        Some("Ok(()) Err(CasMismatch)")
    );
    assert_eq!(host.shared_data("k").unwrap().0, b"v2");
}

#[test]
fn response_body_buffering_and_rewrite() {
    let mut host = host!("");
    let ctx = host.new_http_stream().unwrap();
    host.request_headers(ctx, &request("rewrite-response"), true)
        .unwrap();
    host.response_headers(ctx, &[(":status", "200"), ("content-length", "6")], false)
        .unwrap();
    assert_eq!(
        host.stream(ctx).unwrap().response_header("content-length"),
        None
    );
    assert_eq!(
        host.response_body(ctx, b"abc", false).unwrap(),
        Action::Pause
    );
    assert_eq!(
        host.response_body(ctx, b"def", true).unwrap(),
        Action::Continue
    );
    assert_eq!(host.stream(ctx).unwrap().response_body_sent, b"ABCDEF");
}

#[test]
fn ticks_metrics_and_shared_data() {
    let mut host = host!("tick");
    assert_eq!(host.tick_period(), Some(Duration::from_millis(500)));
    host.tick().unwrap();
    host.set_shared_data("ticks", b"10");
    host.tick().unwrap();
    assert_eq!(host.counter("test_ticks"), Some(2));
    assert_eq!(host.shared_data("ticks").unwrap().0, b"11");
    assert!(matches!(
        host.metrics().get("test_ticks"),
        Some(Metric::Counter(2))
    ));

    let mut quiet = host!("");
    assert!(quiet.tick().is_err());
}

#[test]
fn driver_misuse_is_reported() {
    let mut host = host!("");
    assert!(host.request_headers(42, &request("x"), true).is_err());
    let ctx = host.new_http_stream().unwrap();
    assert!(host.request_body(ctx, b"x", true).is_err());
    host.request_headers(ctx, &request("x"), true).unwrap();
    assert!(host.request_headers(ctx, &request("x"), true).is_err());
    assert!(host.request_body(ctx, b"x", true).is_err());
    assert!(host.response_body(ctx, b"x", true).is_err());
    let _ = SystemTime::now();
}

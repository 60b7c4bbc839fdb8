//! The request path against an in-memory host: retries, fallback, passive health, typed
//! errors and withheld answers, natively and fast. `tests/abi` drives the compiled module through
//! the real ABI.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

mod access_log;
mod affinity;
mod apis;
mod decode_retry;
mod engine_load;
mod fake_host;
mod inflight;
mod intake;
mod models;
mod prefill;
mod response;
mod rules;

use std::cell::Cell;
use std::rc::Rc;

use super::host::Flow;

use super::env::Env;
use super::metrics::Metrics;
use super::root::Root;
use super::shared::Slots;
use super::span_export::SpanQueue;
use super::stream::Stream;
use crate::policy::config::Config;
use fake_host::{Call, FakeHost, Part};

const REGISTRY: &str = r#"{"workers": [
    {"id": 101, "role": "prefill", "address": "10.0.0.11:8000"},
    {"id": 102, "role": "prefill", "address": "10.0.0.12:8000"},
    {"id": 201, "role": "decode", "address": "10.0.0.21:8000"},
    {"id": 202, "role": "decode", "address": "10.0.0.22:8000", "dp_size": 2}
]}"#;

const PROMPT: &str = r#"{"model": "m", "prompt": "hello", "max_tokens": 8, "stream": true}"#;

const KV: &str = r#"{"remote_engine_id":"engine-101","remote_host":"10.0.0.11","remote_port":5600,"remote_block_ids":[1,2],"remote_request_id":"req-xyz"}"#;

/// Envoy's answer to a call whose connection was refused.
const REFUSED: &str =
    "upstream connect error or disconnect/reset before headers. reset reason: connection failure";

const COMPLETION_HEADERS: &[(&str, &str)] = &[
    (":method", "POST"),
    (":path", "/v1/completions"),
    ("content-type", "application/json"),
    ("x-request-id", "req-1"),
];

/// One request through the filter, with its host.
struct Request {
    host: FakeHost,
    stream: Stream<FakeHost>,
    /// The VM's spans waiting for its root's export.
    spans: Rc<SpanQueue>,
}

impl Request {
    /// A request with these headers on a fresh host configured with `config`.
    fn new(config: &str, headers: &[(&str, &str)]) -> Self {
        Self::on(FakeHost::default(), config, headers)
    }

    /// A request on `host`, which may have served others before.
    fn on(host: FakeHost, config: &str, headers: &[(&str, &str)]) -> Self {
        Self::on_vm(host, Rc::default(), config, headers)
    }

    /// A request on `host` in the VM whose requests in flight are `slots`.
    fn on_vm(host: FakeHost, slots: Rc<Slots>, config: &str, headers: &[(&str, &str)]) -> Self {
        let config = Config::from_json(config.as_bytes()).unwrap();
        Self::with_config(host, slots, config, headers)
    }

    /// A request on `host` in the VM whose requests in flight are `slots`, under `config`.
    fn with_config(
        host: FakeHost,
        slots: Rc<Slots>,
        config: Config,
        headers: &[(&str, &str)],
    ) -> Self {
        let config = Rc::new(config);
        let metrics = Rc::new(Metrics::define(&host));
        let spans = Rc::new(SpanQueue::default());
        let env = Env::new(
            host.clone(),
            config,
            Rc::new(Cell::new(0)),
            metrics,
            slots,
            spans.clone(),
            Rc::default(),
        );
        Self::started(host, Stream::new(env), spans, headers)
    }

    /// A request with these headers on `host` and the thread of `root` (its configuration
    /// and its copies of the shared tables).
    fn on_root(root: &Root<FakeHost>, host: FakeHost, headers: &[(&str, &str)]) -> Self {
        Self::started(host, root.new_stream().unwrap(), Rc::default(), headers)
    }

    /// `stream`, on `host`, whose request has these headers.
    fn started(
        host: FakeHost,
        stream: Stream<FakeHost>,
        spans: Rc<SpanQueue>,
        headers: &[(&str, &str)],
    ) -> Self {
        host.new_stream(
            headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect(),
        );
        Self {
            host,
            stream,
            spans,
        }
    }

    /// A completion request with `extra` headers, its headers and whole body sent.
    fn completion(config: &str, extra: &[(&str, &str)], body: &str) -> Self {
        Self::completion_on(FakeHost::default(), config, extra, body)
    }

    fn completion_on(host: FakeHost, config: &str, extra: &[(&str, &str)], body: &str) -> Self {
        // The first copy of a header is the one read: `extra` may name another path.
        let headers = [extra, COMPLETION_HEADERS].concat();
        let mut request = Self::on(host, config, &headers);
        assert_eq!(request.headers(false), Flow::Pause);
        assert_eq!(request.body(body), Flow::Pause);
        request
    }

    fn headers(&mut self, end_of_stream: bool) -> Flow {
        self.host.deliver(true, Part::Headers);
        let flow = self.stream.on_request_headers(end_of_stream);
        self.after(true, Part::Headers, flow)
    }

    fn body(&mut self, body: &str) -> Flow {
        self.host.state().request_body = body.as_bytes().to_vec();
        self.body_chunk(body.len(), true)
    }

    /// A request body callback: `size` bytes held, the last chunk when `end`.
    fn body_chunk(&mut self, size: usize, end: bool) -> Flow {
        self.host.deliver(true, Part::Body);
        let flow = self.stream.on_request_body(size, end);
        self.after(true, Part::Body, flow)
    }

    fn response_headers(&mut self, end_of_stream: bool) -> Flow {
        self.host.deliver(false, Part::Headers);
        let flow = self.stream.on_response_headers(end_of_stream);
        self.after(false, Part::Headers, flow)
    }

    fn response_chunk(&mut self, size: usize, end: bool) -> Flow {
        self.host.deliver(false, Part::Body);
        let flow = self.stream.on_response_body(size, end);
        self.after(false, Part::Body, flow)
    }

    fn call_answer(&mut self, token: u32, body_size: usize) {
        self.stream.on_call_answer(token, body_size);
        self.no_refusals();
    }

    /// After a callback answered `flow`: the side goes on if it continued, and the filter
    /// made no host call Envoy would have refused (`host_rules`).
    fn after(&mut self, request: bool, part: Part, flow: Flow) -> Flow {
        self.host.answered(request, part, flow);
        self.no_refusals();
        flow
    }

    fn no_refusals(&self) {
        let refusals = std::mem::take(&mut self.host.state().refusals);
        assert!(refusals.is_empty(), "calls Envoy refuses: {refusals:?}");
    }

    /// The only prefill call in flight, taken from the host.
    fn prefill_call(&self) -> Call {
        let mut calls = self.host.take_calls();
        assert_eq!(calls.len(), 1, "{calls:?}");
        calls.remove(0)
    }

    /// Answers `call` with `status` (none: no response at all) and `body`.
    fn answer(&mut self, call: &Call, status: Option<u16>, body: &str) {
        let headers = status
            .map(|s| [(":status", s.to_string())].into_iter().collect())
            .unwrap_or_default();
        self.host.state().call_answer = (headers, body.as_bytes().to_vec());
        self.call_answer(call.token, body.len());
    }

    /// The worker's response headers (and, when `body` is given, its whole body) come back.
    fn respond(&mut self, status: u16, body: Option<&str>) -> Flow {
        let mut state = self.host.state();
        state.response_headers = [(":status", status.to_string())].into_iter().collect();
        state.response_body = body.unwrap_or_default().as_bytes().to_vec();
        drop(state);
        let action = self.response_headers(body.is_none());
        match body {
            Some(body) => self.response_chunk(body.len(), true),
            None => action,
        }
    }

    fn request_body(&self) -> String {
        String::from_utf8(self.host.state().request_body.clone()).unwrap()
    }

    fn response_body(&self) -> String {
        String::from_utf8(self.host.state().response_body.clone()).unwrap()
    }

    fn outstanding(&self, worker: u64) -> u64 {
        let bytes = self.host.shared("pinroute.load.v2").unwrap_or_default();
        crate::policy::load::LoadTable::decode(&bytes).outstanding(worker)
    }

    fn end(&mut self) {
        self.host.state().log_phase = true;
        self.stream.on_stream_end();
        self.no_refusals();
    }
}

/// The configuration with `settings` added to the registry.
fn config_with(settings: &str) -> String {
    REGISTRY.replacen("{\"workers\"", &format!("{{{settings}, \"workers\""), 1)
}

//! A proxy-wasm filter exercising the host calls pinroute's wasmtime test host implements,
//! so the host itself is tested against the SDK. Built by `pinroute-harness test`.
//! Behaviour is chosen per request by the `x-mode` request header.
use proxy_wasm::traits::*;
use proxy_wasm::types::*;
use std::time::{Duration, UNIX_EPOCH};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root { config: String::new(), requests: 0, ticks: 0, hist: 0, gauge: 0 })
    });
}}

struct Root {
    config: String,
    requests: u32,
    ticks: u32,
    hist: u32,
    gauge: u32,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_vm_start(&mut self, _size: usize) -> bool {
        log::info!("vm start");
        true
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        let config = self
            .get_plugin_configuration()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        log::info!("configured with {config:?}");
        if config == "fail" {
            log::error!("refusing configuration");
            return false;
        }
        if config == "panic" {
            panic!("configuration panic");
        }
        self.requests =
            proxy_wasm::hostcalls::define_metric(MetricType::Counter, "test_requests").unwrap();
        self.ticks =
            proxy_wasm::hostcalls::define_metric(MetricType::Counter, "test_ticks").unwrap();
        self.hist =
            proxy_wasm::hostcalls::define_metric(MetricType::Histogram, "test_body_size").unwrap();
        self.gauge =
            proxy_wasm::hostcalls::define_metric(MetricType::Gauge, "test_inflight").unwrap();
        if config.contains("tick") {
            self.set_tick_period(Duration::from_millis(500));
        }
        self.config = config;
        true
    }

    fn on_tick(&mut self) {
        proxy_wasm::hostcalls::increment_metric(self.ticks, 1).unwrap();
        let (old, cas) = self.get_shared_data("ticks");
        let n: u32 = old
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if let Err(e) = self.set_shared_data("ticks", Some((n + 1).to_string().as_bytes()), cas) {
            log::warn!("cas failed: {e:?}");
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream {
            id: context_id,
            mode: String::new(),
            config: self.config.clone(),
            requests: self.requests,
            hist: self.hist,
            gauge: self.gauge,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Stream {
    id: u32,
    mode: String,
    config: String,
    requests: u32,
    hist: u32,
    gauge: u32,
}

impl Context for Stream {
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let headers = self.get_http_call_response_headers();
        log::info!("call {token} answered: {num_headers} headers, {body_size} body bytes");
        if headers.is_empty() {
            self.send_http_response(503, vec![("x-call", "failed")], Some(b"call failed"));
            return;
        }
        let status = self
            .get_http_call_response_header(":status")
            .unwrap_or_default();
        let body = self
            .get_http_call_response_body(0, body_size)
            .unwrap_or_default();
        self.set_http_request_header("x-lookup", Some(&String::from_utf8_lossy(&body)));
        self.set_http_request_header("x-lookup-status", Some(&status));
        if self.mode == "call-read-missing" {
            // Reading a header the response does not have is NotFound (None), not a trap.
            let missing = self.get_http_call_response_header("x-absent");
            log::info!("missing header: {missing:?}");
        }
        self.resume_http_request();
        if self.mode == "call-touch-after-resume" {
            // Envoy drops the request header map on resume: this traps.
            self.set_http_request_header("x-too-late", Some("1"));
        }
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, num_headers: usize, end_of_stream: bool) -> Action {
        proxy_wasm::hostcalls::increment_metric(self.requests, 1).unwrap();
        proxy_wasm::hostcalls::increment_metric(self.gauge, 1).unwrap();
        let headers = self.get_http_request_headers();
        log::debug!(
            "ctx {} request headers: {} (eos {end_of_stream}, config {})",
            self.id,
            num_headers,
            self.config
        );
        assert_eq!(headers.len(), num_headers);
        self.mode = self.get_http_request_header("x-mode").unwrap_or_default();
        let now = self
            .get_current_time()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        self.set_http_request_header("x-time", Some(&now.to_string()));
        if let Some(addr) = self.get_property(vec!["source", "address"]) {
            self.set_http_request_header_bytes("x-source", Some(&addr));
        }
        if self.get_property(vec!["no", "such", "property"]).is_some() {
            log::error!("unexpected property");
        }
        match self.mode.as_str() {
            "passthrough" => {
                self.set_http_request_header("x-added", Some("yes"));
                self.add_http_request_header("x-multi", "b");
                self.remove_http_request_header("x-remove-me");
                let missing = self.get_http_request_header("x-absent");
                self.set_http_request_header("x-absent-was", Some(&format!("{missing:?}")));
                Action::Continue
            }
            "replace-all" => {
                self.set_http_request_headers(vec![
                    (":path", "/new"),
                    (":method", "POST"),
                    ("x-only", "1"),
                ]);
                Action::Continue
            }
            "pause-headers" | "late-header" | "body-pause-continue" => Action::Pause,
            "call" | "call-read-missing" | "call-touch-after-resume" => {
                match self.dispatch_http_call(
                    "lookup",
                    vec![
                        (":method", "POST"),
                        (":path", "/lookup"),
                        (":authority", "lookup.svc"),
                        ("X-Upper", "v"),
                    ],
                    Some(b"question"),
                    vec![],
                    Duration::from_millis(1500),
                ) {
                    Ok(token) => {
                        self.set_http_request_header("x-token", Some(&token.to_string()));
                        Action::Pause
                    }
                    Err(status) => {
                        log::error!("dispatch failed: {status:?}");
                        self.send_http_response(500, vec![], Some(b"dispatch failed"));
                        Action::Pause
                    }
                }
            }
            "call-bad" => {
                let r = self.dispatch_http_call(
                    "nope",
                    vec![(":method", "GET"), (":path", "/"), (":authority", "x")],
                    None,
                    vec![],
                    Duration::from_secs(1),
                );
                let r2 = self.dispatch_http_call(
                    "lookup",
                    vec![(":method", "GET"), (":path", "/")],
                    None,
                    vec![],
                    Duration::from_secs(1),
                );
                self.send_http_response(500, vec![("x-r", &format!("{r:?} {r2:?}"))], None);
                Action::Pause
            }
            "reply" => {
                self.send_http_response(403, vec![("x-reason", "denied")], Some(b"forbidden"));
                Action::Pause
            }
            "panic" => panic!("boom in request headers"),
            "unreachable" => trap(),
            "shared" => {
                let (v, cas) = self.get_shared_data("k");
                self.set_http_request_header("x-shared-before", Some(&format!("{v:?} {cas:?}")));
                self.set_shared_data("k", Some(b"v1"), None).unwrap();
                let (_, cas) = self.get_shared_data("k");
                let ok = self.set_shared_data("k", Some(b"v2"), cas);
                let stale = self.set_shared_data("k", Some(b"v3"), cas);
                self.set_http_request_header("x-shared-cas", Some(&format!("{ok:?} {stale:?}")));
                Action::Continue
            }
            "read-response-early" => {
                // Response headers are not available in the request path: BadArgument -> trap.
                let _ = self.get_http_response_header(":status");
                Action::Continue
            }
            _ => Action::Continue,
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        log::debug!("request body {body_size} eos {end_of_stream}");
        match self.mode.as_str() {
            "pause-headers" => {
                if !end_of_stream {
                    return Action::Pause;
                }
                let body = self.get_http_request_body(0, body_size).unwrap_or_default();
                proxy_wasm::hostcalls::record_metric(self.hist, body.len() as u64).unwrap();
                self.set_http_request_header("x-body-len", Some(&body.len().to_string()));
                self.set_http_request_header("content-length", None);
                let mut new_body = b"rewritten:".to_vec();
                new_body.extend_from_slice(&body);
                self.set_http_request_body(0, body_size, &new_body);
                Action::Continue
            }
            "body-pause-continue" => {
                // Pause the first chunk, then continue: the headers go upstream with it.
                if body_size < 4 && !end_of_stream {
                    return Action::Pause;
                }
                Action::Continue
            }
            "late-header" => {
                // The first chunk's Continue sends the paused headers upstream; a header set
                // afterwards would be lost in Envoy.
                if end_of_stream {
                    self.set_http_request_header("x-late", Some("1"));
                }
                Action::Continue
            }
            "body-header" => {
                // Headers answered Continue: the map is gone in the body callback.
                self.set_http_request_header("x-from-body", Some("1"));
                Action::Continue
            }
            _ => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let status = self.get_http_response_header(":status").unwrap_or_default();
        self.set_http_response_header("x-filter-saw-status", Some(&status));
        if self.mode == "rewrite-response" {
            self.set_http_response_header("content-length", None);
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.mode != "rewrite-response" {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let body = self
            .get_http_response_body(0, body_size)
            .unwrap_or_default();
        self.set_http_response_body(0, body_size, &body.to_ascii_uppercase());
        Action::Continue
    }

    fn on_log(&mut self) {
        let path = self.get_http_request_header(":path");
        proxy_wasm::hostcalls::increment_metric(self.gauge, -1).unwrap();
        log::info!("log ctx {} path {path:?}", self.id);
    }
}

/// A bare `unreachable` instruction (only meaningful compiled to wasm).
fn trap() -> ! {
    #[cfg(target_arch = "wasm32")]
    core::arch::wasm32::unreachable();
    #[cfg(not(target_arch = "wasm32"))]
    std::process::abort();
}

//! What the host knows: the per-stream state Envoy keeps for a filter (header maps and their
//! lifetimes, body buffers, deferred actions), http calls, metrics, shared data, logs.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use wasmtime::{Memory, TypedFunc};

use crate::headers::HeaderMap;
use crate::types::{LogLevel, MetricType, Status};

/// How the host behaves where Envoy's behaviour depends on configuration.
#[derive(Clone, Debug)]
pub struct HostOptions {
    /// `vm_config.configuration`: what `proxy_on_vm_start` can read.
    pub vm_configuration: Vec<u8>,
    /// Envoy's `allow_on_headers_stop_iteration` (default false, as in Envoy). When false, a
    /// filter that pauses in a headers callback gets Envoy's `StopAllIterationAndWatermark`:
    /// body chunks are held by Envoy and are not delivered to the filter until it resumes.
    pub allow_on_headers_stop_iteration: bool,
    /// Cluster names `proxy_http_call` accepts; `None` accepts any name. Envoy answers
    /// `BadArgument` for a cluster it does not know.
    pub clusters: Option<Vec<String>>,
    /// What `proxy_get_log_level` answers (Envoy's default level is info).
    pub log_level: LogLevel,
    /// Envoy passes a local reply sent by the filter through the encoder chain, including the
    /// filter's own `on_http_response_headers` / `on_http_response_body`. Default true.
    pub local_reply_through_filter: bool,
    /// Print every filter log line to stderr as it is logged (debugging aid).
    pub echo_logs: bool,
    /// Count every entry into the VM and every host call ([`CallCounts`]).
    pub count_calls: bool,
}

impl Default for HostOptions {
    fn default() -> HostOptions {
        HostOptions {
            vm_configuration: Vec::new(),
            allow_on_headers_stop_iteration: false,
            clusters: None,
            log_level: LogLevel::Info,
            local_reply_through_filter: true,
            echo_logs: false,
            count_calls: false,
        }
    }
}

/// A reply the filter sent with `proxy_send_local_response` (`send_http_response`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    /// The headers the filter added (Envoy adds `content-length`/`content-type` itself; the
    /// full response the client gets is in [`StreamState::response_headers`]).
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// `status_code_details` (empty from the Rust SDK).
    pub details: String,
    /// The gRPC status, `None` when the filter passed -1 (no gRPC status).
    pub grpc_status: Option<i32>,
}

/// An http call the filter dispatched with `proxy_http_call`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpCall {
    pub token: u32,
    /// The context that dispatched it (its `on_http_call_response` will be called).
    pub context_id: u32,
    /// The cluster name.
    pub upstream: String,
    /// Headers as Envoy sends them: keys lower-cased, `content-length` set when there is a body.
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub trailers: HeaderMap,
    /// 0 means no timeout.
    pub timeout_ms: u32,
}

/// A metric's current value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Metric {
    Counter(u64),
    Gauge(i64),
    /// Every recorded value, in order.
    Histogram(Vec<u64>),
}

/// Per-direction bookkeeping mirroring the pointers Envoy's wasm `Context` keeps.
#[derive(Clone, Debug, Default)]
pub(crate) struct Direction {
    /// The headers callback has run.
    pub headers_received: bool,
    /// The header map is reachable from the filter (Envoy's `request_headers_` non-null).
    pub headers_ptr: bool,
    /// The headers carried end_of_stream.
    pub headers_eos: bool,
    /// A body chunk with end_of_stream was handed to the host.
    pub body_eos: bool,
    /// Envoy's `buffering_*_body_`: the last body callback answered Pause, so the decoding
    /// buffer is reachable and the next chunk is appended to it.
    pub buffering: bool,
    /// Envoy's `*_body_buffer_` non-null: the current chunk is reachable.
    pub chunk_ptr: bool,
    /// The headers callback paused without `allow_on_headers_stop_iteration`: Envoy stopped
    /// all iteration and holds body chunks back from the filter.
    pub stop_all: bool,
    /// Body held back from the filter while `stop_all`.
    pub held: Vec<u8>,
    /// Whether the held body ended the stream.
    pub held_eos: bool,
    /// Resume requested (`proxy_continue_stream`), applied after the VM call returns.
    pub continue_pending: bool,
}

/// The state of one HTTP stream as the tests observe it.
#[derive(Clone, Debug, Default)]
pub struct StreamState {
    pub id: u32,
    /// The request header map, as modified by the filter.
    pub request_headers: HeaderMap,
    /// Request body bytes Envoy released upstream (after the filter's changes).
    pub request_body_sent: Vec<u8>,
    /// Request body bytes Envoy holds because the filter paused (the buffer the filter sees
    /// during body callbacks).
    pub request_body_buffered: Vec<u8>,
    /// The request headers went upstream.
    pub request_forwarded: bool,
    /// The filter called `resume_http_request` at least once.
    pub request_resumed: bool,
    /// The response header map (from upstream or the local reply), as modified by the filter.
    pub response_headers: HeaderMap,
    pub response_body_sent: Vec<u8>,
    pub response_body_buffered: Vec<u8>,
    /// The response headers went to the client.
    pub response_forwarded: bool,
    /// The filter called `resume_http_response` at least once.
    pub response_resumed: bool,
    /// The local reply the filter sent, if it did.
    pub local_reply: Option<LocalReply>,
    /// The filter reset the stream (`reset_http_request` / `reset_http_response`), or a
    /// local reply came after the response had started.
    pub reset: bool,
    /// `done()` ran (on_log, on_done, on_delete).
    pub done: bool,
    /// Properties the filter set with `proxy_set_property` (path segments joined by NUL).
    pub filter_properties: BTreeMap<Vec<u8>, Vec<u8>>,
    pub(crate) req: Direction,
    pub(crate) resp: Direction,
    pub(crate) pending_local_reply: Option<LocalReply>,
    pub(crate) pending_reset: bool,
    pub(crate) log_phase: bool,
}

impl StreamState {
    /// The request body as it stands: released bytes followed by buffered ones.
    pub fn request_body(&self) -> Vec<u8> {
        let mut body = self.request_body_sent.clone();
        body.extend_from_slice(&self.request_body_buffered);
        body
    }

    /// The response body as it stands: released bytes followed by buffered ones.
    pub fn response_body(&self) -> Vec<u8> {
        let mut body = self.response_body_sent.clone();
        body.extend_from_slice(&self.response_body_buffered);
        body
    }

    /// A request header as UTF-8.
    pub fn request_header(&self, name: &str) -> Option<&str> {
        self.request_headers.get_str(name)
    }

    /// A response header as UTF-8.
    pub fn response_header(&self, name: &str) -> Option<&str> {
        self.response_headers.get_str(name)
    }

    /// Where the request (`true`) or the response stands, in the terms of Envoy's rules
    /// (`pinroute::host_rules`), which this host enforces as the filter's native tests do.
    pub fn direction(&self, request: bool) -> pinroute::host_rules::Direction {
        let (dir, went_on) = if request {
            (&self.req, self.request_forwarded)
        } else {
            (&self.resp, self.response_forwarded)
        };
        pinroute::host_rules::Direction {
            headers_received: dir.headers_received,
            headers_held: dir.headers_ptr,
            went_on,
            body_reachable: dir.buffering || dir.chunk_ptr,
        }
    }

    /// Whether the request is still held by the filter: not released upstream, not answered
    /// locally, not reset.
    pub fn request_paused(&self) -> bool {
        !self.request_forwarded && self.local_reply.is_none() && !self.reset
    }
}

/// The callback the VM is executing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Callback {
    Initialize,
    ContextCreate,
    VmStart,
    Configure,
    Tick,
    RequestHeaders,
    RequestBody,
    ResponseHeaders,
    ResponseBody,
    HttpCallResponse,
    Log,
    Done,
    Delete,
}

impl Callback {
    /// The SDK-level name of the callback, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Callback::Initialize => "_initialize",
            Callback::ContextCreate => "on_context_create",
            Callback::VmStart => "on_vm_start",
            Callback::Configure => "on_configure",
            Callback::Tick => "on_tick",
            Callback::RequestHeaders => "on_http_request_headers",
            Callback::RequestBody => "on_http_request_body",
            Callback::ResponseHeaders => "on_http_response_headers",
            Callback::ResponseBody => "on_http_response_body",
            Callback::HttpCallResponse => "on_http_call_response",
            Callback::Log => "on_log",
            Callback::Done => "on_done",
            Callback::Delete => "on_delete",
        }
    }
}

/// The guest call in progress.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Frame {
    pub context: u32,
    pub callback: Callback,
}

/// The response of an http call, reachable during `on_http_call_response`.
#[derive(Clone, Debug)]
pub(crate) struct CallResponse {
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// Metrics keyed the way Envoy keys them: ids carry the type in their low two bits.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub ids: BTreeMap<u32, (MetricType, String)>,
    pub values: BTreeMap<(MetricType, String), Metric>,
    pub next_seq: u32,
}

impl Metrics {
    pub fn define(&mut self, kind: MetricType, name: &str) -> u32 {
        self.next_seq = self.next_seq.wrapping_add(1);
        let id = (self.next_seq << 2) | kind.id_tag();
        self.ids.insert(id, (kind, name.to_string()));
        self.values
            .entry((kind, name.to_string()))
            .or_insert_with(|| match kind {
                MetricType::Counter => Metric::Counter(0),
                MetricType::Gauge => Metric::Gauge(0),
                MetricType::Histogram => Metric::Histogram(Vec::new()),
            });
        id
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut Metric> {
        let key = self.ids.get(&id)?.clone();
        self.values.get_mut(&key)
    }
}

/// What crossed the boundary between host and VM, by export or import name: what a
/// request costs beyond the filter's own code (with [`HostOptions::count_calls`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// Calls into the VM: the `proxy_on_*` callbacks and the allocator the host calls to
    /// hand data over.
    pub vm_entries: BTreeMap<String, u64>,
    /// Calls out of the VM: `env.proxy_*` and WASI functions.
    pub host_calls: BTreeMap<String, u64>,
}

impl CallCounts {
    pub fn vm_entries_total(&self) -> u64 {
        self.vm_entries.values().sum()
    }

    pub fn host_calls_total(&self) -> u64 {
        self.host_calls.values().sum()
    }
}

/// Everything the host functions reach through `Caller::data`.
pub(crate) struct HostState {
    pub memory: Option<Memory>,
    pub allocator: Option<TypedFunc<u32, u32>>,
    pub options: HostOptions,
    pub root_id: u32,
    pub next_context_id: u32,
    pub frame: Option<Frame>,
    pub effective_context: Option<u32>,
    pub plugin_config: Vec<u8>,
    pub streams: BTreeMap<u32, StreamState>,
    /// Calls awaiting their response: token → dispatching context.
    pub pending_calls: BTreeMap<u32, u32>,
    /// Calls not yet taken by the test.
    pub new_calls: Vec<HttpCall>,
    pub next_token: u32,
    pub call_response: Option<CallResponse>,
    pub logs: Vec<(LogLevel, String)>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub diagnostics: Vec<String>,
    pub properties: BTreeMap<Vec<u8>, Vec<u8>>,
    pub now: SystemTime,
    pub random_state: u64,
    pub metrics: Metrics,
    pub shared_data: BTreeMap<String, (Vec<u8>, u32)>,
    pub next_cas: u32,
    pub tick_period_ms: u32,
    pub calls: CallCounts,
}

impl HostState {
    pub(crate) fn count_vm_entry(&mut self, export: &str) {
        if self.options.count_calls {
            *self.calls.vm_entries.entry(export.to_string()).or_default() += 1;
        }
    }

    pub fn new(options: HostOptions) -> HostState {
        HostState {
            memory: None,
            allocator: None,
            options,
            root_id: 0,
            next_context_id: 1,
            frame: None,
            effective_context: None,
            plugin_config: Vec::new(),
            streams: BTreeMap::new(),
            pending_calls: BTreeMap::new(),
            new_calls: Vec::new(),
            next_token: 1,
            call_response: None,
            logs: Vec::new(),
            stdout: Vec::new(),
            stderr: Vec::new(),
            diagnostics: Vec::new(),
            properties: BTreeMap::new(),
            now: SystemTime::now(),
            random_state: 0x853c_49e6_748f_ea9b,
            metrics: Metrics::default(),
            shared_data: BTreeMap::new(),
            next_cas: 1,
            calls: CallCounts::default(),
            tick_period_ms: 0,
        }
    }

    /// The context host calls act on: the effective context if the filter set one, else the
    /// context whose callback is running.
    pub fn context(&self) -> Result<u32, Status> {
        if let Some(id) = self.effective_context {
            return Ok(id);
        }
        self.frame.map(|f| f.context).ok_or(Status::InternalFailure)
    }

    pub fn callback(&self) -> Option<Callback> {
        self.frame.map(|f| f.callback)
    }

    /// The running callback's name, for messages.
    pub fn phase(&self) -> &'static str {
        self.callback().map_or("no callback", Callback::name)
    }

    /// The stream of the current context; `None` for the root context.
    pub fn current_stream(&mut self) -> Option<&mut StreamState> {
        let id = self.context().ok()?;
        self.streams.get_mut(&id)
    }

    pub fn log(&mut self, level: LogLevel, message: String) {
        if self.options.echo_logs {
            eprintln!("[filter {level:?}] {message}");
        }
        self.logs.push((level, message));
    }

    pub fn diagnose(&mut self, message: String) {
        if self.options.echo_logs {
            eprintln!("[host] {message}");
        }
        self.diagnostics.push(message);
    }

    pub fn now_nanos(&self) -> u64 {
        self.now
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    pub fn next_cas(&mut self) -> u32 {
        let cas = self.next_cas;
        self.next_cas = self.next_cas.wrapping_add(1);
        if self.next_cas == 0 {
            self.next_cas = 1;
        }
        cas
    }

    /// Deterministic pseudo-random bytes for `random_get` (PCG-style LCG).
    pub fn random_bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            self.random_state = self
                .random_state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            out.extend_from_slice(&(self.random_state >> 16).to_le_bytes());
        }
        out.truncate(len);
        out
    }
}

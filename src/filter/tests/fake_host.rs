//! An in-memory host with Envoy's rules for the calls the request path makes: header maps,
//! the held request body, HTTP calls, shared data with compare-and-swap, and metrics.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use crate::filter::host::rules::{self as host_rules, Access, Direction};
use crate::filter::host::{Flow, HostError, MetricKind};

use crate::filter::host::{Headers, Host, SharedValue};
use crate::policy::trace::SpanIds;

/// A request the filter dispatched.
#[derive(Debug, Clone)]
pub struct Call {
    pub token: u32,
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub timeout: Duration,
}

impl Call {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A response the filter sent itself.
#[derive(Debug, Clone)]
pub struct Sent {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Sent {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }
}

/// What a callback hands the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Headers,
    Body,
}

#[derive(Default)]
pub struct State {
    pub now: u64,
    pub request_headers: Headers,
    pub request_body: Vec<u8>,
    pub resumed: usize,
    pub response_headers: Headers,
    pub response_body: Vec<u8>,
    pub code_details: Option<String>,
    pub upstream_address: Option<String>,
    pub sent: Vec<Sent>,
    /// The stream's access-log fields (filter state), by key.
    pub log_fields: HashMap<String, String>,
    pub calls: Vec<Call>,
    /// The answer the next `call_response_*` reads.
    pub call_answer: (Headers, Vec<u8>),
    /// How often a call's answer body was copied into the VM.
    pub call_body_reads: usize,
    pub fail_dispatch: bool,
    /// Call spans: the ids the next one gets (none: the host has no spans), the one open,
    /// the tags of each closed one.
    pub next_span: Option<SpanIds>,
    pub open_span: Option<SpanIds>,
    pub closed_spans: Vec<Vec<(String, String)>>,
    /// gRPC calls: cluster, `service/method`, message.
    pub grpc_calls: Vec<(String, String, Vec<u8>)>,
    /// Where the request and the response stand, for Envoy's rules (`host_rules`).
    pub request: Direction,
    pub response: Direction,
    pub log_phase: bool,
    /// Host calls Envoy would have refused, as `what: why`.
    pub refusals: Vec<String>,
    /// The plugin configuration a root reads.
    pub plugin_configuration: Option<Vec<u8>>,
    shared: HashMap<String, (Vec<u8>, u32)>,
    /// The name of each metric the filter defined, by id.
    pub metric_names: Vec<String>,
    metric_values: HashMap<u32, u64>,
}

impl State {
    fn direction(&mut self, request: bool) -> &mut Direction {
        if request {
            &mut self.request
        } else {
            &mut self.response
        }
    }
}

/// Cheap to clone: every clone is the same host.
#[derive(Clone, Default)]
pub struct FakeHost(pub Rc<RefCell<State>>);

impl FakeHost {
    pub fn state(&self) -> std::cell::RefMut<'_, State> {
        self.0.borrow_mut()
    }

    /// The host's stream is a new one, with these request headers: its other state (calls,
    /// shared data, metrics) goes on.
    pub fn new_stream(&self, request_headers: Headers) {
        let mut state = self.state();
        state.request_headers = request_headers;
        state.request = Direction::default();
        state.response = Direction::default();
        state.log_phase = false;
        state.log_fields.clear();
    }

    /// A callback of the request (`true`) or response side begins: its headers, or a body
    /// chunk, are handed to the filter.
    pub fn deliver(&self, request: bool, part: Part) {
        let mut state = self.state();
        let direction = state.direction(request);
        match part {
            Part::Headers => {
                direction.headers_received = true;
                direction.headers_held = true;
            }
            Part::Body => direction.body_reachable = true,
        }
    }

    /// The callback answered `flow`: on Continue, that side goes on.
    pub fn answered(&self, request: bool, part: Part, flow: Flow) {
        if flow == Flow::Pause {
            return;
        }
        let mut state = self.state();
        let direction = state.direction(request);
        direction.went_on = true;
        direction.body_reachable = false;
        if part == Part::Headers {
            direction.headers_held = false;
        }
    }

    /// Refuses `access` to the request (`true`) or response as Envoy would, and records it.
    fn check(&self, what: &str, access: Access, request: bool) -> Result<(), HostError> {
        let mut state = self.state();
        let log_phase = state.log_phase;
        let direction = *state.direction(request);
        host_rules::check(access, &direction, log_phase).map_err(|refusal| {
            state.refusals.push(format!("{what}: {refusal}"));
            HostError::Refused("bad argument")
        })
    }

    pub fn request_header(&self, name: &str) -> Option<String> {
        text(&self.0.borrow().request_headers, name)
    }

    pub fn response_header(&self, name: &str) -> Option<String> {
        text(&self.0.borrow().response_headers, name)
    }

    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.state().calls)
    }

    pub fn take_sent(&self) -> Vec<Sent> {
        std::mem::take(&mut self.state().sent)
    }

    /// The value of the metric `name` (0 if never incremented), summed over every
    /// definition of it (each request of a test defines the metrics anew, as each Envoy
    /// thread does).
    pub fn metric(&self, name: &str) -> u64 {
        let state = self.0.borrow();
        let ids = state.metric_names.iter().enumerate();
        ids.filter(|(_, n)| *n == name)
            .filter_map(|(id, _)| state.metric_values.get(&(id as u32)))
            .sum()
    }

    pub fn shared(&self, key: &str) -> Option<Vec<u8>> {
        self.0.borrow().shared.get(key).map(|(v, _)| v.clone())
    }
}

fn text(headers: &Headers, name: &str) -> Option<String> {
    String::from_utf8(headers.get(name)?.to_vec()).ok()
}

fn set(headers: &mut Headers, name: &str, value: Option<&str>) {
    *headers = headers.filtered(|n, _| n != name);
    if let Some(value) = value {
        headers.push(name.as_bytes(), value.as_bytes());
    }
}

fn owned(headers: &[(&str, &str)]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

impl Host for FakeHost {
    fn request_headers(&self) -> Result<Headers, HostError> {
        self.check("request_headers", Access::ReadHeaders, true)?;
        Ok(self.0.borrow().request_headers.clone())
    }

    fn set_request_header(&self, name: &str, value: Option<&str>) -> Result<(), HostError> {
        self.check("set_request_header", Access::WriteHeaders, true)?;
        set(&mut self.state().request_headers, name, value);
        Ok(())
    }

    fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
        self.check("request_body", Access::ReadBody, true)?;
        let body = &self.0.borrow().request_body;
        Ok(body.get(..size).unwrap_or(body).to_vec())
    }

    fn edit_request_body(&self, replaced: usize, with: &[u8]) -> Result<(), HostError> {
        self.check("edit_request_body", Access::WriteBody, true)?;
        let body = &mut self.state().request_body;
        *body = [with, body.get(replaced..).unwrap_or_default()].concat();
        Ok(())
    }

    /// Envoy goes on with the request once the callback returns.
    fn resume_request(&self) -> Result<(), HostError> {
        let mut state = self.state();
        state.resumed += 1;
        state.request.went_on = true;
        state.request.body_reachable = false;
        Ok(())
    }

    fn response_status(&self) -> Option<u16> {
        self.check("response_status", Access::ReadHeaders, false)
            .ok()?;
        self.response_header(":status")?.parse().ok()
    }

    fn set_response_header(&self, name: &str, value: Option<&str>) -> Result<(), HostError> {
        self.check("set_response_header", Access::WriteHeaders, false)?;
        set(&mut self.state().response_headers, name, value);
        Ok(())
    }

    /// Envoy keeps a stream's filter state from its first callback to its log; a native
    /// module's key is read-only once written.
    fn set_log_field(&self, key: &str, value: &str) -> Result<(), HostError> {
        let mut state = self.state();
        if state.log_fields.contains_key(key) {
            state
                .refusals
                .push(format!("set_log_field: {key} written twice"));
            return Err(HostError::Refused("read-only filter state"));
        }
        state.log_fields.insert(key.to_owned(), value.to_owned());
        Ok(())
    }

    fn dispatch_grpc(
        &self,
        cluster: &str,
        service: &str,
        method: &str,
        message: &[u8],
        _timeout: Duration,
    ) -> Result<u32, HostError> {
        let mut state = self.state();
        let call = (
            cluster.to_owned(),
            format!("{service}/{method}"),
            message.to_vec(),
        );
        state.grpc_calls.push(call);
        Ok(u32::try_from(state.grpc_calls.len()).unwrap_or(u32::MAX) + 1000)
    }

    fn has_spans(&self) -> bool {
        self.state().next_span.is_some()
    }

    fn open_call_span(&self, _operation: &str) -> Option<SpanIds> {
        let mut state = self.state();
        if state.open_span.is_some() {
            state
                .refusals
                .push("open_call_span: one is open".to_owned());
        }
        state.open_span = state.next_span.clone();
        state.open_span.clone()
    }

    fn close_call_span(&self, tags: &[(&str, &str)]) {
        let mut state = self.state();
        if state.open_span.take().is_some() {
            let tags = tags.iter().map(|(k, v)| (k.to_string(), v.to_string()));
            state.closed_spans.push(tags.collect());
        }
    }

    fn replace_response_body(&self, old_size: usize, body: &[u8]) -> Result<(), HostError> {
        self.check("replace_response_body", Access::WriteBody, false)?;
        let held = &mut self.state().response_body;
        *held = [body, held.get(old_size..).unwrap_or_default()].concat();
        Ok(())
    }

    fn response_code_details(&self) -> Option<String> {
        self.0.borrow().code_details.clone()
    }

    fn upstream_address(&self) -> Option<String> {
        self.0.borrow().upstream_address.clone()
    }

    fn send_response(
        &self,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError> {
        let sent = Sent {
            status,
            headers: owned(headers),
            body: body.to_vec(),
        };
        self.state().sent.push(sent);
        Ok(())
    }

    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<u32, HostError> {
        let mut state = self.state();
        if state.fail_dispatch {
            return Err(HostError::Refused("bad argument"));
        }
        let token = state.calls.len() as u32 + 100;
        state.calls.push(Call {
            token,
            cluster: cluster.to_string(),
            headers: owned(headers),
            body: body.unwrap_or_default().to_vec(),
            timeout,
        });
        Ok(token)
    }

    fn call_response_headers(&self) -> Result<Headers, HostError> {
        Ok(self.0.borrow().call_answer.0.clone())
    }

    fn call_response_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
        let mut state = self.0.borrow_mut();
        state.call_body_reads += 1;
        let body = &state.call_answer.1;
        Ok(body.get(..size).unwrap_or(body).to_vec())
    }

    fn shared_data(&self, key: &str) -> Result<SharedValue, HostError> {
        Ok(match self.0.borrow().shared.get(key) {
            Some((value, cas)) => (Some(value.clone()), Some(*cas)),
            None => (None, None),
        })
    }

    fn set_shared_data(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError> {
        let mut state = self.state();
        let current = state.shared.get(key).map_or(0, |(_, cas)| *cas);
        if cas.is_some_and(|cas| cas != 0 && cas != current) {
            return Err(HostError::CasMismatch);
        }
        state
            .shared
            .insert(key.to_string(), (value.to_vec(), current + 1));
        Ok(())
    }

    fn define_metric(&self, _kind: MetricKind, name: &str) -> Result<u32, HostError> {
        let mut state = self.state();
        state.metric_names.push(name.to_string());
        Ok(state.metric_names.len() as u32 - 1)
    }

    fn increment_metric(&self, id: u32, offset: i64) -> Result<(), HostError> {
        let mut state = self.state();
        let value = state.metric_values.entry(id).or_default();
        *value = value.saturating_add_signed(offset);
        Ok(())
    }

    fn record_metric(&self, id: u32, value: u64) -> Result<(), HostError> {
        self.state().metric_values.insert(id, value);
        Ok(())
    }

    fn now_nanos(&self) -> u64 {
        self.0.borrow().now
    }

    fn plugin_configuration(&self) -> Option<Vec<u8>> {
        self.0.borrow().plugin_configuration.clone()
    }

    fn set_tick_period(&self, _period: Duration) -> Result<(), HostError> {
        Ok(())
    }
}

//! [`Host`] over Envoy's dynamic-module callbacks. Like proxy-wasm's host calls, the per-stream
//! calls act on the stream whose hook is running: [`super::hooks`] names it in [`CURRENT`]
//! for the duration of the hook, and lends a call's answer through [`CALL_ANSWER`] while the
//! stream reads it; a resume is left in [`RESUME`] for the hook to make once it is done.
//! Metrics go through the filter configuration (any thread may count), and shared data is one
//! process-wide table with proxy-wasm's compare-and-swap semantics.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::abi::{self, EnvoyBuffer, EnvoyHttpHeader, FilterEnvoyPtr, ModuleBuffer};
use super::spans;
use crate::filter::host::{Headers, Host, HostError, MetricKind, SharedValue};
use crate::policy::trace::SpanIds;

/// One filter configuration as Envoy created it on the main thread: shared by every worker
/// thread, so it holds only what is `Send + Sync`.
#[derive(Debug)]
pub struct ModuleConfig {
    /// Names this configuration in the worker threads' tables of roots.
    pub key: u64,
    /// The plugin configuration (the filter's JSON), as Envoy gave it.
    pub bytes: Vec<u8>,
    /// Envoy's `DynamicModuleHttpFilterConfig`, as an address: valid while `alive`.
    envoy: usize,
    /// Every metric the filter may define, by name, with the id Envoy gave it at
    /// configuration time (Envoy defines no metric afterwards). Envoy numbers each kind
    /// apart: the filter sees [`metric_id`]s, which name the kind too.
    metrics: HashMap<String, (MetricKind, usize)>,
    /// False once Envoy destroyed the configuration.
    pub alive: AtomicBool,
}

/// The id the filter sees for Envoy's metric `id` of `kind`: the kind in the top bits.
fn metric_id(kind: MetricKind, id: usize) -> Option<u32> {
    let tag = match kind {
        MetricKind::Counter => 0,
        MetricKind::Gauge => 1,
        MetricKind::Histogram => 2,
    };
    let id = u32::try_from(id).ok().filter(|id| *id < KIND_SHIFT_LIMIT)?;
    Some(tag << KIND_SHIFT | id)
}

const KIND_SHIFT: u32 = 28;
const KIND_SHIFT_LIMIT: u32 = 1 << KIND_SHIFT;

/// [`metric_id`] undone.
fn envoy_metric(id: u32) -> (Option<MetricKind>, usize) {
    let kind = match id >> KIND_SHIFT {
        0 => Some(MetricKind::Counter),
        1 => Some(MetricKind::Gauge),
        2 => Some(MetricKind::Histogram),
        _ => None,
    };
    (kind, (id & (KIND_SHIFT_LIMIT - 1)) as usize)
}

impl ModuleConfig {
    pub fn new(
        key: u64,
        bytes: Vec<u8>,
        envoy: abi::FilterConfigEnvoyPtr,
        metrics: HashMap<String, (MetricKind, usize)>,
    ) -> Self {
        Self {
            key,
            bytes,
            envoy: envoy as usize,
            metrics,
            alive: AtomicBool::new(true),
        }
    }

    pub fn envoy(&self) -> abi::FilterConfigEnvoyPtr {
        self.envoy as abi::FilterConfigEnvoyPtr
    }

    /// Adds `value` to the counter `name`, or records it in the histogram `name`, if it was
    /// defined.
    pub fn update_metric(&self, name: &str, value: u64) {
        let Some(&(kind, id)) = self.metrics.get(name) else {
            return;
        };
        // Not counted is all a failure means here, as for the filter's own metrics.
        let _ = match kind {
            MetricKind::Histogram => self.record(id, value),
            _ => self.add(kind, id, i64::try_from(value).unwrap_or(i64::MAX)),
        };
    }

    /// Adds `offset` to Envoy's metric `id` of `kind` (a gauge's may be negative).
    fn add(&self, kind: MetricKind, id: usize, offset: i64) -> Result<(), HostError> {
        if !self.alive.load(Ordering::Acquire) {
            return Err(HostError::Refused("the configuration is gone"));
        }
        let add = match (kind, offset < 0) {
            (MetricKind::Gauge, true) => {
                abi::envoy_dynamic_module_callback_http_filter_config_decrement_gauge
            }
            (MetricKind::Gauge, false) => {
                abi::envoy_dynamic_module_callback_http_filter_config_increment_gauge
            }
            _ => abi::envoy_dynamic_module_callback_http_filter_config_increment_counter,
        };
        let by = offset.unsigned_abs();
        // SAFETY: the configuration is alive, and `id` one of its metrics; no labels.
        let result = unsafe { add(self.envoy(), id, std::ptr::null_mut(), 0, by) };
        refused(result == abi::METRICS_SUCCESS, "metric not updated")
    }

    /// Records `value` in Envoy's histogram `id`.
    fn record(&self, id: usize, value: u64) -> Result<(), HostError> {
        if !self.alive.load(Ordering::Acquire) {
            return Err(HostError::Refused("the configuration is gone"));
        }
        // SAFETY: the configuration is alive, and `id` one of its histograms; no labels.
        let result = unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_record_histogram_value(
                self.envoy(),
                id,
                std::ptr::null_mut(),
                0,
                value,
            )
        };
        refused(result == abi::METRICS_SUCCESS, "metric not recorded")
    }
}

/// Defines one metric on Envoy's filter configuration (during `config_new` only).
pub fn define_metric(
    config: abi::FilterConfigEnvoyPtr,
    kind: MetricKind,
    name: &str,
) -> Option<usize> {
    let mut id = 0usize;
    let name = ModuleBuffer::of(name.as_bytes());
    let define = match kind {
        MetricKind::Counter => abi::envoy_dynamic_module_callback_http_filter_config_define_counter,
        MetricKind::Gauge => abi::envoy_dynamic_module_callback_http_filter_config_define_gauge,
        MetricKind::Histogram => {
            abi::envoy_dynamic_module_callback_http_filter_config_define_histogram
        }
    };
    // SAFETY: `config` is the configuration pointer of the running `config_new` hook; `name`
    // lives through the call; no labels (null, 0); `id` is a valid out-pointer.
    let result = unsafe { define(config, name, std::ptr::null_mut(), 0, &raw mut id) };
    (result == abi::METRICS_SUCCESS).then_some(id)
}

thread_local! {
    /// The stream whose hook runs on this thread (null: none).
    pub static CURRENT: Cell<FilterEnvoyPtr> = const { Cell::new(std::ptr::null_mut()) };
    /// The answer of the call being delivered on this thread, as Envoy lent it.
    static CALL_ANSWER: Cell<Option<LentAnswer>> = const { Cell::new(None) };
    /// The stream a host call asked to resume during the running hook: it is resumed once the
    /// hook's work is over (`super::hooks`), not from inside it.
    pub static RESUME: Cell<FilterEnvoyPtr> = const { Cell::new(std::ptr::null_mut()) };
    /// The period each configuration's root asked to be ticked at, on this thread.
    static TICK_PERIODS: RefCell<Vec<(u64, Duration)>> = const { RefCell::new(Vec::new()) };
}

/// The period the root of configuration `key` on this thread asked to be ticked at.
pub fn tick_period(key: u64) -> Option<Duration> {
    TICK_PERIODS.with(|periods| {
        periods
            .borrow()
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, period)| *period)
    })
}

/// The host clock: nanoseconds since the Unix epoch.
pub fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_nanos()).ok())
        .unwrap_or(0)
}

/// The host of one filter configuration, on whatever thread uses it.
#[derive(Debug, Clone)]
pub struct Dynamic {
    pub config: Arc<ModuleConfig>,
    /// The configuration's root on the main thread, which fetches the live registry through
    /// the configuration's callouts (`super::registry`); the worker threads' roots do not.
    pub fetcher: bool,
}

impl Dynamic {
    /// The host of a worker thread's root and its streams.
    pub fn worker(config: Arc<ModuleConfig>) -> Self {
        Self {
            config,
            fetcher: false,
        }
    }
}

fn current() -> Result<FilterEnvoyPtr, HostError> {
    let filter = CURRENT.with(Cell::get);
    if filter.is_null() {
        return Err(HostError::Refused("no stream in this callback"));
    }
    Ok(filter)
}

fn refused(ok: bool, why: &'static str) -> Result<(), HostError> {
    if ok {
        Ok(())
    } else {
        Err(HostError::Refused(why))
    }
}

/// The headers of one of the stream's maps.
fn headers(filter: FilterEnvoyPtr, header_type: u32) -> Result<Headers, HostError> {
    // SAFETY: `filter` is the stream of the running hook.
    let size =
        unsafe { abi::envoy_dynamic_module_callback_http_get_headers_size(filter, header_type) };
    let mut raw = vec![EnvoyHttpHeader::NULL; size];
    // SAFETY: `raw` has room for the `size` headers Envoy just counted.
    let ok = unsafe {
        abi::envoy_dynamic_module_callback_http_get_headers(filter, header_type, raw.as_mut_ptr())
    };
    refused(ok, "the header map is not available")?;
    // SAFETY: Envoy's header bytes, valid until this hook ends or a header is set.
    Ok(unsafe { copied(&raw) })
}

/// Envoy's headers `raw`, copied into one map.
///
/// # Safety
/// Each header's pointers are Envoy's header bytes, valid for the duration of the call.
unsafe fn copied(raw: &[EnvoyHttpHeader]) -> Headers {
    let names = raw
        .iter()
        .map(|h| h.key_length)
        .fold(0, usize::saturating_add);
    let values = raw
        .iter()
        .map(|h| h.value_length)
        .fold(0, usize::saturating_add);
    let mut headers = Headers::with_capacity(raw.len(), names, values);
    for header in raw {
        // SAFETY: the caller's contract.
        let (name, value) = unsafe { header.slices() };
        headers.push(name, value);
    }
    headers
}

fn header(filter: FilterEnvoyPtr, header_type: u32, name: &str) -> Option<Vec<u8>> {
    let mut value = EnvoyBuffer::NULL;
    // SAFETY: `filter` is the stream of the running hook; `value` a valid out-pointer; the
    // count of values is not asked (null).
    let found = unsafe {
        abi::envoy_dynamic_module_callback_http_get_header(
            filter,
            header_type,
            ModuleBuffer::of(name.as_bytes()),
            &raw mut value,
            0,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: Envoy's bytes, valid until this hook ends.
    (found && !value.ptr.is_null()).then(|| unsafe { value.to_vec() })
}

fn set_header(
    filter: FilterEnvoyPtr,
    header_type: u32,
    name: &str,
    value: Option<&str>,
) -> Result<(), HostError> {
    let value = value.map_or(ModuleBuffer::NULL, |v| ModuleBuffer::of(v.as_bytes()));
    // SAFETY: `filter` is the stream of the running hook; both buffers live through the call.
    let ok = unsafe {
        abi::envoy_dynamic_module_callback_http_set_header(
            filter,
            header_type,
            ModuleBuffer::of(name.as_bytes()),
            value,
        )
    };
    refused(ok, "the header map is not available")
}

fn body_size(filter: FilterEnvoyPtr, body_type: u32) -> usize {
    // SAFETY: `filter` is the stream of the running hook.
    unsafe { abi::envoy_dynamic_module_callback_http_get_body_size(filter, body_type) }
}

/// Appends one of the stream's body buffers to `out`.
fn read_body(filter: FilterEnvoyPtr, body_type: u32, out: &mut Vec<u8>) {
    // SAFETY: `filter` is the stream of the running hook.
    let count =
        unsafe { abi::envoy_dynamic_module_callback_http_get_body_chunks_size(filter, body_type) };
    if count == 0 {
        return;
    }
    let mut chunks = vec![EnvoyBuffer::NULL; count];
    // SAFETY: `chunks` has room for the `count` slices Envoy just counted.
    let ok = unsafe {
        abi::envoy_dynamic_module_callback_http_get_body_chunks(
            filter,
            body_type,
            chunks.as_mut_ptr(),
        )
    };
    if ok {
        // SAFETY: Envoy's body slices, valid until this hook ends or the body changes.
        unsafe { append_chunks(out, &chunks) };
    }
}

/// Appends Envoy's body slices `chunks` to `out`, growing it once.
///
/// # Safety
/// Each chunk is valid as [`EnvoyBuffer::as_slice`] requires, for the duration of the call.
unsafe fn append_chunks(out: &mut Vec<u8>, chunks: &[EnvoyBuffer]) {
    out.reserve(chunks.iter().map(|chunk| chunk.length).sum());
    for chunk in chunks {
        // SAFETY: the caller's contract.
        out.extend_from_slice(unsafe { chunk.as_slice() });
    }
}

fn drain_body(filter: FilterEnvoyPtr, body_type: u32, bytes: usize) -> bool {
    // SAFETY: `filter` is the stream of the running hook.
    unsafe { abi::envoy_dynamic_module_callback_http_drain_body(filter, body_type, bytes) }
}

fn append_body(filter: FilterEnvoyPtr, body_type: u32, data: &[u8]) -> bool {
    // SAFETY: `filter` is the stream of the running hook; `data` lives through the call.
    unsafe {
        abi::envoy_dynamic_module_callback_http_append_body(
            filter,
            body_type,
            ModuleBuffer::of(data),
        )
    }
}

/// The request body Envoy holds for the stream so far: what it buffered, and what the running
/// body hook received (once: at the end of a buffered body Envoy adds the last chunk to the
/// buffer before the hook, and a body another filter buffered arrives as received).
pub fn request_body_len(filter: FilterEnvoyPtr) -> usize {
    let (buffered, received) = request_body_parts(filter);
    buffered.map_or(0, |t| body_size(filter, t)) + body_size(filter, received)
}

fn request_body_parts(filter: FilterEnvoyPtr) -> (Option<u32>, u32) {
    // SAFETY: `filter` is the stream of the running hook.
    let received_is_buffered =
        unsafe { abi::envoy_dynamic_module_callback_http_received_buffered_request_body(filter) };
    let buffered = (!received_is_buffered).then_some(abi::BUFFERED_REQUEST_BODY);
    (buffered, abi::RECEIVED_REQUEST_BODY)
}

/// The response body Envoy holds for the stream so far (as [`request_body_len`]).
pub fn response_body_len(filter: FilterEnvoyPtr) -> usize {
    body_size(filter, abi::BUFFERED_RESPONSE_BODY) + body_size(filter, abi::RECEIVED_RESPONSE_BODY)
}

/// Of `kinds`, the body buffer that holds the body (the first one not empty).
fn holding(filter: FilterEnvoyPtr, kinds: [u32; 2]) -> u32 {
    let [first, second] = kinds;
    if body_size(filter, first) > 0 {
        first
    } else if body_size(filter, second) > 0 {
        second
    } else {
        first
    }
}

fn attribute(attribute_id: u32) -> Option<String> {
    let filter = current().ok()?;
    let mut value = EnvoyBuffer::NULL;
    // SAFETY: `filter` is the stream of the running hook; `value` a valid out-pointer.
    let found = unsafe {
        abi::envoy_dynamic_module_callback_http_filter_get_attribute_string(
            filter,
            attribute_id,
            &raw mut value,
        )
    };
    // SAFETY: Envoy's bytes, valid until this hook ends.
    let bytes = found.then(|| unsafe { value.to_vec() })?;
    String::from_utf8(bytes).ok().filter(|s| !s.is_empty())
}

/// Shared data as proxy-wasm's: values with a compare-and-swap token, one table per process
/// (made on first use). Values are shared, so that the lock is held while a value's count
/// changes, not while it is copied.
type SharedTable = HashMap<String, (Arc<[u8]>, u32)>;
static SHARED: Mutex<Option<SharedTable>> = Mutex::new(None);
static NEXT_CAS: AtomicU32 = AtomicU32::new(1);

fn next_cas() -> u32 {
    loop {
        let cas = NEXT_CAS.fetch_add(1, Ordering::Relaxed);
        if cas != 0 {
            return cas;
        }
    }
}

impl Host for Dynamic {
    fn request_headers(&self) -> Result<Headers, HostError> {
        headers(current()?, abi::REQUEST_HEADER)
    }

    /// Routes match request headers (`x-pinroute-pool`): as Envoy's wasm host does, a change
    /// clears the route Envoy may have picked already.
    fn set_request_header(&self, name: &str, value: Option<&str>) -> Result<(), HostError> {
        let filter = current()?;
        set_header(filter, abi::REQUEST_HEADER, name, value)?;
        // SAFETY: `filter` is the stream of the running hook.
        unsafe { abi::envoy_dynamic_module_callback_http_clear_route_cache(filter) };
        Ok(())
    }

    fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
        let filter = current()?;
        let (buffered, received) = request_body_parts(filter);
        let mut body = Vec::with_capacity(size);
        if let Some(buffered) = buffered {
            read_body(filter, buffered, &mut body);
        }
        read_body(filter, received, &mut body);
        body.truncate(size);
        Ok(body)
    }

    fn edit_request_body(&self, replaced: usize, with: &[u8]) -> Result<(), HostError> {
        let filter = current()?;
        let target = holding(
            filter,
            [abi::BUFFERED_REQUEST_BODY, abi::RECEIVED_REQUEST_BODY],
        );
        let mut body = Vec::new();
        read_body(filter, target, &mut body);
        let rest = body.get(replaced..).unwrap_or_default();
        let edited = drain_body(filter, target, body.len())
            && append_body(filter, target, with)
            && append_body(filter, target, rest);
        refused(edited, "the request body is not available")
    }

    fn resume_request(&self) -> Result<(), HostError> {
        let filter = current()?;
        RESUME.with(|resume| resume.set(filter));
        Ok(())
    }

    fn response_status(&self) -> Option<u16> {
        let value = header(current().ok()?, abi::RESPONSE_HEADER, ":status")?;
        std::str::from_utf8(&value).ok()?.parse().ok()
    }

    fn set_response_header(&self, name: &str, value: Option<&str>) -> Result<(), HostError> {
        set_header(current()?, abi::RESPONSE_HEADER, name, value)
    }

    fn set_log_field(&self, key: &str, value: &str) -> Result<(), HostError> {
        let filter = current()?;
        // SAFETY: `filter` is the stream of the running hook; both buffers live through the call.
        let ok = unsafe {
            abi::envoy_dynamic_module_callback_http_set_filter_state_bytes(
                filter,
                ModuleBuffer::of(key.as_bytes()),
                ModuleBuffer::of(value.as_bytes()),
            )
        };
        refused(ok, "the stream's filter state is not available")
    }

    fn has_spans(&self) -> bool {
        true
    }

    fn open_call_span(&self, operation: &str) -> Option<SpanIds> {
        spans::open(current().ok()?, operation)
    }

    fn close_call_span(&self, tags: &[(&str, &str)]) {
        if let Ok(filter) = current() {
            spans::close(filter, tags);
        }
    }

    fn replace_response_body(&self, _old_size: usize, body: &[u8]) -> Result<(), HostError> {
        let filter = current()?;
        let kinds = [abi::BUFFERED_RESPONSE_BODY, abi::RECEIVED_RESPONSE_BODY];
        let target = holding(filter, kinds);
        for kind in kinds {
            drain_body(filter, kind, body_size(filter, kind));
        }
        refused(
            append_body(filter, target, body),
            "the response body is not available",
        )
    }

    fn response_code_details(&self) -> Option<String> {
        attribute(abi::ATTRIBUTE_RESPONSE_CODE_DETAILS)
    }

    fn upstream_address(&self) -> Option<String> {
        attribute(abi::ATTRIBUTE_UPSTREAM_ADDRESS)
    }

    fn send_response(
        &self,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError> {
        let filter = current()?;
        let mut raw: Vec<abi::ModuleHttpHeader> = headers
            .iter()
            .map(|(name, value)| abi::ModuleHttpHeader::of(name, value))
            .collect();
        // SAFETY: `filter` is the stream of the running hook; the headers and the body live
        // through the call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_send_response(
                filter,
                u32::from(status),
                raw.as_mut_ptr(),
                raw.len(),
                ModuleBuffer::of(body),
                ModuleBuffer::of(b"pinroute"),
            );
        }
        Ok(())
    }

    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<u32, HostError> {
        // The stream of the running hook calls out, or the configuration on the main thread.
        let (caller, callout): (*mut std::ffi::c_void, abi::Callout) = match self.fetcher {
            true => (
                self.config.envoy(),
                abi::envoy_dynamic_module_callback_http_filter_config_http_callout,
            ),
            false => (
                current()?,
                abi::envoy_dynamic_module_callback_http_filter_http_callout,
            ),
        };
        let mut raw: Vec<abi::ModuleHttpHeader> = headers
            .iter()
            .map(|(name, value)| abi::ModuleHttpHeader::of(name, value))
            .collect();
        let mut id = 0u64;
        let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        // SAFETY: `caller` is the stream of the running hook, or the configuration (alive: its
        // main-thread root runs); everything lent lives through the call; `id` is a valid
        // out-pointer.
        let result = unsafe {
            callout(
                caller,
                &raw mut id,
                ModuleBuffer::of(cluster.as_bytes()),
                raw.as_mut_ptr(),
                raw.len(),
                body.map_or(ModuleBuffer::NULL, ModuleBuffer::of),
                millis,
            )
        };
        match result {
            abi::CALLOUT_SUCCESS => {
                u32::try_from(id).map_err(|_| HostError::Refused("callout id out of range"))
            }
            abi::CALLOUT_MISSING_REQUIRED_HEADERS => {
                Err(HostError::Refused("missing :method, :path or host"))
            }
            abi::CALLOUT_CLUSTER_NOT_FOUND => Err(HostError::Refused("cluster not found")),
            abi::CALLOUT_DUPLICATE_ID => Err(HostError::Refused("duplicate callout id")),
            abi::CALLOUT_CANNOT_CREATE_REQUEST => {
                Err(HostError::Refused("cannot create the request"))
            }
            _ => Err(HostError::Refused("unexpected callout result")),
        }
    }

    fn call_response_headers(&self) -> Result<Headers, HostError> {
        let answer = CALL_ANSWER.get().ok_or(HostError::NotFound)?;
        // SAFETY: a lent answer is in `CALL_ANSWER` only while its callback runs.
        Ok(unsafe { copied(answer.headers()) })
    }

    fn call_response_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
        let answer = CALL_ANSWER.get().ok_or(HostError::NotFound)?;
        let mut body = Vec::new();
        // SAFETY: a lent answer is in `CALL_ANSWER` only while its callback runs.
        unsafe { append_chunks(&mut body, answer.chunks()) };
        body.truncate(size);
        Ok(body)
    }

    fn shared_data(&self, key: &str) -> Result<SharedValue, HostError> {
        let held = {
            let table = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
            table.as_ref().and_then(|t| t.get(key)).cloned()
        };
        Ok(match held {
            Some((value, cas)) => (Some(value.to_vec()), Some(cas)),
            None => (None, None),
        })
    }

    fn set_shared_data(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError> {
        let value = Arc::from(value);
        // The value replaced is freed once the lock is released.
        let _replaced;
        let mut table = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        let table = table.get_or_insert_with(HashMap::new);
        match table.get_mut(key) {
            Some((_, held)) if cas.is_some_and(|c| c != 0 && c != *held) => {
                Err(HostError::CasMismatch)
            }
            Some(entry) => {
                _replaced = std::mem::replace(entry, (value, next_cas()));
                Ok(())
            }
            None => {
                table.insert(key.to_owned(), (value, next_cas()));
                Ok(())
            }
        }
    }

    fn define_metric(&self, kind: MetricKind, name: &str) -> Result<u32, HostError> {
        match self.config.metrics.get(name) {
            Some((defined, id)) if *defined == kind => {
                metric_id(kind, *id).ok_or(HostError::Refused("metric id out of range"))
            }
            _ => Err(HostError::Refused(
                "Envoy defines a dynamic module's metrics at configuration time only",
            )),
        }
    }

    fn increment_metric(&self, id: u32, offset: i64) -> Result<(), HostError> {
        let (Some(kind), id) = envoy_metric(id) else {
            return Err(HostError::NotFound);
        };
        self.config.add(kind, id, offset)
    }

    fn record_metric(&self, id: u32, value: u64) -> Result<(), HostError> {
        let (Some(MetricKind::Histogram), id) = envoy_metric(id) else {
            return Err(HostError::NotFound);
        };
        self.config.record(id, value)
    }

    fn now_nanos(&self) -> u64 {
        now_nanos()
    }

    fn plugin_configuration(&self) -> Option<Vec<u8>> {
        Some(self.config.bytes.clone())
    }

    /// Envoy gives a dynamic module no timer of its own: the hooks tick a thread's root when
    /// one of its streams' hooks runs after the period (`super::hooks`).
    fn set_tick_period(&self, period: Duration) -> Result<(), HostError> {
        let key = self.config.key;
        TICK_PERIODS.with(|periods| {
            let mut periods = periods.borrow_mut();
            periods.retain(|(k, _)| *k != key);
            periods.push((key, period));
        });
        Ok(())
    }

    fn polls_sources(&self) -> bool {
        self.fetcher
    }
}

/// A call's answer as Envoy lent it to the callback delivering it: its headers and body
/// slices, valid while that callback runs.
#[derive(Debug, Clone, Copy)]
struct LentAnswer {
    headers: *const EnvoyHttpHeader,
    headers_size: usize,
    chunks: *const EnvoyBuffer,
    chunks_size: usize,
}

impl LentAnswer {
    /// # Safety
    /// The callback that lent the answer still runs.
    unsafe fn headers<'a>(self) -> &'a [EnvoyHttpHeader] {
        // SAFETY: the caller's contract: Envoy's `headers_size` headers.
        unsafe { lent(self.headers, self.headers_size) }
    }

    /// # Safety
    /// As [`Self::headers`]'.
    unsafe fn chunks<'a>(self) -> &'a [EnvoyBuffer] {
        // SAFETY: the caller's contract: Envoy's `chunks_size` body slices.
        unsafe { lent(self.chunks, self.chunks_size) }
    }

    /// A reset or an answer over the buffer limit: no response, as proxy-wasm tells it.
    const NONE: Self = Self {
        headers: std::ptr::null(),
        headers_size: 0,
        chunks: std::ptr::null(),
        chunks_size: 0,
    };
}

/// The `size` entries Envoy lent at `at` (none if null).
///
/// # Safety
/// A non-null `at` points to `size` entries, valid for `'a`.
unsafe fn lent<'a, T>(at: *const T, size: usize) -> &'a [T] {
    match at.is_null() {
        true => &[],
        // SAFETY: the caller's contract.
        false => unsafe { std::slice::from_raw_parts(at, size) },
    }
}

/// Lends a call's answer to the stream in [`CALL_ANSWER`] while `deliver` runs with its body's
/// size (the answer a call delivered inside `deliver` lends is withdrawn after it).
///
/// # Safety
/// `headers` and `chunks` point to `headers_size` and `chunks_size` entries (or are null),
/// valid while `deliver` runs.
pub unsafe fn with_call_answer(
    result: u32,
    headers: *const EnvoyHttpHeader,
    headers_size: usize,
    chunks: *const EnvoyBuffer,
    chunks_size: usize,
    deliver: impl FnOnce(usize),
) {
    let answer = match result {
        abi::CALLOUT_RESULT_SUCCESS => LentAnswer {
            headers,
            headers_size,
            chunks,
            chunks_size,
        },
        _ => LentAnswer::NONE,
    };
    // SAFETY: the caller's contract.
    let body_size = unsafe { answer.chunks() }.iter().map(|c| c.length).sum();
    let _lent = Lending(CALL_ANSWER.replace(Some(answer)));
    deliver(body_size);
}

/// Withdraws a lent answer, giving back the one lent before it, even if the delivery unwinds:
/// no pointer of Envoy's outlives its callback.
struct Lending(Option<LentAnswer>);

impl Drop for Lending {
    fn drop(&mut self) {
        CALL_ANSWER.set(self.0);
    }
}

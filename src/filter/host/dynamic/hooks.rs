//! The event hooks the module exports to Envoy, each mapped onto [`Root`] and [`Stream`].
//!
//! Threads: Envoy creates a filter configuration on its main thread and runs each stream's
//! hooks on one worker thread. A [`ModuleConfig`] (the configuration's bytes and metric ids) is
//! all the threads share; each worker thread builds its own [`Root`] from it when its first
//! stream starts (thread-local, keyed by the configuration), so the filter's `Rc`s never leave
//! their thread, as each proxy-wasm VM keeps its own.
//!
//! Re-entrance: a host call may make Envoy run another hook of the same stream before it
//! returns (a local reply completes the stream; resuming the request can bring its answer at
//! once). A stream's state is borrowed for one hook at a time: resuming is done once the hook's
//! work is over, and a stream that completes inside a hook is ended after it.
//!
//! Panics: every hook catches them, so none unwinds into Envoy; a stream whose hook panicked
//! is answered 500 where a local reply is still possible, and left alone afterwards.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::abi::{self, EnvoyBuffer, EnvoyHttpHeader, FilterConfigEnvoyPtr, FilterEnvoyPtr};
use super::guard::guarded;
use super::host::{
    CURRENT, Dynamic, ModuleConfig, RESUME, define_metric, now_nanos, request_body_len,
    response_body_len, tick_period, with_call_answer,
};
use super::poller;
use super::spans;
use crate::filter::host::own_time::{self, Timed};
use crate::filter::host::{Flow, MetricKind};
use crate::filter::metrics::fixed_metrics;
use crate::filter::root::Root;
use crate::filter::stream::Stream;
use crate::policy::api::ErrorShape;
use crate::policy::config::Config;
use crate::policy::error::RouteError;
use crate::policy::headers::ERROR_CODE_HEADER;

static LOGGER: EnvoyLog = EnvoyLog;
static NEXT_CONFIG: AtomicU64 = AtomicU64::new(1);

/// A worker thread's root of one configuration.
struct ThreadRoot {
    config: Arc<ModuleConfig>,
    root: Root<Dynamic>,
    /// When it was last ticked (ns since the epoch).
    ticked: u64,
}

thread_local! {
    /// This thread's roots, one per live filter configuration.
    static ROOTS: RefCell<Vec<ThreadRoot>> = const { RefCell::new(Vec::new()) };
}

/// `log` records in Envoy's log (the `dynamic_modules` component).
struct EnvoyLog;

impl log::Log for EnvoyLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Error => abi::LOG_ERROR,
            log::Level::Warn => abi::LOG_WARN,
            log::Level::Info => abi::LOG_INFO,
            log::Level::Debug => abi::LOG_DEBUG,
            log::Level::Trace => abi::LOG_TRACE,
        };
        let message = record.args().to_string();
        // SAFETY: the message lives through the call; Envoy's logger is thread-safe.
        unsafe {
            abi::envoy_dynamic_module_callback_log(
                level,
                abi::ModuleBuffer::of(message.as_bytes()),
            );
        }
    }

    fn flush(&self) {}
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    guarded(
        "program_init",
        || {
            if log::set_logger(&LOGGER).is_ok() {
                log::set_max_level(log::LevelFilter::Info);
            }
            own_time::start_if_asked();
            abi::ABI_VERSION.as_ptr()
        },
        std::ptr::null,
    )
}

/// A configuration's metrics, defined with Envoy: every metric the filter may use, the
/// per-model counters for each model of the registry (`models`) included.
fn define_metrics(
    config: FilterConfigEnvoyPtr,
    models: &[impl AsRef<str>],
) -> HashMap<String, (MetricKind, usize)> {
    let mut defined = HashMap::new();
    let own_time = [
        (MetricKind::Counter, own_time::MODULE_NS),
        (MetricKind::Counter, own_time::ENVOY_NS),
        (MetricKind::Counter, own_time::CLOCK_READS),
        (MetricKind::Histogram, own_time::REQUEST_NS),
    ]
    .into_iter()
    .filter(|_| own_time::on())
    .map(|(kind, name)| (kind, name.to_owned()));
    for (kind, name) in fixed_metrics(models).into_iter().chain(own_time) {
        match define_metric(config, kind, &name) {
            Some(id) => {
                defined.insert(name, (kind, id));
            }
            None => log::warn!("pinroute: Envoy did not define the metric {name}"),
        }
    }
    defined
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: FilterConfigEnvoyPtr,
    _name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    guarded(
        "http_filter_config_new",
        || {
            // SAFETY: Envoy's configuration bytes, valid during this hook.
            let bytes = unsafe { config.to_vec() };
            let parsed = Config::from_json(&bytes).ok();
            let key = NEXT_CONFIG.fetch_add(1, Ordering::Relaxed);
            let models = parsed.as_ref().map_or(&[][..], |c| c.registry.models());
            let metrics = define_metrics(config_envoy, models);
            let shared = Arc::new(ModuleConfig::new(key, bytes, config_envoy, metrics));
            // The configuration is checked here, on the main thread, as each worker thread
            // will read it: Envoy refuses one the filter refuses.
            let mut root = Root::new(Dynamic {
                config: shared.clone(),
                fetcher: true,
            });
            if !root.configure() {
                return std::ptr::null();
            }
            if let Some(period) = parsed.and_then(|c| poller::period(&c.settings)) {
                poller::start(&shared, root, period);
            }
            Arc::into_raw(shared).cast::<c_void>()
        },
        std::ptr::null,
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    guarded(
        "http_filter_config_destroy",
        || {
            if config.is_null() {
                return;
            }
            // SAFETY: `config` came from `Arc::into_raw` in `config_new`; Envoy destroys it
            // once, and this takes back that reference.
            let shared = unsafe { Arc::from_raw(config.cast::<ModuleConfig>()) };
            shared.alive.store(false, Ordering::Release);
            poller::stop(shared.key);
        },
        || (),
    );
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> *const c_void {
    log::error!("pinroute: the native module takes no per-route configuration");
    std::ptr::null()
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(
    _config: *const c_void,
) {
}

/// One stream: its state machine, borrowed by one hook at a time.
struct FilterState {
    stream: RefCell<Stream<Dynamic>>,
    /// The configuration the stream is of (its root's key).
    config: u64,
    /// The stream's end was counted.
    ended: Cell<bool>,
    /// The stream completed inside another of its hooks: it ends after that one.
    end_pending: Cell<bool>,
    /// A hook panicked: the state is left alone from then on.
    broken: Cell<bool>,
    /// The stream's Envoy filter, as its last hook named it (for what outlives the hooks:
    /// an open call span, [`spans::abandon`]).
    filter: Cell<FilterEnvoyPtr>,
    /// The module's own time in the stream's hooks so far, when it counts it ([`own_time`]).
    own_ns: Cell<u64>,
}

/// Restores [`CURRENT`] when a hook is over, however it ends.
struct Entered(FilterEnvoyPtr);

impl Entered {
    fn new(filter: FilterEnvoyPtr) -> Self {
        Self(CURRENT.with(|current| current.replace(filter)))
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        CURRENT.with(|current| current.set(self.0));
    }
}

impl FilterState {
    /// Runs `event` on the stream (`None`: re-entered, or broken), then what it left for after.
    fn run<R>(
        &self,
        filter: FilterEnvoyPtr,
        event: impl FnOnce(&mut Stream<Dynamic>) -> R,
    ) -> Option<R> {
        if self.broken.get() {
            return None;
        }
        self.filter.set(filter);
        let result = {
            let _entered = Entered::new(filter);
            let Ok(mut stream) = self.stream.try_borrow_mut() else {
                log::debug!("pinroute: a stream's hook ran inside another one");
                return None;
            };
            event(&mut stream)
        };
        if self.end_pending.take() {
            self.end(filter);
        }
        let resume = RESUME.with(|resume| resume.replace(std::ptr::null_mut()));
        if !resume.is_null() {
            // SAFETY: `resume` is a stream whose hook ran on this thread just now; Envoy's
            // filter is alive while its hook runs.
            unsafe { abi::envoy_dynamic_module_callback_http_filter_continue_decoding(resume) };
        }
        Some(result)
    }

    /// The stream is over: counted once, now or after the hook it completed in.
    fn end(&self, filter: FilterEnvoyPtr) {
        if self.ended.get() || self.broken.get() {
            return;
        }
        let _entered = Entered::new(filter);
        match self.stream.try_borrow_mut() {
            Ok(mut stream) => {
                self.ended.set(true);
                stream.on_stream_end();
            }
            Err(_) => self.end_pending.set(true),
        }
    }
}

/// What to do about a hook that panicked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnPanic {
    /// Answer the client 500 and stop the stream there.
    Answer,
    /// The answer is already going: let it.
    Continue,
}

/// Runs a stream hook: the stream's `event`, with panics caught.
fn stream_hook(
    hook: &str,
    filter: FilterEnvoyPtr,
    module: *const c_void,
    on_panic: OnPanic,
    event: impl FnOnce(&mut Stream<Dynamic>) -> u32,
) -> u32 {
    // SAFETY: `module` is the `FilterState` `http_filter_new` boxed, alive until
    // `http_filter_destroy`; Envoy uses it on one thread.
    let Some(state) = (unsafe { module.cast::<FilterState>().as_ref() }) else {
        return abi::CONTINUE;
    };
    let status = timed(&state.own_ns, || {
        stream_hook_guarded(hook, state, filter, on_panic, event)
    });
    count_own_time(state.config);
    status
}

fn stream_hook_guarded(
    hook: &str,
    state: &FilterState,
    filter: FilterEnvoyPtr,
    on_panic: OnPanic,
    event: impl FnOnce(&mut Stream<Dynamic>) -> u32,
) -> u32 {
    guarded(
        hook,
        || {
            let status = state.run(filter, event).unwrap_or(abi::CONTINUE);
            tick_if_due(state.config);
            status
        },
        || {
            state.broken.set(true);
            if on_panic == OnPanic::Continue {
                return abi::CONTINUE;
            }
            let error = RouteError::Internal("the gateway failed on this request");
            let body = error.body(ErrorShape::default());
            let mut headers = [
                abi::ModuleHttpHeader::of("content-type", "application/json"),
                abi::ModuleHttpHeader::of(ERROR_CODE_HEADER, error.code()),
            ];
            // SAFETY: `filter` is the stream of this hook; everything lent lives through the call.
            unsafe {
                abi::envoy_dynamic_module_callback_http_send_response(
                    filter,
                    u32::from(error.status()),
                    headers.as_mut_ptr(),
                    headers.len(),
                    abi::ModuleBuffer::of(body.as_bytes()),
                    abi::ModuleBuffer::of(b"pinroute_panic"),
                );
            }
            abi::STOP
        },
    )
}

/// Runs `body` as the module's own time, added to `own` (a stream's so far).
fn timed<R>(own: &Cell<u64>, body: impl FnOnce() -> R) -> R {
    let _timed = Timed::module();
    if !own_time::on() {
        return body();
    }
    let before = own_time::module_total_ns();
    let result = body();
    let took = own_time::module_total_ns().saturating_sub(before);
    own.set(own.get().saturating_add(took));
    result
}

/// Adds what this thread counted of its own time and Envoy's to configuration `key`'s
/// counters, once it has enough and no hook runs ([`own_time`]).
fn count_own_time(key: u64) {
    if !own_time::on() {
        return;
    }
    if let Some(counted) = own_time::take() {
        update_metrics(
            key,
            &[
                (own_time::MODULE_NS, counted.module_ns),
                (own_time::ENVOY_NS, counted.envoy_ns),
                (own_time::CLOCK_READS, counted.clock_reads),
            ],
        );
    }
}

/// Updates metrics of configuration `key` from this thread.
fn update_metrics(key: u64, updates: &[(&str, u64)]) {
    ROOTS.with(|roots| {
        let Ok(roots) = roots.try_borrow() else {
            return;
        };
        if let Some(thread_root) = roots.iter().find(|r| r.config.key == key) {
            for (name, value) in updates {
                thread_root.config.update_metric(name, *value);
            }
        }
    });
}

fn status(flow: Flow) -> u32 {
    match flow {
        Flow::Continue => abi::CONTINUE,
        Flow::Pause => abi::STOP,
    }
}

/// This thread's new stream of `config`, from its root (made on the thread's first stream).
fn new_stream(config: &Arc<ModuleConfig>) -> Option<Stream<Dynamic>> {
    ROOTS.with(|roots| {
        let mut roots = roots.borrow_mut();
        roots.retain(|r| r.config.alive.load(Ordering::Acquire));
        if !roots.iter().any(|r| r.config.key == config.key) {
            let mut root = Root::new(Dynamic::worker(config.clone()));
            if !root.configure() {
                log::error!("pinroute: a worker thread refused the configuration");
            }
            roots.push(ThreadRoot {
                config: config.clone(),
                root,
                ticked: now_nanos(),
            });
        }
        let thread_root = roots.iter().find(|r| r.config.key == config.key)?;
        thread_root.root.new_stream()
    })
}

/// Ticks this thread's root of configuration `key` if its period has passed: Envoy gives a
/// dynamic module no timer, so a root is ticked from its streams' hooks (a thread with no
/// stream is not ticked; its in-flight share is published when its requests start and end).
fn tick_if_due(key: u64) {
    let Some(period) = tick_period(key) else {
        return;
    };
    let period = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX);
    let now = now_nanos();
    ROOTS.with(|roots| {
        let Ok(mut roots) = roots.try_borrow_mut() else {
            return;
        };
        if let Some(thread_root) = roots.iter_mut().find(|r| r.config.key == key)
            && now.saturating_sub(thread_root.ticked) >= period
        {
            thread_root.ticked = now;
            thread_root.root.tick();
        }
    });
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: *const c_void,
    filter: FilterEnvoyPtr,
) -> *const c_void {
    let _timed = Timed::module();
    let started = own_time::on().then(own_time::module_total_ns);
    guarded(
        "http_filter_new",
        || {
            if config.is_null() {
                return std::ptr::null();
            }
            // SAFETY: `config` came from `Arc::into_raw` in `config_new` and Envoy keeps the
            // configuration while it makes streams of it: a new reference is taken here.
            let config = unsafe {
                Arc::increment_strong_count(config.cast::<ModuleConfig>());
                Arc::from_raw(config.cast::<ModuleConfig>())
            };
            let _entered = Entered::new(filter);
            // Ticked first, so that the stream starts from a registry adopted just now.
            tick_if_due(config.key);
            let Some(stream) = new_stream(&config) else {
                return std::ptr::null();
            };
            let state = Box::new(FilterState {
                stream: RefCell::new(stream),
                config: config.key,
                ended: Cell::new(false),
                end_pending: Cell::new(false),
                broken: Cell::new(false),
                filter: Cell::new(filter),
                own_ns: Cell::new(
                    started.map_or(0, |ns| own_time::module_total_ns().saturating_sub(ns)),
                ),
            });
            Box::into_raw(state).cast_const().cast::<c_void>()
        },
        std::ptr::null,
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    stream_hook("request_headers", filter, module, OnPanic::Answer, |s| {
        status(s.on_request_headers(end_of_stream))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    stream_hook("request_body", filter, module, OnPanic::Answer, |s| {
        status(s.on_request_body(request_body_len(filter), end_of_stream))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    filter: FilterEnvoyPtr,
    module: *const c_void,
) -> u32 {
    stream_hook("request_trailers", filter, module, OnPanic::Answer, |s| {
        status(s.on_request_trailers())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    stream_hook("response_headers", filter, module, OnPanic::Continue, |s| {
        status(s.on_response_headers(end_of_stream))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    stream_hook("response_body", filter, module, OnPanic::Continue, |s| {
        status(s.on_response_body(response_body_len(filter), end_of_stream))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
) -> u32 {
    abi::CONTINUE
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    filter: FilterEnvoyPtr,
    module: *const c_void,
) {
    // SAFETY: as in `stream_hook`.
    let Some(state) = (unsafe { module.cast::<FilterState>().as_ref() }) else {
        return;
    };
    timed(&state.own_ns, || {
        guarded(
            "stream_complete",
            || state.end(filter),
            || state.broken.set(true),
        );
    });
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: *const c_void) {
    if module.is_null() {
        return;
    }
    // SAFETY: `module` is the `FilterState` `http_filter_new` boxed; Envoy destroys it once,
    // after its last hook, and this takes it back.
    let state = unsafe { Box::from_raw(module.cast_mut().cast::<FilterState>()) };
    let own = Cell::new(0);
    let key = state.config;
    timed(&own, || {
        guarded(
            "http_filter_destroy",
            || spans::abandon(state.filter.get()),
            || (),
        );
        guarded(
            "http_filter_destroy",
            || state.end(std::ptr::null_mut()),
            || (),
        );
        own.set(state.own_ns.get());
        drop(state);
    });
    if own_time::on() {
        update_metrics(key, &[(own_time::REQUEST_NS, own.get())]);
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    callout_id: u64,
    result: u32,
    headers: *const EnvoyHttpHeader,
    headers_size: usize,
    chunks: *const EnvoyBuffer,
    chunks_size: usize,
) {
    let _timed = Timed::module();
    let Ok(token) = u32::try_from(callout_id) else {
        return;
    };
    let deliver = |body_size| {
        stream_hook("http_callout_done", filter, module, OnPanic::Answer, |s| {
            s.on_call_answer(token, body_size);
            abi::CONTINUE
        });
    };
    // SAFETY: Envoy's answer, valid during this hook.
    unsafe { with_call_answer(result, headers, headers_size, chunks, chunks_size, deliver) };
}

// Hooks Envoy 1.40 requires of an HTTP filter module that the filter has no use for: streamed
// callouts, scheduled events, the downstream's write buffer.

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
    _stream_id: u64,
    _headers: *const EnvoyHttpHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
    _stream_id: u64,
    _trailers: *const EnvoyHttpHeader,
    _trailers_size: usize,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
    _stream_id: u64,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
    _stream_id: u64,
    _reason: u32,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
    _event_id: u64,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
) {
}

//! The periodic calls in the native module — the live registry's fetch and the engines'
//! scrapes: made by the configuration's root on Envoy's main thread, through the
//! configuration's own callouts (as a proxy-wasm root calls through its VM's), and shared
//! with the worker threads' roots in the process-wide tables, where they adopt what it got
//! on their next tick.
//!
//! Envoy gives a dynamic module no timer: a thread of the module's own sleeps through the
//! period and commits an event to the configuration's scheduler, which runs
//! [`envoy_dynamic_module_on_http_filter_config_scheduled`] on the main thread. The thread ends
//! when Envoy destroys the configuration.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::abi::{self, EnvoyBuffer, EnvoyHttpHeader, FilterConfigEnvoyPtr};
use super::guard::guarded;
use super::host::{Dynamic, ModuleConfig, now_nanos, with_call_answer};
use crate::filter::root::Root;
use crate::policy::config::Settings;
use crate::policy::engine_load::EngineLoadSource;

/// The shortest wait between two looks at whether a call is due.
const MIN_TIMER_PERIOD: Duration = Duration::from_millis(50);
/// How often the timer thread checks that its configuration is still alive.
const ALIVE_CHECK: Duration = Duration::from_millis(100);

thread_local! {
    /// The main thread's roots of the configurations with periodic calls, by key.
    static FETCHERS: RefCell<Vec<(u64, Root<Dynamic>)>> = const { RefCell::new(Vec::new()) };
}

/// Envoy's scheduler of one configuration, committed to from the timer thread.
struct Scheduler(*mut c_void);

// SAFETY: Envoy's configuration scheduler is made for committing from any thread; only the
// timer thread holds it, and deletes it once.
unsafe impl Send for Scheduler {}

/// How often the main thread's root of a configuration with `settings` looks whether a
/// call is due: every half registry refresh and every look for an engine scrape, whichever
/// is shorter; `None` when it makes no periodic call.
pub fn period(settings: &Settings) -> Option<Duration> {
    let registry = settings.registry.as_ref().map(|r| r.refresh() / 2);
    let engines = settings.engine_load.as_ref().map(|e| e.look_period());
    let period = registry.into_iter().chain(engines).min()?;
    Some(period.max(MIN_TIMER_PERIOD))
}

/// Keeps `root` (configured, on the main thread) as the poller of `config` and starts the
/// thread that asks it to tick every `period` (a call happens when the root's turn is due).
pub fn start(config: &Arc<ModuleConfig>, root: Root<Dynamic>, period: Duration) {
    // SAFETY: the configuration Envoy is creating (`config_new` runs on the main thread).
    let scheduler = unsafe {
        abi::envoy_dynamic_module_callback_http_filter_config_scheduler_new(config.envoy())
    };
    if scheduler.is_null() {
        log::error!(
            "pinroute: Envoy gave no scheduler: no live registry fetch nor engine scrape is made"
        );
        return;
    }
    FETCHERS.with(|fetchers| fetchers.borrow_mut().push((config.key, root)));
    let scheduler = Scheduler(scheduler);
    let alive = config.clone();
    let spawned = std::thread::Builder::new()
        .name("pinroute-poller".into())
        .spawn(move || ask_for_fetches(&alive, &scheduler, period));
    if let Err(error) = spawned {
        log::error!("pinroute: cannot start the periodic calls' timer: {error}");
    }
}

/// The timer thread: an event every `period` while the configuration lives.
fn ask_for_fetches(config: &ModuleConfig, scheduler: &Scheduler, period: Duration) {
    while config.alive.load(Ordering::Acquire) {
        // SAFETY: the scheduler lives until this thread deletes it below.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_scheduler_commit(scheduler.0, 0)
        };
        // On the clock's multiples of the period, like the proxy-wasm roots' timers.
        let wait = EngineLoadSource::until_next_look(now_nanos(), period);
        let started = Instant::now();
        while started.elapsed() < wait && config.alive.load(Ordering::Acquire) {
            std::thread::sleep(ALIVE_CHECK.min(wait - started.elapsed()));
        }
    }
    // SAFETY: made by `scheduler_new`, committed to by this thread alone, deleted once.
    unsafe { abi::envoy_dynamic_module_callback_http_filter_config_scheduler_delete(scheduler.0) };
}

/// Forgets the poller of a configuration Envoy destroyed (main thread).
pub fn stop(key: u64) {
    FETCHERS.with(|fetchers| {
        if let Ok(mut fetchers) = fetchers.try_borrow_mut() {
            fetchers.retain(|(k, _)| *k != key);
        }
    });
}

/// Runs `event` on the poller of the configuration `module` points to.
fn with_fetcher(module: *const c_void, event: impl FnOnce(&mut Root<Dynamic>)) {
    // SAFETY: `module` is the `ModuleConfig` `config_new` returned, alive while Envoy calls
    // its hooks.
    let Some(config) = (unsafe { module.cast::<ModuleConfig>().as_ref() }) else {
        return;
    };
    FETCHERS.with(|fetchers| {
        let Ok(mut fetchers) = fetchers.try_borrow_mut() else {
            return;
        };
        if let Some((_, root)) = fetchers.iter_mut().find(|(k, _)| *k == config.key) {
            event(root);
        }
    });
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _config_envoy: FilterConfigEnvoyPtr,
    module: *const c_void,
    _event: u64,
) {
    guarded(
        "http_filter_config_scheduled",
        || with_fetcher(module, Root::tick),
        || (),
    );
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _config_envoy: FilterConfigEnvoyPtr,
    module: *const c_void,
    callout_id: u64,
    result: u32,
    headers: *const EnvoyHttpHeader,
    headers_size: usize,
    chunks: *const EnvoyBuffer,
    chunks_size: usize,
) {
    let Ok(token) = u32::try_from(callout_id) else {
        return;
    };
    let deliver = |body_size| {
        guarded(
            "http_filter_config_http_callout_done",
            || with_fetcher(module, |root| root.on_call_answer(token, body_size)),
            || (),
        );
    };
    // SAFETY: Envoy's answer, valid during this hook.
    unsafe { with_call_answer(result, headers, headers_size, chunks, chunks_size, deliver) };
}

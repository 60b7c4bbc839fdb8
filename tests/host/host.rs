//! The driver: loads the module, plays Envoy's part of the ABI (context creation, the HTTP
//! filter callbacks in Envoy's order, deferred actions after each VM call) and exposes what
//! the filter did.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use wasmtime::{Config, Engine, Instance, Linker, Module, Store, WasmParams, WasmResults};

use crate::headers::HeaderMap;
use crate::hostcalls;
use crate::state::{
    CallCounts, CallResponse, Callback, Frame, HostOptions, HostState, HttpCall, LocalReply,
    Metric, StreamState,
};
use crate::types::{Action, LogLevel, MetricType};
use crate::wasi;

/// What Envoy's async client answers a call whose connection was refused.
pub const CONNECT_FAILURE_BODY: &[u8] =
    b"upstream connect error or disconnect/reset before headers. reset reason: connection failure";

/// A proxy-wasm VM with one plugin (root context) loaded, driven like Envoy drives it.
pub struct Host {
    store: Store<HostState>,
    instance: Instance,
    unimplemented_imports: Vec<String>,
    /// Set once the VM trapped: Envoy never calls a failed VM again.
    failure: Option<String>,
}

/// Compiled modules, shared by every `Host` of the test process (compiling is the slow part).
struct Cache {
    engine: Option<Engine>,
    modules: HashMap<PathBuf, (SystemTime, u64, Module)>,
}

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(|| {
        Mutex::new(Cache {
            engine: None,
            modules: HashMap::new(),
        })
    })
}

/// Compiles (or reuses) the module at `path`; rebuilt files are recompiled.
fn load_module(path: &Path) -> Result<Module> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot read the filter module {}", path.display()))?;
    let stamp = (
        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        meta.len(),
    );
    let mut cache = cache()
        .lock()
        .map_err(|_| anyhow!("the module cache lock is poisoned"))?;
    if let Some((modified, len, module)) = cache.modules.get(path)
        && (*modified, *len) == stamp
    {
        return Ok(module.clone());
    }
    let engine = match &cache.engine {
        Some(engine) => engine.clone(),
        None => {
            let mut config = Config::new();
            // Tests run the filter briefly; a fast compile matters more than fast code.
            config.cranelift_opt_level(wasmtime::OptLevel::None);
            // Counts the instructions the filter executes ([`Host::instructions`]).
            config.consume_fuel(true);
            let engine = Engine::new(&config)?;
            cache.engine = Some(engine.clone());
            engine
        }
    };
    let bytes = std::fs::read(path)
        .with_context(|| format!("cannot read the filter module {}", path.display()))?;
    let module = Module::new(&engine, &bytes)
        .map_err(anyhow::Error::from)
        .with_context(|| format!("cannot compile {}", path.display()))?;
    cache
        .modules
        .insert(path.to_path_buf(), (stamp.0, stamp.1, module.clone()));
    Ok(module)
}

impl Host {
    /// Loads the module with Envoy's default options (see [`HostOptions`]) and starts the
    /// plugin: `_initialize`, root context creation, `proxy_on_vm_start`,
    /// `proxy_on_configure(plugin_config)`. Fails if any of them traps or answers false.
    pub fn new(wasm_path: &Path, plugin_config: &str) -> Result<Host> {
        Host::with_options(wasm_path, plugin_config, HostOptions::default())
    }

    /// [`Host::new`] with explicit options.
    pub fn with_options(
        wasm_path: &Path,
        plugin_config: &str,
        options: HostOptions,
    ) -> Result<Host> {
        let module = load_module(wasm_path)?;
        let abi = module.exports().any(|e| {
            matches!(
                e.name(),
                "proxy_abi_version_0_2_1" | "proxy_abi_version_0_2_0"
            )
        });
        ensure!(
            abi,
            "{} exports no proxy_abi_version_0_2_1 (or 0_2_0): Envoy would refuse it",
            wasm_path.display()
        );
        let engine = module.engine().clone();
        let mut store = Store::new(&engine, HostState::new(options));
        store.set_fuel(u64::MAX)?;
        let mut linker: Linker<HostState> = Linker::new(&engine);
        hostcalls::add_to_linker(&mut linker)?;
        wasi::add_to_linker(&mut linker)?;
        let unimplemented_imports =
            hostcalls::define_missing_as_traps(&mut linker, &mut store, &module)?;
        if store.data().options.count_calls {
            linker = hostcalls::counting(&linker, &mut store, &module)?;
        }
        let instance = linker
            .instantiate(&mut store, &module)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("cannot instantiate {}", wasm_path.display()))?;
        let memory = instance.get_memory(&mut store, "memory");
        // Envoy prefers `malloc` and falls back on `proxy_on_memory_allocate`.
        let allocator = instance
            .get_typed_func::<u32, u32>(&mut store, "malloc")
            .or_else(|_| {
                instance.get_typed_func::<u32, u32>(&mut store, "proxy_on_memory_allocate")
            })
            .ok();
        ensure!(memory.is_some(), "the module exports no `memory`");
        ensure!(
            allocator.is_some(),
            "the module exports neither `malloc` nor `proxy_on_memory_allocate`"
        );
        store.data_mut().memory = memory;
        store.data_mut().allocator = allocator;

        let mut host = Host {
            store,
            instance,
            unimplemented_imports,
            failure: None,
        };
        let start = if host
            .instance
            .get_func(&mut host.store, "_initialize")
            .is_some()
        {
            "_initialize"
        } else {
            "_start"
        };
        host.call::<(), ()>(start, 0, Callback::Initialize, ())?;

        let root = host.next_context_id();
        host.store.data_mut().root_id = root;
        host.call::<(u32, u32), ()>(
            "proxy_on_context_create",
            root,
            Callback::ContextCreate,
            (root, 0),
        )?;
        let vm_config_len = len_u32(host.store.data().options.vm_configuration.len());
        let started = host
            .call::<(u32, u32), u32>(
                "proxy_on_vm_start",
                root,
                Callback::VmStart,
                (root, vm_config_len),
            )?
            .unwrap_or(1);
        if started == 0 {
            bail!("proxy_on_vm_start returned false{}", host.recent_logs(0));
        }
        let log_mark = host.store.data().logs.len();
        if !host.configure(plugin_config)? {
            bail!(
                "proxy_on_configure returned false for {plugin_config:?}{}",
                host.recent_logs(log_mark)
            );
        }
        Ok(host)
    }

    /// Runs `proxy_on_configure` again with a new plugin configuration; returns its answer.
    pub fn configure(&mut self, plugin_config: &str) -> Result<bool> {
        let root = self.root_context_id();
        self.store.data_mut().plugin_config = plugin_config.as_bytes().to_vec();
        let len = len_u32(plugin_config.len());
        let answer = self
            .call::<(u32, u32), u32>("proxy_on_configure", root, Callback::Configure, (root, len))?
            .unwrap_or(1);
        Ok(answer != 0)
    }

    /// Creates an HTTP stream context (`proxy_on_context_create(id, root)`); returns its id.
    pub fn new_http_stream(&mut self) -> Result<u32> {
        self.check_usable("proxy_on_context_create")?;
        let id = self.next_context_id();
        let root = self.root_context_id();
        self.store.data_mut().streams.insert(
            id,
            StreamState {
                id,
                ..StreamState::default()
            },
        );
        self.call::<(u32, u32), ()>(
            "proxy_on_context_create",
            id,
            Callback::ContextCreate,
            (id, root),
        )?;
        Ok(id)
    }

    // -----------------------------------------------------------------------------------
    // Request path

    /// Delivers the request headers (`proxy_on_request_headers`). Keys are lower-cased and
    /// pseudo-headers put first, as Envoy's codec does. The map stays reachable from the
    /// filter while it is paused, until it resumes.
    pub fn request_headers<K: AsRef<str>, V: AsRef<[u8]>>(
        &mut self,
        ctx: u32,
        headers: &[(K, V)],
        end_of_stream: bool,
    ) -> Result<Action> {
        self.check_usable("proxy_on_request_headers")?;
        let s = self.stream_mut(ctx)?;
        ensure!(!s.done, "stream {ctx} is done");
        ensure!(
            !s.req.headers_received,
            "stream {ctx}: request headers were already delivered"
        );
        s.request_headers = HeaderMap::from_pairs(headers);
        s.req.headers_received = true;
        s.req.headers_ptr = true;
        s.req.headers_eos = end_of_stream;
        s.req.body_eos = end_of_stream;
        let n = len_u32(s.request_headers.len());
        let action = self.call_action(
            "proxy_on_request_headers",
            ctx,
            Callback::RequestHeaders,
            (ctx, n, u32::from(end_of_stream)),
        )?;
        let allow_stop = self.store.data().options.allow_on_headers_stop_iteration;
        let s = self.stream_mut(ctx)?;
        if action == Action::Continue {
            s.req.headers_ptr = false;
        }
        if !terminating(s, true) {
            match action {
                Action::Continue => forward(s, true),
                Action::Pause => s.req.stop_all = !allow_stop,
            }
        }
        self.settle(ctx)?;
        Ok(action)
    }

    /// Delivers a request body chunk (`proxy_on_request_body`). While the filter keeps
    /// answering Pause, Envoy buffers: the next call's `body_size` is the whole buffer and the
    /// filter reads and rewrites the whole buffer.
    ///
    /// If the headers callback paused without `allow_on_headers_stop_iteration`, Envoy holds
    /// the chunk back from the filter: this returns `Pause` without calling the filter, and the
    /// held body is delivered when the filter resumes.
    pub fn request_body(&mut self, ctx: u32, chunk: &[u8], end_of_stream: bool) -> Result<Action> {
        self.check_usable("proxy_on_request_body")?;
        let s = self.stream_mut(ctx)?;
        ensure!(!s.done, "stream {ctx} is done");
        ensure!(
            s.req.headers_received,
            "stream {ctx}: request body before request headers"
        );
        ensure!(
            !s.req.body_eos,
            "stream {ctx}: the request already ended (end_of_stream was delivered)"
        );
        ensure!(
            s.local_reply.is_none() && !s.reset,
            "stream {ctx}: the stream was answered locally or reset; Envoy stops decoding"
        );
        s.req.body_eos = end_of_stream;
        if s.req.stop_all {
            s.req.held.extend_from_slice(chunk);
            s.req.held_eos = end_of_stream;
            let note = format!(
                "stream {ctx}: request body chunk ({} bytes) held by Envoy, not given to the \
                 filter: its headers callback paused without allow_on_headers_stop_iteration",
                chunk.len()
            );
            self.store.data_mut().diagnose(note);
            return Ok(Action::Pause);
        }
        self.deliver_body(ctx, true, chunk, end_of_stream)
    }

    // -----------------------------------------------------------------------------------
    // Response path

    /// Delivers the upstream response headers (`proxy_on_response_headers`). Fails if the
    /// request never went upstream (still paused, answered locally or reset).
    pub fn response_headers<K: AsRef<str>, V: AsRef<[u8]>>(
        &mut self,
        ctx: u32,
        headers: &[(K, V)],
        end_of_stream: bool,
    ) -> Result<Action> {
        self.check_usable("proxy_on_response_headers")?;
        let s = self.stream_ref(ctx)?;
        ensure!(!s.done, "stream {ctx} is done");
        ensure!(
            !s.resp.headers_received,
            "stream {ctx}: response headers were already delivered"
        );
        ensure!(
            s.local_reply.is_none() && !s.reset,
            "stream {ctx}: the stream was answered locally or reset; no upstream response comes"
        );
        ensure!(
            s.request_forwarded,
            "stream {ctx}: the request never went upstream (the filter still holds it), so no \
             response can arrive"
        );
        self.deliver_response_headers(ctx, HeaderMap::from_pairs(headers), end_of_stream)
    }

    /// Delivers a response body chunk (`proxy_on_response_body`), buffering like the request
    /// side.
    pub fn response_body(&mut self, ctx: u32, chunk: &[u8], end_of_stream: bool) -> Result<Action> {
        self.check_usable("proxy_on_response_body")?;
        let s = self.stream_mut(ctx)?;
        ensure!(!s.done, "stream {ctx} is done");
        ensure!(
            s.resp.headers_received,
            "stream {ctx}: response body before response headers"
        );
        ensure!(!s.resp.body_eos, "stream {ctx}: the response already ended");
        ensure!(!s.reset, "stream {ctx}: the stream was reset");
        ensure!(
            s.local_reply.is_none(),
            "stream {ctx}: the response is the filter's local reply; its body was delivered"
        );
        s.resp.body_eos = end_of_stream;
        if s.resp.stop_all {
            s.resp.held.extend_from_slice(chunk);
            s.resp.held_eos = end_of_stream;
            let note = format!(
                "stream {ctx}: response body chunk ({} bytes) held by Envoy: the response headers \
                 callback paused without allow_on_headers_stop_iteration",
                chunk.len()
            );
            self.store.data_mut().diagnose(note);
            return Ok(Action::Pause);
        }
        self.deliver_body(ctx, false, chunk, end_of_stream)
    }

    // -----------------------------------------------------------------------------------
    // Http calls

    /// Answers the http call `token` (`proxy_on_http_call_response`): the headers (include
    /// `:status`) and body are reachable from the filter during the callback only.
    pub fn http_call_response<K: AsRef<str>, V: AsRef<[u8]>>(
        &mut self,
        token: u32,
        headers: &[(K, V)],
        body: &[u8],
    ) -> Result<()> {
        let response = CallResponse {
            headers: HeaderMap::from_pairs(headers),
            body: body.to_vec(),
        };
        self.answer_call(token, Some(response))
    }

    /// Fails the http call `token` as Envoy does when a reached worker's answer broke off or
    /// outgrew the async client's limit (a reset mid-body, a timeout after the headers):
    /// `proxy_on_http_call_response` with 0 headers and an empty body, and no response map
    /// (reading a header of it is BadArgument, which the SDK turns into a panic).
    pub fn http_call_failure(&mut self, token: u32) -> Result<()> {
        self.answer_call(token, None)
    }

    /// Answers the http call `token` as Envoy 1.40 does when the worker refused the
    /// connection: its own 503 naming the reset reason (the end-to-end suite relies on it).
    pub fn http_call_refused(&mut self, token: u32) -> Result<()> {
        self.http_call_response(token, &[(":status", "503")], CONNECT_FAILURE_BODY)
    }

    /// Answers `token` although the host tracks no such call (the filter must ignore it):
    /// `proxy_on_http_call_response` on the root context, with no response.
    pub fn stray_http_call_response(&mut self, token: u32) -> Result<()> {
        let root = self.root_context_id();
        self.call::<(u32, u32, u32, u32, u32), ()>(
            "proxy_on_http_call_response",
            root,
            Callback::HttpCallResponse,
            (root, token, 0, 0, 0),
        )?;
        Ok(())
    }

    /// The next http call gets `token`, as when Envoy's call id counter wraps around.
    pub fn set_next_http_call_token(&mut self, token: u32) {
        self.store.data_mut().next_token = token;
    }

    /// Calls dispatched since the last `take_http_calls`.
    pub fn take_http_calls(&mut self) -> Vec<HttpCall> {
        std::mem::take(&mut self.store.data_mut().new_calls)
    }

    /// Tokens of calls dispatched and not yet answered (nor cancelled by `done`).
    pub fn pending_http_calls(&self) -> Vec<u32> {
        self.store.data().pending_calls.keys().copied().collect()
    }

    // -----------------------------------------------------------------------------------
    // End of stream, timers

    /// Ends the stream as Envoy does: `proxy_on_log` (request/response headers readable, not
    /// writable), then `proxy_on_done` and `proxy_on_delete`. Pending http calls of the
    /// stream are cancelled (their responses never reach the filter).
    pub fn done(&mut self, ctx: u32) -> Result<()> {
        self.check_usable("proxy_on_log")?;
        let s = self.stream_mut(ctx)?;
        ensure!(!s.done, "stream {ctx} is already done");
        s.log_phase = true;
        let logged = self.call::<(u32,), ()>("proxy_on_log", ctx, Callback::Log, (ctx,));
        if let Ok(s) = self.stream_mut(ctx) {
            s.log_phase = false;
        }
        logged?;
        self.call::<(u32,), u32>("proxy_on_done", ctx, Callback::Done, (ctx,))?;
        self.call::<(u32,), ()>("proxy_on_delete", ctx, Callback::Delete, (ctx,))?;
        self.stream_mut(ctx)?.done = true;
        let state = self.store.data_mut();
        let cancelled: Vec<u32> = state
            .pending_calls
            .iter()
            .filter(|(_, c)| **c == ctx)
            .map(|(t, _)| *t)
            .collect();
        for token in cancelled {
            state.pending_calls.remove(&token);
            state.diagnose(format!("http call {token} cancelled: stream {ctx} ended"));
        }
        Ok(())
    }

    /// Fires the plugin's timer (`proxy_on_tick`). Fails if the filter set no tick period,
    /// since Envoy would never call it then.
    pub fn tick(&mut self) -> Result<()> {
        ensure!(
            self.store.data().tick_period_ms > 0,
            "the filter set no tick period: Envoy would not call proxy_on_tick"
        );
        let root = self.root_context_id();
        self.call::<(u32,), ()>("proxy_on_tick", root, Callback::Tick, (root,))?;
        Ok(())
    }

    /// The tick period the filter asked for, if any.
    pub fn tick_period(&self) -> Option<Duration> {
        let ms = self.store.data().tick_period_ms;
        (ms > 0).then(|| Duration::from_millis(u64::from(ms)))
    }

    // -----------------------------------------------------------------------------------
    // Observation and environment

    /// The state of a stream (also after `done`).
    pub fn stream(&self, ctx: u32) -> Result<&StreamState> {
        self.stream_ref(ctx)
    }

    /// What crossed between host and VM since the last reset (with
    /// [`HostOptions::count_calls`]).
    pub fn call_counts(&self) -> &CallCounts {
        &self.store.data().calls
    }

    pub fn reset_call_counts(&mut self) {
        self.store.data_mut().calls = CallCounts::default();
    }

    /// The root context id.
    pub fn root_context_id(&self) -> u32 {
        self.store.data().root_id
    }

    /// The size of the module's linear memory, in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.store
            .data()
            .memory
            .map_or(0, |memory| memory.data_size(&self.store) as u64)
    }

    /// Everything the filter logged (`proxy_log`, plus stdout/stderr lines as info/error).
    pub fn logs(&self) -> Vec<(LogLevel, String)> {
        self.store.data().logs.clone()
    }

    /// Takes the logs collected so far.
    pub fn take_logs(&mut self) -> Vec<(LogLevel, String)> {
        std::mem::take(&mut self.store.data_mut().logs)
    }

    /// What the module wrote to stderr (Rust's default panic message goes there when the
    /// SDK's panic hook is not installed).
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.store.data().stderr).into_owned()
    }

    /// Notes of the host about calls Envoy would refuse or silently ignore.
    pub fn diagnostics(&self) -> Vec<String> {
        self.store.data().diagnostics.clone()
    }

    /// Imports of the module this host links as traps (a call to one fails the VM).
    pub fn unimplemented_imports(&self) -> &[String] {
        &self.unimplemented_imports
    }

    /// Why the VM is dead, if a call trapped.
    /// The wasm instructions the filter has executed since it was loaded (wasmtime's fuel:
    /// one per instruction, a few bookkeeping ones free), the same on every machine.
    pub fn instructions(&self) -> u64 {
        u64::MAX - self.store.get_fuel().unwrap_or(u64::MAX)
    }

    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Sets the value `proxy_get_property` answers for `path` (e.g. `&["source", "address"]`).
    /// Properties not set are `NotFound`, as Envoy answers for unknown ones.
    pub fn set_property(&mut self, path: &[&str], value: &[u8]) {
        self.store
            .data_mut()
            .properties
            .insert(property_key(path), value.to_vec());
    }

    /// Removes a property set with `set_property`.
    pub fn clear_property(&mut self, path: &[&str]) {
        self.store.data_mut().properties.remove(&property_key(path));
    }

    /// Sets the clock (`proxy_get_current_time_nanoseconds`, WASI `clock_time_get`).
    pub fn set_time(&mut self, t: SystemTime) {
        self.store.data_mut().now = t;
    }

    /// Moves the clock forward.
    pub fn advance_time(&mut self, by: Duration) {
        let state = self.store.data_mut();
        state.now = state.now.checked_add(by).unwrap_or(state.now);
    }

    /// The host clock.
    pub fn now(&self) -> SystemTime {
        self.store.data().now
    }

    /// All metrics by name (a name defined with two types keeps the last type's entry).
    pub fn metrics(&self) -> BTreeMap<String, Metric> {
        self.store
            .data()
            .metrics
            .values
            .iter()
            .map(|((_, name), value)| (name.clone(), value.clone()))
            .collect()
    }

    /// A counter's value.
    pub fn counter(&self, name: &str) -> Option<u64> {
        match self.metric_of(MetricType::Counter, name)? {
            Metric::Counter(v) => Some(*v),
            _ => None,
        }
    }

    /// A gauge's value.
    pub fn gauge(&self, name: &str) -> Option<i64> {
        match self.metric_of(MetricType::Gauge, name)? {
            Metric::Gauge(v) => Some(*v),
            _ => None,
        }
    }

    /// A histogram's recorded values.
    pub fn histogram(&self, name: &str) -> Option<Vec<u64>> {
        match self.metric_of(MetricType::Histogram, name)? {
            Metric::Histogram(v) => Some(v.clone()),
            _ => None,
        }
    }

    fn metric_of(&self, kind: MetricType, name: &str) -> Option<&Metric> {
        self.store
            .data()
            .metrics
            .values
            .get(&(kind, name.to_string()))
    }

    /// A shared-data entry and its CAS.
    pub fn shared_data(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.store.data().shared_data.get(key).cloned()
    }

    /// Writes a shared-data entry as another worker would (bumps its CAS).
    pub fn set_shared_data(&mut self, key: &str, value: &[u8]) {
        let state = self.store.data_mut();
        let cas = state.next_cas();
        state
            .shared_data
            .insert(key.to_string(), (value.to_vec(), cas));
    }

    // -----------------------------------------------------------------------------------
    // Internals

    fn next_context_id(&mut self) -> u32 {
        let state = self.store.data_mut();
        let id = state.next_context_id;
        state.next_context_id += 1;
        id
    }

    fn stream_ref(&self, ctx: u32) -> Result<&StreamState> {
        self.store
            .data()
            .streams
            .get(&ctx)
            .ok_or_else(|| anyhow!("no stream with context id {ctx}"))
    }

    fn stream_mut(&mut self, ctx: u32) -> Result<&mut StreamState> {
        self.store
            .data_mut()
            .streams
            .get_mut(&ctx)
            .ok_or_else(|| anyhow!("no stream with context id {ctx}"))
    }

    fn check_usable(&self, what: &str) -> Result<()> {
        match &self.failure {
            Some(why) => bail!("the VM failed earlier ({why}); Envoy would not call {what} on it"),
            None => Ok(()),
        }
    }

    fn recent_logs(&self, from: usize) -> String {
        let logs = self.store.data().logs.get(from..).unwrap_or_default();
        if logs.is_empty() {
            return String::new();
        }
        let mut out = String::from("\nfilter logs:");
        for (level, message) in logs {
            out.push_str(&format!("\n  [{level:?}] {message}"));
        }
        out
    }

    /// Calls an export with `context` as the current context. A missing export answers
    /// `None` (Envoy skips callbacks a module does not export). A trap fails the VM and
    /// returns an error with the trap, the filter's logs during the call (the SDK logs a
    /// panic's message at critical level) and the host's notes.
    fn call<P: WasmParams, R: WasmResults>(
        &mut self,
        name: &str,
        context: u32,
        callback: Callback,
        params: P,
    ) -> Result<Option<R>> {
        self.check_usable(name)?;
        let Some(func) = self.instance.get_func(&mut self.store, name) else {
            return Ok(None);
        };
        let typed = func
            .typed::<P, R>(&self.store)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("the export {name} has an unexpected signature"))?;
        let state = self.store.data_mut();
        state.count_vm_entry(name);
        let log_mark = state.logs.len();
        let diag_mark = state.diagnostics.len();
        state.frame = Some(Frame { context, callback });
        state.effective_context = None;
        let result = typed.call(&mut self.store, params);
        let state = self.store.data_mut();
        state.frame = None;
        state.effective_context = None;
        state.call_response = None;
        match result {
            Ok(r) => Ok(Some(r)),
            Err(trap) => {
                // The cause first, then what the filter said (the SDK logs a panic's message
                // at critical level), the host's notes, and the wasm backtrace.
                let mut report =
                    format!("{name}(context {context}) trapped: {}", trap.root_cause());
                report.push_str(&self.recent_logs(log_mark));
                let notes = self
                    .store
                    .data()
                    .diagnostics
                    .get(diag_mark..)
                    .unwrap_or_default();
                if !notes.is_empty() {
                    report.push_str("\nhost notes:");
                    for note in notes {
                        report.push_str(&format!("\n  {note}"));
                    }
                }
                report.push_str(&format!("\n{trap:?}"));
                self.failure = Some(format!("{name}(context {context}) trapped"));
                Err(anyhow!(report))
            }
        }
    }

    fn call_action(
        &mut self,
        name: &str,
        ctx: u32,
        callback: Callback,
        params: (u32, u32, u32),
    ) -> Result<Action> {
        match self.call::<(u32, u32, u32), u32>(name, ctx, callback, params)? {
            None => Ok(Action::Continue),
            Some(raw) => Action::from_abi(raw)
                .ok_or_else(|| anyhow!("{name} returned {raw}, not an action of ABI 0.2.1")),
        }
    }

    fn answer_call(&mut self, token: u32, response: Option<CallResponse>) -> Result<()> {
        self.check_usable("proxy_on_http_call_response")?;
        let ctx = self
            .store
            .data_mut()
            .pending_calls
            .remove(&token)
            .ok_or_else(|| {
                anyhow!(
                    "no pending http call with token {token} (never dispatched, already answered, \
                 or cancelled when its stream ended)"
                )
            })?;
        let (headers, body) = response
            .as_ref()
            .map(|r| (len_u32(r.headers.len()), len_u32(r.body.len())))
            .unwrap_or((0, 0));
        self.store.data_mut().call_response = response;
        // `call` clears `call_response` when the VM call returns.
        self.call::<(u32, u32, u32, u32, u32), ()>(
            "proxy_on_http_call_response",
            ctx,
            Callback::HttpCallResponse,
            (ctx, token, headers, body, 0),
        )?;
        if self.store.data().streams.contains_key(&ctx) {
            self.settle(ctx)?;
        }
        Ok(())
    }

    /// Delivers a body chunk to the filter, mirroring Envoy's `decodeData`/`encodeData`.
    fn deliver_body(&mut self, ctx: u32, request: bool, chunk: &[u8], eos: bool) -> Result<Action> {
        let s = self.stream_mut(ctx)?;
        let (dir, buffered) = if request {
            (&mut s.req, &mut s.request_body_buffered)
        } else {
            (&mut s.resp, &mut s.response_body_buffered)
        };
        // Buffering: the chunk joins the buffer and the filter sees all of it. Otherwise the
        // buffer is empty and the filter sees this chunk.
        buffered.extend_from_slice(chunk);
        dir.chunk_ptr = true;
        let size = len_u32(buffered.len());
        let (name, callback) = if request {
            ("proxy_on_request_body", Callback::RequestBody)
        } else {
            ("proxy_on_response_body", Callback::ResponseBody)
        };
        let action = self.call_action(name, ctx, callback, (ctx, size, u32::from(eos)))?;
        let s = self.stream_mut(ctx)?;
        if request {
            s.req.buffering = false;
        } else {
            s.resp.buffering = false;
        }
        if !terminating(s, request) {
            match action {
                Action::Continue => forward(s, request),
                Action::Pause => {
                    let dir = if request { &mut s.req } else { &mut s.resp };
                    dir.buffering = true;
                    dir.chunk_ptr = false;
                }
            }
        }
        self.settle(ctx)?;
        Ok(action)
    }

    fn deliver_response_headers(
        &mut self,
        ctx: u32,
        headers: HeaderMap,
        eos: bool,
    ) -> Result<Action> {
        let s = self.stream_mut(ctx)?;
        let n = len_u32(headers.len());
        s.response_headers = headers;
        s.resp.headers_received = true;
        s.resp.headers_ptr = true;
        s.resp.headers_eos = eos;
        s.resp.body_eos = eos;
        let action = self.call_action(
            "proxy_on_response_headers",
            ctx,
            Callback::ResponseHeaders,
            (ctx, n, u32::from(eos)),
        )?;
        let allow_stop = self.store.data().options.allow_on_headers_stop_iteration;
        let s = self.stream_mut(ctx)?;
        if action == Action::Continue {
            s.resp.headers_ptr = false;
        }
        if !terminating(s, false) {
            match action {
                Action::Continue => forward(s, false),
                Action::Pause => s.resp.stop_all = !allow_stop,
            }
        }
        self.settle(ctx)?;
        Ok(action)
    }

    /// Runs what Envoy defers until after a VM call: resets, local replies, resumes (which
    /// may deliver held body to the filter). Repeats until nothing is pending.
    fn settle(&mut self, ctx: u32) -> Result<()> {
        loop {
            let s = self.stream_mut(ctx)?;
            if s.pending_reset {
                s.pending_reset = false;
                s.reset = true;
                s.req.continue_pending = false;
                s.resp.continue_pending = false;
                continue;
            }
            if let Some(reply) = s.pending_local_reply.take() {
                self.send_local_reply(ctx, reply)?;
                continue;
            }
            if s.req.continue_pending {
                s.req.continue_pending = false;
                self.resume(ctx, true)?;
                continue;
            }
            if s.resp.continue_pending {
                s.resp.continue_pending = false;
                self.resume(ctx, false)?;
                continue;
            }
            return Ok(());
        }
    }

    /// Envoy's `continueDecoding` / `continueEncoding` after `proxy_continue_stream`.
    fn resume(&mut self, ctx: u32, request: bool) -> Result<()> {
        let s = self.stream_mut(ctx)?;
        let started = if request {
            s.req.headers_received
        } else {
            s.resp.headers_received
        };
        let answered_locally = request && s.local_reply.is_some();
        if s.reset || answered_locally || !started {
            return Ok(());
        }
        let dir = if request { &mut s.req } else { &mut s.resp };
        let held_back = dir.stop_all && (!dir.held.is_empty() || dir.held_eos);
        let held = std::mem::take(&mut dir.held);
        let held_eos = dir.held_eos;
        forward(s, request);
        if held_back {
            // After StopAllIteration Envoy hands the body it held to this filter now.
            self.deliver_body(ctx, request, &held, held_eos)?;
        }
        Ok(())
    }

    /// Envoy's `sendLocalReply` after the VM call: the reply goes through the encoder chain,
    /// this filter's response callbacks included.
    fn send_local_reply(&mut self, ctx: u32, reply: LocalReply) -> Result<()> {
        let through_filter = self.store.data().options.local_reply_through_filter;
        let s = self.stream_mut(ctx)?;
        if s.response_forwarded || s.local_reply.is_some() || s.reset {
            s.reset = true;
            let note = format!(
                "stream {ctx}: local reply {} after the response started: Envoy resets the stream",
                reply.status
            );
            self.store.data_mut().diagnose(note);
            return Ok(());
        }
        let mut headers = HeaderMap::new();
        headers.add(":status", reply.status.to_string().as_bytes());
        for (k, v) in reply.headers.entries() {
            headers.add(k, v);
        }
        if !reply.body.is_empty() {
            headers.replace("content-length", reply.body.len().to_string().as_bytes());
            if !headers.contains("content-type") {
                headers.add("content-type", b"text/plain");
            }
        }
        let body = reply.body.clone();
        s.local_reply = Some(reply);
        // The upstream response, if any had started, is replaced.
        s.response_body_buffered.clear();
        s.response_body_sent.clear();
        s.resp = Default::default();
        if !through_filter {
            s.response_headers = headers;
            s.response_forwarded = true;
            s.response_body_sent = body;
            return Ok(());
        }
        self.deliver_response_headers(ctx, headers, body.is_empty())?;
        let s = self.stream_ref(ctx)?;
        if !body.is_empty() && !s.reset {
            if s.resp.stop_all {
                let s = self.stream_mut(ctx)?;
                s.resp.held = body;
                s.resp.held_eos = true;
                s.resp.body_eos = true;
            } else {
                self.stream_mut(ctx)?.resp.body_eos = true;
                self.deliver_body(ctx, false, &body, true)?;
            }
        }
        Ok(())
    }
}

/// A reset or local reply is on its way (or done): the callback's answer no longer moves
/// data in that direction. The response direction still carries the local reply itself.
fn terminating(s: &StreamState, request: bool) -> bool {
    s.reset
        || s.pending_reset
        || s.pending_local_reply.is_some()
        || (request && s.local_reply.is_some())
}

/// Releases a direction: headers go on, buffered body goes on, Envoy stops buffering.
fn forward(s: &mut StreamState, request: bool) {
    if request {
        s.request_forwarded = true;
        let buffered = std::mem::take(&mut s.request_body_buffered);
        s.request_body_sent.extend_from_slice(&buffered);
        s.req.buffering = false;
        s.req.chunk_ptr = false;
        s.req.stop_all = false;
    } else {
        s.response_forwarded = true;
        let buffered = std::mem::take(&mut s.response_body_buffered);
        s.response_body_sent.extend_from_slice(&buffered);
        s.resp.buffering = false;
        s.resp.chunk_ptr = false;
        s.resp.stop_all = false;
    }
}

fn property_key(path: &[&str]) -> Vec<u8> {
    path.join("\0").into_bytes()
}

fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

//! What every phase of a request works with: the host, the configuration, the thread's
//! counters, and the request's id.

use std::cell::{Cell, OnceCell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use super::access_log::{self, Field};
use super::host::{Host, HostError};
use super::metrics::{Counter, Metrics};
use super::shared::{self, Slots};
use super::span_export::SpanQueue;
use crate::policy::api::ErrorShape;
use crate::policy::availability::Observed;
use crate::policy::config::Config;
use crate::policy::engine_load::{EngineLoads, EngineTable};
use crate::policy::error::RouteError;
use crate::policy::headers;
use crate::policy::load::LoadTable;
use crate::policy::pins::{HeaderHints, Pins};
use crate::policy::prefix::PromptPrefix;
use crate::policy::registry::{Pool, Worker, WorkerId};
use crate::policy::resolve::{self, PromptFacts, PromptUse, Resolver, Route, Target, TokenHop};
use crate::policy::select::{self, Affinity, Loads};
use crate::policy::turns::{LastTurn, Turn};

/// A completion's prompt, for the choice of its workers.
pub struct RequestPrompt<'b> {
    pub raw: &'b [u8],
    pub prefix: PromptPrefix,
    /// The conversation's last turn through this gateway, when this prompt continues it.
    pub last_turn: Option<LastTurn>,
}

impl RequestPrompt<'_> {
    fn remembered(&self) -> Vec<WorkerId> {
        self.last_turn
            .map(|turn| turn.prefill.into_iter().chain([turn.decode]).collect())
            .unwrap_or_default()
    }

    /// What a graded bound draws by (`docs/semantics.md` §5): the conversation's, carried by
    /// the turn memory, or this prompt's deepest hash.
    fn draw_key(&self, min_bytes: usize) -> u64 {
        let deepest = || self.prefix.depths(min_bytes).last().copied().unwrap_or(0);
        self.last_turn.map_or_else(deepest, |turn| turn.draw_key)
    }
}

pub struct Env<H: Host> {
    pub host: H,
    pub config: Rc<Config>,
    /// The thread's running request count: the round-robin rotation and generated request ids.
    pub rotation: Rc<Cell<u64>>,
    pub metrics: Rc<Metrics>,
    /// The request's `x-request-id`, for the prefill hop and the logs (known once the
    /// headers are read).
    pub request_id: String,
    /// How the request's client reads an error (known once its path is read).
    pub errors: ErrorShape,
    /// The model the request names, once its body is read: only workers serving it are
    /// candidates (`docs/semantics.md` §3).
    pub model: Option<Rc<str>>,
    /// Hops started (+1) and ended (-1) during this callback, counted in one write at its end.
    load_changes: RefCell<Vec<(WorkerId, i64)>>,
    /// This VM's requests in flight, for the in-flight limit.
    pub slots: Rc<Slots>,
    /// Whether this request holds one of them (given back once, when its stream ends).
    pub holds_slot: bool,
    /// This VM's spans waiting for its root to export them.
    pub spans: Rc<SpanQueue>,
    /// The engines' load as this thread last read it (`docs/semantics.md` §5).
    engine: Rc<EngineTable>,
}

impl<H: Host> Env<H> {
    pub fn new(
        host: H,
        config: Rc<Config>,
        rotation: Rc<Cell<u64>>,
        metrics: Rc<Metrics>,
        slots: Rc<Slots>,
        spans: Rc<SpanQueue>,
        engine: Rc<EngineTable>,
    ) -> Self {
        Self {
            host,
            config,
            rotation,
            metrics,
            request_id: String::new(),
            errors: ErrorShape::default(),
            model: None,
            load_changes: RefCell::default(),
            slots,
            holds_slot: false,
            spans,
            engine,
        }
    }

    /// A number no other request shares, on any thread or replica: for the ids the gateway
    /// makes (`policy::responses`).
    pub fn unique(&self) -> u128 {
        let mut seed = Vec::with_capacity(self.request_id.len() + 16);
        seed.extend_from_slice(self.request_id.as_bytes());
        seed.extend_from_slice(&self.host.now_nanos().to_le_bytes());
        seed.extend_from_slice(&self.rotation.get().to_le_bytes());
        xxhash_rust::xxh3::xxh3_128(&seed)
    }

    /// Takes a slot of the in-flight limit for this request (`docs/semantics.md` §1), or
    /// refuses it before its body is buffered.
    pub fn take_slot(&mut self) -> Result<(), RouteError> {
        let Some(limit) = self.config.settings.in_flight_limit() else {
            return Ok(());
        };
        if !self.slots.take(&self.host, limit) {
            return Err(RouteError::Overloaded { limit });
        }
        self.holds_slot = true;
        Ok(())
    }

    /// Gives the request's slot back, if it holds one; the stream is over.
    pub fn release_slot(&mut self) {
        if std::mem::take(&mut self.holds_slot) {
            self.slots.release(&self.host);
        }
    }

    /// A hop to `worker` started (+1) or ended (-1); counted by [`Env::flush_load`].
    pub fn count_outstanding(&self, worker: WorkerId, delta: i64) {
        if self.is_listed(worker) {
            self.load_changes.borrow_mut().push((worker, delta));
        }
    }

    /// Whether the registry lists `worker`: load and passive health are kept for listed
    /// workers only, not for those a picker chose outside it (`docs/semantics.md` §9).
    fn is_listed(&self, worker: WorkerId) -> bool {
        self.config.registry.get(worker).is_some()
    }

    /// Counts the hops this callback started and ended, for every thread.
    pub fn flush_load(&self) {
        let changes = self.load_changes.take();
        if !changes.is_empty() {
            shared::add_outstanding(&self.host, &changes);
        }
    }

    /// Dispatches a call to `cluster`: its token, or `None` (logged) if Envoy refuses it.
    pub fn call(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Option<u32> {
        let dispatched = self.host.dispatch(cluster, headers, body, timeout);
        dispatched
            .map_err(|status| {
                log::error!(
                    "pinroute: cannot dispatch to cluster {cluster:?}: {status:?}; is it in the Envoy configuration?"
                );
            })
            .ok()
    }

    pub fn count(&self, counter: Counter) {
        self.metrics.count(&self.host, counter);
    }

    /// Hops decided in panic mode (`docs/semantics.md` §5): prefill, token-generating.
    pub fn count_panics(&self, prefill: bool, token: bool) {
        self.metrics.count_panics(&self.host, prefill, token);
    }

    /// How a completion's route was decided: panic mode, placements, a skipped prefill hop;
    /// counted, and told the access log.
    pub fn count_route(&self, route: &Route) {
        self.count_panics(route.prefill_panic, route.decode.panic);
        self.metrics
            .count_route(&self.host, route, self.counted_model());
        for (field, value) in access_log::choices(route) {
            self.log_field(field, value);
        }
    }

    /// Tells the access log the model the request names.
    pub fn log_model(&self, model: &str) {
        self.log_field(Field::Model, access_log::model(model));
    }

    /// Tells the access log a field of this request, unless `access_log_fields` is off.
    pub fn log_field(&self, field: Field, value: &str) {
        if self.config.settings.access_log_fields {
            access_log::write(&self.host, field, value);
        }
    }

    /// Tells the access log a hop's worker and rank.
    pub fn log_target(&self, target: &Target, worker: Field, rank: Field) {
        for (field, value) in access_log::target(target, worker, rank) {
            self.log_field(field, &value);
        }
    }

    /// Tells the access log the token hop's worker that answered: its target, or an alternate
    /// Envoy retried on (no rank named).
    pub fn log_served_decode(&self, hop: &TokenHop, served: WorkerId) {
        if hop.target.worker.id == served {
            self.log_target(&hop.target, Field::DecodeWorker, Field::DecodeRank);
        } else {
            self.log_field(Field::DecodeWorker, &served.to_string());
        }
    }

    /// A request whose model is known, counted for it (`pinroute.model.requests`).
    pub fn count_model_request(&self) {
        if let Some(model) = self.counted_model() {
            self.metrics
                .count_for_model(&self.host, model, Counter::Requests);
        }
    }

    /// An error answered, by code and for the request's model.
    pub fn count_error(&self, error: &RouteError) {
        self.metrics
            .count_error(&self.host, error, self.counted_model());
    }

    /// The request's model, if the registry names it: the only models metrics are kept for.
    fn counted_model(&self) -> Option<&str> {
        let registry = &self.config.registry;
        self.model
            .as_deref()
            .filter(|m| registry.listed_model(m).is_some())
    }

    pub fn set_request_header(&self, name: &str, value: Option<&str>) -> Result<(), RouteError> {
        self.host
            .set_request_header(name, value)
            .map_err(host_failure)
    }

    /// Runs `resolve` with this request's resolver: health as all threads see it now, and
    /// the session, prefix-affinity or least-loaded choice for unpinned hops
    /// (`docs/semantics.md` §5).
    pub fn with_resolver<T>(
        &self,
        hints: &HeaderHints,
        prompt: Option<&RequestPrompt<'_>>,
        resolve: impl FnOnce(&Resolver<'_, Observed<'_>>) -> T,
    ) -> T {
        let rotation = self.rotation.get();
        self.rotation.set(rotation.wrapping_add(1));
        let now = self.host.now_nanos();
        let sent = SharedLoads {
            host: &self.host,
            table: OnceCell::new(),
        };
        let settings = &self.config.settings;
        let engine = settings.engine_load.as_ref().map(|source| EngineLoads {
            sent: &sent,
            table: &self.engine,
            rule: source.rule(),
            now,
            rotation,
        });
        let loads: &dyn Loads = match &engine {
            Some(engine) => engine,
            None => &sent,
        };
        let remembered = prompt.map_or_else(Vec::new, RequestPrompt::remembered);
        let affinity = prompt.map(|p| Affinity {
            depths: p.prefix.depths(settings.prefix_min_bytes),
            remembered: &remembered,
            busy: settings.busy(),
            rotation,
            outstanding: loads,
            draw_key: p.draw_key(settings.prefix_min_bytes),
        });
        let session = hints.session.as_deref();
        let choice = select::unpinned_choice(session, affinity, rotation, loads);
        let facts = prompt.map_or_else(PromptFacts::default, |p| PromptFacts {
            bytes: p.raw.len(),
            last_turn: p.last_turn,
        });
        let table = shared::health(&self.host);
        let availability = Observed { table: &table, now };
        resolve(&Resolver {
            registry: &self.config.registry,
            settings: &self.config.settings,
            availability,
            choice,
            prompt: facts,
            picked: &hints.picked,
            model: self.model.as_deref(),
            rank_loads: engine.as_ref().map(|e| e as &dyn Loads),
        })
    }

    /// A completion's prompt (`messages` or `prompt`, as the client wrote it) read for the
    /// choice of workers as [`resolve::prompt_use`] says, and looked up in the turn memory.
    pub fn read_prompt<'b>(&self, raw: &'b [u8], pins: &Pins) -> Option<RequestPrompt<'b>> {
        let settings = &self.config.settings;
        match resolve::prompt_use(settings, pins, raw.len()) {
            PromptUse::Unread => return None,
            PromptUse::Length => {
                return Some(RequestPrompt {
                    raw,
                    prefix: PromptPrefix::unhashed(raw.len()),
                    last_turn: None,
                });
            }
            PromptUse::Hashed => {}
        }
        let window = settings.prefix_affinity_bytes;
        let prefix = PromptPrefix::of_model(raw, window, self.model.as_deref());
        let last_turn = settings.turn_memory_nanos().and_then(|memory| {
            let now = self.host.now_nanos();
            let (deepest, previous) = prefix.memory_keys(settings.prefix_min_bytes);
            [deepest, previous].into_iter().flatten().find_map(|key| {
                shared::turn(&self.host, Turn::slot(key))?.continued_by(key, raw, now, memory)
            })
        });
        Some(RequestPrompt {
            raw,
            prefix,
            last_turn,
        })
    }

    /// Remembers which workers this request went to, for its conversation's next turn, when
    /// the route lets it ([`Route::remembered_workers`]).
    pub fn remember_turn(&self, prompt: Option<&RequestPrompt<'_>>, route: &Route) {
        let settings = &self.config.settings;
        let (Some(prompt), Some(_), Some(workers)) = (
            prompt,
            settings.turn_memory_nanos(),
            route.remembered_workers(),
        ) else {
            return;
        };
        let now = self.host.now_nanos();
        if let Some(turn) = Turn::of(
            &prompt.prefix,
            prompt.raw,
            settings.prefix_min_bytes,
            workers,
            (now, prompt.draw_key(settings.prefix_min_bytes)),
        ) {
            shared::remember_turn(&self.host, &turn);
        }
    }

    pub fn count_pins(&self, pins: &Pins, hints: &HeaderHints) {
        let counted = [
            (pins.prefill_worker_id.is_some(), Counter::PinPrefillWorker),
            (pins.prefill_dp_rank.is_some(), Counter::PinPrefillRank),
            (
                pins.decode_worker_id.or(pins.backend_instance_id).is_some(),
                Counter::PinDecodeWorker,
            ),
            (pins.dp_rank.is_some(), Counter::PinDecodeRank),
            (hints.session.is_some(), Counter::PinSession),
        ];
        for (_, counter) in counted.iter().filter(|(pinned, _)| *pinned) {
            self.count(*counter);
        }
    }

    /// Counts a failed connection to `worker`, on every thread; enough in a row take it out
    /// of unpinned selection for a while (`docs/semantics.md` §5).
    pub fn record_connect_failure(&self, worker: WorkerId) {
        if !self.is_listed(worker) {
            return;
        }
        if let Some(rule) = self.config.settings.ejection() {
            self.count(Counter::WorkerConnectFailed);
            if shared::record_connect_failure(&self.host, worker, rule) {
                self.count(Counter::WorkerMarkedUnhealthy);
            }
        }
    }

    /// A hop to `worker` got its answer: its connection failures no longer count.
    pub fn record_success(&self, worker: WorkerId) {
        if let Some(rule) = self.config.settings.ejection()
            && self.is_listed(worker)
        {
            shared::record_success(&self.host, worker, rule);
        }
    }

    /// Answers `error` in place of whatever the request would have got; the request is over.
    pub fn answer(&self, error: &RouteError) {
        log::debug!(
            "pinroute: request {} answered {}: {error}",
            self.request_id,
            error.status()
        );
        self.count_error(error);
        self.send_error(error);
    }

    pub fn send_error(&self, error: &RouteError) {
        let retry_after = error.retry_after_secs().map(|s| s.to_string());
        let mut headers = vec![
            ("content-type", "application/json"),
            (headers::ERROR_CODE_HEADER, error.code()),
        ];
        if let Some(seconds) = &retry_after {
            headers.push(("retry-after", seconds));
        }
        if let Some(methods) = error.allow() {
            headers.push(("allow", methods));
        }
        let body = error.body(self.errors);
        if let Err(failure) = self
            .host
            .send_response(error.status(), &headers, body.as_bytes())
        {
            log::error!("pinroute: could not send the local response: {failure}");
        }
    }
}

/// A host call that failed where the request cannot go on: logged, and answered 500.
pub fn host_failure(error: HostError) -> RouteError {
    log::error!("pinroute: host call failed: {error}");
    RouteError::Internal("a host call failed")
}

/// The load table, read from shared data when a choice first asks.
struct SharedLoads<'h, H: Host> {
    host: &'h H,
    table: OnceCell<LoadTable>,
}

impl<H: Host> SharedLoads<'_, H> {
    fn table(&self) -> &LoadTable {
        self.table.get_or_init(|| shared::loads(self.host))
    }
}

impl<H: Host> Loads for SharedLoads<'_, H> {
    fn outstanding(&self, worker: &Worker) -> u64 {
        Loads::outstanding(self.table(), worker)
    }

    fn total(&self, pool: Pool<'_>, excluded: &[WorkerId]) -> u64 {
        self.table().total(pool, excluded)
    }
}

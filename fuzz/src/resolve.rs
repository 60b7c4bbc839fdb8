//! Registry validation and per-hop resolution (docs/semantics.md §3, §4, §5, §8).
//!
//! The input describes a worker list, health, settings, what the request carries for the
//! choice of unpinned workers, and the pins (often naming registry workers, so pins hit real,
//! wrong-role and unknown workers).
//!
//! §3's checks of a pin are data here ([`CHECKS`]), evaluated against the case; the rest
//! are properties of what resolution returns, not a second resolver:
//! - `Registry::new` accepts exactly the lists docs/semantics.md §8 allows, and `from_json` of
//!   the same list agrees with it;
//! - resolution never panics and is deterministic, on the empty registry too;
//! - it refuses exactly when a row of [`CHECKS`] holds, prefill hop first, with that row's
//!   status, code and `Retry-After`; the error names its hop and the pinned worker, its body
//!   is OpenAI-shaped and never contains a registry address;
//! - every target is a registry worker of the hop's role, never draining, unhealthy only in
//!   a pool in panic; a pinned target is exactly the pin, with its rank (0 for `dp_size` 1),
//!   whatever the unpinned choice (pins beat sessions); a rank is < `dp_size`;
//! - an unpinned hop offers every worker its pool has available, up to its limit, each once:
//!   the healthy ones, then, in a pool in panic only, the unhealthy ones;
//! - the placement of an unpinned hop's first worker (§5), from what the request carries (a
//!   session, a completion's prompt as `prompt_use` reads it, the choice `unpinned_choice`
//!   makes of them, as in the filter): with a session, the worker the key weighs highest
//!   (sessions beat prefix affinity); with a prompt's hashes or a remembered turn, a
//!   remembered worker that is not busy, else the shallowest hash's top worker if it is not
//!   busy (affinity beats load), else a worker that is not busy (busy: over `percent` % of
//!   the pool's mean plus `excess`), the others in the deepest hash's order; otherwise by
//!   load, one of the next two in round-robin order and the less loaded of them;
//! - the prefill plan depends on P and pr only: changing B, D and r never changes it, but for
//!   whether the next turn skips it (§4: that depends on the decode worker); the token hop
//!   depends on D/B and r only and equals `token_hop`;
//! - a prefill hop is skipped by choice (§4) only in place of unpinned candidates, exactly
//!   when the prompt is short enough or its decode worker served the last turn and little was
//!   added, and the skip changes nothing else;
//! - with a session, a worker other than the chosen one leaving keeps the choice;
//! - a prompt's hashes: a longer prompt keeps the hashes of its beginning; a turn
//!   remembered for a prompt is found by its continuation under a shared key, with the
//!   bytes it adds; a remembered turn encodes and decodes to itself.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use arbitrary::Arbitrary;
use pinroute::policy::availability::{Availability, Unavailability};
use pinroute::policy::config::Settings;
use pinroute::policy::error::RouteError;
use pinroute::policy::hop::Hop;
use pinroute::policy::load::LoadTable;
use pinroute::policy::picker;
use pinroute::policy::pins::Pins;
use pinroute::policy::prefix::{BLOCK_BYTES, PromptPrefix};
use pinroute::policy::registry::{Deployment, Registry, Role, Worker, WorkerId};
use pinroute::policy::resolve::{
    DECODE_ATTEMPTS, LocalPrefill, PrefillPlan, PromptFacts, PromptUse, Resolver, Route, Target,
    prompt_use,
};
use pinroute::policy::select::{
    Affinity, Busy, Loads, Placement, prefix_weight, session_weight, unpinned_choice,
};
use pinroute::policy::turns::{LastTurn, Turn};

use crate::violated;

const MAX_WORKERS: usize = 8;

#[derive(Arbitrary, Debug)]
pub struct Case {
    workers: Vec<WorkerSpec>,
    unhealthy: u16,
    retry_after_secs: u8,
    prefill_retries: Retries,
    aggregated_fallback: bool,
    /// `panic_threshold_percent`, taken modulo 101.
    panic_threshold: u8,
    request: RequestSpec,
    pins: PinsSpec,
    /// B, D and r of a second resolution that must leave the prefill plan alone.
    other_token_pins: PinsSpec,
    /// The prompt, for prefix affinity and conditional disaggregation.
    prompt: PromptSpec,
    /// The request's model (docs/semantics.md §3), of [`MODELS`]; `None`: every worker serves it.
    model: Option<bool>,
}

/// The models workers name and requests ask for.
const MODELS: [&str; 2] = ["base", "base-lora"];

#[derive(Arbitrary, Debug)]
struct PromptSpec {
    /// The prompt's beginning; see [`PromptSpec::prompt`].
    text: Vec<u8>,
    /// Filler bytes after `text`, modulo 4096: a short input makes a prompt long enough for
    /// prefix affinity (at least 256 bytes).
    padding: u16,
    /// Bytes a continuation adds (after dropping the prompt's last byte).
    more: Vec<u8>,
    /// `prefix_affinity_bytes`, modulo 16385.
    window: u16,
    /// `prefix_min_bytes` is this many blocks, plus one, modulo 8.
    min_blocks: u8,
    remembered: Vec<IdRef>,
    busy_excess: u8,
    /// `affinity_busy_percent` is 100 plus this, modulo 400.
    busy_percent: u16,
    local_max: u16,
    local_suffix: u16,
    /// The last turn: its decode worker, its prefill worker, the bytes added since.
    last_turn: Option<(IdRef, Option<IdRef>, u16)>,
}

#[derive(Arbitrary, Debug)]
struct WorkerSpec {
    id: IdSpec,
    role: RoleSpec,
    address: AddressSpec,
    dp_size: RankSpec,
    draining: bool,
    /// `None`: every model; else, modulo 3, the first of [`MODELS`], the second, or both.
    models: Option<u8>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum IdSpec {
    Small(u8),
    Any(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum RoleSpec {
    Prefill,
    Decode,
    Aggregated,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum AddressSpec {
    Loopback(u8),
    V4([u8; 4], u16),
    V6(u16, u16),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum RankSpec {
    Small(u8),
    Any(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Retries {
    Small(u8),
    Any(u32),
}

/// What decides how a request's unpinned hops are placed (docs/semantics.md §5).
#[derive(Arbitrary, Debug)]
struct RequestSpec {
    /// `x-dynamo-session-id`.
    session: Option<Vec<u8>>,
    /// A completion, whose prompt is read for placement; otherwise another routed path.
    completion: bool,
    rotation: u64,
    /// Outstanding requests per worker: `load[id % 8]`.
    load: [u8; 8],
}

fn outstanding(load: &[u8; 8], worker: &Worker) -> u64 {
    load.get(usize::try_from(worker.id % 8).unwrap_or(0))
        .map_or(0, |n| u64::from(*n))
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct PinsSpec {
    backend: Option<IdRef>,
    prefill: Option<IdRef>,
    decode: Option<IdRef>,
    rank: Option<RankSpec>,
    prefill_rank: Option<RankSpec>,
}

/// A pinned id: usually a registry worker's, by index.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum IdRef {
    Worker(u8),
    Any(u64),
}

/// Draining from the registry, unhealthy from the fuzzer. With `listed`, it names its
/// unhealthy workers as the filter's health table does; without, the resolver asks of each.
#[derive(Clone)]
struct Health {
    unhealthy: HashSet<WorkerId>,
    retry_after_secs: u32,
    listed: bool,
}

impl Availability for Health {
    fn unavailability(&self, worker: &Worker) -> Option<Unavailability> {
        if worker.draining {
            Some(Unavailability::Draining)
        } else {
            let retry_after_secs = self.retry_after_secs;
            self.unhealthy
                .contains(&worker.id)
                .then_some(Unavailability::Unhealthy { retry_after_secs })
        }
    }

    fn unhealthy_ids(&self) -> Option<Vec<WorkerId>> {
        // As a health table may, it also names a worker the registry no longer lists.
        let gone = WorkerId::MAX - 1;
        self.listed
            .then(|| self.unhealthy.iter().copied().chain([gone]).collect())
    }
}

pub fn check(case: &Case) {
    let workers = case.workers();
    // No workers at all is the empty registry a live source starts from.
    let registry = match check_registry(&workers) {
        Some(registry) => registry,
        None if workers.is_empty() => Registry::empty(),
        None => return,
    };
    let prompt = &case.prompt;
    let settings = case.settings();
    let text = prompt.prompt();
    check_prompt_hashes(&text, &prompt.more, &settings);
    let prefix = PromptPrefix::new(&text, settings.prefix_affinity_bytes);
    let health = Health {
        unhealthy: case.unhealthy_ids(&workers),
        retry_after_secs: u32::from(case.retry_after_secs),
        listed: case.retry_after_secs.is_multiple_of(2),
    };
    let pins = case.pins.pins(&workers);
    let request = &case.request;
    let closure = |w: &Worker| outstanding(&request.load, w);
    // Or the same counts in a table, as the filter reads them (it sums a pool's total from its
    // own entries), which also counts a worker the registry does not list.
    let mut table = LoadTable::default();
    for worker in registry.workers() {
        table.add(worker.id, i64::try_from(closure(worker)).unwrap_or(0));
    }
    table.add(WorkerId::MAX - 2, 3);
    let in_table = request.load.first().is_some_and(|n| n.is_multiple_of(2));
    let by_load: &dyn Loads = if in_table { &table } else { &closure };
    // A completion's prompt as the filter reads it: not at all, its length only, or hashed
    // and looked up in the turn memory.
    let read = request
        .completion
        .then(|| prompt_use(&settings, &pins, text.len()))
        .filter(|read| *read != PromptUse::Unread);
    let hashed = read == Some(PromptUse::Hashed);
    let remembered: Vec<WorkerId> = prompt
        .remembered
        .iter()
        .filter(|_| hashed)
        .map(|r| r.id(&workers))
        .collect();
    let affinity = read.map(|_| Affinity {
        depths: if hashed {
            prefix.depths(settings.prefix_min_bytes)
        } else {
            &[]
        },
        remembered: &remembered,
        busy: settings.busy(),
        rotation: request.rotation,
        outstanding: by_load,
        draw_key: prefix
            .depths(settings.prefix_min_bytes)
            .last()
            .copied()
            .unwrap_or(0),
    });
    let last_turn = prompt.last_turn.filter(|_| hashed);
    let facts = PromptFacts {
        bytes: read.map_or(0, |_| text.len()),
        last_turn: last_turn.map(|(decode, prefill, added)| LastTurn {
            prefill: prefill.map(|p| p.id(&workers)),
            decode: decode.id(&workers),
            added_bytes: u64::from(added),
            draw_key: 0,
        }),
    };
    let request = Request {
        session: request.session.as_deref(),
        affinity,
        rotation: request.rotation,
        outstanding: by_load,
    };
    let world = World {
        registry: &registry,
        settings: &settings,
        health: &health,
        request,
        prompt: facts,
        model: case
            .model
            .and_then(|second| MODELS.get(usize::from(second)).copied()),
    };
    world.check(&pins, &case.other_token_pins.pins(&workers));
}

impl Case {
    fn settings(&self) -> Settings {
        let prompt = &self.prompt;
        Settings {
            prefill_retries: self.prefill_retries.value(),
            aggregated_fallback: self.aggregated_fallback,
            panic_threshold_percent: u32::from(self.panic_threshold % 101),
            prefix_affinity_bytes: usize::from(prompt.window % 16385),
            prefix_min_bytes: BLOCK_BYTES * (1 + usize::from(prompt.min_blocks % 8)),
            affinity_busy_excess: u64::from(prompt.busy_excess),
            affinity_busy_percent: 100 + u64::from(prompt.busy_percent % 400),
            local_prefill_max_bytes: usize::from(prompt.local_max),
            local_prefill_suffix_bytes: usize::from(prompt.local_suffix),
            ..Settings::default()
        }
    }

    fn workers(&self) -> Vec<Worker> {
        self.workers
            .iter()
            .take(MAX_WORKERS)
            .map(WorkerSpec::worker)
            .collect()
    }

    fn unhealthy_ids(&self, workers: &[Worker]) -> HashSet<WorkerId> {
        let down = |i: &usize| self.unhealthy & (1 << i) != 0;
        workers
            .iter()
            .enumerate()
            .filter(|(i, _)| down(i))
            .map(|(_, w)| w.id)
            .collect()
    }
}

impl PromptSpec {
    fn prompt(&self) -> Vec<u8> {
        let mut prompt = self.text.clone();
        prompt.resize(self.text.len() + usize::from(self.padding % 4096), b'.');
        prompt
    }
}

impl WorkerSpec {
    fn worker(&self) -> Worker {
        Worker {
            id: match self.id {
                IdSpec::Small(id) => u64::from(id % 16),
                IdSpec::Any(id) => id,
            },
            role: match self.role {
                RoleSpec::Prefill => Role::Prefill,
                RoleSpec::Decode => Role::Decode,
                RoleSpec::Aggregated => Role::Aggregated,
            },
            address: match self.address {
                AddressSpec::Loopback(n) => {
                    SocketAddr::from(([127, 0, 0, 1], 8000 + u16::from(n % 8)))
                }
                AddressSpec::V4(ip, port) => SocketAddr::from((Ipv4Addr::from(ip), port)),
                AddressSpec::V6(segment, port) => SocketAddr::new(
                    IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, segment)),
                    port,
                ),
            },
            dp_size: self.dp_size.value(),
            draining: self.draining,
            models: self.models.map(|m| {
                let names: &[&str] = match m % 3 {
                    0 => &MODELS[..1],
                    1 => &MODELS[1..],
                    _ => &MODELS,
                };
                names.iter().map(|n| std::rc::Rc::from(*n)).collect()
            }),
            unlisted: false,
        }
    }
}

impl RankSpec {
    fn value(self) -> u32 {
        match self {
            RankSpec::Small(n) => u32::from(n % 5),
            RankSpec::Any(n) => n,
        }
    }
}

impl Retries {
    fn value(self) -> u32 {
        match self {
            Retries::Small(n) => u32::from(n % 4),
            Retries::Any(n) => n,
        }
    }
}

impl IdRef {
    fn id(self, workers: &[Worker]) -> WorkerId {
        match self {
            IdRef::Worker(i) => workers
                .get(usize::from(i) % workers.len().max(1))
                .map_or(0, |w| w.id),
            IdRef::Any(id) => id,
        }
    }
}

impl PinsSpec {
    fn pins(&self, workers: &[Worker]) -> Pins {
        let id = |r: Option<IdRef>| r.map(|r| r.id(workers));
        Pins {
            backend_instance_id: id(self.backend),
            prefill_worker_id: id(self.prefill),
            decode_worker_id: id(self.decode),
            dp_rank: self.rank.map(RankSpec::value),
            prefill_dp_rank: self
                .prefill_rank
                .map(RankSpec::value)
                .filter(|r| *r != u32::MAX),
        }
    }
}

/// `Registry::new` against docs/semantics.md §8, and `from_json` against `new`.
fn check_registry(workers: &[Worker]) -> Option<Registry> {
    let valid = registry_is_valid(workers);
    let registry = Registry::new(workers.to_vec());
    assert_eq!(
        registry.is_ok(),
        valid,
        "Registry::new({workers:?}) = {registry:?}"
    );
    let from_json = Registry::from_json(registry_json(workers).as_bytes());
    match (&registry, &from_json) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "from_json and new disagree"),
        (Err(_), Err(_)) => {}
        _ => violated(format!(
            "Registry::new: {registry:?}, from_json: {from_json:?}"
        )),
    }
    registry.ok()
}

pub fn registry_is_valid(workers: &[Worker]) -> bool {
    let unique_ids = workers.iter().map(|w| w.id).collect::<HashSet<_>>().len() == workers.len();
    let unique_addresses = workers
        .iter()
        .map(|w| w.address)
        .collect::<HashSet<_>>()
        .len()
        == workers.len();
    let has = |role| workers.iter().any(|w| w.role == role);
    let roles_ok = if has(Role::Aggregated) {
        !has(Role::Prefill) && !has(Role::Decode)
    } else {
        has(Role::Decode)
    };
    unique_ids && unique_addresses && workers.iter().all(|w| w.dp_size > 0) && roles_ok
}

fn registry_json(workers: &[Worker]) -> String {
    let workers: Vec<serde_json::Value> = workers
        .iter()
        .map(|w| {
            let models: Option<Vec<&str>> =
                w.models.as_ref().map(|m| m.iter().map(|n| &**n).collect());
            serde_json::json!({
                "id": w.id, "role": w.role.to_string(), "address": w.address.to_string(),
                "dp_size": w.dp_size, "draining": w.draining, "models": models,
            })
        })
        .collect();
    serde_json::json!({ "workers": workers }).to_string()
}

impl Health {
    fn is_unhealthy(&self, worker: &Worker) -> bool {
        matches!(
            self.unavailability(worker),
            Some(Unavailability::Unhealthy { .. })
        )
    }
}

/// The `Retry-After` of a refusal.
#[derive(Debug, Clone, Copy)]
enum RetryAfter {
    None,
    Five,
    /// The seconds until the unhealthy worker is back.
    UntilHealthy,
}

type Condition = fn(&HopFacts) -> bool;
type Check = (Condition, u16, &'static str, RetryAfter);

/// docs/semantics.md §3's checks of one hop, in order: the first that holds is the hop's
/// answer, and the prefill hop is checked before the token hop. "Unknown, and the registry has
/// no worker at all" comes before plain "unknown", as the narrower row of the two. The last
/// row is an unpinned hop with nothing to go to (§4, §5), which the prefill hop may be when
/// it can fall back to one hop.
#[rustfmt::skip]
const CHECKS: [Check; 9] = [
    (HopFacts::rank_without_worker,          400, "rank_without_worker",  RetryAfter::None),
    (HopFacts::unknown_to_an_empty_registry, 503, "no_worker_available",  RetryAfter::Five),
    (HopFacts::unknown,                      400, "unknown_worker",       RetryAfter::None),
    (HopFacts::in_another_pool,              400, "wrong_worker_role",    RetryAfter::None),
    (HopFacts::serves_another_model,         400, "model_not_served",     RetryAfter::None),
    (HopFacts::rank_out_of_range,            400, "dp_rank_out_of_range", RetryAfter::None),
    (HopFacts::draining,                     503, "worker_unavailable",   RetryAfter::Five),
    (HopFacts::unhealthy_outside_panic,      503, "worker_unavailable",   RetryAfter::UntilHealthy),
    (HopFacts::unpinned_with_nowhere_to_go,  503, "no_worker_available",  RetryAfter::Five),
];

/// What [`CHECKS`] read of one hop: its pins, and what the registry and health say of them.
struct HopFacts {
    hop: Hop,
    role: Role,
    pin: Option<WorkerId>,
    rank: Option<u32>,
    /// The pinned worker, when the registry knows it.
    worker: Option<Worker>,
    /// It does not serve the request's model.
    not_serving_model: bool,
    registry_is_empty: bool,
    unhealthy: bool,
    pool: Pool,
    /// Whether the hop, unpinned, may find no worker: a prefill hop falling back to one hop.
    optional: bool,
}

impl HopFacts {
    fn rank_without_worker(&self) -> bool {
        self.pin.is_none() && self.rank.is_some()
    }

    fn unknown_to_an_empty_registry(&self) -> bool {
        self.unknown() && self.registry_is_empty
    }

    fn unknown(&self) -> bool {
        self.pin.is_some() && self.worker.is_none()
    }

    fn in_another_pool(&self) -> bool {
        self.worker.as_ref().is_some_and(|w| w.role != self.role)
    }

    fn serves_another_model(&self) -> bool {
        self.not_serving_model
    }

    fn rank_out_of_range(&self) -> bool {
        self.worker
            .as_ref()
            .zip(self.rank)
            .is_some_and(|(w, rank)| rank >= w.dp_size)
    }

    fn draining(&self) -> bool {
        self.worker.as_ref().is_some_and(|w| w.draining)
    }

    fn unhealthy_outside_panic(&self) -> bool {
        self.unhealthy && !self.pool.in_panic
    }

    fn unpinned_with_nowhere_to_go(&self) -> bool {
        self.pin.is_none() && self.pool.available() == 0 && !self.optional
    }
}

/// A hop's pool as docs/semantics.md §5 counts it: its role's workers that are not draining.
#[derive(Debug, Clone, Copy)]
struct Pool {
    healthy: usize,
    unhealthy: usize,
    /// Fewer than `panic_threshold_percent` of them are healthy.
    in_panic: bool,
}

impl Pool {
    /// How many workers an unpinned hop can be given: the healthy ones, and in panic the
    /// unhealthy ones too.
    fn available(&self) -> usize {
        self.healthy + if self.in_panic { self.unhealthy } else { 0 }
    }
}

/// docs/semantics.md §3's first table: the prefill hop's worker and rank pins.
fn prefill_pins(pins: &Pins) -> (Option<WorkerId>, Option<u32>) {
    (pins.prefill_worker_id, pins.prefill_dp_rank)
}

/// The token hop's: D, else B, and r.
fn token_pins(pins: &Pins) -> (Option<WorkerId>, Option<u32>) {
    (
        pins.decode_worker_id.or(pins.backend_instance_id),
        pins.dp_rank,
    )
}

/// What a request tells the choice of its unpinned workers.
#[derive(Clone, Copy)]
struct Request<'a> {
    session: Option<&'a [u8]>,
    /// A completion's prompt, when it is read.
    affinity: Option<Affinity<'a>>,
    rotation: u64,
    outstanding: &'a dyn Loads,
}

/// Everything a resolution depends on but the pins.
struct World<'a> {
    registry: &'a Registry,
    settings: &'a Settings,
    health: &'a Health,
    request: Request<'a>,
    prompt: PromptFacts,
    model: Option<&'static str>,
}

impl World<'_> {
    fn resolver(&self) -> Resolver<'_, &Health> {
        Resolver {
            registry: self.registry,
            settings: self.settings,
            availability: self.health,
            choice: unpinned_choice(
                self.request.session,
                self.request.affinity,
                self.request.rotation,
                self.request.outstanding,
            ),
            prompt: self.prompt,
            picked: &picker::NOTHING,
            model: self.model,
            rank_loads: None,
        }
    }

    fn check(&self, pins: &Pins, other_token_pins: &Pins) {
        let actual = self.resolver().resolve(pins);
        assert_eq!(
            self.resolver().resolve(pins),
            actual,
            "resolution is not deterministic"
        );
        self.check_refusal(pins, &actual);
        match &self.check_local_prefill(pins, &actual) {
            Ok(route) => self.check_route(route, pins),
            Err(error) => self.check_error(error),
        }
        self.check_prefill_ignores_token_pins(pins, &actual, other_token_pins);
        self.check_token_hop(pins, &actual);
        self.check_session_stability(pins, &actual);
    }

    // ---- §3's checks, as data ----

    fn token_hop(&self) -> Hop {
        match self.registry.deployment() {
            Deployment::Disaggregated => Hop::Decode,
            Deployment::Aggregated => Hop::Aggregated,
        }
    }

    /// The role's workers that are not draining and serve the request's model (§3, §5).
    fn serving(&self, role: Role) -> impl Iterator<Item = &Worker> {
        self.registry
            .workers()
            .iter()
            .filter(move |w| w.role == role && !w.draining && self.serves(w))
    }

    fn serves(&self, worker: &Worker) -> bool {
        let names = worker.models.as_deref();
        match (self.model, names) {
            (Some(model), Some(names)) => names.iter().any(|n| &**n == model),
            _ => true,
        }
    }

    fn pool(&self, role: Role) -> Pool {
        let serving = self.serving(role).count();
        let unhealthy = self
            .serving(role)
            .filter(|w| self.health.is_unhealthy(w))
            .count();
        let healthy = serving - unhealthy;
        let threshold = u128::from(self.settings.panic_threshold_percent);
        Pool {
            healthy,
            unhealthy,
            in_panic: (healthy as u128) * 100 < threshold * serving as u128,
        }
    }

    fn facts(
        &self,
        hop: Hop,
        role: Role,
        (pin, rank): (Option<WorkerId>, Option<u32>),
    ) -> HopFacts {
        let worker = pin.and_then(|id| self.registry.workers().iter().find(|w| w.id == id));
        let optional = hop == Hop::Prefill
            && (self.settings.aggregated_fallback
                || self.registry.deployment() == Deployment::Aggregated);
        HopFacts {
            hop,
            role,
            pin,
            rank,
            not_serving_model: worker.is_some_and(|w| !self.serves(w)),
            worker: worker.cloned(),
            registry_is_empty: self.registry.workers().is_empty(),
            unhealthy: worker.is_some_and(|w| self.health.is_unhealthy(w)),
            pool: self.pool(role),
            optional,
        }
    }

    /// The first of [`CHECKS`] that holds, prefill hop first, with its hop's facts.
    fn refusal(&self, pins: &Pins) -> Option<(HopFacts, Check)> {
        let prefill = self.facts(Hop::Prefill, Role::Prefill, prefill_pins(pins));
        let token = self.facts(
            self.token_hop(),
            self.registry.token_role(),
            token_pins(pins),
        );
        [prefill, token].into_iter().find_map(|facts| {
            let check = CHECKS.into_iter().find(|(holds, ..)| holds(&facts))?;
            Some((facts, check))
        })
    }

    fn check_refusal(&self, pins: &Pins, actual: &Result<Route, RouteError>) {
        let ((facts, (_, status, code, retry_after)), error) = match (self.refusal(pins), actual) {
            (None, Ok(_)) => return,
            (None, Err(e)) => violated(format!("no check holds, yet {pins:?} is refused: {e:?}")),
            (Some((facts, (_, status, code, _))), Ok(_)) => violated(format!(
                "{pins:?}: the {} hop must be refused with {status} {code}",
                facts.hop
            )),
            (Some(refusal), Err(error)) => (refusal, error),
        };
        assert_eq!(
            (error_hop(error), error.status(), error.code()),
            (Some(facts.hop), status, code),
            "{pins:?} refused with {error:?}"
        );
        let retry_after = match retry_after {
            RetryAfter::None => None,
            RetryAfter::Five => Some(5),
            RetryAfter::UntilHealthy => Some(self.health.retry_after_secs),
        };
        assert_eq!(
            error.retry_after_secs(),
            retry_after,
            "Retry-After of {error:?}"
        );
        if let Some((_, Some(worker))) = hop_and_worker(error) {
            assert_eq!(Some(worker), facts.pin, "{error:?} names another worker");
        }
    }

    fn check_error(&self, error: &RouteError) {
        let body: serde_json::Value =
            match serde_json::from_str(&error.body(pinroute::policy::api::ErrorShape::OpenAi)) {
                Ok(body) => body,
                Err(e) => violated(format!("error body is not JSON: {e}")),
            };
        let kind = if error.status() < 500 {
            "invalid_request_error"
        } else {
            "server_error"
        };
        assert_eq!(
            (body.pointer("/error/code"), body.pointer("/error/type")),
            (Some(&error.code().into()), Some(&kind.into())),
            "body of {error:?}"
        );
        let message = error.to_string();
        if let Some((hop, worker)) = hop_and_worker(error) {
            assert!(
                message.contains(&hop.to_string()),
                "{message} does not name the {hop} hop"
            );
            assert!(
                worker.is_none_or(|id| message.contains(&id.to_string())),
                "{message}: no worker id"
            );
        }
        for worker in self.registry.workers() {
            let address = worker.address.to_string();
            assert!(
                !error
                    .body(pinroute::policy::api::ErrorShape::OpenAi)
                    .contains(&address),
                "error body leaks {address}"
            );
        }
    }

    // ---- properties of a route ----

    fn check_route(&self, route: &Route, pins: &Pins) {
        let decode = &route.decode;
        assert_eq!(decode.hop, self.token_hop());
        let role = self.registry.token_role();
        match token_pins(pins) {
            (Some(pin), rank) => {
                self.check_pinned(&decode.target, role, pin, rank);
                assert!(decode.alternates.is_empty(), "a pinned hop has alternates");
                assert_eq!(decode.placement, None, "a pinned hop has a placement");
                let unhealthy = self.health.is_unhealthy(&decode.target.worker);
                assert_eq!(decode.panic, unhealthy, "panic of a pinned decode hop");
            }
            (None, _) => {
                let mut offered = unpinned_workers([&decode.target]);
                offered.extend(&decode.alternates);
                self.check_unpinned(
                    role,
                    &offered,
                    DECODE_ATTEMPTS,
                    decode.placement,
                    decode.panic,
                );
            }
        }
        self.check_prefill(route, pins);
    }

    fn check_prefill(&self, route: &Route, pins: &Pins) {
        let (pin, rank) = prefill_pins(pins);
        let chosen = (route.prefill_placement, route.prefill_panic);
        match (&route.prefill, pin) {
            (PrefillPlan::Pinned(target), Some(pin)) => {
                self.check_pinned(target, Role::Prefill, pin, rank);
                let unhealthy = self.health.is_unhealthy(&target.worker);
                assert_eq!(
                    chosen,
                    (None, unhealthy),
                    "a pinned prefill hop's placement, panic"
                );
            }
            (PrefillPlan::Candidates(targets), None) => {
                let limit = usize::try_from(self.settings.prefill_retries)
                    .map_or(usize::MAX, |n| n.saturating_add(1));
                let offered = unpinned_workers(targets);
                self.check_unpinned(Role::Prefill, &offered, limit, chosen.0, chosen.1);
            }
            (PrefillPlan::Skip, None) => {
                let nowhere = self.pool(Role::Prefill).available() == 0;
                assert!(
                    nowhere || self.registry.deployment() == Deployment::Aggregated,
                    "prefill skipped with prefill workers available"
                );
                assert_eq!(
                    chosen,
                    (None, false),
                    "a skipped prefill hop's placement, panic"
                );
            }
            (plan, pin) => violated(format!("prefill plan {plan:?} with prefill pin {pin:?}")),
        }
    }

    /// A pinned target is exactly the pinned worker, with the pinned rank, or 0 when it has
    /// one rank; it is usable.
    fn check_pinned(&self, target: &Target, role: Role, pin: WorkerId, rank: Option<u32>) {
        assert!(target.pinned, "pinned {pin}, got an unpinned target");
        assert_eq!(
            target.worker.id, pin,
            "pinned {pin}, got {}",
            target.worker.id
        );
        let implied = (target.worker.dp_size == 1).then_some(0);
        assert_eq!(target.rank, rank.or(implied), "rank of pinned {pin}");
        self.check_usable(&target.worker, role);
        assert!(
            target.rank.is_none_or(|r| r < target.worker.dp_size),
            "rank {:?} >= dp_size",
            target.rank
        );
    }

    /// A registry worker of the hop's role, never draining, unhealthy only in a pool in panic.
    fn check_usable(&self, worker: &Worker, role: Role) {
        assert_eq!(
            self.registry.workers().iter().find(|w| w.id == worker.id),
            Some(worker),
            "target is not the registry's worker"
        );
        assert_eq!(worker.role, role, "target {} has the wrong role", worker.id);
        assert!(!worker.draining, "target {} is draining", worker.id);
        assert!(
            !self.health.is_unhealthy(worker) || self.pool(role).in_panic,
            "unhealthy target {} outside panic",
            worker.id
        );
    }

    /// An unpinned hop's workers, best first: every available worker of its pool up to
    /// `limit`, each once, the healthy ones first; the first placed as §5 says.
    fn check_unpinned(
        &self,
        role: Role,
        offered: &[&Worker],
        limit: usize,
        placement: Option<Placement>,
        panic: bool,
    ) {
        let pool = self.pool(role);
        assert_eq!(panic, pool.in_panic, "the hop's panic flag");
        assert_eq!(
            offered.len(),
            pool.available().min(limit),
            "an unpinned hop is offered every available worker, up to {limit}"
        );
        let ids: HashSet<WorkerId> = offered.iter().map(|w| w.id).collect();
        assert_eq!(ids.len(), offered.len(), "a worker is offered twice");
        for worker in offered {
            self.check_usable(worker, role);
        }
        let unhealthy_last = offered
            .iter()
            .map(|w| self.health.is_unhealthy(w))
            .is_sorted();
        assert!(
            unhealthy_last,
            "an unhealthy worker is offered before a healthy one"
        );
        let Some(placement) = placement else {
            violated("an unpinned hop without a placement")
        };
        self.check_placement(role, offered, placement);
    }

    /// How the first worker of an unpinned hop was chosen, among the group it comes from:
    /// the healthy workers, or the unhealthy ones of a pool in panic with none healthy.
    fn check_placement(&self, role: Role, offered: &[&Worker], placement: Placement) {
        let Some(first) = offered.first() else { return };
        let unhealthy = self.health.is_unhealthy(first);
        let group: Vec<&Worker> = self
            .serving(role)
            .filter(|w| self.health.is_unhealthy(w) == unhealthy)
            .collect();
        let chosen: Vec<&Worker> = offered
            .iter()
            .copied()
            .take_while(|w| self.health.is_unhealthy(w) == unhealthy)
            .collect();
        // Sessions beat prefix affinity, and affinity beats load.
        match (self.request.session, self.request.affinity) {
            (Some(key), _) => {
                assert_eq!(placement, Placement::Session, "a session's placement");
                let weight = |w: &Worker| (session_weight(key, w), w.id);
                check_descending(&group, &chosen, weight, "session weight");
            }
            (None, Some(affinity))
                if !affinity.depths.is_empty() || !affinity.remembered.is_empty() =>
            {
                check_affinity(&affinity, &group, &chosen, placement);
            }
            (None, _) => {
                assert_eq!(placement, Placement::Load, "placement by load");
                let outstanding = self.request.outstanding;
                let next_two: Vec<&Worker> = round_robin(&group, self.request.rotation)
                    .into_iter()
                    .take(2)
                    .filter_map(|id| group.iter().copied().find(|w| w.id == id))
                    .collect();
                assert!(
                    next_two.contains(first)
                        && next_two
                            .iter()
                            .all(|w| outstanding.outstanding(first) <= outstanding.outstanding(w)),
                    "least loaded chose {} of {next_two:?}",
                    first.id
                );
            }
        }
    }

    // ---- metamorphic properties ----

    /// docs/semantics.md §4's skip by choice: without it (no short-prompt limit, no last
    /// turn) the route is the same but for unpinned candidates where this one prefills
    /// locally, and those are replaced exactly when the prompt is short enough or the decode
    /// worker served the last turn with little added. Returns the resolution without it.
    fn check_local_prefill(
        &self,
        pins: &Pins,
        actual: &Result<Route, RouteError>,
    ) -> Result<Route, RouteError> {
        let settings = Settings {
            local_prefill_max_bytes: 0,
            ..self.settings.clone()
        };
        let world = World {
            settings: &settings,
            prompt: PromptFacts {
                last_turn: None,
                ..self.prompt
            },
            ..*self
        };
        let without = world.resolver().resolve(pins);
        let (Ok(route), Ok(unskipped)) = (actual, &without) else {
            assert_eq!(actual, &without, "the skip by choice changed a refusal");
            return without;
        };
        let why = match unskipped.prefill {
            PrefillPlan::Candidates(_) => self.local_prefill(route),
            _ => None,
        };
        let expected = match why {
            Some(why) => Route {
                prefill: PrefillPlan::Local(why),
                prefill_panic: false,
                prefill_placement: None,
                ..unskipped.clone()
            },
            None => unskipped.clone(),
        };
        assert_eq!(route, &expected, "the skip by choice");
        without
    }

    fn local_prefill(&self, route: &Route) -> Option<LocalPrefill> {
        let prompt = &self.prompt;
        if prompt.bytes > 0 && prompt.bytes <= self.settings.local_prefill_max_bytes {
            return Some(LocalPrefill::ShortPrompt);
        }
        let turn = prompt.last_turn?;
        let suffix = self.settings.local_prefill_suffix_bytes as u128;
        (turn.decode == route.decode.target.worker.id && u128::from(turn.added_bytes) <= suffix)
            .then_some(LocalPrefill::NextTurn)
    }

    /// Changing B, D and r leaves the prefill plan, or a prefill error, as it was — but for
    /// whether the next turn of a conversation skips it, which depends on its decode worker.
    fn check_prefill_ignores_token_pins(
        &self,
        pins: &Pins,
        actual: &Result<Route, RouteError>,
        other: &Pins,
    ) {
        let variant = Pins {
            backend_instance_id: other.backend_instance_id,
            decode_worker_id: other.decode_worker_id,
            dp_rank: other.dp_rank,
            ..pins.clone()
        };
        let changed = self.resolver().resolve(&variant);
        match (actual, &changed) {
            (Ok(a), Ok(b)) if next_turn(a) || next_turn(b) => {
                let skippable =
                    |r: &Route| next_turn(r) || matches!(r.prefill, PrefillPlan::Candidates(_));
                assert!(
                    skippable(a) && skippable(b),
                    "B/D/r changed more than the next turn's skip: {:?} / {:?}",
                    a.prefill,
                    b.prefill
                );
            }
            (Ok(a), Ok(b)) => assert_eq!(a.prefill, b.prefill, "B/D/r changed the prefill plan"),
            (Err(e), _) if error_hop(e) == Some(Hop::Prefill) => {
                assert_eq!(&changed, actual, "B/D/r changed a prefill error")
            }
            (_, Err(e)) if error_hop(e) == Some(Hop::Prefill) => {
                violated(format!("B/D/r {other:?} made prefill fail: {e}"))
            }
            _ => {}
        }
    }

    /// The token hop of a route is `token_hop`, whatever P and pr are.
    fn check_token_hop(&self, pins: &Pins, actual: &Result<Route, RouteError>) {
        let token_hop = self.resolver().token_hop(pins);
        let without_prefill_pins = Pins {
            prefill_worker_id: None,
            prefill_dp_rank: None,
            ..pins.clone()
        };
        assert_eq!(
            self.resolver().token_hop(&without_prefill_pins),
            token_hop,
            "P/pr changed the token hop"
        );
        match actual {
            Ok(route) => assert_eq!(token_hop.as_ref(), Ok(&route.decode), "token_hop"),
            Err(e) if error_hop(e) != Some(Hop::Prefill) => {
                assert_eq!(token_hop.err().as_ref(), Some(e))
            }
            Err(_) => {}
        }
    }

    /// Rendezvous hashing: another worker leaving keeps a session's choice.
    fn check_session_stability(&self, pins: &Pins, actual: &Result<Route, RouteError>) {
        let (Some(_), Ok(route)) = (self.request.session, actual) else {
            return;
        };
        if route.decode.target.pinned {
            return;
        }
        let chosen = route.decode.target.worker.id;
        let others = self
            .registry
            .pool(self.registry.token_role())
            .filter(|w| w.id != chosen);
        for leaving in others {
            let mut health = self.health.clone();
            health.unhealthy.insert(leaving.id);
            let world = World {
                health: &health,
                ..*self
            };
            let after = world.resolver().token_hop(pins).map(|t| t.target.worker.id);
            assert_eq!(
                after,
                Ok(chosen),
                "worker {} leaving moved the session from {chosen}",
                leaving.id
            );
        }
    }
}

/// The workers of unpinned targets, which carry no pin and no rank.
fn unpinned_workers<'t>(targets: impl IntoIterator<Item = &'t Target>) -> Vec<&'t Worker> {
    targets
        .into_iter()
        .map(|target| {
            assert!(
                !target.pinned && target.rank.is_none(),
                "unpinned target {} has a pin or rank",
                target.worker.id
            );
            &target.worker
        })
        .collect()
}

/// docs/semantics.md §5's prefix affinity, as properties of its choice: a remembered worker
/// that is not busy goes first; else the worker the shallowest hash weighs highest, if it is
/// not busy; else a worker that is not busy. The others follow in the deepest hash's order.
fn check_affinity(
    affinity: &Affinity<'_>,
    group: &[&Worker],
    chosen: &[&Worker],
    placement: Placement,
) {
    let Some((first, rest)) = chosen.split_first() else {
        return;
    };
    let load = |w: &Worker| affinity.outstanding.outstanding(w);
    let total = group.iter().map(|w| load(w)).sum();
    let busy = |w: &Worker| busy_model(affinity.busy, load(w), total, group.len());
    let remembered = |w: &Worker| affinity.remembered.contains(&w.id) && !busy(w);
    let affine = affinity
        .depths
        .first()
        .and_then(|hash| {
            let weight = |w: &&Worker| (prefix_weight(*hash, w), w.id);
            group.iter().copied().max_by_key(weight)
        })
        .filter(|w| !busy(w));
    let expected = if group.iter().any(|w| remembered(w)) {
        Placement::Remembered
    } else if affine.is_some() {
        Placement::Affinity
    } else {
        Placement::Spilled
    };
    assert_eq!(placement, expected, "affinity's placement of {}", first.id);
    assert!(
        !busy(first),
        "affinity placed a hop on busy worker {}",
        first.id
    );
    match placement {
        Placement::Remembered => assert!(remembered(first), "{} is not remembered", first.id),
        Placement::Affinity => assert_eq!(Some(*first), affine, "the shallowest hash's worker"),
        _ => {}
    }
    let deepest = affinity.depths.last().copied().unwrap_or(0);
    let others: Vec<&Worker> = group.iter().copied().filter(|w| w.id != first.id).collect();
    check_descending(
        &others,
        rest,
        |w| (prefix_weight(deepest, w), w.id),
        "deepest hash",
    );
}

/// `chosen` is the beginning of `group` in descending `weight`.
fn check_descending<K: Ord>(
    group: &[&Worker],
    chosen: &[&Worker],
    weight: impl Fn(&Worker) -> K,
    what: &str,
) {
    let descending = chosen
        .windows(2)
        .all(|pair| matches!(pair, [a, b] if weight(a) > weight(b)));
    let rest_below = chosen.last().is_none_or(|last| {
        group
            .iter()
            .filter(|w| !chosen.contains(w))
            .all(|w| weight(w) < weight(last))
    });
    assert!(
        descending && rest_below,
        "{:?} is not {:?} by descending {what}",
        ids_of(chosen),
        ids_of(group)
    );
}

/// Round robin: the ids in order, starting at the `turn`-th.
fn round_robin(group: &[&Worker], turn: u64) -> Vec<WorkerId> {
    let mut ids = ids_of(group);
    ids.sort_unstable();
    let len = u64::try_from(ids.len()).unwrap_or(u64::MAX).max(1);
    ids.rotate_left(usize::try_from(turn % len).unwrap_or(0));
    ids
}

fn ids_of(workers: &[&Worker]) -> Vec<WorkerId> {
    workers.iter().map(|w| w.id).collect()
}

/// docs/semantics.md §5: `load > percent/100 × total/workers + excess`, multiplied out by
/// `100 × workers` so that it is exact.
fn busy_model(busy: Busy, load: u64, total: u64, workers: usize) -> bool {
    let workers = workers.max(1) as u128;
    let scaled_load = u128::from(load) * 100 * workers;
    let scaled_bound =
        u128::from(busy.percent) * u128::from(total) + u128::from(busy.excess) * 100 * workers;
    scaled_load > scaled_bound
}

/// A prompt's hashes and its turn memory, stated directly.
fn check_prompt_hashes(text: &[u8], more: &[u8], settings: &Settings) {
    let window = settings.prefix_affinity_bytes;
    let min = settings.prefix_min_bytes;
    let base = PromptPrefix::new(text, window);
    let mut longer = text.to_vec();
    longer.extend_from_slice(more);
    let extended = PromptPrefix::new(&longer, window);
    let (short, long) = (base.depths(BLOCK_BYTES), extended.depths(BLOCK_BYTES));
    assert!(
        long.starts_with(short),
        "a longer prompt lost the hashes of its beginning"
    );
    assert!(short.len() * BLOCK_BYTES <= window.min(text.len()));
    assert_eq!(
        base.depths(min),
        short
            .get(min.div_ceil(BLOCK_BYTES) - 1..)
            .unwrap_or_default()
    );
    let draw_key = base.depths(min).last().copied().unwrap_or(0);
    let Some(turn) = Turn::of(&base, text, min, (Some(1), 2), (10, draw_key)) else {
        return;
    };
    assert_eq!(
        Turn::decode(&turn.encode()),
        Some(turn),
        "a turn round-trips"
    );
    // The client resends the prompt without its closing byte, then what it adds.
    let mut next = text.get(..text.len() - 1).unwrap_or_default().to_vec();
    next.extend_from_slice(more);
    let (deepest, previous) = PromptPrefix::new(&next, window).memory_keys(min);
    for key in [deepest, previous]
        .into_iter()
        .flatten()
        .filter(|k| *k == turn.key)
    {
        let found = turn.continued_by(key, &next, 11, 1_000);
        let added = (next.len() as u64)
            .checked_sub(text.len() as u64)
            .filter(|a| *a > 0);
        assert_eq!(
            found.map(|t| t.added_bytes),
            added,
            "a continuation under a shared key is found with what it adds"
        );
        if let Some(found) = found {
            assert_eq!(
                found.draw_key, draw_key,
                "a continuation draws by its first turn"
            );
        }
    }
}

fn next_turn(route: &Route) -> bool {
    route.prefill == PrefillPlan::Local(LocalPrefill::NextTurn)
}

/// Round robin: by id, starting at the `turn`-th worker.
fn hop_and_worker(error: &RouteError) -> Option<(Hop, Option<WorkerId>)> {
    match *error {
        RouteError::RankWithoutWorker { hop } | RouteError::NoWorkerAvailable { hop, .. } => {
            Some((hop, None))
        }
        RouteError::UnknownWorker { hop, worker }
        | RouteError::WrongRole { hop, worker, .. }
        | RouteError::RankOutOfRange { hop, worker, .. }
        | RouteError::ModelNotServed { hop, worker, .. }
        | RouteError::WorkerUnavailable { hop, worker, .. } => Some((hop, Some(worker))),
        _ => None,
    }
}

fn error_hop(error: &RouteError) -> Option<Hop> {
    hop_and_worker(error).map(|(hop, _)| hop)
}

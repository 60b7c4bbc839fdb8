//! Registry validation and per-hop resolution (docs/semantics.md §3, §5, §8).
//!
//! The input describes a worker list, health, settings, the unpinned choice and the pins
//! (often naming registry workers, so pins hit real, wrong-role and unknown workers).
//!
//! Properties:
//! - `Registry::new` accepts exactly the lists docs/semantics.md §8 allows, and `from_json` of
//!   the same list agrees with it;
//! - resolution never panics and is deterministic, on the empty registry too;
//! - it equals a model of docs/semantics.md §3 written out here: route, or exact error and
//!   hop, with §5's panic mode (a pool with too few healthy workers offers its unhealthy ones
//!   after them, and a pin to one of those is tried);
//! - every target is a registry worker (so its address is a registry address) of the hop's
//!   role, never draining, unhealthy only in a pool in panic; a pinned target is exactly the
//!   pinned worker; a rank is < `dp_size`;
//! - the prefill plan depends on P and pr only: changing B, D and r never changes it (so
//!   prefill is never pinned without P and its rank never comes from r), but for whether the
//!   next turn skips it (§4: that depends on the decode worker); the token hop
//!   depends on D/B and r only and equals `token_hop`;
//! - with a session, a worker other than the chosen one leaving keeps the choice;
//! - prefix affinity (§5) equals a model: a remembered worker that is not busy, else depth
//!   by depth the top worker of each hash among those not yet found busy, else the first
//!   worker not busy in the deepest hash's order (busy: over `percent` % of the pool's mean
//!   plus `excess`); the worker it places is never busy, and
//!   each hop reports how its worker was chosen;
//! - a prefill hop is skipped by choice (§4) exactly when it is unpinned and the prompt is
//!   short enough, or its decode worker served the last turn and little was added;
//! - a prompt's hashes: a longer prompt keeps the hashes of its beginning; a turn
//!   remembered for a prompt is found by its continuation under a shared key, with the
//!   bytes it adds; a remembered turn encodes and decodes to itself.
//! - an error maps to its SPEC status and code, names the worker and hop, and its body
//!   never contains a registry address.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use arbitrary::Arbitrary;
use pinroute::policy::availability::{Availability, Unavailability};
use pinroute::policy::config::Settings;
use pinroute::policy::error::RouteError;
use pinroute::policy::hop::Hop;
use pinroute::policy::pins::Pins;
use pinroute::policy::prefix::{BLOCK_BYTES, PromptPrefix};
use pinroute::policy::registry::{Deployment, Registry, Role, Worker, WorkerId};
use pinroute::policy::resolve::{
    DECODE_ATTEMPTS, LocalPrefill, PrefillPlan, PromptFacts, Resolver, Route, Target, TokenHop,
};
use pinroute::policy::select::{Affinity, Busy, Choice, Placement, prefix_weight, session_weight};
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
    choice: ChoiceSpec,
    pins: PinsSpec,
    /// B, D and r of a second resolution that must leave the prefill plan alone.
    other_token_pins: PinsSpec,
    /// The prompt, for prefix affinity and conditional disaggregation.
    prompt: PromptSpec,
}

#[derive(Arbitrary, Debug)]
struct PromptSpec {
    text: Vec<u8>,
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

#[derive(Arbitrary, Debug)]
enum ChoiceSpec {
    Session(Vec<u8>),
    Turn(u64),
    /// Outstanding requests per worker: `load[id % 8]`.
    LeastLoaded(u64, [u8; 8]),
    /// Prefix affinity over the prompt's hashes, with these loads.
    Prefix(u64, [u8; 8]),
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

/// Draining from the registry, unhealthy from the fuzzer.
#[derive(Clone)]
struct Health {
    unhealthy: HashSet<WorkerId>,
    retry_after_secs: u32,
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
    let settings = Settings {
        prefill_retries: case.prefill_retries.value(),
        aggregated_fallback: case.aggregated_fallback,
        panic_threshold_percent: u32::from(case.panic_threshold % 101),
        prefix_affinity_bytes: usize::from(prompt.window % 16385),
        prefix_min_bytes: BLOCK_BYTES * (1 + usize::from(prompt.min_blocks % 8)),
        affinity_busy_excess: u64::from(prompt.busy_excess),
        affinity_busy_percent: 100 + u64::from(prompt.busy_percent % 400),
        local_prefill_max_bytes: usize::from(prompt.local_max),
        local_prefill_suffix_bytes: usize::from(prompt.local_suffix),
        ..Settings::default()
    };
    check_prompt_hashes(prompt, &settings);
    let prefix = PromptPrefix::new(&prompt.text, settings.prefix_affinity_bytes);
    let health = Health {
        unhealthy: case.unhealthy_ids(&workers),
        retry_after_secs: u32::from(case.retry_after_secs),
    };
    let load = match &case.choice {
        ChoiceSpec::LeastLoaded(_, load) | ChoiceSpec::Prefix(_, load) => *load,
        _ => [0; 8],
    };
    let by_load = |w: &Worker| outstanding(&load, w);
    let remembered: Vec<WorkerId> = prompt.remembered.iter().map(|r| r.id(&workers)).collect();
    let choice = match &case.choice {
        ChoiceSpec::Session(key) => Choice::Session(key),
        ChoiceSpec::Turn(turn) => Choice::RoundRobin(*turn),
        ChoiceSpec::LeastLoaded(turn, _) => Choice::LeastLoaded {
            rotation: *turn,
            outstanding: &by_load,
        },
        ChoiceSpec::Prefix(turn, _) => Choice::Prefix(Affinity {
            depths: prefix.depths(settings.prefix_min_bytes),
            remembered: &remembered,
            busy: settings.busy(),
            rotation: *turn,
            outstanding: &by_load,
        }),
    };
    let facts = PromptFacts {
        bytes: prompt.text.len(),
        last_turn: prompt.last_turn.map(|(decode, prefill, added)| LastTurn {
            prefill: prefill.map(|p| p.id(&workers)),
            decode: decode.id(&workers),
            added_bytes: u64::from(added),
        }),
    };
    let pins = case.pins.pins(&workers);
    let world = World {
        registry: &registry,
        settings: &settings,
        health: &health,
        choice,
        prompt: facts,
    };
    world.check(&pins, &case.other_token_pins.pins(&workers));
}

impl Case {
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
            serde_json::json!({
                "id": w.id, "role": w.role.to_string(), "address": w.address.to_string(),
                "dp_size": w.dp_size, "draining": w.draining,
            })
        })
        .collect();
    serde_json::json!({ "workers": workers }).to_string()
}

/// Everything a resolution depends on but the pins.
struct World<'a> {
    registry: &'a Registry,
    settings: &'a Settings,
    health: &'a Health,
    choice: Choice<'a>,
    prompt: PromptFacts,
}

impl World<'_> {
    fn resolver(&self) -> Resolver<'_, &Health> {
        Resolver {
            registry: self.registry,
            settings: self.settings,
            availability: self.health,
            choice: self.choice,
            prompt: self.prompt,
        }
    }

    fn check(&self, pins: &Pins, other_token_pins: &Pins) {
        let actual = self.resolver().resolve(pins);
        assert_eq!(
            self.resolver().resolve(pins),
            actual,
            "resolution is not deterministic"
        );
        assert_eq!(actual, self.expected(pins), "resolution of {pins:?}");
        match &actual {
            Ok(route) => self.check_route(route, pins),
            Err(error) => self.check_error(error),
        }
        self.check_prefill_ignores_token_pins(pins, &actual, other_token_pins);
        self.check_token_hop(pins, &actual);
        self.check_session_stability(pins, &actual);
        self.check_affinity_avoids_busy_workers(&actual);
    }

    // ---- the model of docs/semantics.md §3 ----

    fn expected(&self, pins: &Pins) -> Result<Route, RouteError> {
        let (prefill, prefill_panic) = self.expected_prefill(pins)?;
        let decode = self.expected_token_hop(pins)?;
        let prefill_placement = match &prefill {
            PrefillPlan::Candidates(_) => Some(self.expected_placement(Role::Prefill)),
            _ => None,
        };
        let local = matches!(prefill, PrefillPlan::Candidates(_))
            .then(|| self.expected_local(&decode))
            .flatten();
        Ok(match local {
            Some(why) => Route {
                prefill: PrefillPlan::Local(why),
                decode,
                prefill_panic: false,
                prefill_placement: None,
            },
            None => Route {
                prefill,
                decode,
                prefill_panic,
                prefill_placement,
            },
        })
    }

    /// docs/semantics.md §4: a short prompt, or the next turn on the decode worker of the last.
    fn expected_local(&self, decode: &TokenHop) -> Option<LocalPrefill> {
        let prompt = &self.prompt;
        if prompt.bytes > 0 && prompt.bytes <= self.settings.local_prefill_max_bytes {
            return Some(LocalPrefill::ShortPrompt);
        }
        let turn = prompt.last_turn?;
        let next = turn.decode == decode.target.worker.id
            && u128::from(turn.added_bytes) <= self.settings.local_prefill_suffix_bytes as u128;
        next.then_some(LocalPrefill::NextTurn)
    }

    /// How the first unpinned worker of `role` is chosen: from the healthy workers' ranking,
    /// or the unhealthy ones' when in panic with no healthy worker.
    fn expected_placement(&self, role: Role) -> Placement {
        let healthy = !self.of_role(role, true).is_empty() || !self.in_panic(role);
        self.ranked_with_placement(self.of_role(role, healthy)).1
    }

    fn of_role(&self, role: Role, healthy: bool) -> Vec<&Worker> {
        self.registry
            .workers()
            .iter()
            .filter(|w| w.role == role && !w.draining)
            .filter(|w| self.health.unavailability(w).is_none() == healthy)
            .collect()
    }

    fn expected_prefill(&self, pins: &Pins) -> Result<(PrefillPlan, bool), RouteError> {
        let hop = Hop::Prefill;
        if let Some(target) = self.expected_pin(
            hop,
            Role::Prefill,
            pins.prefill_worker_id,
            pins.prefill_dp_rank,
        )? {
            let panic = self.health.unavailability(&target.worker).is_some();
            return Ok((PrefillPlan::Pinned(target), panic));
        }
        if self.registry.deployment() == Deployment::Aggregated {
            return Ok((PrefillPlan::Skip, false));
        }
        let mut order = self.expected_order(Role::Prefill);
        order.truncate(
            usize::try_from(self.settings.prefill_retries)
                .map_or(usize::MAX, |n| n.saturating_add(1)),
        );
        if !order.is_empty() {
            Ok((PrefillPlan::Candidates(order), self.in_panic(Role::Prefill)))
        } else if self.settings.aggregated_fallback {
            Ok((PrefillPlan::Skip, false))
        } else {
            Err(RouteError::NoWorkerAvailable {
                hop,
                role: Role::Prefill,
            })
        }
    }

    /// docs/semantics.md §5's panic mode: fewer than `panic_threshold_percent` of the pool's
    /// non-draining workers are healthy.
    fn in_panic(&self, role: Role) -> bool {
        let serving: Vec<&Worker> = self
            .registry
            .workers()
            .iter()
            .filter(|w| w.role == role && !w.draining)
            .collect();
        let healthy = serving
            .iter()
            .filter(|w| self.health.unavailability(w).is_none())
            .count();
        let threshold = u128::from(self.settings.panic_threshold_percent);
        (healthy as u128) * 100 < threshold * (serving.len() as u128)
    }

    /// Whether a resolution may hand out `worker`: healthy, or unhealthy in a pool in panic.
    fn usable(&self, worker: &Worker) -> bool {
        match self.health.unavailability(worker) {
            None => true,
            Some(Unavailability::Unhealthy { .. }) => self.in_panic(worker.role),
            Some(Unavailability::Draining) => false,
        }
    }

    fn expected_token_hop(&self, pins: &Pins) -> Result<TokenHop, RouteError> {
        let (hop, role) = match self.registry.deployment() {
            Deployment::Disaggregated => (Hop::Decode, Role::Decode),
            Deployment::Aggregated => (Hop::Aggregated, Role::Aggregated),
        };
        let pin = pins.decode_worker_id.or(pins.backend_instance_id);
        if let Some(target) = self.expected_pin(hop, role, pin, pins.dp_rank)? {
            return Ok(TokenHop {
                panic: self.health.unavailability(&target.worker).is_some(),
                target,
                hop,
                alternates: Vec::new(),
                placement: None,
            });
        }
        let mut order = self.expected_order(role).into_iter();
        let target = order
            .next()
            .ok_or(RouteError::NoWorkerAvailable { hop, role })?;
        let alternates = order.take(DECODE_ATTEMPTS - 1).map(|t| t.worker).collect();
        Ok(TokenHop {
            target,
            hop,
            alternates,
            panic: self.in_panic(role),
            placement: Some(self.expected_placement(role)),
        })
    }

    fn expected_pin(
        &self,
        hop: Hop,
        role: Role,
        id: Option<WorkerId>,
        rank: Option<u32>,
    ) -> Result<Option<Target>, RouteError> {
        let Some(id) = id else {
            return if rank.is_some() {
                Err(RouteError::RankWithoutWorker { hop })
            } else {
                Ok(None)
            };
        };
        let Some(worker) = self.registry.workers().iter().find(|w| w.id == id) else {
            if self.registry.workers().is_empty() {
                return Err(RouteError::NoWorkerAvailable { hop, role });
            }
            return Err(RouteError::UnknownWorker { hop, worker: id });
        };
        if worker.role != role {
            return Err(RouteError::WrongRole {
                hop,
                worker: id,
                actual: worker.role,
                expected: role,
            });
        }
        if let Some(rank) = rank.filter(|r| *r >= worker.dp_size) {
            return Err(RouteError::RankOutOfRange {
                hop,
                worker: id,
                rank,
                dp_size: worker.dp_size,
            });
        }
        if let Some(why) = self
            .health
            .unavailability(worker)
            .filter(|_| !self.usable(worker))
        {
            return Err(RouteError::WorkerUnavailable {
                hop,
                worker: id,
                why,
            });
        }
        let rank = rank.or(if worker.dp_size == 1 { Some(0) } else { None });
        Ok(Some(Target {
            worker: worker.clone(),
            rank,
            pinned: true,
        }))
    }

    /// The available workers of a role, best first: by session weight (highest first, ties
    /// to the higher id), or round robin over ids from the turn; in panic, the unhealthy
    /// ones follow in the same order among themselves.
    fn expected_order(&self, role: Role) -> Vec<Target> {
        let mut order = self.ranked(self.of_role(role, true));
        if self.in_panic(role) {
            order.extend(self.ranked(self.of_role(role, false)));
        }
        order
    }

    fn ranked(&self, pool: Vec<&Worker>) -> Vec<Target> {
        self.ranked_with_placement(pool).0
    }

    fn ranked_with_placement(&self, mut pool: Vec<&Worker>) -> (Vec<Target>, Placement) {
        let placement = match self.choice {
            Choice::Session(key) => {
                pool.sort_by_key(|w| std::cmp::Reverse((session_weight(key, w), w.id)));
                Placement::Session
            }
            Choice::RoundRobin(turn) => {
                round_robin(&mut pool, turn);
                Placement::Load
            }
            Choice::LeastLoaded {
                rotation: turn,
                outstanding,
            } => {
                least_loaded(&mut pool, turn, outstanding);
                Placement::Load
            }
            Choice::Prefix(affinity)
                if affinity.depths.is_empty() && affinity.remembered.is_empty() =>
            {
                least_loaded(&mut pool, affinity.rotation, affinity.outstanding);
                Placement::Load
            }
            Choice::Prefix(affinity) => affinity_model(&mut pool, &affinity),
        };
        let targets = pool
            .into_iter()
            .map(|w| Target {
                worker: w.clone(),
                rank: None,
                pinned: false,
            })
            .collect();
        (targets, placement)
    }

    // ---- properties stated directly ----

    /// docs/semantics.md §5: a worker far busier than its share of its (healthy) pool is
    /// never the one prefix affinity places a hop on.
    fn check_affinity_avoids_busy_workers(&self, actual: &Result<Route, RouteError>) {
        let (Choice::Prefix(affinity), Ok(route)) = (self.choice, actual) else {
            return;
        };
        let placed = |p: Option<Placement>| {
            matches!(
                p,
                Some(Placement::Affinity | Placement::Spilled | Placement::Remembered)
            )
        };
        let mut hops = vec![(route.decode.placement, &route.decode.target.worker)];
        if let PrefillPlan::Candidates(targets) = &route.prefill
            && let Some(first) = targets.first()
        {
            hops.push((route.prefill_placement, &first.worker));
        }
        for (placement, worker) in hops {
            if !placed(placement) || self.health.unavailability(worker).is_some() {
                continue;
            }
            let pool = self.of_role(worker.role, true);
            let total = pool.iter().map(|w| (affinity.outstanding)(w)).sum();
            let load = (affinity.outstanding)(worker);
            assert!(
                !busy_model(affinity.busy, load, total, pool.len()),
                "affinity placed a hop on busy worker {}",
                worker.id
            );
        }
    }

    fn check_route(&self, route: &Route, pins: &Pins) {
        let expected_hop = match self.registry.deployment() {
            Deployment::Disaggregated => Hop::Decode,
            Deployment::Aggregated => Hop::Aggregated,
        };
        assert_eq!(route.decode.hop, expected_hop);
        let token_pin = pins.decode_worker_id.or(pins.backend_instance_id);
        self.check_target(
            &route.decode.target,
            self.registry.token_role(),
            token_pin,
            pins.dp_rank,
        );
        self.check_alternates(&route.decode);
        match &route.prefill {
            PrefillPlan::Pinned(target) => self.check_target(
                target,
                Role::Prefill,
                pins.prefill_worker_id,
                pins.prefill_dp_rank,
            ),
            PrefillPlan::Candidates(targets) => self.check_candidates(targets, pins),
            PrefillPlan::Skip | PrefillPlan::Local(_) => assert!(
                pins.prefill_worker_id.is_none(),
                "prefill skipped though P is set"
            ),
        }
    }

    fn check_target(
        &self,
        target: &Target,
        role: Role,
        pin: Option<WorkerId>,
        rank_pin: Option<u32>,
    ) {
        let worker = &target.worker;
        assert_eq!(
            self.registry.get(worker.id),
            Some(worker),
            "target is not the registry's worker"
        );
        assert!(
            self.registry
                .workers()
                .iter()
                .any(|w| w.address == worker.address),
            "address not in registry"
        );
        assert_eq!(worker.role, role, "target {} has the wrong role", worker.id);
        assert!(
            target.rank.is_none_or(|r| r < worker.dp_size),
            "rank {:?} >= dp_size",
            target.rank
        );
        assert!(
            self.usable(worker),
            "target {} is not available: {:?}",
            worker.id,
            self.health.unavailability(worker)
        );
        match pin {
            Some(id) => {
                assert!(
                    target.pinned && worker.id == id,
                    "pinned {id}, got {}",
                    worker.id
                );
                let implied = if worker.dp_size == 1 { Some(0) } else { None };
                assert_eq!(target.rank, rank_pin.or(implied), "rank of pinned {id}");
            }
            None => assert!(
                !target.pinned && target.rank.is_none(),
                "unpinned target has a pin or rank"
            ),
        }
    }

    /// Alternates: only for an unpinned hop, distinct available registry workers of the
    /// hop's role other than the target, at most `DECODE_ATTEMPTS - 1`.
    fn check_alternates(&self, decode: &TokenHop) {
        let alternates = &decode.alternates;
        assert!(
            !decode.target.pinned || alternates.is_empty(),
            "a pinned hop has alternates"
        );
        assert!(
            alternates.len() < DECODE_ATTEMPTS,
            "{} alternates",
            alternates.len()
        );
        let mut ids: HashSet<WorkerId> = alternates.iter().map(|w| w.id).collect();
        assert!(
            ids.insert(decode.target.worker.id) && ids.len() == alternates.len() + 1,
            "repeated worker"
        );
        for worker in alternates {
            let target = Target {
                worker: worker.clone(),
                rank: None,
                pinned: false,
            };
            self.check_target(&target, self.registry.token_role(), None, None);
        }
    }

    fn check_candidates(&self, targets: &[Target], pins: &Pins) {
        assert!(
            pins.prefill_worker_id.is_none(),
            "P is set but prefill is unpinned"
        );
        assert!(
            !targets.is_empty(),
            "no candidates must be Skip or an error"
        );
        let limit = u64::from(self.settings.prefill_retries) + 1;
        assert!(
            u64::try_from(targets.len()).is_ok_and(|n| n <= limit),
            "more than 1 + retries candidates"
        );
        let ids: HashSet<WorkerId> = targets.iter().map(|t| t.worker.id).collect();
        assert_eq!(ids.len(), targets.len(), "a candidate is repeated");
        for target in targets {
            self.check_target(target, Role::Prefill, None, None);
        }
    }

    fn check_error(&self, error: &RouteError) {
        let (status, code) = expected_status(error);
        assert_eq!((error.status(), error.code()), (status, code), "{error:?}");
        let body: serde_json::Value = match serde_json::from_str(&error.body()) {
            Ok(body) => body,
            Err(e) => violated(format!("error body is not JSON: {e}")),
        };
        assert_eq!(
            body.pointer("/error/code").and_then(|c| c.as_str()),
            Some(code)
        );
        assert_eq!(
            error.retry_after_secs(),
            expected_retry_after(error),
            "Retry-After of {error:?}"
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
                !error.body().contains(&address),
                "error body leaks {address}"
            );
        }
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
        let (Choice::Session(_), Ok(route)) = (self.choice, actual) else {
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

fn least_loaded(pool: &mut [&Worker], turn: u64, outstanding: &dyn Fn(&Worker) -> u64) {
    round_robin(pool, turn);
    let first_two: Vec<u64> = pool.iter().take(2).map(|w| outstanding(w)).collect();
    if let [first, second] = first_two.as_slice()
        && second < first
    {
        pool.swap(0, 1);
    }
}

/// docs/semantics.md §5, prefix affinity, written out: the first worker, then the others in
/// the deepest hash's order.
fn affinity_model(pool: &mut Vec<&Worker>, affinity: &Affinity<'_>) -> Placement {
    let load = |w: &Worker| (affinity.outstanding)(w);
    let total = pool.iter().map(|w| load(w)).sum();
    let workers = pool.len();
    let busy = |w: &Worker| busy_model(affinity.busy, load(w), total, workers);
    let deepest = affinity.depths.last().copied().unwrap_or(0);
    let weight = |hash: u64, w: &Worker| (prefix_weight(hash, w), w.id);
    pool.sort_by_key(|w| std::cmp::Reverse(weight(deepest, w)));
    let mut first = pool
        .iter()
        .find(|w| affinity.remembered.contains(&w.id) && !busy(w))
        .map(|w| (w.id, Placement::Remembered));
    let mut passed: Vec<WorkerId> = Vec::new();
    for (depth, hash) in affinity.depths.iter().enumerate() {
        if first.is_some() {
            break;
        }
        let Some(top) = pool
            .iter()
            .filter(|w| !passed.contains(&w.id))
            .max_by_key(|w| weight(*hash, w))
        else {
            break;
        };
        if busy(top) {
            passed.push(top.id);
        } else {
            let placement = if depth == 0 {
                Placement::Affinity
            } else {
                Placement::Spilled
            };
            first = Some((top.id, placement));
        }
    }
    let (id, placement) = first
        .or_else(|| {
            pool.iter()
                .find(|w| !busy(w))
                .map(|w| (w.id, Placement::Spilled))
        })
        .unwrap_or((pool.first().map_or(0, |w| w.id), Placement::Spilled));
    if let Some(at) = pool.iter().position(|w| w.id == id) {
        let chosen = pool.remove(at);
        pool.insert(0, chosen);
    }
    placement
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
fn check_prompt_hashes(prompt: &PromptSpec, settings: &Settings) {
    let window = settings.prefix_affinity_bytes;
    let min = settings.prefix_min_bytes;
    let text = &prompt.text;
    let base = PromptPrefix::new(text, window);
    let mut longer = text.clone();
    longer.extend_from_slice(&prompt.more);
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
    let Some(turn) = Turn::of(&base, text, min, (Some(1), 2), 10) else {
        return;
    };
    assert_eq!(
        Turn::decode(&turn.encode()),
        Some(turn),
        "a turn round-trips"
    );
    // The client resends the prompt without its closing byte, then what it adds.
    let mut next = text.get(..text.len() - 1).unwrap_or_default().to_vec();
    next.extend_from_slice(&prompt.more);
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
    }
}

fn next_turn(route: &Route) -> bool {
    route.prefill == PrefillPlan::Local(LocalPrefill::NextTurn)
}

/// Round robin: by id, starting at the `turn`-th worker.
fn round_robin(pool: &mut [&Worker], turn: u64) {
    pool.sort_by_key(|w| w.id);
    let len = u64::try_from(pool.len()).unwrap_or(u64::MAX).max(1);
    pool.rotate_left(usize::try_from(turn % len).unwrap_or(0));
}

fn expected_status(error: &RouteError) -> (u16, &'static str) {
    match error {
        RouteError::RankWithoutWorker { .. } => (400, "rank_without_worker"),
        RouteError::UnknownWorker { .. } => (400, "unknown_worker"),
        RouteError::WrongRole { .. } => (400, "wrong_worker_role"),
        RouteError::RankOutOfRange { .. } => (400, "dp_rank_out_of_range"),
        RouteError::WorkerUnavailable { .. } => (503, "worker_unavailable"),
        RouteError::NoWorkerAvailable { .. } => (503, "no_worker_available"),
        other => violated(format!(
            "resolution answered an error it cannot cause: {other:?}"
        )),
    }
}

/// docs/semantics.md §3: a worker out of service answers 503 with `Retry-After`; a 400 has none.
fn expected_retry_after(error: &RouteError) -> Option<u32> {
    match error {
        RouteError::WorkerUnavailable {
            why: Unavailability::Unhealthy { retry_after_secs },
            ..
        } => Some(*retry_after_secs),
        RouteError::WorkerUnavailable { .. } | RouteError::NoWorkerAvailable { .. } => {
            Some(pinroute::policy::error::RETRY_AFTER_SECS)
        }
        _ => None,
    }
}

fn hop_and_worker(error: &RouteError) -> Option<(Hop, Option<WorkerId>)> {
    match *error {
        RouteError::RankWithoutWorker { hop } | RouteError::NoWorkerAvailable { hop, .. } => {
            Some((hop, None))
        }
        RouteError::UnknownWorker { hop, worker }
        | RouteError::WrongRole { hop, worker, .. }
        | RouteError::RankOutOfRange { hop, worker, .. }
        | RouteError::WorkerUnavailable { hop, worker, .. } => Some((hop, Some(worker))),
        _ => None,
    }
}

fn error_hop(error: &RouteError) -> Option<Hop> {
    hop_and_worker(error).map(|(hop, _)| hop)
}

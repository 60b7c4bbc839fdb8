//! Per-hop resolution of pins against the registry (`docs/semantics.md` §3).
//!
//! | hop | worker pin | rank pin |
//! |---|---|---|
//! | prefill | P only | pr only |
//! | decode | D, else B | r |
//! | aggregated | D, else B | r |

use super::availability::{Availability, Unavailability, pool_in_panic};
use super::config::Settings;
use super::error::RouteError;
use super::hop::Hop;
use super::picker::{self, Allowed, Picked, RoutingMode};
use super::pins::Pins;
use super::registry::{Deployment, Pool, Registry, Role, Worker, WorkerId};
use super::select::{Choice, Loads, Placement, rank_candidates, rank_pool};
use super::turns::LastTurn;

/// A worker chosen for a hop, with the rank to send it as `X-data-parallel-rank`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub worker: Worker,
    /// `None`: no rank header, the worker balances over its own ranks.
    pub rank: Option<u32>,
    pub pinned: bool,
}

/// What happens before the token-generating hop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefillPlan {
    /// One hop: an aggregated deployment, or no healthy prefill worker (decode prefills).
    Skip,
    /// One hop by choice (conditional disaggregation, `docs/semantics.md` §4): the prefill
    /// hop would not pay off, the decode worker prefills.
    Local(LocalPrefill),
    Pinned(Target),
    /// Unpinned: the workers to try in order, the first plus at most `prefill_retries` more.
    Candidates(Vec<Target>),
}

/// Why an unpinned prefill hop is skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalPrefill {
    /// The prompt is at most `local_prefill_max_bytes`.
    ShortPrompt,
    /// The decode worker served the conversation's last turn, and the prompt adds at most
    /// `local_prefill_suffix_bytes` to it.
    NextTurn,
    /// The picker routed the request as one hop (`x-dynamo-routing-mode: aggregated`).
    Picker,
    /// The request reads or starts state only its decode worker keeps: it continues a stored
    /// response, or runs in the background (`super::responses`).
    Stateful,
}

/// What the request's prompt tells the prefill plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptFacts {
    /// Its length in bytes; 0 when there is none.
    pub bytes: usize,
    /// The conversation's last turn through this gateway, when the prompt continues it.
    pub last_turn: Option<LastTurn>,
}

/// How many workers an unpinned decode hop may be offered: the first and those Envoy retries
/// when a connection fails (the bootstrap's `num_retries` plus one).
pub const DECODE_ATTEMPTS: usize = 3;

/// The token-generating hop: the decode hop, or the single hop of an aggregated deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenHop {
    pub target: Target,
    pub hop: Hop,
    /// Unpinned only: the next best workers, in order, for a connection that fails.
    pub alternates: Vec<Worker>,
    /// Its pool was in panic (`docs/semantics.md` §5) and that decided the hop: unhealthy
    /// workers are among the candidates, or the pinned worker is unhealthy.
    pub panic: bool,
    /// How the worker was chosen; `None` when pinned.
    pub placement: Option<Placement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub prefill: PrefillPlan,
    pub decode: TokenHop,
    /// The prefill pool was in panic and that decided the prefill plan (as `TokenHop::panic`).
    pub prefill_panic: bool,
    /// How the first prefill candidate was chosen; `None` unless the plan is `Candidates`.
    pub prefill_placement: Option<Placement>,
}

/// How much of a completion's prompt its placement reads (`docs/semantics.md` §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptUse {
    /// Both hops are pinned: there is nothing to choose, the prompt is not read.
    Unread,
    /// Only its length counts (conditional disaggregation, §4): affinity is off, or the
    /// prompt is shorter than the shortest beginning worth placing by.
    Length,
    /// Its beginning is hashed for prefix affinity and looked up in the turn memory.
    Hashed,
}

/// How a prompt of `bytes` bytes is read, given the request's pins.
pub fn prompt_use(settings: &Settings, pins: &Pins, bytes: usize) -> PromptUse {
    let both_pinned = pins.prefill_worker_id.is_some()
        && pins.decode_worker_id.or(pins.backend_instance_id).is_some();
    if both_pinned {
        PromptUse::Unread
    } else if settings.prefix_affinity_bytes == 0 || bytes < settings.prefix_min_bytes {
        PromptUse::Length
    } else {
        PromptUse::Hashed
    }
}

impl Route {
    /// The route with its unpinned prefill hop left out: the decode worker prefills.
    pub fn in_one_hop(self, why: LocalPrefill) -> Route {
        match self.prefill {
            PrefillPlan::Candidates(_) => Route {
                prefill: PrefillPlan::Local(why),
                prefill_panic: false,
                prefill_placement: None,
                ..self
            },
            _ => self,
        }
    }

    /// The workers the turn memory may keep for this route's conversation (`docs/semantics.md`
    /// §5): the prefill worker (if a hop was planned) and the decode worker, but only when
    /// pinroute chose both from the prompt. A pinned hop or a session's placement was the
    /// client's choice, and one client's choice never becomes another's placement.
    pub fn remembered_workers(&self) -> Option<(Option<WorkerId>, WorkerId)> {
        let chosen_from_prompt = |placement: Option<Placement>| {
            placement.is_some_and(|p| !matches!(p, Placement::Session | Placement::Picker))
        };
        let prefill = match &self.prefill {
            PrefillPlan::Pinned(_) => return None,
            PrefillPlan::Candidates(_) if !chosen_from_prompt(self.prefill_placement) => {
                return None;
            }
            PrefillPlan::Candidates(targets) => targets.first().map(|t| t.worker.id),
            PrefillPlan::Skip | PrefillPlan::Local(_) => None,
        };
        let decode = &self.decode;
        (!decode.target.pinned && chosen_from_prompt(decode.placement))
            .then_some((prefill, decode.target.worker.id))
    }
}

/// A pool's workers for an unpinned hop, best first, whether it was in panic, and how the
/// first was chosen.
struct Candidates {
    targets: Vec<Target>,
    panic: bool,
    placement: Placement,
}

/// The inputs of one resolution.
pub struct Resolver<'a, A: Availability> {
    pub registry: &'a Registry,
    pub settings: &'a Settings,
    pub availability: A,
    pub choice: Choice<'a>,
    pub prompt: PromptFacts,
    /// What an endpoint picker chose (picker mode, `docs/semantics.md` §9); empty otherwise.
    pub picked: &'a Picked,
    /// The model the request names: only workers serving it are candidates (§3). `None`:
    /// every worker is.
    pub model: Option<&'a str>,
    /// The load that names an unpinned hop's rank ([`Loads::rank`], the engines' figures);
    /// `None`: unpinned hops name none.
    pub rank_loads: Option<&'a dyn Loads>,
}

impl<A: Availability> Resolver<'_, A> {
    /// Resolves each hop from its own pins only. Pins are exact: an unusable pin is an
    /// error, never silently replaced by another worker.
    pub fn resolve(&self, pins: &Pins) -> Result<Route, RouteError> {
        let (prefill, prefill_panic, prefill_placement) = self.prefill(pins)?;
        let decode = self.token_hop(pins)?;
        let route = Route {
            prefill,
            decode,
            prefill_panic,
            prefill_placement,
        };
        let picker_decided = route.prefill_placement == Some(Placement::Picker)
            || self.picked.mode == Some(RoutingMode::Disaggregated);
        Ok(match self.local_prefill(&route.decode) {
            Some(why) if !picker_decided => route.in_one_hop(why),
            _ => route,
        })
    }

    /// Whether an unpinned prefill hop would not pay off (`docs/semantics.md` §4): a short
    /// prompt, or the next turn of a conversation the decode worker just served.
    fn local_prefill(&self, decode: &TokenHop) -> Option<LocalPrefill> {
        let settings = self.settings;
        let prompt = &self.prompt;
        if prompt.bytes > 0 && prompt.bytes <= settings.local_prefill_max_bytes {
            return Some(LocalPrefill::ShortPrompt);
        }
        let turn = prompt.last_turn?;
        let suffix = u64::try_from(settings.local_prefill_suffix_bytes).unwrap_or(u64::MAX);
        (turn.decode == decode.target.worker.id && turn.added_bytes <= suffix)
            .then_some(LocalPrefill::NextTurn)
    }

    /// The token-generating hop alone: for paths that take no prefill hop (`/v1/models`, ...).
    pub fn token_hop(&self, pins: &Pins) -> Result<TokenHop, RouteError> {
        let hop = match self.registry.deployment() {
            Deployment::Disaggregated => Hop::Decode,
            Deployment::Aggregated => Hop::Aggregated,
        };
        let worker_pin = pins.decode_worker_id.or(pins.backend_instance_id);
        let role = self.registry.token_role();
        if worker_pin.is_none() && !self.picked.token.is_empty() {
            return self.picked_token_hop(hop, role, pins.dp_rank);
        }
        if let Some(target) = self.pinned(hop, role, worker_pin, pins.dp_rank)? {
            return Ok(TokenHop {
                panic: self.is_unhealthy(&target.worker),
                target,
                hop,
                alternates: Vec::new(),
                placement: None,
            });
        }
        let Candidates {
            targets,
            panic,
            placement,
        } = self.candidates(role, DECODE_ATTEMPTS);
        let mut candidates = targets.into_iter();
        let mut target = candidates
            .next()
            .ok_or(RouteError::NoWorkerAvailable { hop, role })?;
        let alternates: Vec<Worker> = candidates.map(|t| t.worker).collect();
        // A retry, Envoy's or the filter's, carries the hop's rank header to an alternate.
        target.rank = target
            .rank
            .filter(|rank| alternates.iter().all(|w| *rank < w.dp_size));
        Ok(TokenHop {
            target,
            hop,
            alternates,
            panic,
            placement: Some(placement),
        })
    }

    /// The prefill plan, whether the prefill pool's panic decided it, and how its first
    /// candidate was chosen.
    fn prefill(&self, pins: &Pins) -> Result<(PrefillPlan, bool, Option<Placement>), RouteError> {
        let picker_rank = pins.prefill_worker_id.is_none() && !self.picked.prefill.is_empty();
        let pinned = self.pinned(
            Hop::Prefill,
            Role::Prefill,
            pins.prefill_worker_id,
            pins.prefill_dp_rank.filter(|_| !picker_rank),
        )?;
        if let Some(target) = pinned {
            let panic = self.is_unhealthy(&target.worker);
            return Ok((PrefillPlan::Pinned(target), panic, None));
        }
        if self.registry.deployment() == Deployment::Aggregated {
            return Ok((PrefillPlan::Skip, false, None));
        }
        if self.picked.mode == Some(RoutingMode::Aggregated) {
            return Ok((PrefillPlan::Local(LocalPrefill::Picker), false, None));
        }
        if !self.picked.prefill.is_empty() {
            let targets = self.picked_prefill(pins.prefill_dp_rank)?;
            return Ok((
                PrefillPlan::Candidates(targets),
                false,
                Some(Placement::Picker),
            ));
        }
        let attempts = usize::try_from(self.settings.prefill_retries).unwrap_or(usize::MAX);
        let Candidates {
            targets: candidates,
            panic,
            placement,
        } = self.candidates(Role::Prefill, attempts.saturating_add(1));
        match (candidates.is_empty(), self.settings.aggregated_fallback) {
            (false, _) => Ok((PrefillPlan::Candidates(candidates), panic, Some(placement))),
            (true, true) => Ok((PrefillPlan::Skip, false, None)),
            (true, false) => Err(RouteError::NoWorkerAvailable {
                hop: Hop::Prefill,
                role: Role::Prefill,
            }),
        }
    }

    /// The token-generating hop to the picker's endpoints: the first with the rank header's
    /// rank, the next ones for a connection that fails. The picker has its own view of load
    /// and health: pinroute's passive health does not overrule it.
    fn picked_token_hop(
        &self,
        hop: Hop,
        role: Role,
        rank: Option<u32>,
    ) -> Result<TokenHop, RouteError> {
        let header = picker::DESTINATION_HEADER;
        let workers = picker::workers(
            header,
            &self.picked.token,
            role,
            self.registry,
            self.allowed(),
        )?;
        let mut workers = workers.into_iter().take(DECODE_ATTEMPTS);
        let first = workers.next().ok_or(RouteError::Internal(
            "a picker endpoint list is never empty",
        ))?;
        Ok(TokenHop {
            target: picked_target(hop, first, rank)?,
            hop,
            alternates: workers.collect(),
            panic: false,
            placement: Some(Placement::Picker),
        })
    }

    /// The prefill candidates the picker named, in its order: the first plus at most
    /// `prefill_retries` more.
    fn picked_prefill(&self, rank: Option<u32>) -> Result<Vec<Target>, RouteError> {
        let header = picker::PREFILLER_HEADER;
        let workers = picker::workers(
            header,
            &self.picked.prefill,
            Role::Prefill,
            self.registry,
            self.allowed(),
        )?;
        let attempts = usize::try_from(self.settings.prefill_retries).unwrap_or(usize::MAX);
        workers
            .into_iter()
            .take(attempts.saturating_add(1))
            .zip(std::iter::once(rank).chain(std::iter::repeat(None)))
            .map(|(worker, rank)| picked_target(Hop::Prefill, worker, rank))
            .collect()
    }

    fn allowed(&self) -> &[Allowed] {
        self.settings
            .picker
            .as_ref()
            .map_or(&[], |p| p.allow.as_slice())
    }

    /// The pinned worker of a hop, checked against the registry; `None` when not pinned. An
    /// unhealthy one is tried while its pool is in panic (`docs/semantics.md` §5).
    fn pinned(
        &self,
        hop: Hop,
        role: Role,
        worker: Option<WorkerId>,
        rank: Option<u32>,
    ) -> Result<Option<Target>, RouteError> {
        let Some(id) = worker else {
            return match rank {
                Some(_) => Err(RouteError::RankWithoutWorker { hop }),
                None => Ok(None),
            };
        };
        let Some(worker) = self.registry.get(id) else {
            // No worker at all (a live registry not fetched yet): nothing could serve it.
            return Err(if self.registry.workers().is_empty() {
                RouteError::NoWorkerAvailable { hop, role }
            } else {
                RouteError::UnknownWorker { hop, worker: id }
            });
        };
        if worker.role != role {
            return Err(RouteError::WrongRole {
                hop,
                worker: id,
                actual: worker.role,
                expected: role,
            });
        }
        if let Some(model) = self.model.filter(|m| !worker.serves(m)) {
            return Err(RouteError::ModelNotServed {
                hop,
                worker: id,
                model: model.to_owned(),
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
        let usable = match self.availability.unavailability(worker) {
            None => None,
            Some(Unavailability::Unhealthy { .. }) if self.in_panic(role) => None,
            why => why,
        };
        if let Some(why) = usable {
            return Err(RouteError::WorkerUnavailable {
                hop,
                worker: id,
                why,
            });
        }
        let rank = rank.or((worker.dp_size == 1).then_some(0));
        Ok(Some(Target {
            worker: worker.clone(),
            rank,
            pinned: true,
        }))
    }

    /// The first `limit` available workers of a pool, best first; in panic, the unhealthy
    /// ones after them.
    fn candidates(&self, role: Role, limit: usize) -> Candidates {
        let pool = self.serving(role);
        let unhealthy = self.unhealthy_in(pool);
        let panic = self.panics(pool.len().saturating_sub(unhealthy.len()), unhealthy.len());
        let excluded: Vec<WorkerId> = unhealthy.iter().map(|w| w.id).collect();
        let mut ranked = rank_pool(pool, &excluded, limit, self.choice);
        if panic {
            let rest = rank_candidates(unhealthy, self.choice);
            if ranked.order.is_empty() {
                ranked.placement = rest.placement;
            }
            ranked.order.extend(rest.order);
            ranked.order.truncate(limit);
        }
        let (order, placement) = (ranked.order, ranked.placement);
        let targets = order
            .into_iter()
            .map(|worker| Target {
                worker: worker.clone(),
                rank: self.rank_loads.and_then(|loads| loads.rank(worker)),
                pinned: false,
            })
            .collect();
        Candidates {
            targets,
            panic,
            placement,
        }
    }

    /// The pool's non-draining workers serving the request's model. Panic mode and load are
    /// judged among them alone.
    fn serving(&self, role: Role) -> Pool<'_> {
        self.registry.serving(role, self.model)
    }

    /// The workers of `pool` that are unhealthy now, asked of those the availability names
    /// when it can.
    fn unhealthy_in<'p>(&self, pool: Pool<'p>) -> Vec<&'p Worker> {
        let unhealthy = |w: &&Worker| self.is_unhealthy(w);
        match self.availability.unhealthy_ids() {
            Some(mut ids) => {
                ids.sort_unstable();
                ids.dedup();
                ids.iter()
                    .filter_map(|id| pool.get(pool.position(*id)?))
                    .filter(unhealthy)
                    .collect()
            }
            None => pool.iter().filter(unhealthy).collect(),
        }
    }

    fn panics(&self, healthy: usize, unhealthy: usize) -> bool {
        let serving = healthy.saturating_add(unhealthy);
        pool_in_panic(serving, healthy, self.settings.panic_threshold_percent)
    }

    fn in_panic(&self, role: Role) -> bool {
        let pool = self.serving(role);
        let unhealthy = self.unhealthy_in(pool).len();
        self.panics(pool.len().saturating_sub(unhealthy), unhealthy)
    }

    fn is_unhealthy(&self, worker: &Worker) -> bool {
        matches!(
            self.availability.unavailability(worker),
            Some(Unavailability::Unhealthy { .. })
        )
    }
}

/// A picker's worker for a hop, with the rank a rank header gives it (checked against a
/// registry worker's `dp_size`; an unlisted worker checks it itself).
fn picked_target(hop: Hop, worker: Worker, rank: Option<u32>) -> Result<Target, RouteError> {
    if let Some(rank) = rank.filter(|r| *r >= worker.dp_size) {
        return Err(RouteError::RankOutOfRange {
            hop,
            worker: worker.id,
            rank,
            dp_size: worker.dp_size,
        });
    }
    let rank = rank.or((worker.dp_size == 1).then_some(0));
    Ok(Target {
        worker,
        rank,
        pinned: false,
    })
}

#[cfg(test)]
#[path = "tests/resolve.rs"]
mod tests;

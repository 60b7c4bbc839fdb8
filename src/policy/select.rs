//! Choosing a worker for a hop that is not pinned (`docs/semantics.md` §5).

use std::cell::{Cell, OnceCell};

use super::registry::{Pool, Worker, WorkerId};

/// Requests in flight per worker, as a hop's choice reads them.
pub trait Loads {
    fn outstanding(&self, worker: &Worker) -> u64;

    /// The requests in flight on the workers of `pool` but `excluded`: by default the sum of
    /// each one's; a table of the workers with requests in flight sums only those.
    fn total(&self, pool: Pool<'_>, excluded: &[WorkerId]) -> u64 {
        pool.iter()
            .filter(|w| !excluded.contains(&w.id))
            .map(|w| self.outstanding(w))
            .fold(0, u64::saturating_add)
    }

    /// The load prefix affinity's graded share reads (`docs/semantics.md` §5), in thousandths
    /// of a request: the engines' own figures where there are fresh ones, the same on every
    /// replica reading them; by default what `outstanding` counts.
    fn reported_milli(&self, worker: &Worker) -> u64 {
        self.outstanding(worker).saturating_mul(1000)
    }

    /// Requests this gateway sent `worker` since its engine's figures were scraped, beyond
    /// those that ended: none without figures.
    fn sent_since(&self, _worker: &Worker) -> u64 {
        0
    }

    /// Whether the engine's own fresh figures say `worker` is full (`docs/semantics.md` §5):
    /// then it is busy for prefix affinity, whatever its share of the requests in flight.
    fn full(&self, _worker: &Worker) -> bool {
        false
    }

    /// The rank an unpinned hop to `worker` names; `None`: the worker balances over its own
    /// ranks.
    fn rank(&self, _worker: &Worker) -> Option<u32> {
        None
    }
}

impl<F: Fn(&Worker) -> u64> Loads for F {
    fn outstanding(&self, worker: &Worker) -> u64 {
        self(worker)
    }
}

/// How an unpinned hop picks among healthy workers.
#[derive(Clone, Copy)]
pub enum Choice<'a> {
    /// Rendezvous (highest-random-weight) hashing of the session key: every replica with the
    /// same registry agrees, and a worker leaving moves only the sessions it held.
    Session(&'a [u8]),
    /// Round robin: the caller's running request count.
    RoundRobin(u64),
    /// Power of two choices: of the next two workers in round-robin order, the one with fewer
    /// requests outstanding (as `outstanding` tells) goes first.
    LeastLoaded {
        rotation: u64,
        outstanding: &'a dyn Loads,
    },
    /// Prefix affinity, bounded by load (see [`Affinity`]).
    Prefix(Affinity<'a>),
}

/// Where prefix affinity sends a request: to the worker that most likely holds its prompt's
/// beginning, unless that worker is [`Busy`].
#[derive(Clone, Copy)]
pub struct Affinity<'a> {
    /// Chained hashes of the prompt's blocks, shallowest first (`PromptPrefix::depths`).
    /// Empty: the prompt is too short to place by, and the hop is least-loaded.
    pub depths: &'a [u64],
    /// Workers that served this conversation's last turn through this gateway: preferred
    /// while not busy, they hold more of it than any hash can tell.
    pub remembered: &'a [WorkerId],
    pub busy: Busy,
    pub rotation: u64,
    pub outstanding: &'a dyn Loads,
    /// What a graded bound draws by: the deepest hash of the conversation's first turn, which
    /// the turn memory carries from turn to turn, or this prompt's own deepest hash.
    pub draw_key: u64,
}

/// When a worker is too busy to be chosen for affinity: it has more requests in flight than
/// `percent` % of its pool's mean plus `excess` (bounded-load hashing: no worker takes far
/// more than its share for the sake of a prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy {
    pub excess: u64,
    pub percent: u64,
    /// With the engines' figures: a share of the prompts growing with the engines' load over
    /// the bound goes past the worker, each conversation by its own draw, rather than every
    /// prompt once this replica's count is over it.
    pub graded: bool,
}

impl Busy {
    /// The load of `worker` this bound reads: graded, the engines' figures in thousandths
    /// ([`Loads::reported_milli`]); else the requests in flight.
    fn load_of(&self, loads: &dyn Loads, worker: &Worker) -> u64 {
        if self.graded {
            loads.reported_milli(worker)
        } else {
            loads.outstanding(worker)
        }
    }

    /// [`Busy::load_of`] summed over `workers`.
    fn total_of<'w>(&self, loads: &dyn Loads, workers: impl Iterator<Item = &'w Worker>) -> u64 {
        workers
            .map(|w| self.load_of(loads, w))
            .fold(0, u64::saturating_add)
    }

    /// Whether `worker`, with `load` ([`Busy::load_of`]) in a pool of `workers` with `total`,
    /// is busy for a prompt that draws by `draw_key`: its prompt is among the share that goes
    /// past the worker, this gateway sent it more than its bound since the scrape (a burst
    /// must not pile onto it until the next), or it is full by its engine's own figures.
    fn worker_is_busy(
        &self,
        worker: &Worker,
        loads: &dyn Loads,
        (load, total, workers): (u64, u64, usize),
        draw_key: u64,
    ) -> bool {
        let over = if self.graded {
            let milli = self.in_thousandths();
            let share = milli.spill_share(load, total, workers);
            let burst = loads.sent_since(worker).saturating_mul(1000);
            milli.is_busy(burst, total, workers)
                || (share > 0 && spill_draw(draw_key, worker) < share)
        } else {
            self.is_busy(load, total, workers)
        };
        over || loads.full(worker)
    }

    /// The same bound over loads counted in thousandths of a request.
    fn in_thousandths(&self) -> Busy {
        Busy {
            excess: self.excess.saturating_mul(1000),
            ..*self
        }
    }

    /// The share of the prompts placed on a worker with `load` requests in flight that go
    /// past it, in parts of 2^32: none up to its bound, then growing with the load over the
    /// bound until all of them at one and a half times the bound.
    pub fn spill_share(&self, load: u64, total: u64, workers: usize) -> u64 {
        let (scaled_load, bound) = self.scaled(load, total, workers);
        if scaled_load <= bound {
            return 0;
        }
        // Both scaled down to at most 96 bits, so that the excess in parts of 2^32 fits.
        let shift = (u128::BITS - bound.leading_zeros()).saturating_sub(96);
        let ramp = ((bound / 2) >> shift).max(1);
        let over = ((scaled_load - bound) >> shift).min(ramp);
        u64::try_from((over << 32) / ramp).unwrap_or(u64::MAX)
    }

    /// Whether a worker with `load` requests in flight is busy, in a pool of `workers` with
    /// `total` in flight. With `percent` at least 100, the least loaded worker never is.
    pub fn is_busy(&self, load: u64, total: u64, workers: usize) -> bool {
        let (scaled_load, bound) = self.scaled(load, total, workers);
        scaled_load > bound
    }

    /// A worker's load and its bound (`percent` % of the pool's mean plus `excess`), both
    /// multiplied by 100 × `workers` so that neither is divided.
    fn scaled(&self, load: u64, total: u64, workers: usize) -> (u128, u128) {
        let workers = workers.max(1) as u128;
        let scaled_load = u128::from(load) * 100 * workers;
        let of_mean = u128::from(self.percent).saturating_mul(u128::from(total));
        let slack = u128::from(self.excess) * 100 * workers;
        (scaled_load, of_mean.saturating_add(slack))
    }
}

/// How the first worker of an unpinned hop was chosen (counted in the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// By load alone: no session and no prompt long enough to place by.
    Load,
    Session,
    /// The worker that served the conversation's last turn.
    Remembered,
    /// The first worker the prompt's beginning hashes to.
    Affinity,
    /// A worker further down the prompt's hashes: those before it were busy.
    Spilled,
    /// The endpoint picker's choice (picker mode, `docs/semantics.md` §9).
    Picker,
}

/// A pool in order of preference, and how its first worker was chosen.
pub struct Ranked<'w> {
    pub order: Vec<&'w Worker>,
    pub placement: Placement,
}

/// How a request's unpinned hops are placed (`docs/semantics.md` §5): a session beats prefix
/// affinity, and prefix affinity (a completion's prompt, `affinity`) beats load alone. Pins
/// beat all three: the resolver takes a pinned worker before any choice is made.
pub fn unpinned_choice<'a>(
    session: Option<&'a [u8]>,
    affinity: Option<Affinity<'a>>,
    rotation: u64,
    outstanding: &'a dyn Loads,
) -> Choice<'a> {
    match (session, affinity) {
        (Some(key), _) => Choice::Session(key),
        (None, Some(affinity)) => Choice::Prefix(affinity),
        (None, None) => Choice::LeastLoaded {
            rotation,
            outstanding,
        },
    }
}

/// Orders `pool` by preference for this request: the first is tried, the rest are the
/// fallbacks for retries, in order.
pub fn rank_candidates<'w>(mut pool: Vec<&'w Worker>, choice: Choice<'_>) -> Ranked<'w> {
    let placement = match choice {
        Choice::Session(key) => {
            pool.sort_by_cached_key(|w| std::cmp::Reverse((session_weight(key, w), w.id)));
            Placement::Session
        }
        Choice::RoundRobin(rotation) => {
            rotate(&mut pool, rotation);
            Placement::Load
        }
        Choice::LeastLoaded {
            rotation,
            outstanding,
        } => {
            least_loaded(&mut pool, rotation, outstanding);
            Placement::Load
        }
        Choice::Prefix(affinity)
            if affinity.depths.is_empty() && affinity.remembered.is_empty() =>
        {
            least_loaded(&mut pool, affinity.rotation, affinity.outstanding);
            Placement::Load
        }
        Choice::Prefix(affinity) => by_affinity(&mut pool, &affinity),
    };
    Ranked {
        order: pool,
        placement,
    }
}

/// [`rank_candidates`] of `pool` without the workers in `excluded`, cut to its first `limit`:
/// the same order, for what grows with `limit` (round robin and load) or with one weight per
/// worker (sessions and prefix affinity): no copy or sort of the pool.
pub fn rank_pool<'w>(
    pool: Pool<'w>,
    excluded: &[WorkerId],
    limit: usize,
    choice: Choice<'_>,
) -> Ranked<'w> {
    let eligible = || pool.iter().filter(|w| !excluded.contains(&w.id));
    let (order, placement) = match choice {
        Choice::Session(key) => (
            top(eligible(), limit, |w| session_weight(key, w)),
            Placement::Session,
        ),
        Choice::RoundRobin(rotation) => (
            in_rotation(pool, excluded, rotation, limit),
            Placement::Load,
        ),
        Choice::LeastLoaded {
            rotation,
            outstanding,
        } => (
            least_loaded_of(pool, excluded, rotation, limit, outstanding),
            Placement::Load,
        ),
        Choice::Prefix(affinity)
            if affinity.depths.is_empty() && affinity.remembered.is_empty() =>
        {
            let (rotation, outstanding) = (affinity.rotation, affinity.outstanding);
            (
                least_loaded_of(pool, excluded, rotation, limit, outstanding),
                Placement::Load,
            )
        }
        Choice::Prefix(affinity) => {
            let remembered: Vec<&Worker> = affinity
                .remembered
                .iter()
                .filter_map(|id| pool.get(pool.position(*id)?))
                .filter(|w| !excluded.contains(&w.id))
                .collect();
            let total = if affinity.busy.graded {
                affinity.busy.total_of(affinity.outstanding, eligible())
            } else {
                affinity.outstanding.total(pool, excluded)
            };
            affinity_order(&eligible, &remembered, total, limit, &affinity)
        }
    };
    Ranked { order, placement }
}

/// The first `limit` of `workers` by descending `(weight, id)`.
fn top<'w>(
    workers: impl Iterator<Item = &'w Worker>,
    limit: usize,
    weight: impl Fn(&Worker) -> u64,
) -> Vec<&'w Worker> {
    let mut best: Vec<((u64, WorkerId), &'w Worker)> = Vec::with_capacity(limit.min(64) + 1);
    for worker in workers {
        let key = (weight(worker), worker.id);
        if best.len() == limit && best.last().is_none_or(|(last, _)| key <= *last) {
            continue;
        }
        let at = best.partition_point(|(better, _)| *better > key);
        best.insert(at, (key, worker));
        best.truncate(limit);
    }
    best.into_iter().map(|(_, worker)| worker).collect()
}

/// Round-robin order without `excluded`: by id from the `rotation`-th, the first `limit`.
fn in_rotation<'w>(
    pool: Pool<'w>,
    excluded: &[WorkerId],
    rotation: u64,
    limit: usize,
) -> Vec<&'w Worker> {
    let mut skipped: Vec<usize> = excluded
        .iter()
        .filter_map(|id| pool.position(*id))
        .collect();
    skipped.sort_unstable();
    skipped.dedup();
    let eligible = pool.len().saturating_sub(skipped.len());
    if eligible == 0 {
        return Vec::new();
    }
    let mut start = usize::try_from(rotation % eligible as u64).unwrap_or(0);
    for at in &skipped {
        if *at > start {
            break;
        }
        start += 1;
    }
    (0..pool.len())
        .map(|step| (start + step) % pool.len())
        .filter(|at| skipped.binary_search(at).is_err())
        .take(limit)
        .filter_map(|at| pool.get(at))
        .collect()
}

/// [`least_loaded`] order without `excluded`, the first `limit`.
fn least_loaded_of<'w>(
    pool: Pool<'w>,
    excluded: &[WorkerId],
    rotation: u64,
    limit: usize,
    loads: &dyn Loads,
) -> Vec<&'w Worker> {
    let mut order = in_rotation(pool, excluded, rotation, limit.max(2));
    if let [first, second, ..] = order.as_mut_slice()
        && loads.outstanding(second) < loads.outstanding(first)
    {
        std::mem::swap(first, second);
    }
    order.truncate(limit);
    order
}

/// [`by_affinity`]'s order of the workers `eligible` gives (`total`: their load by
/// [`Busy::total_of`]), the first `limit`: one weight per worker (two when the prompt has
/// several depths), and one more pass per depth only when that depth's worker is busy.
fn affinity_order<'w, I: Iterator<Item = &'w Worker>>(
    eligible: &dyn Fn() -> I,
    remembered: &[&'w Worker],
    total: u64,
    limit: usize,
    affinity: &Affinity<'_>,
) -> (Vec<&'w Worker>, Placement) {
    let outstanding = affinity.outstanding;
    let deepest = affinity.depths.last().copied().unwrap_or(0);
    let count = Cell::new(0usize);
    let weigh = |worker: &Worker| {
        count.set(count.get() + 1);
        prefix_weight(deepest, worker)
    };
    let order = top(eligible(), limit.max(1), weigh);
    let count = count.get();
    let over = |w: &Worker| {
        let busy = &affinity.busy;
        let load = busy.load_of(outstanding, w);
        busy.worker_is_busy(w, outstanding, (load, total, count), affinity.draw_key)
    };
    // A pool whose every worker is busy has none: moving would lose the prefix for nothing.
    let all_busy = OnceCell::new();
    let busy = |w: &Worker| over(w) && !*all_busy.get_or_init(|| eligible().all(&over));
    let remembered = remembered
        .iter()
        .copied()
        .filter(|w| !busy(w))
        .max_by_key(|w| (prefix_weight(deepest, w), w.id));
    let deepest_first = order.first().map(|w| (deepest, *w));
    let (chosen, placement) = match remembered {
        Some(worker) => (Some(worker), Placement::Remembered),
        None => walk_depths(eligible, affinity.depths, &busy, deepest_first),
    };
    let Some(chosen) = chosen else {
        return (order, placement);
    };
    let rest = order.into_iter().filter(|w| w.id != chosen.id);
    let mut ranked: Vec<&Worker> = std::iter::once(chosen).chain(rest).collect();
    ranked.truncate(limit);
    (ranked, placement)
}

/// [`walk`] without the pool's order at hand: each depth's first worker not yet found busy,
/// until one is not busy; else the first worker not busy in the deepest hash's order.
/// `deepest_first` is the deepest hash and its first worker, known already.
fn walk_depths<'w, I: Iterator<Item = &'w Worker>>(
    eligible: &dyn Fn() -> I,
    depths: &[u64],
    busy: &dyn Fn(&Worker) -> bool,
    deepest_first: Option<(u64, &'w Worker)>,
) -> (Option<&'w Worker>, Placement) {
    let deepest = deepest_first.map_or(0, |(hash, _)| hash);
    let mut passed: Vec<WorkerId> = Vec::new();
    for (depth, hash) in depths.iter().enumerate() {
        let top = match deepest_first {
            Some((known, first)) if known == *hash && passed.is_empty() => Some(first),
            _ => eligible()
                .filter(|w| !passed.contains(&w.id))
                .max_by_key(|w| (prefix_weight(*hash, w), w.id)),
        };
        let Some(worker) = top else { break };
        if !busy(worker) {
            let placement = if depth == 0 {
                Placement::Affinity
            } else {
                Placement::Spilled
            };
            return (Some(worker), placement);
        }
        passed.push(worker.id);
    }
    let by_deepest = |w: &&'w Worker| (prefix_weight(deepest, w), w.id);
    let first = eligible()
        .filter(|w| !busy(w))
        .max_by_key(by_deepest)
        .or_else(|| eligible().max_by_key(by_deepest));
    (first, Placement::Spilled)
}

fn least_loaded(pool: &mut [&Worker], rotation: u64, loads: &dyn Loads) {
    rotate(pool, rotation);
    if let [first, second, ..] = pool
        && loads.outstanding(second) < loads.outstanding(first)
    {
        std::mem::swap(first, second);
    }
}

/// Round-robin order: by id, starting at the `rotation`-th worker.
fn rotate(pool: &mut [&Worker], rotation: u64) {
    pool.sort_by_key(|w| w.id);
    if !pool.is_empty() {
        let start = usize::try_from(rotation % pool.len() as u64).unwrap_or(0);
        pool.rotate_left(start);
    }
}

/// The first choice: a remembered worker that is not busy; else, depth by depth from the
/// shallowest, the worker the depth's hash ranks first among those not yet found busy, until
/// one is not busy; else the first worker not busy in the deepest hash's order (the least
/// loaded one always qualifies). The rest follow in the deepest hash's order.
fn by_affinity(pool: &mut Vec<&Worker>, affinity: &Affinity<'_>) -> Placement {
    let (loads, rule) = (affinity.outstanding, &affinity.busy);
    let total = rule.total_of(loads, pool.iter().copied());
    let deepest = affinity.depths.last().copied().unwrap_or(0);
    let busy: Vec<WorkerId> = pool
        .iter()
        .filter(|w| {
            let pool_load = (rule.load_of(loads, w), total, pool.len());
            rule.worker_is_busy(w, loads, pool_load, affinity.draw_key)
        })
        .map(|w| w.id)
        .collect();
    let busy = if busy.len() == pool.len() {
        Vec::new()
    } else {
        busy
    };
    pool.sort_by_cached_key(|w| std::cmp::Reverse((prefix_weight(deepest, w), w.id)));
    let remembered = pool
        .iter()
        .position(|w| affinity.remembered.contains(&w.id) && !busy.contains(&w.id));
    let (chosen, placement) = match remembered {
        Some(at) => (at, Placement::Remembered),
        None => walk(pool, affinity.depths, &busy),
    };
    if chosen < pool.len() {
        let first = pool.remove(chosen);
        pool.insert(0, first);
    }
    placement
}

/// The index in `order` (the deepest hash's order) of the affinity walk's choice.
fn walk(order: &[&Worker], depths: &[u64], busy: &[WorkerId]) -> (usize, Placement) {
    let mut passed: Vec<WorkerId> = Vec::new();
    for (depth, hash) in depths.iter().enumerate() {
        let top = order
            .iter()
            .enumerate()
            .filter(|(_, w)| !passed.contains(&w.id))
            .max_by_key(|(_, w)| (prefix_weight(*hash, w), w.id));
        let Some((at, worker)) = top else { break };
        if !busy.contains(&worker.id) {
            let placement = if depth == 0 {
                Placement::Affinity
            } else {
                Placement::Spilled
            };
            return (at, placement);
        }
        passed.push(worker.id);
    }
    let at = order
        .iter()
        .position(|w| !busy.contains(&w.id))
        .unwrap_or(0);
    (at, Placement::Spilled)
}

/// A worker's weight for a session: a stable 64-bit hash of the key seeded by the worker id,
/// the same on every platform and every Envoy replica.
pub fn session_weight(key: &[u8], worker: &Worker) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(key, worker.id)
}

/// Where a prompt falls among a worker's prompts when some must go past it, in parts of
/// 2^32: the same on every replica, independent of [`prefix_weight`].
fn spill_draw(draw_key: u64, worker: &Worker) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(&draw_key.to_le_bytes(), !worker.id) >> 32
}

/// A worker's weight for one depth of a prompt's hashes, as stable as [`session_weight`].
pub fn prefix_weight(hash: u64, worker: &Worker) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(&hash.to_le_bytes(), worker.id)
}

#[cfg(test)]
#[path = "tests/select.rs"]
mod tests;

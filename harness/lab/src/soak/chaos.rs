//! Killing and restarting workers while the load runs, and the record of when each was
//! down (the workload judges requests by it).
//!
//! A kill is [`Stack::kill_worker`]: the sim worker's listener and every open connection
//! are closed at once, as when a worker process is SIGKILLed: requests in flight get no
//! answer (Envoy sees the upstream reset; an SSE stream stops mid-body), new connections are
//! refused, and the KV entries a prefill worker held are gone. The restart is a fresh worker
//! on the same address, so its registry entry stays valid.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use super::deployment::{DECODE_VICTIM, PREFILL_VICTIM};
use pinroute_harness::sim::SimConfig;
use pinroute_harness::stack::Stack;

/// How long after a kill a request can still meet a connection Envoy pooled to the dead
/// worker (seen once: a `GET /v1/models` sent as its worker was being killed got a reset).
pub const STALE_CONNECTION_GRACE: Duration = Duration::from_secs(2);
/// A killed worker stays down at least this long: longer than the passive-health period, so
/// that unpinned selection takes it back while it is still down (twice per outage), as when
/// a real worker takes minutes to restart.
pub const MIN_DOWNTIME: Duration = Duration::from_millis(2500);
/// A restarted worker runs at least this long before it is killed again: longer than the
/// passive-health period and the workload's margin, so that it is seen back in service.
pub const MIN_UPTIME: Duration = Duration::from_millis(2500);
const POLL: Duration = Duration::from_millis(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Kill,
    Restart,
}

/// One chaos action, due once this fraction of the run's requests has been sent (a restart
/// also waits for [`MIN_DOWNTIME`], a kill of a restarted worker for [`MIN_UPTIME`]). Each worker's steps run in order, the workers' timelines
/// independently of each other.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    pub at: f64,
    pub action: Action,
    pub worker: u64,
}

const fn step(at: f64, action: Action, worker: u64) -> Step {
    Step { at, action, worker }
}

/// `--quick`: each victim killed and restarted once.
pub const QUICK_SCHEDULE: [Step; 4] = [
    step(0.05, Action::Kill, PREFILL_VICTIM),
    step(0.15, Action::Kill, DECODE_VICTIM),
    step(0.55, Action::Restart, PREFILL_VICTIM),
    step(0.75, Action::Restart, DECODE_VICTIM),
];

/// The full run: each victim killed three times, once both together.
pub const FULL_SCHEDULE: [Step; 12] = [
    step(0.05, Action::Kill, PREFILL_VICTIM),
    step(0.12, Action::Kill, DECODE_VICTIM),
    step(0.20, Action::Restart, PREFILL_VICTIM),
    step(0.28, Action::Restart, DECODE_VICTIM),
    step(0.40, Action::Kill, PREFILL_VICTIM),
    step(0.40, Action::Kill, DECODE_VICTIM),
    step(0.55, Action::Restart, PREFILL_VICTIM),
    step(0.55, Action::Restart, DECODE_VICTIM),
    step(0.65, Action::Kill, DECODE_VICTIM),
    step(0.75, Action::Kill, PREFILL_VICTIM),
    step(0.80, Action::Restart, DECODE_VICTIM),
    step(0.90, Action::Restart, PREFILL_VICTIM),
];

/// How far the load is: requests sent so far, and whether it ended.
#[derive(Debug, Default)]
pub struct Progress {
    sent: AtomicU64,
    done: AtomicBool,
}

impl Progress {
    pub fn request_sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    pub fn finish(&self) {
        self.done.store(true, Ordering::Relaxed);
    }

    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Relaxed)
    }
}

/// One period a worker was down.
#[derive(Debug, Clone, Copy)]
struct Outage {
    worker: u64,
    /// From just before the kill (recorded before the kill starts, so that no request can
    /// see the kill before the workload knows of it) to when its port was free.
    kill_began: Instant,
    kill_ended: Option<Instant>,
    restarted: Option<Instant>,
}

/// When each worker was killed and restarted.
#[derive(Debug, Default)]
pub struct Outages {
    outages: Mutex<Vec<Outage>>,
}

impl Outages {
    /// `worker` is about to be killed.
    pub fn kill_begins(&self, worker: u64, at: Instant) {
        self.lock().push(Outage {
            worker,
            kill_began: at,
            kill_ended: None,
            restarted: None,
        });
    }

    /// The kill of `worker` is over: its port is free.
    pub fn kill_ended(&self, worker: u64, at: Instant) {
        self.stamp_latest(worker, at, |o| &mut o.kill_ended);
    }

    pub fn restarted(&self, worker: u64, at: Instant) {
        self.stamp_latest(worker, at, |o| &mut o.restarted);
    }

    /// Sets `field` to `at` in the latest outage of `worker` where it is still unset.
    fn stamp_latest(
        &self,
        worker: u64,
        at: Instant,
        field: fn(&mut Outage) -> &mut Option<Instant>,
    ) {
        let mut outages = self.lock();
        let open = outages
            .iter_mut()
            .rev()
            .filter(|o| o.worker == worker)
            .map(field)
            .find(|slot| slot.is_none());
        if let Some(slot) = open {
            *slot = Some(at);
        }
    }

    /// Whether `worker` was killed while a request open from `from` to `to` ran, or just
    /// before it began: a connection Envoy pooled to the worker before the kill can still be
    /// tried for [`STALE_CONNECTION_GRACE`] after it, and its request fails as if cut.
    pub fn killed_during(&self, worker: u64, from: Instant, to: Instant) -> bool {
        self.lock().iter().any(|o| {
            o.worker == worker
                && o.kill_began <= to
                && o.kill_ended
                    .is_none_or(|end| end + STALE_CONNECTION_GRACE >= from)
        })
    }

    /// Whether `worker` was down, or within `aftermath` of its restart (the passive-health
    /// period a failure observed just before the restart still keeps it out), at any time
    /// from `from` to `to`.
    pub fn disturbed_during(
        &self,
        worker: u64,
        from: Instant,
        to: Instant,
        aftermath: Duration,
    ) -> bool {
        self.lock().iter().any(|o| {
            let back = o.restarted.map(|at| at + aftermath);
            o.worker == worker && o.kill_began <= to && back.is_none_or(|back| back >= from)
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Outage>> {
        self.outages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What the chaos did, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct ChaosRecord {
    pub action: Action,
    pub worker: u64,
    /// Seconds since the load started.
    pub at_seconds: f64,
    /// Requests sent when it happened.
    pub after_requests: u64,
    /// Whether the load was still running.
    pub during_load: bool,
}

/// Runs `steps` against `stack` as the load progresses towards `total` requests (records
/// times since `started`). Once the load has ended, kills still due are dropped (with the
/// restarts that follow them) and restarts still due happen.
pub async fn run_chaos(
    stack: &mut Stack,
    steps: &[Step],
    total: u64,
    progress: &Progress,
    outages: &Outages,
    started: Instant,
) -> Result<Vec<ChaosRecord>> {
    let mut chaos = Chaos {
        stack,
        outages,
        killed: HashMap::new(),
        restarted: HashMap::new(),
        records: Vec::new(),
        started,
    };
    let mut pending: Vec<Step> = steps.to_vec();
    while !pending.is_empty() {
        let load_done = progress.is_done();
        if load_done {
            drop_kills(&mut pending, &chaos.killed);
        }
        let reached = |step: &Step| load_done || progress.sent() as f64 >= step.at * total as f64;
        if let Some(index) = chaos.next_due(&pending, reached) {
            let step = pending.remove(index);
            chaos.run(step, progress.sent(), !load_done).await?;
        } else {
            tokio::time::sleep(POLL).await;
        }
    }
    Ok(chaos.records)
}

type Killed = HashMap<u64, (SimConfig, SocketAddr, Instant)>;

/// After the load: no more kills, and no restart of a worker that is running.
fn drop_kills(pending: &mut Vec<Step>, killed: &Killed) {
    pending.retain(|step| step.action == Action::Restart && killed.contains_key(&step.worker));
    let mut restarting = Vec::new();
    pending.retain(|step| {
        let first = !restarting.contains(&step.worker);
        restarting.push(step.worker);
        first
    });
}

struct Chaos<'a> {
    stack: &'a mut Stack,
    outages: &'a Outages,
    killed: Killed,
    /// When each worker was last restarted.
    restarted: HashMap<u64, Instant>,
    records: Vec<ChaosRecord>,
    started: Instant,
}

impl Chaos<'_> {
    /// The first step, in each worker's order, that may run now.
    fn next_due(&self, pending: &[Step], reached: impl Fn(&Step) -> bool) -> Option<usize> {
        let mut seen = Vec::new();
        for (index, step) in pending.iter().enumerate() {
            if seen.contains(&step.worker) {
                continue;
            }
            seen.push(step.worker);
            if reached(step) && self.ready(step) {
                return Some(index);
            }
        }
        None
    }

    /// A restart waits for [`MIN_DOWNTIME`] since the kill, a kill for [`MIN_UPTIME`] since
    /// the last restart.
    fn ready(&self, step: &Step) -> bool {
        match step.action {
            Action::Kill => self
                .restarted
                .get(&step.worker)
                .is_none_or(|at| at.elapsed() >= MIN_UPTIME),
            Action::Restart => self
                .killed
                .get(&step.worker)
                .is_some_and(|(_, _, at)| at.elapsed() >= MIN_DOWNTIME),
        }
    }

    async fn run(&mut self, step: Step, sent: u64, during_load: bool) -> Result<()> {
        match step.action {
            Action::Kill => kill(self.stack, step.worker, self.outages, &mut self.killed).await?,
            Action::Restart => {
                restart(self.stack, step.worker, self.outages, &mut self.killed).await?;
                self.restarted.insert(step.worker, Instant::now());
            }
        }
        log::info!(
            "chaos: {:?} worker {} after {sent} requests",
            step.action,
            step.worker
        );
        self.records.push(ChaosRecord {
            action: step.action,
            worker: step.worker,
            at_seconds: self.started.elapsed().as_secs_f64(),
            after_requests: sent,
            during_load,
        });
        Ok(())
    }
}

async fn kill(
    stack: &mut Stack,
    worker: u64,
    outages: &Outages,
    killed: &mut Killed,
) -> Result<()> {
    outages.kill_begins(worker, Instant::now());
    let (config, addr) = stack
        .kill_worker(worker)
        .await
        .context("chaos: killing a worker")?;
    let ended = Instant::now();
    outages.kill_ended(worker, ended);
    killed.insert(worker, (config, addr, ended));
    Ok(())
}

async fn restart(
    stack: &mut Stack,
    worker: u64,
    outages: &Outages,
    killed: &mut Killed,
) -> Result<()> {
    let Some((config, addr, down_since)) = killed.remove(&worker) else {
        anyhow::bail!("chaos schedule: worker {worker} is restarted but was not killed");
    };
    let downtime = down_since.elapsed();
    if downtime < MIN_DOWNTIME {
        tokio::time::sleep(MIN_DOWNTIME - downtime).await;
    }
    stack
        .restart_worker(config, addr)
        .await
        .context("chaos: restarting a worker")?;
    outages.restarted(worker, Instant::now());
    Ok(())
}

//! State every Envoy worker thread sees alike, in proxy-wasm shared data (one map per VM id).

use std::cell::{Cell, RefCell};
use std::time::Duration;

use super::host::{Host, HostError, SharedValue};

use crate::policy::engine_load::{EngineReport, EngineTable};
use crate::policy::health::{Ejection, HealthTable, Recorded};
use crate::policy::inflight::{self, InFlightTable};
use crate::policy::load::LoadTable;
use crate::policy::registry::WorkerId;
use crate::policy::turns::Turn;

/// Versioned with `HealthTable`'s encoding: a filter reloaded in a running Envoy never reads
/// a table an older one wrote.
const HEALTH_KEY: &str = "pinroute.health.v3";
/// Compare-and-swap attempts before a health update is given up (and logged).
const CAS_ATTEMPTS: usize = 16;

thread_local! {
    /// The health table as this VM (one per Envoy thread) last read or wrote it: a success
    /// clears a worker's failure count only when this shows one, so that a success costs no
    /// shared-data write (the table is read anyway at every resolution).
    static SEEN: RefCell<HealthTable> = RefCell::new(HealthTable::default());
}

/// Creates the shared entries if absent, so that every later update is a compare-and-swap.
pub fn initialize(host: &impl Host) {
    for key in [HEALTH_KEY, LOAD_KEY, IN_FLIGHT_KEY] {
        if let Ok((None, None)) = host.shared_data(key) {
            let _ = host.set_shared_data(key, &[], None);
        }
    }
}

pub fn health(host: &impl Host) -> HealthTable {
    let table = match host.shared_data(HEALTH_KEY) {
        Ok((Some(bytes), _)) => HealthTable::decode(&bytes),
        _ => HealthTable::default(),
    };
    SEEN.with(|seen| seen.replace(table.clone()));
    table
}

/// Counts a failed connection to `worker` for every thread; the last of
/// `rule.after_failures` in a row takes it out of unpinned selection. Returns whether this
/// one did.
pub fn record_connect_failure(host: &impl Host, worker: WorkerId, rule: Ejection) -> bool {
    let now = host.now_nanos();
    let recorded = update_health(host, worker, |table| {
        table.record_failure(worker, rule, now)
    });
    match recorded {
        Some(Recorded::TakenOut { until }) => {
            let seconds = until.saturating_sub(now) as f64 / 1e9;
            log::info!("pinroute: worker {worker} out of unpinned selection for {seconds:.1} s");
            true
        }
        Some(Recorded::Counted(failures)) => {
            log::debug!("pinroute: worker {worker}: {failures} connection failures in a row");
            false
        }
        Some(Recorded::StillOut { .. }) | None => false,
    }
}

/// A hop to `worker` got its answer: its connection failures no longer count. Writes only
/// when this thread's last view of the table shows some.
pub fn record_success(host: &impl Host, worker: WorkerId, rule: Ejection) {
    if SEEN.with(|seen| seen.borrow().failures(worker)) > 0 {
        let now = host.now_nanos();
        update_health(host, worker, |table| {
            table.record_success(worker, rule.period, now)
        });
    }
}

/// Applies `change` to the shared table by compare-and-swap; `None` when it could not.
fn update_health<R>(
    host: &impl Host,
    worker: WorkerId,
    change: impl Fn(&mut HealthTable) -> R,
) -> Option<R> {
    let updated = rewrite(host, HEALTH_KEY, |bytes| {
        let mut table = bytes.map(HealthTable::decode).unwrap_or_default();
        let result = change(&mut table);
        Ok((table.encode(), (result, table)))
    });
    match updated {
        Ok((result, table)) => {
            SEEN.with(|seen| seen.replace(table));
            Some(result)
        }
        Err(HostError::CasMismatch) => {
            log::warn!(
                "pinroute: health of worker {worker} not recorded: shared data kept changing"
            );
            None
        }
        Err(status) => {
            log::error!("pinroute: cannot record the health of worker {worker}: {status:?}");
            None
        }
    }
}

/// Rewrites `key` by compare-and-swap: `change` gets its value and returns the new one with
/// a result, or `Err(result)` to leave it as it is. `CasMismatch` when it kept changing.
fn rewrite<R>(
    host: &impl Host,
    key: &str,
    change: impl Fn(Option<&[u8]>) -> Result<(Vec<u8>, R), R>,
) -> Result<R, HostError> {
    rewrite_from(host, key, None, change)
}

/// [`rewrite`], trying first `seen` (the value and compare-and-swap token of a recent read)
/// in place of reading the key again.
fn rewrite_from<R>(
    host: &impl Host,
    key: &str,
    mut seen: Option<SharedValue>,
    change: impl Fn(Option<&[u8]>) -> Result<(Vec<u8>, R), R>,
) -> Result<R, HostError> {
    for _ in 0..CAS_ATTEMPTS {
        let read = seen.take().map_or_else(|| host.shared_data(key), Ok);
        let (bytes, cas) = read.unwrap_or((None, None));
        let (value, result) = match change(bytes.as_deref()) {
            Ok(changed) => changed,
            Err(unchanged) => return Ok(unchanged),
        };
        match host.set_shared_data(key, &value, cas.or(Some(0))) {
            Ok(()) => return Ok(result),
            Err(HostError::CasMismatch) => continue,
            Err(status) => return Err(status),
        }
    }
    Err(HostError::CasMismatch)
}

/// Claims the periodic work whose next turn `lease_key` holds (u64 LE nanoseconds) when it
/// is due, moving the turn to the next multiple of `period` on the host's clock: true when
/// this thread should do it. The thread whose compare-and-swap moves it does the work, so
/// one thread at a time does; and replicas whose clocks agree do it at the same moments.
pub fn claim_period(host: &impl Host, lease_key: &str, period: Duration) -> bool {
    let now = host.now_nanos();
    let Ok((bytes, cas)) = host.shared_data(lease_key) else {
        return false;
    };
    let due = bytes
        .as_deref()
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes);
    if now < due {
        return false;
    }
    let period = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX).max(1);
    let next = (now / period).saturating_add(1).saturating_mul(period);
    host.set_shared_data(lease_key, &next.to_le_bytes(), cas.or(Some(0)))
        .is_ok()
}

/// Versioned with `LoadTable`'s encoding, like the health table.
const LOAD_KEY: &str = "pinroute.load.v2";

thread_local! {
    /// The load table as this VM last read it, with its compare-and-swap token: the next
    /// change tries that first, so that a read for choosing workers and the count of the
    /// chosen one cost one read and one write.
    static LOAD_SEEN: RefCell<Option<SharedValue>> = const { RefCell::new(None) };
}

/// Requests in flight to every worker, counted by every thread.
pub fn loads(host: &impl Host) -> LoadTable {
    match host.shared_data(LOAD_KEY) {
        Ok((bytes, Some(cas))) => {
            let table = bytes.as_deref().map(LoadTable::decode).unwrap_or_default();
            LOAD_SEEN.with(|seen| seen.replace(Some((bytes, Some(cas)))));
            table
        }
        _ => LoadTable::default(),
    }
}

/// Applies `changes` (+1 when a hop starts, -1 when it ends, per worker) to the counts in
/// one write.
pub fn add_outstanding(host: &impl Host, changes: &[(WorkerId, i64)]) {
    let seen = LOAD_SEEN.with(|seen| seen.take());
    let counted = rewrite_from(host, LOAD_KEY, seen, |bytes| {
        let mut table = bytes.map(LoadTable::decode).unwrap_or_default();
        for (worker, delta) in changes {
            table.add(*worker, *delta);
        }
        Ok((table.encode(), ()))
    });
    match counted {
        Ok(()) => {}
        Err(HostError::CasMismatch) => {
            log::warn!("pinroute: requests in flight not counted: shared data kept changing");
        }
        Err(status) => log::error!("pinroute: cannot count requests in flight: {status:?}"),
    }
}

/// The turn memory (`docs/semantics.md` §5): one key per slot, the newest turn winning.
const TURN_PREFIX: &str = "pinroute.turn.";

/// The turn remembered in `slot`, if any.
pub fn turn(host: &impl Host, slot: u64) -> Option<Turn> {
    match host.shared_data(&format!("{TURN_PREFIX}{slot}")) {
        Ok((Some(bytes), _)) => Turn::decode(&bytes),
        _ => None,
    }
}

/// Remembers `turn` in its slot, over whatever was there.
pub fn remember_turn(host: &impl Host, turn: &Turn) {
    let key = format!("{TURN_PREFIX}{}", Turn::slot(turn.key));
    if let Err(status) = host.set_shared_data(&key, &turn.encode(), None) {
        log::warn!("pinroute: cannot remember a turn: {status:?}");
    }
}

/// The in-flight limit's table (`docs/semantics.md` §1): every VM's requests in flight.
const IN_FLIGHT_KEY: &str = "pinroute.inflight.v1";

/// This VM's requests in flight and its name in the shared table (0 until it joined).
#[derive(Debug, Default)]
pub struct Slots {
    vm: Cell<u64>,
    held: Cell<u64>,
}

impl Slots {
    /// Names this VM in the shared table; until then (or if that fails) it publishes nothing
    /// and admits every request.
    pub fn join(&self, host: &impl Host) {
        let now = host.now_nanos();
        match rewrite(host, IN_FLIGHT_KEY, |bytes| {
            let mut table = bytes.map(InFlightTable::decode).unwrap_or_default();
            let vm = table.join(now);
            Ok((table.encode(), vm))
        }) {
            Ok(vm) => self.vm.set(vm),
            Err(status) => log::error!("pinroute: cannot join the in-flight table: {status:?}"),
        }
    }

    /// Takes a slot for a new request if all VMs together hold fewer than `limit`; false when
    /// they do not. A table that keeps changing admits the request: it is counted here, and
    /// published with the next change.
    pub fn take(&self, host: &impl Host, limit: u64) -> bool {
        let (vm, own, now) = (self.vm.get(), self.held.get(), host.now_nanos());
        if vm == 0 {
            self.held.set(own + 1);
            return true;
        }
        let taken = rewrite(host, IN_FLIGHT_KEY, |bytes| {
            let mut table = bytes.map(InFlightTable::decode).unwrap_or_default();
            if !inflight::admits(limit, table.others(vm, now), own) {
                return Err(false);
            }
            table.publish(vm, own + 1, now);
            Ok((table.encode(), true))
        });
        if let Err(status) = taken {
            log::warn!("pinroute: in-flight count not published: {status:?}");
        }
        let admitted = taken.unwrap_or(true);
        if admitted {
            self.held.set(own + 1);
        }
        admitted
    }

    /// Gives back a slot `take` gave.
    pub fn release(&self, host: &impl Host) {
        self.held.set(self.held.get().saturating_sub(1));
        self.publish(host);
    }

    /// Publishes this VM's count, which also says it is alive (every tick).
    pub fn publish(&self, host: &impl Host) {
        let (vm, held, now) = (self.vm.get(), self.held.get(), host.now_nanos());
        if vm == 0 {
            return;
        }
        let published = rewrite(host, IN_FLIGHT_KEY, |bytes| {
            let mut table = bytes.map(InFlightTable::decode).unwrap_or_default();
            table.publish(vm, held, now);
            Ok((table.encode(), ()))
        });
        if let Err(status) = published {
            log::warn!("pinroute: in-flight count not published: {status:?}");
        }
    }
}

/// The engines' load (`docs/semantics.md` §5), versioned with `EngineTable`'s encoding.
const ENGINE_KEY: &str = "pinroute.engine.v1";

/// The engines' last reports, if the table changed since `known_version`, with its version.
pub fn engine_table(host: &impl Host, known_version: Option<u32>) -> Option<(EngineTable, u32)> {
    let (bytes, version) = host.shared_data(ENGINE_KEY).ok()?;
    let version = version?;
    if Some(version) == known_version {
        return None;
    }
    let table = bytes
        .as_deref()
        .map(EngineTable::decode)
        .unwrap_or_default();
    Some((table, version))
}

/// Takes a scrape round's reports into the shared table, over older ones (averaged with
/// them unless `stale_nanos` older), forgetting the workers `listed` no longer names.
pub fn merge_engine_reports(
    host: &impl Host,
    reports: Vec<EngineReport>,
    listed: impl Fn(WorkerId) -> bool,
    stale_nanos: u64,
) -> Result<(), HostError> {
    rewrite(host, ENGINE_KEY, |bytes| {
        let mut table = bytes.map(EngineTable::decode).unwrap_or_default();
        table.merge(reports.clone(), &listed, stale_nanos);
        Ok((table.encode(), ()))
    })
}

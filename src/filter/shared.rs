//! State every Envoy worker thread sees alike, in proxy-wasm shared data (one map per VM id).

use std::time::Duration;

use proxy_wasm::types::Status;

use super::host::Host;

use crate::policy::health::HealthTable;
use crate::policy::registry::WorkerId;

/// Versioned with `HealthTable`'s encoding: a filter reloaded in a running Envoy never reads
/// a table an older one wrote.
const HEALTH_KEY: &str = "pinroute.health.v2";
/// Compare-and-swap attempts before a health update is given up (and logged).
const CAS_ATTEMPTS: usize = 16;

/// Creates the shared entries if absent, so that every later update is a compare-and-swap.
pub fn initialize(host: &impl Host) {
    if let Ok((None, _)) = host.shared_data(HEALTH_KEY) {
        let _ = host.set_shared_data(HEALTH_KEY, &[], None);
    }
}

pub fn health(host: &impl Host) -> HealthTable {
    match host.shared_data(HEALTH_KEY) {
        Ok((Some(bytes), _)) => HealthTable::decode(&bytes),
        _ => HealthTable::default(),
    }
}

/// Takes `worker` out of unpinned selection for `period` (longer after repeated outages),
/// for every thread.
pub fn mark_unhealthy(host: &impl Host, worker: WorkerId, period: Duration) {
    let now = host.now_nanos();
    let period = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX);
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = host.shared_data(HEALTH_KEY).unwrap_or((None, None));
        let mut table = bytes.map(|b| HealthTable::decode(&b)).unwrap_or_default();
        let already_out = table.unhealthy_until(worker, now).is_some();
        let until = table.mark(worker, period, now);
        match host.set_shared_data(HEALTH_KEY, &table.encode(), cas) {
            Ok(()) => {
                if !already_out {
                    let seconds = until.saturating_sub(now) as f64 / 1e9;
                    log::info!(
                        "pinroute: worker {worker} out of unpinned selection for {seconds:.1} s"
                    );
                }
                return;
            }
            Err(Status::CasMismatch) => continue,
            Err(status) => {
                log::error!("pinroute: cannot record worker {worker} as unhealthy: {status:?}");
                return;
            }
        }
    }
    log::warn!("pinroute: worker {worker} not recorded as unhealthy: shared data kept changing");
}

const LOAD_PREFIX: &str = "pinroute.load.";

/// Requests in flight to `worker`, counted by every thread.
pub fn outstanding(host: &impl Host, worker: WorkerId) -> u64 {
    match host.shared_data(&format!("{LOAD_PREFIX}{worker}")) {
        Ok((Some(bytes), _)) => decode_count(&bytes),
        _ => 0,
    }
}

/// Adds `delta` (+1 when a hop starts, -1 when it ends) to `worker`'s outstanding count.
pub fn add_outstanding(host: &impl Host, worker: WorkerId, delta: i64) {
    let key = format!("{LOAD_PREFIX}{worker}");
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = host.shared_data(&key).unwrap_or((None, None));
        let count = bytes
            .map_or(0, |b| decode_count(&b))
            .saturating_add_signed(delta);
        match host.set_shared_data(&key, &count.to_le_bytes(), cas.or(Some(0))) {
            Ok(()) => return,
            Err(Status::CasMismatch) => continue,
            Err(status) => {
                log::error!("pinroute: cannot count requests to worker {worker}: {status:?}");
                return;
            }
        }
    }
}

fn decode_count(bytes: &[u8]) -> u64 {
    bytes.try_into().map_or(0, u64::from_le_bytes)
}

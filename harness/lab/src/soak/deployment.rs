//! The soak's deployment: which sim workers run, which ones the chaos kills, and the
//! filter settings that differ from the defaults.

use std::path::PathBuf;
use std::time::Duration;

use pinroute::policy::health::MAX_OUTAGE_PERIODS;
use serde_json::json;

use super::mix::MAX_BODY_BYTES;
use pinroute_harness::sim::{SimConfig, SimRole};
use pinroute_harness::stack::StackSpec;

/// Prefill workers: `(id, dp_size)`.
pub const PREFILL_WORKERS: [(u64, u32); 2] = [(101, 1), (102, 2)];
/// Decode workers: `(id, dp_size)`.
pub const DECODE_WORKERS: [(u64, u32); 3] = [(201, 1), (202, 2), (203, 1)];
/// A prefill worker in the registry whose every answer is hostile (`Fault::Hostile`: over
/// the bounds, truncated, compressed): unpinned requests must go on without it, pins to it
/// fail typed, and it must stay in service.
pub const HOSTILE_PREFILL: u64 = 103;
/// The prefill worker the chaos kills and restarts.
pub const PREFILL_VICTIM: u64 = 102;
/// The decode worker the chaos kills and restarts.
pub const DECODE_VICTIM: u64 = 202;
/// How often the gateway reads the engines' load (`engine_load`, `docs/semantics.md` §5):
/// often, so that scrapes of killed workers fail and the hostile worker's garbage metrics
/// page is read many times in a run.
pub const ENGINE_LOAD_PERIOD_MS: u64 = 200;
/// Passive health period: short, so that a restarted worker is back in service (and pins to
/// it succeed again) well within the run.
pub const UNHEALTHY_PERIOD: Duration = Duration::from_millis(1000);
/// The longest a worker can stay out of service after its last failure: the period, doubled
/// for each repeated outage.
pub const LONGEST_OUTAGE: Duration =
    Duration::from_secs(UNHEALTHY_PERIOD.as_secs() * MAX_OUTAGE_PERIODS);

/// What every sim worker costs per generated token.
#[derive(Debug, Clone, Copy)]
pub struct WorkerTiming {
    pub token_latency: Duration,
}

/// The stack: every worker of [`PREFILL_WORKERS`] and [`DECODE_WORKERS`], and
/// [`HOSTILE_PREFILL`] (its faults are set once it runs); no draining one; the engines'
/// load read every [`ENGINE_LOAD_PERIOD_MS`].
pub fn stack_spec(wasm: PathBuf, timing: WorkerTiming) -> StackSpec {
    let prefill = PREFILL_WORKERS
        .iter()
        .chain(&[(HOSTILE_PREFILL, 1)])
        .map(|(id, dp)| (*id, SimRole::Prefill, *dp));
    let decode = DECODE_WORKERS
        .iter()
        .map(|(id, dp)| (*id, SimRole::Decode, *dp));
    let workers = prefill
        .chain(decode)
        .map(|(id, role, dp)| {
            SimConfig::new(id, role)
                .with_dp_size(dp)
                .with_token_latency(timing.token_latency)
        })
        .collect();
    let mut spec = StackSpec::new(workers, wasm);
    let period_ms = u64::try_from(UNHEALTHY_PERIOD.as_millis()).unwrap_or(u64::MAX);
    spec.settings = json!({
        "unhealthy_period_ms": period_ms,
        "max_body_bytes": MAX_BODY_BYTES,
        "engine_load": {"period_ms": ENGINE_LOAD_PERIOD_MS},
    });
    spec
}

/// The data-parallel size of a registry worker, `None` for an unknown id.
pub fn dp_size(id: u64) -> Option<u32> {
    PREFILL_WORKERS
        .iter()
        .chain(DECODE_WORKERS.iter())
        .find(|(known, _)| *known == id)
        .map(|(_, dp)| *dp)
}

pub fn is_decode_worker(id: u64) -> bool {
    DECODE_WORKERS.iter().any(|(known, _)| *known == id)
}

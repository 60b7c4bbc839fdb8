//! The module's own time, told apart from Envoy's. With `PINROUTE_OWN_TIME=1` in Envoy's
//! environment, the time of every hook is counted as the module's and the time inside every
//! callback it makes into Envoy as Envoy's, in the counters [`MODULE_NS`] and [`ENVOY_NS`];
//! divided by `pinroute.requests`, they are the module's own cost per request and Envoy's work
//! inside its calls (what `perf` attributes to either, without `perf`). A hook that Envoy runs
//! inside a callback (a local reply runs the stream's response hooks) is the module's again:
//! each side is entered with a [`Timed`] and the one before restored when it drops. Every
//! switch reads the monotonic clock once; off, it is one relaxed load.

// Natively tested; only the dynamic module counts.
#![cfg_attr(not(feature = "dynamic-module"), allow(dead_code))]

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// The environment variable that turns the counting on (`1`).
pub const ENV: &str = "PINROUTE_OWN_TIME";
/// Nanoseconds in the module's own code.
pub const MODULE_NS: &str = "pinroute.module.own_ns";
/// Nanoseconds inside the callbacks the module made into Envoy.
pub const ENVOY_NS: &str = "pinroute.module.envoy_ns";
/// Each request's own nanoseconds, recorded when its stream is destroyed: its median is
/// the typical request's, which a thread preempted inside a hook now and then (the counters'
/// mean counts that wait) does not move.
pub const REQUEST_NS: &str = "pinroute.module.request_own_ns";
/// Readings of the clock: the counting's own cost (each about one vDSO `clock_gettime`),
/// shared between the two counts.
pub const CLOCK_READS: &str = "pinroute.module.clock_reads";
/// A thread adds what it counted to the counters once it has this much (about one request's).
const FLUSH_NS: u64 = 20_000;

static ON: AtomicBool = AtomicBool::new(false);

/// Turns the counting on if Envoy's environment asks for it (at program start).
pub fn start_if_asked() {
    if std::env::var_os(ENV).is_some_and(|value| value == "1") {
        ON.store(true, Ordering::Relaxed);
        log::info!("pinroute: counting the module's own time ({ENV}=1)");
    }
}

pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Whose the time on a thread is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Envoy's, outside any hook: not counted.
    Outside,
    Module,
    /// Envoy's, inside a callback the module made.
    Envoy,
}

/// Time counted on a thread and not yet added to the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counted {
    pub module_ns: u64,
    pub envoy_ns: u64,
    pub clock_reads: u64,
}

#[derive(Clone, Copy)]
struct Clock {
    side: Side,
    since: Option<Instant>,
    counted: Counted,
    /// Every nanosecond counted to the module on this thread, never taken.
    module_total_ns: u64,
}

thread_local! {
    static CLOCK: Cell<Clock> = const {
        Cell::new(Clock {
            side: Side::Outside,
            since: None,
            counted: Counted { module_ns: 0, envoy_ns: 0, clock_reads: 0 },
            module_total_ns: 0,
        })
    };
}

/// While it lives, this thread's time is counted to one side; dropped, to the one before.
#[must_use]
pub struct Timed(Option<Side>);

impl Timed {
    /// A hook of the module runs.
    pub fn module() -> Self {
        Self::enter(Side::Module)
    }

    /// The module called into Envoy.
    pub fn envoy() -> Self {
        Self::enter(Side::Envoy)
    }

    fn enter(side: Side) -> Self {
        Self(on().then(|| switch(side)))
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        if let Some(previous) = self.0 {
            switch(previous);
        }
    }
}

/// Counts the time since the last switch to the side it was on; returns that side.
fn switch(to: Side) -> Side {
    CLOCK.with(|cell| {
        let mut clock = cell.get();
        let now = Instant::now();
        let ns = clock.since.map_or(0, |since| {
            u64::try_from(now.duration_since(since).as_nanos()).unwrap_or(u64::MAX)
        });
        let counted = &mut clock.counted;
        counted.clock_reads = counted.clock_reads.saturating_add(1);
        match clock.side {
            Side::Module => {
                counted.module_ns = counted.module_ns.saturating_add(ns);
                clock.module_total_ns = clock.module_total_ns.saturating_add(ns);
            }
            Side::Envoy => counted.envoy_ns = counted.envoy_ns.saturating_add(ns),
            Side::Outside => {}
        }
        let previous = clock.side;
        clock.side = to;
        clock.since = Some(now);
        cell.set(clock);
        previous
    })
}

/// Every nanosecond this thread counted to the module so far, the module's time running now
/// included: what a stream's hooks took is the difference across them.
pub fn module_total_ns() -> u64 {
    let clock = CLOCK.with(Cell::get);
    let running = match (clock.side, clock.since) {
        (Side::Module, Some(since)) => {
            u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
        }
        _ => 0,
    };
    clock.module_total_ns.saturating_add(running)
}

/// What this thread counted since the last take, once it is outside every hook and has
/// counted at least [`FLUSH_NS`].
pub fn take() -> Option<Counted> {
    CLOCK.with(|cell| {
        let mut clock = cell.get();
        let total = clock
            .counted
            .module_ns
            .saturating_add(clock.counted.envoy_ns);
        if clock.side != Side::Outside || total < FLUSH_NS {
            return None;
        }
        let counted = std::mem::take(&mut clock.counted);
        cell.set(clock);
        Some(counted)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spin(ns: u64) {
        let start = Instant::now();
        while start.elapsed().as_nanos() < u128::from(ns) {}
    }

    #[test]
    fn each_side_counts_its_own_time_and_a_hook_inside_a_callback_is_the_module_s() {
        ON.store(true, Ordering::Relaxed);
        let started = Instant::now();
        {
            let _hook = Timed::module();
            spin(30_000);
            {
                let _call = Timed::envoy();
                spin(30_000);
                {
                    let _inner_hook = Timed::module();
                    spin(30_000);
                    assert_eq!(take(), None, "inside a hook nothing is taken");
                }
                spin(30_000);
            }
            spin(30_000);
        }
        let elapsed = u64::try_from(started.elapsed().as_nanos()).unwrap();
        assert!(module_total_ns() >= 90_000);
        spin(30_000);
        let counted = take().unwrap();
        assert!(counted.module_ns >= 90_000, "{counted:?}");
        assert!(counted.envoy_ns >= 60_000, "{counted:?}");
        assert!(
            counted.module_ns + counted.envoy_ns <= elapsed,
            "time outside the hooks is not counted: {counted:?} of {elapsed} ns"
        );
        assert_eq!(counted.clock_reads, 6, "one per switch");
        assert_eq!(take(), None, "taken once");
    }
}

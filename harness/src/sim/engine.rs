//! The simulated engine's compute: prefills take their turn on it, one after another, for
//! a time proportional to the tokens they compute; token generation waits while a prefill
//! holds it (a decode step cannot run during a local prefill), which is what makes local
//! prefill on a decode worker cost its other streams something.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::state::lock;

#[derive(Debug)]
pub struct Engine {
    /// When the work queued so far is done.
    busy_until: Mutex<Instant>,
}

impl Default for Engine {
    fn default() -> Self {
        Engine {
            busy_until: Mutex::new(Instant::now()),
        }
    }
}

impl Engine {
    /// Queues `work` after what is queued, calls `started` when its turn comes and returns
    /// once it is done.
    pub async fn compute(&self, work: Duration, started: impl FnOnce()) {
        if work.is_zero() {
            started();
            return;
        }
        let done = self.reserve(Instant::now(), work);
        tokio::time::sleep_until(done - work).await;
        started();
        tokio::time::sleep_until(done).await;
    }

    /// Queues `work` at `now`, after what is queued: when it will be done.
    fn reserve(&self, now: Instant, work: Duration) -> Instant {
        let mut busy_until = lock(&self.busy_until);
        *busy_until = (*busy_until).max(now) + work;
        *busy_until
    }

    /// Waits until no prefill holds the engine.
    pub async fn stall(&self) {
        let until = *lock(&self.busy_until);
        if until > Instant::now() {
            tokio::time::sleep_until(until).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefills_take_turns_and_an_idle_engine_starts_at_once() {
        let engine = Engine::default();
        let now = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(engine.reserve(now, ms(30)), now + ms(30));
        assert_eq!(
            engine.reserve(now + ms(5), ms(20)),
            now + ms(50),
            "after the first"
        );
        assert_eq!(
            *lock(&engine.busy_until),
            now + ms(50),
            "what generation waits for"
        );
        assert_eq!(
            engine.reserve(now + ms(100), ms(10)),
            now + ms(110),
            "idle meanwhile"
        );
    }
}

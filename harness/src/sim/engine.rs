//! The simulated engine's compute: prefills take their turn on it, one after another, for
//! a time proportional to the tokens they compute; token generation waits while a prefill
//! holds it (a decode step cannot run during a local prefill), which is what makes local
//! prefill on a decode worker cost its other streams something. A prefill is scheduled
//! (vLLM's scheduler moves it from waiting to running) once the compute queued ahead of it
//! fits in one engine step.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::state::lock;

#[derive(Debug)]
pub struct Engine {
    /// When the work queued so far is done.
    busy_until: Mutex<Instant>,
    /// The compute one step holds.
    step: Duration,
}

impl Engine {
    pub fn new(step: Duration) -> Self {
        Engine {
            busy_until: Mutex::new(Instant::now()),
            step,
        }
    }

    /// Queues `work` after what is queued, calls `scheduled` once what is ahead of it fits
    /// in one step and returns once it is done.
    pub async fn compute(&self, work: Duration, scheduled: impl FnOnce()) {
        if work.is_zero() {
            scheduled();
            return;
        }
        let now = Instant::now();
        let done = self.reserve(now, work);
        let ahead = (done - work).saturating_duration_since(now);
        tokio::time::sleep(ahead.saturating_sub(self.step)).await;
        scheduled();
        tokio::time::sleep_until(done).await;
    }

    /// Queues `work` at `now`, after what is queued: when it will be done.
    fn reserve(&self, now: Instant, work: Duration) -> Instant {
        let mut busy_until = lock(&self.busy_until);
        *busy_until = (*busy_until).max(now) + work;
        *busy_until
    }

    /// Forgets the compute queued so far, as vLLM aborts the requests whose clients left.
    pub fn abort_queued(&self) {
        *lock(&self.busy_until) = Instant::now();
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
        let engine = Engine::new(Duration::ZERO);
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

    #[test]
    fn aborted_work_no_longer_delays_the_next_prefill() {
        let engine = Engine::new(Duration::ZERO);
        let ms = Duration::from_millis;
        let now = Instant::now();
        engine.reserve(now, ms(500));
        engine.abort_queued();
        let later = Instant::now();
        assert_eq!(engine.reserve(later, ms(10)), later + ms(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_prefill_is_scheduled_once_what_is_ahead_of_it_fits_in_a_step() {
        let ms = Duration::from_millis;
        let engine = std::sync::Arc::new(Engine::new(ms(10)));
        let start = Instant::now();
        let first = tokio::spawn({
            let engine = engine.clone();
            async move {
                let mut scheduled = None;
                engine
                    .compute(ms(30), || scheduled = Some(Instant::now()))
                    .await;
                scheduled
            }
        });
        tokio::task::yield_now().await;
        let mut scheduled = None;
        engine
            .compute(ms(20), || scheduled = Some(Instant::now()))
            .await;
        assert_eq!(
            first.await.unwrap(),
            Some(start),
            "an idle engine schedules at once"
        );
        assert_eq!(
            scheduled,
            Some(start + ms(20)),
            "30 ms ahead, 10 of them in its step"
        );
        assert_eq!(Instant::now(), start + ms(50), "done after the first");
    }
}

//! Every hook runs inside [`guarded`]: a panic is caught and logged, never unwound into Envoy
//! (there is no VM around native code: an unwinding panic would take Envoy down).

use std::panic::{AssertUnwindSafe, catch_unwind};

/// A panic's message, for the log.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic")
}

/// Runs a hook's body; a panic is logged and becomes `on_panic`'s value.
pub fn guarded<R>(hook: &str, body: impl FnOnce() -> R, on_panic: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            log::error!("pinroute: panic in {hook}: {}", panic_message(&*payload));
            on_panic()
        }
    }
}

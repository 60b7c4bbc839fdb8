//! How a failed wasm VM shows in Envoy: the stats that move and the lines it logs.

/// Envoy stats that move when a wasm VM fails. With `failure_policy: FAIL_CLOSED` a failed
/// VM is not replaced (its requests get 503s); with `FAIL_RELOAD` the `vm_reload_*`
/// counters count the replacements. A VM created after start-up (`created` grows, `active`
/// changes) is a replacement too.
pub const VM_FAILURE_COUNTERS: [&str; 3] = [
    "wasm.pinroute.vm_reload_success",
    "wasm.pinroute.vm_reload_failure",
    "wasm.pinroute.vm_reload_backoff",
];
pub const VM_CREATED: &str = "wasm.envoy.wasm.runtime.v8.created";
pub const VM_ACTIVE: &str = "wasm.envoy.wasm.runtime.v8.active";
/// What a wasm VM failure leaves in Envoy's log (V8 traps, Rust panics, failed callbacks).
pub const VM_FAILURE_MARKERS: [&str; 5] = [
    "RuntimeError",
    "Uncaught",
    "panicked",
    "wasm_fail",
    "Function: proxy_on",
];

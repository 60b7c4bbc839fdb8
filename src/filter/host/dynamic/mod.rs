//! The second host: an Envoy dynamic module (`envoy.filters.http.dynamic_modules`), a native
//! shared object built from the same request path as the `.wasm` (`cargo build -p pinroute
//! --profile dynamic-module --features dynamic-module` makes `libpinroute.so`).
//!
//! [`abi`] declares the part of Envoy's C ABI the module uses, [`host`] is the [`super::Host`]
//! over it, [`hooks`] the functions Envoy calls for streams, [`poller`] those that fetch the
//! live registry and scrape the engines' load on the main thread. Only this folder names the ABI; every `unsafe` of the
//! native module is here.
//!
//! What the proxy-wasm host has that this one has not: a timer for each thread's root (one is
//! ticked from its streams' hooks once the period passed, which keeps the in-flight limit's
//! shares fresh and adopts a new live registry and the engines' figures while requests run), and metrics defined after
//! configuration: Envoy 1.40 defines a dynamic module's metrics only in `config_new`, so every
//! metric is defined there, the per-model counters for each model the registry names (a model
//! only a later registry names would go uncounted).

mod abi;
mod guard;
mod hooks;
mod host;
mod poller;
mod spans;

//! What Envoy 1.40 lets a filter do with a stream's header maps and bodies at a given moment
//! (`source/extensions/common/wasm/context.cc`, checked through the end-to-end suite). This
//! is the one statement of those rules: the in-memory host of the filter's native tests and
//! the wasmtime host of `tests/host/` both ask it, so the two cannot drift apart.

/// Where one direction (the request, or the response) of a stream stands, as Envoy tracks it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Direction {
    /// Its headers were delivered to the filter.
    pub headers_received: bool,
    /// Envoy still points at its header map: from the headers callback until that callback
    /// answers Continue.
    pub headers_held: bool,
    /// Its headers went on (upstream, or to the client): a change to them would be lost.
    pub went_on: bool,
    /// A body buffer is reachable: during a body callback, or since one answered Pause.
    pub body_reachable: bool,
}

/// A host call on a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    ReadHeaders,
    WriteHeaders,
    ReadBody,
    WriteBody,
}

/// Why Envoy does not do what a call asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Envoy answers BadArgument (the SDK panics): the map is not reachable.
    #[error("the header map is not available in this phase")]
    MapUnavailable,
    /// Envoy keeps the map reachable, but the change would be lost.
    #[error("the headers already went on")]
    WentOn,
    /// Envoy answers BadArgument: there is no body buffer for the filter here.
    #[error("there is no body buffer for the filter here")]
    NoBody,
}

/// Whether `access` to `direction` is allowed; `log_phase`: the stream is in its access-log
/// callback, where Envoy still shows the maps it has, read-only.
pub fn check(access: Access, direction: &Direction, log_phase: bool) -> Result<(), Refusal> {
    let readable_map = direction.headers_held || (log_phase && direction.headers_received);
    match access {
        Access::ReadHeaders if readable_map => Ok(()),
        Access::ReadHeaders => Err(Refusal::MapUnavailable),
        Access::WriteHeaders if log_phase || !direction.headers_held => {
            Err(Refusal::MapUnavailable)
        }
        Access::WriteHeaders if direction.went_on => Err(Refusal::WentOn),
        Access::WriteHeaders => Ok(()),
        Access::ReadBody | Access::WriteBody if direction.body_reachable => Ok(()),
        Access::ReadBody | Access::WriteBody => Err(Refusal::NoBody),
    }
}

//! State the Responses API keeps on a worker (`docs/semantics.md` §4): a stored response
//! lives on the decode worker that made it, so everything that reads it — a follow-up's
//! `previous_response_id`, `GET /v1/responses/{id}`, its `cancel` — must reach that worker.
//!
//! The gateway names the worker in the response's id: vLLM takes a response's id from the
//! request's `request_id`, which the filter sets on the decode hop to
//! `resp_w<worker>_<32 hex digits>`. Any gateway replica reads the worker back from the id
//! alone; no table is kept. A forged id reaches the worker it names and finds nothing there.

use super::error::{RouteError, quoted};
use super::json::JsonObject;
use super::pins::Pins;
use super::registry::{Registry, WorkerId};
use super::resolve::{LocalPrefill, Route};

/// The request member vLLM makes the response's id of: the gateway's on `/v1/responses`.
pub const REQUEST_ID: &str = "request_id";
pub const PREVIOUS_RESPONSE_ID: &str = "previous_response_id";
const ID_PREFIX: &str = "resp_w";

/// The id of a response `worker` makes; `unique` tells it from every other.
pub fn response_id(worker: WorkerId, unique: u128) -> String {
    format!("{ID_PREFIX}{worker}_{unique:032x}")
}

/// The worker a response id names, when the gateway made it.
pub fn stored_on(id: &str) -> Option<WorkerId> {
    let (worker, unique) = id.strip_prefix(ID_PREFIX)?.split_once('_')?;
    let canonical = !worker.starts_with('0') || worker == "0";
    let digits = !worker.is_empty() && worker.bytes().all(|b| b.is_ascii_digit());
    let hex = unique.len() == 32 && unique.bytes().all(|b| b.is_ascii_hexdigit());
    (canonical && digits && hex)
        .then(|| worker.parse().ok())
        .flatten()
}

/// What a `/v1/responses` request asks of the state its workers keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResponsesRequest {
    /// The worker holding `previous_response_id`, which the request continues.
    pub follows: Option<WorkerId>,
    /// `background: true`: the worker answers at once and generates on its own.
    pub background: bool,
    /// The worker keeps the response (`store`, true unless `false`, as vLLM reads it).
    pub stored: bool,
}

impl ResponsesRequest {
    /// Reads `request`, refusing a `request_id` (the gateway's) and a `previous_response_id`
    /// no worker of `registry` can hold.
    pub fn read(request: &JsonObject<'_>, registry: &Registry) -> Result<Self, RouteError> {
        if request.get(REQUEST_ID).is_some() {
            return Err(RouteError::InvalidField {
                field: REQUEST_ID,
                reason: "is set by the gateway on /v1/responses: the response's id names the \
                         worker that stores it"
                    .into(),
            });
        }
        let follows = match request.get(PREVIOUS_RESPONSE_ID).map(|v| v.get()) {
            None | Some("null") => None,
            Some(raw) => {
                let id: String =
                    serde_json::from_str(raw).map_err(|_| RouteError::InvalidField {
                        field: PREVIOUS_RESPONSE_ID,
                        reason: format!("must be a string, got {}", quoted(raw)),
                    })?;
                Some(worker_holding(&id, registry)?)
            }
        };
        Ok(Self {
            follows,
            background: request.get("background").is_some_and(|v| v.get() == "true"),
            stored: request.get("store").is_none_or(|v| v.get() != "false"),
        })
    }

    /// Whether the request must take one hop: a prefill worker holds no stored response to
    /// continue, and a background response's KV would wait for a decode that runs later.
    pub fn one_hop(&self) -> bool {
        self.follows.is_some() || self.background
    }

    /// A request about the stored response `id` (read or cancelled): it goes to the worker
    /// holding it.
    pub fn about(id: &str, registry: &Registry) -> Result<Self, RouteError> {
        Ok(Self {
            follows: Some(worker_holding(id, registry)?),
            background: false,
            stored: true,
        })
    }

    /// `route` as the kept state needs it: one hop when the request continues a stored
    /// response or runs in the background, and a decode worker that is not swapped for
    /// another when the response is stored there (its id names the worker).
    pub fn route(&self, route: Route) -> Route {
        let mut route = if self.one_hop() {
            route.in_one_hop(LocalPrefill::Stateful)
        } else {
            route
        };
        if self.stored {
            route.decode.alternates.clear();
        }
        route
    }

    /// `pins` with the decode hop pinned to the worker holding the previous response; a
    /// client pin that disagrees, or one of a prefill worker for a one-hop request, is refused
    /// (`field` names what set the holder).
    pub fn pin(&self, pins: Pins, field: &'static str) -> Result<Pins, RouteError> {
        let field = if self.follows.is_some() {
            field
        } else {
            "background"
        };
        if self.one_hop() && pins.prefill_worker_id.is_some() {
            return Err(RouteError::InvalidField {
                field,
                reason: "takes one hop, to the worker that keeps the response: a prefill \
                         worker cannot be pinned"
                    .into(),
            });
        }
        let Some(holder) = self.follows else {
            return Ok(pins);
        };
        match pins.decode_worker_id.or(pins.backend_instance_id) {
            Some(pinned) if pinned != holder => Err(RouteError::InvalidField {
                field,
                reason: format!(
                    "names a response stored on worker {holder}, but the request pins worker \
                     {pinned}"
                ),
            }),
            _ => Ok(Pins {
                decode_worker_id: Some(holder),
                ..pins
            }),
        }
    }
}

/// The registry worker that holds response `id`, or why none can.
pub fn worker_holding(id: &str, registry: &Registry) -> Result<WorkerId, RouteError> {
    let id_quoted = quoted(id);
    let Some(worker) = stored_on(id) else {
        return Err(RouteError::ResponseNotFound {
            id: id_quoted,
            reason: "this gateway did not make it",
        });
    };
    if registry.get(worker).is_none() {
        return Err(RouteError::ResponseNotFound {
            id: id_quoted,
            reason: "the worker that stored it is no longer in the registry",
        });
    }
    Ok(worker)
}

#[cfg(test)]
#[path = "tests/responses.rs"]
mod tests;

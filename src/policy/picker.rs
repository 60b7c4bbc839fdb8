//! Picker mode (`docs/semantics.md` §9): an endpoint picker in front of the filter (Envoy's
//! `ext_proc`) chooses the workers, and the filter performs the hops it chose.
//!
//! The picker's headers are read here; the edge removed every client copy of them before
//! the picker ran, so whatever is present is the picker's. An endpoint is obeyed only inside
//! the operator's allowlist: a registry worker of the hop's role, or an address in one of
//! the allowed CIDR ranges.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::{Deserialize, Deserializer};

use super::error::{RouteError, quoted};
use super::registry::{Registry, Role, Worker};

/// The token-generating hop's endpoint, then its fallbacks (GIE Endpoint Picker Protocol).
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// The prefill hop's endpoint (llm-d; Dynamo's EPP for stock vLLM).
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";
/// `aggregated` (one hop) or `disaggregated` (two), Dynamo's EPP.
pub const ROUTING_MODE_HEADER: &str = "x-dynamo-routing-mode";
/// The response header naming the endpoint that served the token-generating hop, as the
/// GIE protocol asks for it (the bootstrap turns it into `envoy.lb` metadata).
pub const SERVED_HEADER: &str = "x-gateway-destination-endpoint-served";
/// The response header naming the endpoint that served the prefill hop.
pub const PREFILL_SERVED_HEADER: &str = "x-pinroute-prefill-endpoint-served";
/// The GIE subset hint's header form: the gateway's restriction, read by the picker only.
pub const SUBSET_HEADER: &str = "x-gateway-destination-endpoint-subset";

/// Every request header a picker sets: the edge removes client copies of all of them.
pub const PICKER_HEADERS: &[&str] = &[
    DESTINATION_HEADER,
    SUBSET_HEADER,
    PREFILLER_HEADER,
    ROUTING_MODE_HEADER,
];

/// The most endpoints of one header the filter reads: a longer list is refused.
pub const MAX_ENDPOINTS: usize = 16;

/// Which picker's protocol the headers follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Protocol {
    /// The Gateway API Inference Extension's Endpoint Picker Protocol.
    #[serde(rename = "gie")]
    Gie,
    /// llm-d's scheduler: GIE's header for decode, `x-prefiller-host-port` for prefill.
    #[serde(rename = "llm-d")]
    LlmD,
    /// Dynamo's EPP: its worker-id headers are pins; `x-prefiller-host-port` holds exactly
    /// one endpoint.
    #[serde(rename = "dynamo")]
    Dynamo,
}

/// One allowlist entry: the registry's workers, or a range of addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    Registry,
    Range(IpNet),
}

impl<'de> Deserialize<'de> for Allowed {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text == "registry" {
            return Ok(Allowed::Registry);
        }
        text.parse().map(Allowed::Range).map_err(|_| {
            serde::de::Error::custom(format_args!(
                "picker.allow entry {text:?} is neither \"registry\" nor a CIDR range (10.0.0.0/8)"
            ))
        })
    }
}

/// The plugin configuration's `picker`: present, the filter obeys a picker.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PickerSettings {
    pub protocol: Protocol,
    #[serde(default = "registry_only")]
    pub allow: Vec<Allowed>,
    /// `host:port` of the picker's gRPC `ext_proc` service, for the bootstrap renderer (the
    /// filter itself never calls the picker).
    #[serde(default)]
    pub address: Option<String>,
}

fn registry_only() -> Vec<Allowed> {
    vec![Allowed::Registry]
}

/// One or two hops, as the picker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutingMode {
    Aggregated,
    Disaggregated,
}

/// What a picker's headers chose, before the allowlist is applied.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Picked {
    /// The token-generating hop's endpoints, first choice first; empty: not chosen.
    pub token: Vec<SocketAddr>,
    /// The prefill hop's endpoints; empty: not chosen.
    pub prefill: Vec<SocketAddr>,
    pub mode: Option<RoutingMode>,
}

/// No choice: outside picker mode, or a picker that named no hop.
pub static NOTHING: Picked = Picked {
    token: Vec::new(),
    prefill: Vec::new(),
    mode: None,
};

/// Reads the picker's headers (lowercase names, as Envoy presents them).
pub fn parse_headers<'a>(
    protocol: Protocol,
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Result<Picked, RouteError> {
    let mut picked = Picked::default();
    let mut seen: Vec<&str> = Vec::new();
    for (name, raw) in headers {
        let Some(&header) = [DESTINATION_HEADER, PREFILLER_HEADER, ROUTING_MODE_HEADER]
            .iter()
            .find(|h| **h == name)
        else {
            continue;
        };
        if seen.contains(&header) {
            return Err(invalid(header, "is set more than once".into()));
        }
        seen.push(header);
        let text = std::str::from_utf8(raw).map_err(|_| invalid(header, "is not UTF-8".into()))?;
        match header {
            DESTINATION_HEADER => picked.token = endpoints(header, text)?,
            ROUTING_MODE_HEADER => picked.mode = Some(routing_mode(text)?),
            _ => {
                picked.prefill = endpoints(header, text)?;
                if protocol == Protocol::Dynamo && picked.prefill.len() > 1 {
                    let reason = "must name exactly one host:port for Dynamo's EPP".into();
                    return Err(invalid(header, reason));
                }
            }
        }
    }
    if picked.mode == Some(RoutingMode::Aggregated) && !picked.prefill.is_empty() {
        let reason = format!("names a prefill endpoint, but {ROUTING_MODE_HEADER} is aggregated");
        return Err(invalid(PREFILLER_HEADER, reason));
    }
    Ok(picked)
}

/// `ip:port[,ip:port...]`, IPv6 in brackets; no entry may be empty or a name.
fn endpoints(header: &'static str, text: &str) -> Result<Vec<SocketAddr>, RouteError> {
    let entries: Vec<&str> = text.split(',').map(str::trim).collect();
    if entries.len() > MAX_ENDPOINTS {
        let reason = format!(
            "lists {} endpoints, more than {MAX_ENDPOINTS}",
            entries.len()
        );
        return Err(invalid(header, reason));
    }
    let parse = |(at, entry): (usize, &&str)| match entry.parse::<SocketAddr>() {
        Ok(address) if address.port() != 0 => Ok(address),
        _ if entry.is_empty() => Err(invalid(header, format!("entry {} is empty", at + 1))),
        _ => Err(invalid(
            header,
            format!("entry {} is not ip:port (IPv6 as [::1]:8000)", at + 1),
        )),
    };
    entries.iter().enumerate().map(parse).collect()
}

fn routing_mode(text: &str) -> Result<RoutingMode, RouteError> {
    match text {
        "aggregated" => Ok(RoutingMode::Aggregated),
        "disaggregated" => Ok(RoutingMode::Disaggregated),
        other => Err(invalid(
            ROUTING_MODE_HEADER,
            format!("{} is neither aggregated nor disaggregated", quoted(other)),
        )),
    }
}

/// The workers behind a picker's endpoints for a hop whose workers have `role`, in its
/// order; an endpoint outside the allowlist, or a registry worker of another role, is refused.
/// Errors name an endpoint by its place in the list: answers never carry a worker address.
pub fn workers(
    header: &'static str,
    endpoints: &[SocketAddr],
    role: Role,
    registry: &Registry,
    allow: &[Allowed],
) -> Result<Vec<Worker>, RouteError> {
    let worker = |(at, address): (usize, &SocketAddr)| {
        let at = at + 1;
        let listed = registry.at_address(*address);
        match listed {
            Some(worker) if worker.role != role => Err(invalid(
                header,
                format!(
                    "entry {at} is {} worker {}, not a {role} worker",
                    worker.role, worker.id
                ),
            )),
            Some(worker) if allow.contains(&Allowed::Registry) => Ok(worker.clone()),
            _ if in_ranges(address.ip(), allow) => Ok(listed
                .cloned()
                .unwrap_or_else(|| Worker::unlisted(role, *address))),
            _ => Err(invalid(
                header,
                format!("entry {at} is outside the allowlist"),
            )),
        }
    };
    endpoints.iter().enumerate().map(worker).collect()
}

fn in_ranges(ip: IpAddr, allow: &[Allowed]) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    allow.iter().any(|entry| match entry {
        Allowed::Range(range) => range.contains(&ip),
        Allowed::Registry => false,
    })
}

fn invalid(header: &'static str, reason: String) -> RouteError {
    RouteError::InvalidEppMetadata { header, reason }
}

#[cfg(test)]
#[path = "tests/picker.rs"]
mod tests;

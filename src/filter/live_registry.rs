//! The live registry: fetched from an Envoy cluster on a period by one thread at a time,
//! shared with every thread through proxy-wasm shared data, applied to new requests only.

use std::time::Duration;

use super::host::Host;
use super::shared;
use crate::policy::config::RegistrySource;
use crate::policy::registry::Registry;

/// The last good registry document (its CAS token is its version).
const REGISTRY_KEY: &str = "pinroute.registry";
/// When the next fetch is due (u64 LE nanoseconds): the thread that moves it forward fetches.
const LEASE_KEY: &str = "pinroute.registry.next_fetch";

/// How often each thread looks for a registry another thread fetched.
pub const ADOPT_PERIOD: Duration = Duration::from_millis(500);

/// A shared registry newer than `known_version`, parsed; `None` when there is none.
pub fn newer_shared(host: &impl Host, known_version: Option<u32>) -> Option<(Registry, u32)> {
    let (bytes, version) = host.shared_data(REGISTRY_KEY).ok()?;
    let (bytes, version) = (bytes?, version?);
    if Some(version) == known_version {
        return None;
    }
    match Registry::from_json(&bytes) {
        Ok(registry) => Some((registry, version)),
        Err(error) => {
            log::error!("pinroute: the shared registry is unreadable: {error}");
            None
        }
    }
}

/// Claims the next fetch for this thread when it is due; true when this thread should fetch.
pub fn claim_fetch(host: &impl Host, source: &RegistrySource) -> bool {
    shared::claim_period(host, LEASE_KEY, source.refresh())
}

/// The largest registry read (about 20,000 workers): a registry service cannot make every
/// thread's VM hold an unbounded body.
const MAX_REGISTRY_BYTES: usize = 4 << 20;

pub fn dispatch_fetch(host: &impl Host, source: &RegistrySource) -> Option<u32> {
    let headers = vec![
        (":method", "GET"),
        (":path", source.path.as_str()),
        (":authority", source.authority.as_str()),
        ("accept-encoding", "identity"),
    ];
    match host.dispatch(&source.cluster, &headers, None, source.timeout()) {
        Ok(token) => Some(token),
        Err(status) => {
            log::error!(
                "pinroute: cannot fetch the registry from cluster {:?}: {status:?}",
                source.cluster
            );
            None
        }
    }
}

/// Why a fetched registry was not taken; the last good one stays.
pub fn take_fetched(host: &impl Host, body_size: usize) -> Result<Registry, String> {
    let headers = host
        .call_response_headers()
        .map_err(|s| format!("no response ({s:?})"))?;
    let status = headers.get(":status");
    if status != Some(b"200".as_slice()) {
        let status = status.map_or("none".into(), |s| String::from_utf8_lossy(s).into_owned());
        return Err(format!("the registry answered status {status}"));
    }
    if body_size > MAX_REGISTRY_BYTES {
        return Err(format!(
            "the registry's {body_size} bytes are over the limit of {MAX_REGISTRY_BYTES}"
        ));
    }
    let body = host
        .call_response_body(body_size)
        .map_err(|s| format!("unreadable body ({s:?})"))?;
    let registry = Registry::from_json(&body).map_err(|e| format!("invalid registry: {e}"))?;
    host.set_shared_data(REGISTRY_KEY, &body, None)
        .map_err(|s| format!("cannot share it ({s:?})"))?;
    Ok(registry)
}

//! Thin wrappers over the host calls the filter makes, each returning a `Result`.

use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, Status};

pub type Headers = Vec<(String, Vec<u8>)>;

pub fn plugin_configuration() -> Option<Vec<u8>> {
    hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
        .ok()
        .flatten()
}

pub fn request_headers() -> Result<Headers, Status> {
    hostcalls::get_map_bytes(MapType::HttpRequestHeaders)
}

pub fn set_request_header(name: &str, value: Option<&str>) -> Result<(), Status> {
    hostcalls::set_map_value(MapType::HttpRequestHeaders, name, value)
}

pub fn response_status() -> Option<u16> {
    let value = hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, ":status").ok()??;
    std::str::from_utf8(&value).ok()?.parse().ok()
}

pub fn set_response_header(name: &str, value: Option<&str>) -> Result<(), Status> {
    hostcalls::set_map_value(MapType::HttpResponseHeaders, name, value)
}

pub fn request_body(size: usize) -> Result<Vec<u8>, Status> {
    Ok(hostcalls::get_buffer(BufferType::HttpRequestBody, 0, size)?.unwrap_or_default())
}

/// Replaces the first `replaced` bytes of the buffered request body with `with` (Envoy
/// drains them and prepends `with`; the rest of the body is not copied).
pub fn edit_request_body(replaced: usize, with: &[u8]) -> Result<(), Status> {
    hostcalls::set_buffer(BufferType::HttpRequestBody, 0, replaced, with)
}

pub fn response_body(size: usize) -> Result<Vec<u8>, Status> {
    Ok(hostcalls::get_buffer(BufferType::HttpResponseBody, 0, size)?.unwrap_or_default())
}

pub fn replace_response_body(old_size: usize, body: &[u8]) -> Result<(), Status> {
    hostcalls::set_buffer(BufferType::HttpResponseBody, 0, old_size, body)
}

pub fn call_response_headers() -> Result<Headers, Status> {
    hostcalls::get_map_bytes(MapType::HttpCallResponseHeaders)
}

pub fn call_response_body(size: usize) -> Result<Vec<u8>, Status> {
    Ok(hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, size)?.unwrap_or_default())
}

pub fn dispatch(
    cluster: &str,
    headers: Vec<(&str, &str)>,
    body: &[u8],
    timeout: Duration,
) -> Result<u32, Status> {
    hostcalls::dispatch_http_call(cluster, headers, Some(body), vec![], timeout)
}

pub fn send_response(status: u16, headers: Vec<(&str, &str)>, body: &[u8]) -> Result<(), Status> {
    hostcalls::send_http_response(u32::from(status), headers, Some(body))
}

pub fn resume_request() -> Result<(), Status> {
    hostcalls::resume_http_request()
}

/// Nanoseconds since the Unix epoch by the host's clock (0 if it cannot tell).
pub fn now_nanos() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| u64::try_from(d.as_nanos()).ok())
        .unwrap_or(0)
}

/// Envoy's `response.code_details`: `via_upstream` for a worker's own answer, otherwise why
/// Envoy answered itself (`upstream_reset_before_response_started{...}`, ...).
pub fn response_code_details() -> Option<String> {
    let value = hostcalls::get_property(vec!["response", "code_details"]).ok()??;
    String::from_utf8(value).ok()
}

/// `upstream.address`: the `ip:port` the routed request went to, once a response came.
pub fn upstream_address() -> Option<String> {
    let value = hostcalls::get_property(vec!["upstream", "address"]).ok()??;
    String::from_utf8(value).ok()
}

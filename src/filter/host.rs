//! The one door to the host: every proxy-wasm host call the filter makes goes through this
//! module. The request path sees the host as the [`Host`] trait, so its retry, fallback,
//! passive-health and withheld-answer paths run natively against an in-memory host in tests.

use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType, Status};

pub type Headers = Vec<(String, Vec<u8>)>;

/// A shared-data value and its compare-and-swap token (`None`: no such key).
pub type SharedValue = (Option<Vec<u8>>, Option<u32>);

/// The host calls of a request and of the state all Envoy threads share.
pub trait Host {
    fn request_headers(&self) -> Result<Headers, Status>;
    fn set_request_header(&self, name: &str, value: Option<&str>) -> Result<(), Status>;
    fn request_body(&self, size: usize) -> Result<Vec<u8>, Status>;
    /// Replaces the first `replaced` bytes of the held request body with `with` (Envoy
    /// drains them and prepends `with`; the rest of the body is not copied).
    fn edit_request_body(&self, replaced: usize, with: &[u8]) -> Result<(), Status>;
    fn resume_request(&self) -> Result<(), Status>;

    fn response_status(&self) -> Option<u16>;
    fn set_response_header(&self, name: &str, value: Option<&str>) -> Result<(), Status>;
    fn replace_response_body(&self, old_size: usize, body: &[u8]) -> Result<(), Status>;
    /// Envoy's `response.code_details`: `via_upstream` for a worker's own answer, otherwise
    /// why Envoy answered itself (`upstream_reset_before_response_started{...}`, ...).
    fn response_code_details(&self) -> Option<String>;
    /// `upstream.address`: the `ip:port` the routed request went to, once a response came.
    fn upstream_address(&self) -> Option<String>;
    /// Answers the request from the filter, in place of whatever it would have got.
    fn send_response(
        &self,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), Status>;

    /// Starts an HTTP call; its token identifies the answer.
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<u32, Status>;
    fn call_response_headers(&self) -> Result<Headers, Status>;
    fn call_response_body(&self, size: usize) -> Result<Vec<u8>, Status>;

    fn shared_data(&self, key: &str) -> Result<SharedValue, Status>;
    /// Writes `value` if the key's token is still `cas` (`None`: whatever it is).
    fn set_shared_data(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), Status>;

    fn define_metric(&self, kind: MetricType, name: &str) -> Result<u32, Status>;
    /// Adds `offset` to a counter (positive) or a gauge.
    fn increment_metric(&self, id: u32, offset: i64) -> Result<(), Status>;
    fn record_metric(&self, id: u32, value: u64) -> Result<(), Status>;

    /// Nanoseconds since the Unix epoch by the host's clock (0 if it cannot tell).
    fn now_nanos(&self) -> u64;
}

/// The real host: Envoy, through the proxy-wasm ABI.
#[derive(Debug, Default, Clone, Copy)]
pub struct Envoy;

impl Host for Envoy {
    fn request_headers(&self) -> Result<Headers, Status> {
        hostcalls::get_map_bytes(MapType::HttpRequestHeaders)
    }

    fn set_request_header(&self, name: &str, value: Option<&str>) -> Result<(), Status> {
        hostcalls::set_map_value(MapType::HttpRequestHeaders, name, value)
    }

    fn request_body(&self, size: usize) -> Result<Vec<u8>, Status> {
        Ok(hostcalls::get_buffer(BufferType::HttpRequestBody, 0, size)?.unwrap_or_default())
    }

    fn edit_request_body(&self, replaced: usize, with: &[u8]) -> Result<(), Status> {
        hostcalls::set_buffer(BufferType::HttpRequestBody, 0, replaced, with)
    }

    fn resume_request(&self) -> Result<(), Status> {
        hostcalls::resume_http_request()
    }

    fn response_status(&self) -> Option<u16> {
        let value =
            hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, ":status").ok()??;
        std::str::from_utf8(&value).ok()?.parse().ok()
    }

    fn set_response_header(&self, name: &str, value: Option<&str>) -> Result<(), Status> {
        hostcalls::set_map_value(MapType::HttpResponseHeaders, name, value)
    }

    fn replace_response_body(&self, old_size: usize, body: &[u8]) -> Result<(), Status> {
        hostcalls::set_buffer(BufferType::HttpResponseBody, 0, old_size, body)
    }

    fn response_code_details(&self) -> Option<String> {
        property(&["response", "code_details"])
    }

    fn upstream_address(&self) -> Option<String> {
        property(&["upstream", "address"])
    }

    fn send_response(
        &self,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), Status> {
        hostcalls::send_http_response(u32::from(status), headers.to_vec(), Some(body))
    }

    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<u32, Status> {
        hostcalls::dispatch_http_call(cluster, headers.to_vec(), body, vec![], timeout)
    }

    fn call_response_headers(&self) -> Result<Headers, Status> {
        hostcalls::get_map_bytes(MapType::HttpCallResponseHeaders)
    }

    fn call_response_body(&self, size: usize) -> Result<Vec<u8>, Status> {
        let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, size)?;
        Ok(body.unwrap_or_default())
    }

    fn shared_data(&self, key: &str) -> Result<SharedValue, Status> {
        hostcalls::get_shared_data(key)
    }

    fn set_shared_data(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), Status> {
        hostcalls::set_shared_data(key, Some(value), cas)
    }

    fn define_metric(&self, kind: MetricType, name: &str) -> Result<u32, Status> {
        hostcalls::define_metric(kind, name)
    }

    fn increment_metric(&self, id: u32, offset: i64) -> Result<(), Status> {
        hostcalls::increment_metric(id, offset)
    }

    fn record_metric(&self, id: u32, value: u64) -> Result<(), Status> {
        hostcalls::record_metric(id, value)
    }

    fn now_nanos(&self) -> u64 {
        hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| u64::try_from(d.as_nanos()).ok())
            .unwrap_or(0)
    }
}

fn property(path: &[&str]) -> Option<String> {
    let value = hostcalls::get_property(path.to_vec()).ok()??;
    String::from_utf8(value).ok()
}

/// The plugin configuration Envoy holds for this filter (root context only).
pub fn plugin_configuration() -> Option<Vec<u8>> {
    hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
        .ok()
        .flatten()
}

/// Calls the root context's `on_tick` every `period` (root context only).
pub fn set_tick_period(period: Duration) -> Result<(), Status> {
    hostcalls::set_tick_period(period)
}

/// The SDK's start-up hooks, behind the same door as every other host call.
pub fn start(root: fn(u32) -> Box<dyn proxy_wasm::traits::RootContext>) {
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(root);
}

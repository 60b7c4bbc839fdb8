//! The proxy-wasm host: every proxy-wasm host call the filter makes, in [`Host`]'s terms.

use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, MetricType, Status};

use super::{Headers, Host, HostError, MetricKind, SharedValue};

/// The real host: Envoy, through the proxy-wasm ABI.
#[derive(Debug, Default, Clone, Copy)]
pub struct Envoy;

impl Host for Envoy {
    fn request_headers(&self) -> Result<Headers, HostError> {
        hostcalls::get_map_bytes(MapType::HttpRequestHeaders).map_err(refused)
    }

    fn set_request_header(&self, name: &str, value: Option<&str>) -> Result<(), HostError> {
        hostcalls::set_map_value(MapType::HttpRequestHeaders, name, value).map_err(refused)
    }

    fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, size).map_err(refused)?;
        Ok(body.unwrap_or_default())
    }

    fn edit_request_body(&self, replaced: usize, with: &[u8]) -> Result<(), HostError> {
        hostcalls::set_buffer(BufferType::HttpRequestBody, 0, replaced, with).map_err(refused)
    }

    fn resume_request(&self) -> Result<(), HostError> {
        hostcalls::resume_http_request().map_err(refused)
    }

    fn response_status(&self) -> Option<u16> {
        let value =
            hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, ":status").ok()??;
        std::str::from_utf8(&value).ok()?.parse().ok()
    }

    fn set_response_header(&self, name: &str, value: Option<&str>) -> Result<(), HostError> {
        hostcalls::set_map_value(MapType::HttpResponseHeaders, name, value).map_err(refused)
    }

    fn replace_response_body(&self, old_size: usize, body: &[u8]) -> Result<(), HostError> {
        hostcalls::set_buffer(BufferType::HttpResponseBody, 0, old_size, body).map_err(refused)
    }

    fn response_code_details(&self) -> Option<String> {
        property(&["response", "code_details"])
    }

    fn upstream_address(&self) -> Option<String> {
        property(&["upstream", "address"])
    }

    /// Envoy prefixes what `set_property` sets with `wasm.`: the path is the key without it.
    fn set_log_field(&self, key: &str, value: &str) -> Result<(), HostError> {
        let path = key.strip_prefix("wasm.").unwrap_or(key);
        hostcalls::set_property(vec![path], Some(value.as_bytes())).map_err(refused)
    }

    fn send_response(
        &self,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError> {
        hostcalls::send_http_response(u32::from(status), headers.to_vec(), Some(body))
            .map_err(refused)
    }

    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<u32, HostError> {
        hostcalls::dispatch_http_call(cluster, headers.to_vec(), body, vec![], timeout)
            .map_err(refused)
    }

    fn dispatch_grpc(
        &self,
        cluster: &str,
        service: &str,
        method: &str,
        message: &[u8],
        timeout: Duration,
    ) -> Result<u32, HostError> {
        hostcalls::dispatch_grpc_call(cluster, service, method, vec![], Some(message), timeout)
            .map_err(refused)
    }

    fn call_response_headers(&self) -> Result<Headers, HostError> {
        hostcalls::get_map_bytes(MapType::HttpCallResponseHeaders).map_err(refused)
    }

    fn call_response_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
        let body =
            hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, size).map_err(refused)?;
        Ok(body.unwrap_or_default())
    }

    fn shared_data(&self, key: &str) -> Result<SharedValue, HostError> {
        hostcalls::get_shared_data(key).map_err(refused)
    }

    fn set_shared_data(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError> {
        hostcalls::set_shared_data(key, Some(value), cas).map_err(refused)
    }

    fn define_metric(&self, kind: MetricKind, name: &str) -> Result<u32, HostError> {
        let kind = match kind {
            MetricKind::Counter => MetricType::Counter,
            MetricKind::Gauge => MetricType::Gauge,
            MetricKind::Histogram => MetricType::Histogram,
        };
        hostcalls::define_metric(kind, name).map_err(refused)
    }

    fn increment_metric(&self, id: u32, offset: i64) -> Result<(), HostError> {
        hostcalls::increment_metric(id, offset).map_err(refused)
    }

    fn record_metric(&self, id: u32, value: u64) -> Result<(), HostError> {
        hostcalls::record_metric(id, value).map_err(refused)
    }

    fn now_nanos(&self) -> u64 {
        hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| u64::try_from(d.as_nanos()).ok())
            .unwrap_or(0)
    }

    fn plugin_configuration(&self) -> Option<Vec<u8>> {
        hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
    }

    fn set_tick_period(&self, period: Duration) -> Result<(), HostError> {
        hostcalls::set_tick_period(period).map_err(refused)
    }
}

fn property(path: &[&str]) -> Option<String> {
    let value = hostcalls::get_property(path.to_vec()).ok()??;
    String::from_utf8(value).ok()
}

/// A proxy-wasm status in the filter's terms.
fn refused(status: Status) -> HostError {
    match status {
        Status::CasMismatch => HostError::CasMismatch,
        Status::NotFound => HostError::NotFound,
        Status::BadArgument => HostError::Refused("bad argument"),
        Status::SerializationFailure => HostError::Refused("serialization failure"),
        Status::ParseFailure => HostError::Refused("parse failure"),
        Status::Empty => HostError::Refused("empty"),
        Status::InternalFailure => HostError::Refused("internal failure"),
        _ => HostError::Refused("unexpected status"),
    }
}

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
        header_map(MapType::HttpRequestHeaders)
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
        header_map(MapType::HttpCallResponseHeaders)
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

fn header_map(map: MapType) -> Result<Headers, HostError> {
    let bytes = hostcalls::get_map_serialized(map).map_err(refused)?;
    deserialized(&bytes).ok_or(HostError::Refused("a malformed header map"))
}

/// A map as proxy-wasm serializes it (`proxy_get_header_map_pairs`): a count, then each
/// header's name and value sizes, then the names and values, each followed by a NUL. None
/// when the bytes are not such a map.
fn deserialized(bytes: &[u8]) -> Option<Headers> {
    if bytes.is_empty() {
        return Some(Headers::default());
    }
    let (count, rest) = bytes.split_first_chunk::<4>()?;
    let count = usize::try_from(u32::from_le_bytes(*count)).ok()?;
    let (sizes, mut text) = rest.split_at_checked(count.checked_mul(8)?)?;
    let mut headers = Headers::with_capacity(count, text.len(), text.len());
    for sizes in sizes.chunks_exact(8) {
        let (name_size, value_size) = sizes.split_first_chunk::<4>()?;
        let name;
        (name, text) = nul_terminated(text, name_size)?;
        let value;
        (value, text) = nul_terminated(text, value_size.first_chunk::<4>()?)?;
        headers.push(name, value);
    }
    Some(headers)
}

/// The `size` bytes at the start of `text`, and what follows their NUL.
fn nul_terminated<'t>(text: &'t [u8], size: &[u8; 4]) -> Option<(&'t [u8], &'t [u8])> {
    let size = usize::try_from(u32::from_le_bytes(*size)).ok()?;
    let (field, rest) = text.split_at_checked(size)?;
    Some((field, rest.get(1..)?))
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn serialized(pairs: &[(&str, &str)]) -> Vec<u8> {
        let size = |len: usize| u32::try_from(len).unwrap().to_le_bytes();
        let mut bytes = size(pairs.len()).to_vec();
        for (name, value) in pairs {
            bytes.extend(size(name.len()));
            bytes.extend(size(value.len()));
        }
        for (name, value) in pairs {
            bytes.extend([name.as_bytes(), b"\0", value.as_bytes(), b"\0"].concat());
        }
        bytes
    }

    #[test]
    fn serialized_maps_are_read_and_truncated_ones_refused() {
        let pairs = [
            (":method", "POST"),
            ("x-dynamo-worker-id", "7"),
            ("empty", ""),
        ];
        let bytes = serialized(&pairs);
        let headers = deserialized(&bytes).unwrap();
        assert_eq!(headers.texts().collect::<Vec<_>>(), pairs);
        assert_eq!(deserialized(&[]), Some(Headers::default()));
        for cut in 1..bytes.len() {
            assert_eq!(deserialized(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut huge = bytes.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(deserialized(&huge), None);
    }
}

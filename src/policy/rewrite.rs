//! The bodies of the two hops (SPEC section 4).

use serde_json::value::RawValue;

use super::error::HopFailure;
use super::json::{JsonObject, write_key};

/// What the prefill worker is told: produce KV for a remote decode.
pub const PREFILL_KV_TRANSFER_PARAMS: &str = r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#;

const KV_TRANSFER_PARAMS: &str = "kv_transfer_params";

/// `nvext` fields that pin the decode hop: they never reach the prefill worker (SPEC 3).
const DECODE_NVEXT_FIELDS: &[&str] = &["backend_instance_id", "decode_worker_id", "dp_rank"];

/// The prefill hop's body: the client's, capped at one token, not streamed, and asking for
/// a remote decode. Any `kv_transfer_params` of the client's is dropped, and so are the
/// decode hop's pins in `nvext`.
pub fn prefill_body(request: &JsonObject<'_>, capacity: usize) -> String {
    let mut out = ObjectWriter::with_capacity(capacity + PREFILL_KV_TRANSFER_PARAMS.len() + 64);
    let mut has_max_tokens = false;
    let mut has_stream = false;
    for (key, value) in request.members() {
        match key {
            "stream" => {
                has_stream = true;
                out.member(key, "false");
            }
            "max_tokens" => {
                has_max_tokens = true;
                out.member(key, "1");
            }
            "max_completion_tokens" => out.member(key, "1"),
            "stream_options" | "min_tokens" | "min_completion_tokens" | KV_TRANSFER_PARAMS => {}
            "nvext" => out.member(key, &without_decode_pins(value)),
            _ => out.member(key, value.get()),
        }
    }
    if !has_stream {
        out.member("stream", "false");
    }
    if !has_max_tokens {
        out.member("max_tokens", "1");
    }
    out.member(KV_TRANSFER_PARAMS, PREFILL_KV_TRANSFER_PARAMS);
    out.finish()
}

/// `nvext` without the decode hop's pins; anything but an object is passed as it is.
fn without_decode_pins(nvext: &RawValue) -> String {
    let Ok(object) = JsonObject::parse(nvext.get().as_bytes()) else { return nvext.get().to_string() };
    let mut out = ObjectWriter::with_capacity(nvext.get().len());
    for (key, value) in object.members().filter(|(key, _)| !DECODE_NVEXT_FIELDS.contains(key)) {
        out.member(key, value.get());
    }
    out.finish()
}

/// The body of a single-hop request (aggregated deployment or fallback): `None` when the
/// client's body goes as it is, the body without the client's `kv_transfer_params` when it
/// sent some.
pub fn one_hop_body(request: &JsonObject<'_>, capacity: usize) -> Option<String> {
    request.get(KV_TRANSFER_PARAMS).map(|_| DecodeBody::new(request, capacity).finish(None))
}

/// The token-generating hop's body, before the prefill answer is known: the client's
/// body intact but for its `kv_transfer_params`, which a client must never steer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeBody {
    open: ObjectWriter,
}

impl DecodeBody {
    pub fn new(request: &JsonObject<'_>, capacity: usize) -> Self {
        let mut open = ObjectWriter::with_capacity(capacity + 64);
        for (key, value) in request.members().filter(|(key, _)| *key != KV_TRANSFER_PARAMS) {
            open.member(key, value.get());
        }
        Self { open }
    }

    /// The final body, carrying the prefill worker's `kv_transfer_params` when it sent any.
    pub fn finish(mut self, kv_transfer_params: Option<&RawValue>) -> String {
        if let Some(params) = kv_transfer_params {
            self.open.member(KV_TRANSFER_PARAMS, params.get());
        }
        self.open.finish()
    }
}

/// The `kv_transfer_params` a prefill worker returned: an object, or none (`null` or absent,
/// as with shared-storage connectors).
pub fn prefill_kv_transfer_params(response: &[u8]) -> Result<Option<Box<RawValue>>, HopFailure> {
    let object = JsonObject::parse(response)
        .map_err(|_| HopFailure::BadResponse("the body is not a JSON object"))?;
    let Some(params) = object.get(KV_TRANSFER_PARAMS) else { return Ok(None) };
    match params.get().as_bytes().first() {
        Some(b'{') => Ok(Some(params.to_owned())),
        Some(b'n') => Ok(None),
        _ => Err(HopFailure::BadResponse("kv_transfer_params is not an object")),
    }
}

/// Writes `{"k":v,...}` member by member.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ObjectWriter {
    out: String,
    empty: bool,
}

impl ObjectWriter {
    fn with_capacity(capacity: usize) -> Self {
        let mut out = String::with_capacity(capacity);
        out.push('{');
        Self { out, empty: true }
    }

    fn member(&mut self, key: &str, raw_value: &str) {
        if !self.empty {
            self.out.push(',');
        }
        self.empty = false;
        write_key(&mut self.out, key);
        self.out.push_str(raw_value);
    }

    fn finish(mut self) -> String {
        self.out.push('}');
        self.out
    }
}

#[cfg(test)]
#[path = "tests/rewrite.rs"]
mod tests;

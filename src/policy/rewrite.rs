//! The bodies of the two hops (`docs/semantics.md` §4).

use serde_json::value::RawValue;

use super::hop::HopFailure;
use super::json::{JsonObject, write_key};

/// What the prefill worker is told: produce KV for a remote decode.
pub const PREFILL_KV_TRANSFER_PARAMS: &str = r#"{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}"#;

pub const KV_TRANSFER_PARAMS: &str = "kv_transfer_params";

/// `nvext` fields that pin the decode hop: they never reach the prefill worker (§3).
const DECODE_NVEXT_FIELDS: &[&str] = &["backend_instance_id", "decode_worker_id", "dp_rank"];

/// Request fields that make a worker's answer larger without changing the KV it computes:
/// the prefill hop never carries them, so its answer stays within a bound (§4) whatever the
/// client asked of the decode hop.
pub const ANSWER_INFLATING_FIELDS: &[&str] = &[
    "echo",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "n",
    "best_of",
    "return_token_ids",
];

/// The prefill hop's body: the client's, capped at one token, not streamed, and asking for
/// a remote decode. Any `kv_transfer_params` of the client's is dropped, and so are the
/// decode hop's pins in `nvext` and the fields that would inflate its answer.
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
            _ if ANSWER_INFLATING_FIELDS.contains(&key) => {}
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
    let Ok(object) = JsonObject::parse(nvext.get().as_bytes()) else {
        return nvext.get().to_string();
    };
    let mut out = ObjectWriter::with_capacity(nvext.get().len());
    for (key, value) in object
        .members()
        .filter(|(key, _)| !DECODE_NVEXT_FIELDS.contains(key))
    {
        out.member(key, value.get());
    }
    out.finish()
}

/// A change to the body Envoy holds: its first `replaced` bytes become `with`. Envoy drains
/// and prepends, so an edit costs what it writes, not the size of the prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyEdit {
    pub replaced: usize,
    pub with: String,
}

impl BodyEdit {
    /// The length of the edited body, from the held one's.
    pub fn edited_len(&self, held: usize) -> usize {
        held.saturating_sub(self.replaced) + self.with.len()
    }

    /// The edited body, as Envoy makes it.
    pub fn apply(&self, held: &[u8]) -> Vec<u8> {
        let rest = held.get(self.replaced..).unwrap_or_default();
        [self.with.as_bytes(), rest].concat()
    }
}

/// The token-generating hop's body, before the prefill answer is known: the client's body
/// intact but for its `kv_transfer_params`, which a client must never steer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeBody {
    /// The client sent none: its body stays as Envoy holds it, and the prefill worker's
    /// `kv_transfer_params` go in right after its `{`, the first `open` bytes.
    Held { open: usize, empty: bool },
    /// The client sent some: the body is rebuilt without them, replacing all `held` bytes.
    Rebuilt { open: ObjectWriter, held: usize },
}

impl DecodeBody {
    /// `held` is the client's body, the bytes `request` was parsed from.
    pub fn new(request: &JsonObject<'_>, held: &[u8]) -> Self {
        if request.get(KV_TRANSFER_PARAMS).is_none() {
            let open = held.iter().position(|&b| b == b'{').map_or(0, |at| at + 1);
            return Self::Held {
                open,
                empty: request.members().next().is_none(),
            };
        }
        let mut open = ObjectWriter::with_capacity(held.len() + 64);
        for (key, value) in request
            .members()
            .filter(|(key, _)| *key != KV_TRANSFER_PARAMS)
        {
            open.member(key, value.get());
        }
        Self::Rebuilt {
            open,
            held: held.len(),
        }
    }

    /// The edit that makes the held body the final one, carrying the prefill worker's
    /// `kv_transfer_params` when it sent any; `None` when the held body goes as it is.
    pub fn finish(self, kv_transfer_params: Option<&RawValue>) -> Option<BodyEdit> {
        match self {
            Self::Held { open, empty } => kv_transfer_params.map(|params| {
                let mut with =
                    String::with_capacity(params.get().len() + KV_TRANSFER_PARAMS.len() + 4);
                with.push('{');
                write_key(&mut with, KV_TRANSFER_PARAMS);
                with.push_str(params.get());
                if !empty {
                    with.push(',');
                }
                BodyEdit {
                    replaced: open,
                    with,
                }
            }),
            Self::Rebuilt { mut open, held } => {
                if let Some(params) = kv_transfer_params {
                    open.member(KV_TRANSFER_PARAMS, params.get());
                }
                Some(BodyEdit {
                    replaced: held,
                    with: open.finish(),
                })
            }
        }
    }
}

/// The `kv_transfer_params` a prefill worker returned: an object, or none (`null` or absent,
/// as with shared-storage connectors).
pub fn prefill_kv_transfer_params(response: &[u8]) -> Result<Option<Box<RawValue>>, HopFailure> {
    let object = JsonObject::parse(response)
        .map_err(|_| HopFailure::BadResponse("the body is not a JSON object"))?;
    let Some(params) = object.get(KV_TRANSFER_PARAMS) else {
        return Ok(None);
    };
    match params.get().as_bytes().first() {
        Some(b'{') => Ok(Some(params.to_owned())),
        Some(b'n') => Ok(None),
        _ => Err(HopFailure::BadResponse(
            "kv_transfer_params is not an object",
        )),
    }
}

/// Writes `{"k":v,...}` member by member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectWriter {
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

//! The bodies of the two hops (`docs/semantics.md` §4).

use serde_json::value::RawValue;

use super::api::Api;
use super::error::RouteError;
use super::hop::HopFailure;
use super::json::{JsonObject, MAX_DEPTH, nests_deeper_than, write_key};

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

/// Fields a prefill hop never carries: it is not streamed, and a minimum length would outlast
/// its single token.
const NOT_FOR_PREFILL: &[&str] = &[
    "stream_options",
    "min_tokens",
    "min_completion_tokens",
    KV_TRANSFER_PARAMS,
];

/// The Responses API's own fields a prefill hop never carries: the hop is answered, not
/// polled (`background`), and `include` and `enable_response_messages` only add output
/// (log-probabilities, the messages as the engine saw them).
const NOT_FOR_RESPONSES_PREFILL: &[&str] = &["background", "include", "enable_response_messages"];

/// How the prefill hop's body treats one of the client's members.
enum PrefillMember {
    Kept,
    Dropped,
    Set(&'static str),
    Rewritten(String),
}

/// The prefill hop's body: the client's, capped at one token, not streamed, and asking for
/// a remote decode, in `api`'s own fields (§4). Any `kv_transfer_params` of the client's is
/// dropped, and so are the decode hop's pins in `nvext` and the fields that would inflate its
/// answer.
pub fn prefill_body(api: Api, request: &JsonObject<'_>, capacity: usize) -> String {
    let mut out = ObjectWriter::with_capacity(capacity + PREFILL_KV_TRANSFER_PARAMS.len() + 64);
    for (key, value) in request.members() {
        match prefill_member(api, key, value) {
            PrefillMember::Kept => out.member(key, value.get()),
            PrefillMember::Dropped => {}
            PrefillMember::Set(raw) => out.member(key, raw),
            PrefillMember::Rewritten(raw) => out.member(key, &raw),
        }
    }
    for (key, raw) in prefill_defaults(api) {
        if request.get(key).is_none() {
            out.member(key, raw);
        }
    }
    out.member(KV_TRANSFER_PARAMS, PREFILL_KV_TRANSFER_PARAMS);
    out.finish()
}

fn prefill_member(api: Api, key: &str, value: &RawValue) -> PrefillMember {
    match (api, key) {
        (_, "stream") => PrefillMember::Set("false"),
        (Api::Responses, "store") => PrefillMember::Set("false"),
        (Api::Responses, key) if NOT_FOR_RESPONSES_PREFILL.contains(&key) => PrefillMember::Dropped,
        (Api::Generate, "sampling_params") => PrefillMember::Rewritten(one_token_sampling(value)),
        (_, "max_completion_tokens") => PrefillMember::Set("1"),
        (_, "nvext") => PrefillMember::Rewritten(without_decode_pins(value)),
        (_, key) if key == api.limit_field() => PrefillMember::Set("1"),
        (_, key) if NOT_FOR_PREFILL.contains(&key) || ANSWER_INFLATING_FIELDS.contains(&key) => {
            PrefillMember::Dropped
        }
        _ => PrefillMember::Kept,
    }
}

/// Members the prefill hop needs even where the client left them out: no stream, one token,
/// and nothing stored on the prefill worker.
fn prefill_defaults(api: Api) -> impl Iterator<Item = (&'static str, &'static str)> {
    let one_token = if api == Api::Generate {
        ONE_TOKEN_SAMPLING
    } else {
        "1"
    };
    let stored_nowhere = (api == Api::Responses).then_some(("store", "false"));
    [("stream", "false"), (api.limit_field(), one_token)]
        .into_iter()
        .chain(stored_nowhere)
}

/// `/inference/v1/generate`'s `sampling_params` for one token, when the client sent none.
const ONE_TOKEN_SAMPLING: &str = r#"{"max_tokens":1}"#;

/// Refuses a request whose limits the prefill hop could not cap: `sampling_params` that is
/// not one JSON object (`/inference/v1/generate`).
pub fn check_limits(api: Api, request: &JsonObject<'_>) -> Result<(), RouteError> {
    let Some(params) = request
        .get("sampling_params")
        .filter(|_| api == Api::Generate)
    else {
        return Ok(());
    };
    if params.get() == "null" {
        return Ok(());
    }
    JsonObject::parse(params.get().as_bytes())
        .map(drop)
        .map_err(|why| RouteError::InvalidField {
            field: "sampling_params",
            reason: format!("must be a JSON object: {why}"),
        })
}

/// `/inference/v1/generate`'s `sampling_params` for one token: `max_tokens` 1, no minimum,
/// nothing that inflates the answer; anything but an object is passed as it is, for the
/// worker to refuse.
fn one_token_sampling(params: &RawValue) -> String {
    if params.get() == "null" {
        return ONE_TOKEN_SAMPLING.to_string();
    }
    let Ok(object) = JsonObject::parse(params.get().as_bytes()) else {
        return params.get().to_string();
    };
    let mut out = ObjectWriter::with_capacity(params.get().len() + 16);
    for (key, value) in object.members() {
        match key {
            "max_tokens" | "min_tokens" => {}
            _ if ANSWER_INFLATING_FIELDS.contains(&key) => {}
            _ => out.member(key, value.get()),
        }
    }
    out.member("max_tokens", "1");
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
/// intact but for its `kv_transfer_params`, which a client must never steer, and with the
/// members the gateway sets (a stored response's `request_id`, `policy::responses`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeBody {
    /// The client sent none: its body stays as Envoy holds it, and the prefill worker's
    /// `kv_transfer_params` and the gateway's members go in right after its `{`, the first
    /// `open` bytes.
    Held {
        open: usize,
        empty: bool,
        gateway: String,
    },
    /// The client sent some: the body is rebuilt without them, replacing all `held` bytes.
    Rebuilt { open: ObjectWriter, held: usize },
}

impl DecodeBody {
    /// `held` is the client's body, the bytes `request` was parsed from; `gateway` the
    /// members the gateway sets, which the client's body does not have.
    pub fn new(request: &JsonObject<'_>, held: &[u8], gateway: &[(&str, &str)]) -> Self {
        if request.get(KV_TRANSFER_PARAMS).is_none() {
            let open = held.iter().position(|&b| b == b'{').map_or(0, |at| at + 1);
            let mut members = String::new();
            for (key, raw) in gateway {
                write_key(&mut members, key);
                members.push_str(raw);
                members.push(',');
            }
            return Self::Held {
                open,
                empty: request.members().next().is_none(),
                gateway: members,
            };
        }
        let mut open = ObjectWriter::with_capacity(held.len() + 64);
        for (key, raw) in gateway {
            open.member(key, raw);
        }
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
            Self::Held {
                open,
                empty,
                gateway,
            } => {
                if kv_transfer_params.is_none() && gateway.is_empty() {
                    return None;
                }
                let params = kv_transfer_params.map_or("", |p| p.get());
                let mut with = String::with_capacity(params.len() + gateway.len() + 24);
                with.push('{');
                if let Some(params) = kv_transfer_params {
                    write_key(&mut with, KV_TRANSFER_PARAMS);
                    with.push_str(params.get());
                    with.push(',');
                }
                with.push_str(&gateway);
                if empty {
                    with.pop();
                }
                Some(BodyEdit {
                    replaced: open,
                    with,
                })
            }
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
/// as with shared-storage connectors). The answer's other members are checked as JSON and
/// skipped, not kept.
pub fn prefill_kv_transfer_params(response: &[u8]) -> Result<Option<Box<RawValue>>, HopFailure> {
    let not_an_object = HopFailure::BadResponse("the body is not a JSON object");
    // A struct would also be read from an array.
    if response.trim_ascii_start().first() != Some(&b'{') {
        return Err(not_an_object);
    }
    let answer: PrefillAnswerMembers<'_> =
        serde_json::from_slice(response).map_err(|_| not_an_object)?;
    let Some(params) = answer.kv_transfer_params else {
        return Ok(None);
    };
    if nests_deeper_than(params.get(), MAX_DEPTH - 1) {
        return Err(HopFailure::BadResponse("kv_transfer_params nest too deep"));
    }
    match params.get().as_bytes().first() {
        Some(b'{') => Ok(Some(params.to_owned())),
        _ => Err(HopFailure::BadResponse(
            "kv_transfer_params is not an object",
        )),
    }
}

/// The one member of a prefill answer the filter reads.
#[derive(serde::Deserialize)]
struct PrefillAnswerMembers<'a> {
    #[serde(borrow)]
    kv_transfer_params: Option<&'a RawValue>,
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

//! OpenAI request parsing and response shapes, as vLLM's server produces them.

use axum::http::StatusCode;
use serde_json::{Map, Value, json};

use super::kv::prompt_hash;

pub(crate) const DEFAULT_MAX_TOKENS: u32 = 16;
pub(crate) const MAX_MODEL_LEN: u64 = 65_536;

/// The two generation endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Completions,
    Chat,
}

impl Endpoint {
    pub(crate) fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }

    /// vLLM's response id prefix: `cmpl-<request id>` / `chatcmpl-<request id>`.
    pub(crate) fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        }
    }

    pub(crate) fn prompt_field(self) -> &'static str {
        match self {
            Endpoint::Completions => "prompt",
            Endpoint::Chat => "messages",
        }
    }

    /// Limit fields in order of precedence (vLLM chat prefers `max_completion_tokens`).
    fn limit_fields(self) -> &'static [&'static str] {
        match self {
            Endpoint::Completions => &["max_tokens"],
            Endpoint::Chat => &["max_completion_tokens", "max_tokens"],
        }
    }
}

/// An error answered as `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": error_type(self.status),
            "param": null,
            "code": self.status.as_u16(),
        }})
    }
}

fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "BadRequestError",
        404 => "NotFoundError",
        429 => "RateLimitError",
        503 => "ServiceUnavailableError",
        500..=599 => "InternalServerError",
        _ => "Error",
    }
}

/// What the request body asks for in `kv_transfer_params`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KvRequest {
    Absent,
    /// `do_remote_decode: true`: a prefill hop.
    RemoteDecode,
    /// `do_remote_prefill: true`: a decode hop that loads KV from a prefill worker.
    RemotePrefill(RemotePrefill),
    /// Anything else, with the reason it is unusable.
    Invalid(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RemotePrefill {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) request_id: String,
    pub(crate) engine_id: Option<String>,
}

/// A validated `/v1/completions` or `/v1/chat/completions` request.
#[derive(Debug, Clone)]
pub(crate) struct GenerationRequest {
    pub(crate) endpoint: Endpoint,
    pub(crate) max_tokens: u32,
    /// Every limit field present in the body, with its value.
    pub(crate) limits_present: Vec<(&'static str, u64)>,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) prompt_hash: String,
    pub(crate) prompt_tokens: u64,
    pub(crate) kv: KvRequest,
}

impl GenerationRequest {
    pub(crate) fn parse(endpoint: Endpoint, body: &Value) -> Result<Self, ApiError> {
        let Some(object) = body.as_object() else {
            return Err(ApiError::bad_request("request body must be a JSON object"));
        };
        let prompt = required_prompt(endpoint, object)?;
        let limits_present = limits_present(object)?;
        let max_tokens = effective_max_tokens(endpoint, object)?;
        let stream = optional_bool(object, "stream")?.unwrap_or(false);
        check_min_tokens(object, max_tokens)?;
        let include_usage = stream_include_usage(object, stream)?;
        Ok(GenerationRequest {
            endpoint,
            max_tokens,
            limits_present,
            stream,
            include_usage,
            prompt_hash: prompt_hash(prompt),
            prompt_tokens: count_tokens(prompt).max(1),
            kv: parse_kv_request(object.get("kv_transfer_params")),
        })
    }
}

fn required_prompt(endpoint: Endpoint, object: &Map<String, Value>) -> Result<&Value, ApiError> {
    let field = endpoint.prompt_field();
    match (endpoint, object.get(field)) {
        (Endpoint::Completions, Some(prompt @ (Value::String(_) | Value::Array(_)))) => Ok(prompt),
        (Endpoint::Chat, Some(messages @ Value::Array(_))) => Ok(messages),
        _ => Err(ApiError::bad_request(format!(
            "field `{field}` is required ({})",
            match endpoint {
                Endpoint::Completions => "a string or an array",
                Endpoint::Chat => "an array of messages",
            }
        ))),
    }
}

fn optional_u64(object: &Map<String, Value>, field: &str) -> Result<Option<u64>, ApiError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_u64().map(Some).ok_or_else(|| {
            ApiError::bad_request(format!(
                "`{field}` must be a non-negative integer, got {value}"
            ))
        }),
    }
}

fn optional_bool(object: &Map<String, Value>, field: &str) -> Result<Option<bool>, ApiError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(flag)) => Ok(Some(*flag)),
        Some(value) => Err(ApiError::bad_request(format!(
            "`{field}` must be a boolean, got {value}"
        ))),
    }
}

fn limits_present(object: &Map<String, Value>) -> Result<Vec<(&'static str, u64)>, ApiError> {
    let mut present = Vec::new();
    for field in ["max_tokens", "max_completion_tokens"] {
        if let Some(value) = optional_u64(object, field)? {
            present.push((field, value));
        }
    }
    Ok(present)
}

fn effective_max_tokens(endpoint: Endpoint, object: &Map<String, Value>) -> Result<u32, ApiError> {
    for field in endpoint.limit_fields() {
        if let Some(value) = optional_u64(object, field)? {
            return checked_limit(field, value);
        }
    }
    Ok(DEFAULT_MAX_TOKENS)
}

fn checked_limit(field: &str, value: u64) -> Result<u32, ApiError> {
    if value == 0 {
        return Err(ApiError::bad_request(format!(
            "`{field}` must be at least 1, got 0"
        )));
    }
    if value > MAX_MODEL_LEN {
        return Err(ApiError::bad_request(format!(
            "`{field}` is {value}, more than this model's maximum context length of {MAX_MODEL_LEN} tokens"
        )));
    }
    u32::try_from(value).map_err(|_| ApiError::bad_request(format!("`{field}` is too large")))
}

fn check_min_tokens(object: &Map<String, Value>, max_tokens: u32) -> Result<(), ApiError> {
    for field in ["min_tokens", "min_completion_tokens"] {
        if let Some(minimum) = optional_u64(object, field)?
            && minimum > u64::from(max_tokens)
        {
            return Err(ApiError::bad_request(format!(
                "`{field}` ({minimum}) must be less than or equal to max_tokens ({max_tokens})"
            )));
        }
    }
    Ok(())
}

fn stream_include_usage(object: &Map<String, Value>, stream: bool) -> Result<bool, ApiError> {
    match object.get("stream_options") {
        None | Some(Value::Null) => Ok(false),
        Some(_) if !stream => Err(ApiError::bad_request(
            "Stream options can only be defined when `stream=True`.",
        )),
        Some(Value::Object(options)) => {
            Ok(optional_bool(options, "include_usage")?.unwrap_or(false))
        }
        Some(other) => Err(ApiError::bad_request(format!(
            "`stream_options` must be an object, got {other}"
        ))),
    }
}

/// A rough token count: words of every string, one per number.
fn count_tokens(value: &Value) -> u64 {
    match value {
        Value::String(text) => count_words(text.as_bytes()),
        Value::Number(_) => 1,
        Value::Array(items) => items.iter().map(count_tokens).sum(),
        Value::Object(map) => map.values().map(count_tokens).sum(),
        Value::Null | Value::Bool(_) => 0,
    }
}

/// Runs of bytes between separators (ASCII whitespace and other bytes up to 0x20): what
/// `split_whitespace().count()` gives for ASCII text, eight bytes at a time, so that the
/// workers stay cheap next to the gateway they benchmark with 256 KB prompts.
fn count_words(text: &[u8]) -> u64 {
    let (chunks, rest) = text.as_chunks::<8>();
    let mut words = 0u64;
    // 1 when the byte before the current chunk is a separator (the start of the text is).
    let mut carry = 1u64;
    for chunk in chunks {
        let separators = separator_bytes(u64::from_le_bytes(*chunk));
        let after_separator = (separators << 8) | (carry << 7);
        words += u64::from((!separators & after_separator & HIGH_BITS).count_ones());
        carry = separators >> 63;
    }
    let mut after_separator = carry == 1;
    for byte in rest {
        let separator = *byte <= b' ';
        words += u64::from(!separator && after_separator);
        after_separator = separator;
    }
    words
}

const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `x` that is at most 0x20 (no carries cross bytes: each
/// byte's low seven bits plus 0x5f stay below 0x100).
fn separator_bytes(x: u64) -> u64 {
    !(((x & !HIGH_BITS) + 0x5f5f_5f5f_5f5f_5f5f) | x) & HIGH_BITS
}

fn is_true(object: &Map<String, Value>, field: &str) -> bool {
    object.get(field) == Some(&Value::Bool(true))
}

pub(crate) fn parse_kv_request(params: Option<&Value>) -> KvRequest {
    let object = match params {
        None | Some(Value::Null) => return KvRequest::Absent,
        Some(Value::Object(object)) => object,
        Some(_) => {
            return KvRequest::Invalid("kv_transfer_params is not a JSON object".to_string());
        }
    };
    match (
        is_true(object, "do_remote_decode"),
        is_true(object, "do_remote_prefill"),
    ) {
        (true, true) => {
            KvRequest::Invalid("do_remote_decode and do_remote_prefill are both true".to_string())
        }
        (true, false) => KvRequest::RemoteDecode,
        (false, true) => parse_remote_prefill(object).unwrap_or_else(KvRequest::Invalid),
        (false, false) => {
            KvRequest::Invalid("neither do_remote_prefill nor do_remote_decode is true".to_string())
        }
    }
}

fn parse_remote_prefill(object: &Map<String, Value>) -> Result<KvRequest, String> {
    let text = |field: &str| {
        object
            .get(field)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| {
                format!("do_remote_prefill is true but `{field}` is missing or not a string")
            })
    };
    let port = object
        .get("remote_port")
        .and_then(Value::as_u64)
        .and_then(|port| u16::try_from(port).ok())
        .ok_or_else(|| {
            "do_remote_prefill is true but `remote_port` is missing or not a port".to_string()
        })?;
    Ok(KvRequest::RemotePrefill(RemotePrefill {
        host: text("remote_host")?,
        port,
        request_id: text("remote_request_id")?,
        engine_id: text("remote_engine_id").ok(),
    }))
}

/// The `sim` object every JSON body (and the final SSE chunk) carries.
pub(crate) fn sim_object(
    worker_id: u64,
    role: &str,
    dp_rank: i64,
    kv_from: Option<u64>,
    prompt_tokens: u64,
) -> Value {
    json!({
        "worker_id": worker_id,
        "role": role,
        "dp_rank": dp_rank,
        "kv_from": kv_from,
        "prompt_tokens": prompt_tokens,
    })
}

/// Text of generated token `index`; the tokens of a response join to "tok0 tok1 ...".
pub(crate) fn token_text(index: u32) -> String {
    if index == 0 {
        "tok0".to_string()
    } else {
        format!(" tok{index}")
    }
}

pub(crate) fn generated_text(tokens: u32) -> String {
    (0..tokens).map(token_text).collect()
}

/// Everything needed to write one generation's response.
#[derive(Debug, Clone)]
pub(crate) struct Generation {
    pub(crate) endpoint: Endpoint,
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) tokens: u32,
    pub(crate) prompt_tokens: u64,
    pub(crate) include_usage: bool,
    /// Prompt tokens found in the worker's prefix cache.
    pub(crate) cached_tokens: u64,
    pub(crate) sim: Value,
    pub(crate) kv_transfer_params: Value,
}

impl Generation {
    fn usage(&self) -> Value {
        let completion = u64::from(self.tokens);
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }

    fn envelope(&self, object: &str, choices: Value) -> Map<String, Value> {
        let mut body = Map::new();
        body.insert("id".into(), json!(self.id));
        body.insert("object".into(), json!(object));
        body.insert("created".into(), json!(self.created));
        body.insert("model".into(), json!(self.model));
        body.insert("choices".into(), choices);
        body
    }

    /// The non-streaming `text_completion` / `chat.completion` object.
    pub(crate) fn full_response(&self) -> Value {
        let text = generated_text(self.tokens);
        let (object, choice) = match self.endpoint {
            Endpoint::Completions => (
                "text_completion",
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length", "stop_reason": null}),
            ),
            Endpoint::Chat => (
                "chat.completion",
                json!({"index": 0, "message": {"role": "assistant", "content": text},
                       "logprobs": null, "finish_reason": "length", "stop_reason": null}),
            ),
        };
        let mut body = self.envelope(object, json!([choice]));
        body.insert("usage".into(), self.usage());
        body.insert("kv_transfer_params".into(), self.kv_transfer_params.clone());
        body.insert("sim".into(), self.sim.clone());
        Value::Object(body)
    }

    fn chunk_object(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        }
    }

    fn chunk_choice(&self, piece: Option<String>, first: bool, finish_reason: Value) -> Value {
        match self.endpoint {
            Endpoint::Completions => {
                json!({"index": 0, "text": piece.unwrap_or_default(), "logprobs": null, "finish_reason": finish_reason})
            }
            Endpoint::Chat => {
                let mut delta = Map::new();
                if first {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(piece) = piece {
                    delta.insert("content".into(), json!(piece));
                }
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason})
            }
        }
    }

    /// The SSE chunk carrying token `index`.
    pub(crate) fn token_chunk(&self, index: u32) -> Value {
        let choice = self.chunk_choice(Some(token_text(index)), index == 0, Value::Null);
        Value::Object(self.envelope(self.chunk_object(), json!([choice])))
    }

    /// The last content chunk: `finish_reason: "length"` and the `sim` object.
    pub(crate) fn final_chunk(&self) -> Value {
        let choice = self.chunk_choice(None, false, json!("length"));
        let mut body = self.envelope(self.chunk_object(), json!([choice]));
        body.insert("sim".into(), self.sim.clone());
        Value::Object(body)
    }

    /// The `stream_options.include_usage` chunk (no choices).
    pub(crate) fn usage_chunk(&self) -> Value {
        let mut body = self.envelope(self.chunk_object(), json!([]));
        body.insert("usage".into(), self.usage());
        Value::Object(body)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn chat_prefers_max_completion_tokens() {
        let body = json!({"messages": [], "max_tokens": 5, "max_completion_tokens": 3});
        let request = GenerationRequest::parse(Endpoint::Chat, &body).unwrap();
        assert_eq!(request.max_tokens, 3);
        assert_eq!(
            request.limits_present,
            vec![("max_tokens", 5), ("max_completion_tokens", 3)]
        );
        let request =
            GenerationRequest::parse(Endpoint::Completions, &json!({"prompt": "a b"})).unwrap();
        assert_eq!(request.max_tokens, DEFAULT_MAX_TOKENS);
        assert_eq!(request.prompt_tokens, 2);
    }

    #[test]
    fn invalid_requests_are_rejected() {
        let cases = [
            json!([1, 2]),
            json!({"max_tokens": 3}),
            json!({"prompt": "x", "max_tokens": 0}),
            json!({"prompt": "x", "max_tokens": "3"}),
            json!({"prompt": "x", "stream": "yes"}),
            json!({"prompt": "x", "stream_options": {"include_usage": true}}),
            json!({"prompt": "x", "max_tokens": 1, "min_tokens": 2}),
        ];
        for body in cases {
            let error = GenerationRequest::parse(Endpoint::Completions, &body).unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{body}");
        }
    }

    #[test]
    fn kv_requests_are_classified() {
        assert_eq!(parse_kv_request(None), KvRequest::Absent);
        assert_eq!(parse_kv_request(Some(&Value::Null)), KvRequest::Absent);
        let prefill_hop =
            json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_host": null});
        assert_eq!(
            parse_kv_request(Some(&prefill_hop)),
            KvRequest::RemoteDecode
        );
        let decode_hop = json!({"do_remote_prefill": true, "remote_host": "127.0.0.1", "remote_port": 9,
                                "remote_request_id": "r", "remote_engine_id": "e"});
        let KvRequest::RemotePrefill(remote) = parse_kv_request(Some(&decode_hop)) else {
            panic!("not a remote prefill");
        };
        assert_eq!(
            (
                remote.host.as_str(),
                remote.port,
                remote.request_id.as_str()
            ),
            ("127.0.0.1", 9, "r")
        );
        assert!(matches!(
            parse_kv_request(Some(&json!({"x": 1}))),
            KvRequest::Invalid(_)
        ));
        assert!(matches!(
            parse_kv_request(Some(&json!("garbage"))),
            KvRequest::Invalid(_)
        ));
        let no_port =
            json!({"do_remote_prefill": true, "remote_host": "h", "remote_request_id": "r"});
        assert!(matches!(
            parse_kv_request(Some(&no_port)),
            KvRequest::Invalid(_)
        ));
    }

    #[test]
    fn words_are_counted_between_ascii_spaces() {
        let long = "the prefill caf\u{e9} \\n worker\t x\r\n".repeat(300);
        for text in [
            "",
            "  ",
            "one",
            " two  words\n",
            "caf\u{e9} au\tlait\r\n",
            "abcdefgh ijklmnop",
            "        x",
            "x        ",
            long.as_str(),
        ] {
            assert_eq!(
                count_words(text.as_bytes()),
                text.split_whitespace().count() as u64,
                "{text:?}"
            );
        }
    }

    #[test]
    fn generated_text_joins_tokens() {
        assert_eq!(generated_text(3), "tok0 tok1 tok2");
        assert_eq!(generated_text(0), "");
    }
}

//! OpenAI request parsing and response shapes, as vLLM's server produces them.

use axum::http::StatusCode;
use serde_json::{Map, Value, json};

use super::kv::prompt_hash;

pub(crate) const DEFAULT_MAX_TOKENS: u32 = 16;
pub(crate) const MAX_MODEL_LEN: u64 = 65_536;

/// The generation endpoints: one generation path, each answering in its API's shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Completions,
    Chat,
    /// OpenAI's Responses API (`/v1/responses`).
    Responses,
    /// Anthropic's Messages API (`/v1/messages`).
    Messages,
    /// vLLM's token-in/token-out API (`/inference/v1/generate`).
    Generate,
}

impl Endpoint {
    pub(crate) fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Messages => "/v1/messages",
            Endpoint::Generate => "/inference/v1/generate",
        }
    }

    /// vLLM's response id prefix: `cmpl-<request id>` / `chatcmpl-<request id>` (the
    /// Messages API answers its chat completion's id), `generate-tokens-<request id>`;
    /// `resp_<...>` for Responses, whose ids are the body's `request_id`.
    pub(crate) fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Completions => "cmpl-",
            Endpoint::Chat | Endpoint::Messages => "chatcmpl-",
            Endpoint::Responses => "resp_",
            Endpoint::Generate => "generate-tokens-",
        }
    }

    /// Limit fields in order of precedence (vLLM chat prefers `max_completion_tokens`).
    fn limit_fields(self) -> &'static [&'static str] {
        match self {
            Endpoint::Completions => &["max_tokens"],
            Endpoint::Chat => &["max_completion_tokens", "max_tokens"],
            Endpoint::Responses => &["max_output_tokens"],
            Endpoint::Messages | Endpoint::Generate => &["max_tokens"],
        }
    }
}

/// An error answered as `{"error": {"message", "type", "param", "code"}}` (on the Messages
/// API, as Anthropic's `{"type": "error", "error": {"type", "message"}}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    /// `error.type` when vLLM names it rather than deriving it from the status.
    pub(crate) kind: Option<&'static str>,
    pub(crate) param: Option<String>,
    /// The body failed FastAPI's request validation: vLLM's app-wide handler answers it,
    /// in OpenAI's shape whatever the endpoint (the Messages API's router never sees it).
    pub(crate) validation: bool,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind: None,
            param: None,
            validation: false,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// What vLLM's validation handler answers for a body that does not fit the request
    /// model: 400, `type: "Bad Request"`, `param: "body.<field>"`.
    pub(crate) fn validation(field: &str, kind: &str, message: &str) -> Self {
        let loc = format!("body.{field}");
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!(
                "1 validation error:\n  {{'type': '{kind}', 'loc': '{loc}', 'msg': '{message}'}}"
            ),
            kind: Some("Bad Request"),
            param: Some(loc),
            validation: true,
        }
    }

    /// vLLM's answer for a model it does not serve.
    pub(crate) fn model_not_found(model: &str) -> Self {
        ApiError {
            kind: Some("NotFoundError"),
            param: Some("model".to_owned()),
            ..Self::new(
                StatusCode::NOT_FOUND,
                format!("The model `{model}` does not exist."),
            )
        }
    }

    /// vLLM's `create_error_response(err_type="invalid_request_error", param=...)`.
    pub(crate) fn invalid_request(
        status: StatusCode,
        param: &str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            kind: Some("invalid_request_error"),
            param: Some(param.to_string()),
            ..Self::new(status, message)
        }
    }

    fn kind(&self) -> &'static str {
        self.kind.unwrap_or_else(|| error_type(self.status))
    }

    pub(crate) fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.status.as_u16(),
        }})
    }

    /// The body on `endpoint`: the Messages API's router translates the errors of its
    /// handler into Anthropic's shape, keeping vLLM's error type.
    pub(crate) fn body_for(&self, endpoint: Endpoint) -> Value {
        if endpoint == Endpoint::Messages && !self.validation {
            json!({"type": "error", "error": {"type": self.kind(), "message": self.message}})
        } else {
            self.body()
        }
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
    /// `remote_prefill_cached_tokens`: the prefill's prefix-cache hits.
    pub(crate) cached_tokens: Option<u64>,
}

/// Where a request's prompt is: a field of the body (not copied: benchmark prompts are
/// large), or built from several (`instructions` + `input`, `system` + `messages`).
#[derive(Debug, Clone)]
pub(crate) enum Prompt {
    Field(&'static str),
    Built(Value),
}

/// A validated generation request, whatever its API.
#[derive(Debug, Clone)]
pub(crate) struct GenerationRequest {
    pub(crate) endpoint: Endpoint,
    pub(crate) max_tokens: u32,
    /// Every limit field present in the body, with its value.
    pub(crate) limits_present: Vec<(&'static str, u64)>,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) prompt: Prompt,
    pub(crate) prompt_hash: String,
    pub(crate) prompt_tokens: u64,
    pub(crate) kv: KvRequest,
    /// The body's `request_id` (Responses, generate).
    pub(crate) request_id: Option<String>,
    /// Responses: keep the finished response (vLLM's default `store: true`).
    pub(crate) store: bool,
    /// Responses: answer at once and finish in the background.
    pub(crate) background: bool,
    /// Responses: the stored response this one continues.
    pub(crate) previous_response_id: Option<String>,
    /// generate: `output_mode: "text"` (detokenized text beside the token ids).
    pub(crate) text_output: bool,
}

impl GenerationRequest {
    pub(crate) fn parse(endpoint: Endpoint, body: &Value) -> Result<Self, ApiError> {
        let Some(object) = body.as_object() else {
            return Err(ApiError::bad_request("request body must be a JSON object"));
        };
        match endpoint {
            Endpoint::Completions | Endpoint::Chat => Self::parse_openai(endpoint, object),
            Endpoint::Responses => Self::parse_responses(object),
            Endpoint::Messages => Self::parse_messages(object),
            Endpoint::Generate => Self::parse_generate(object),
        }
    }

    fn new(
        endpoint: Endpoint,
        object: &Map<String, Value>,
        prompt: Prompt,
        limits: Limits,
    ) -> Self {
        let mut request = GenerationRequest {
            endpoint,
            max_tokens: limits.max_tokens,
            limits_present: limits.present,
            stream: false,
            include_usage: false,
            prompt: Prompt::Built(Value::Null),
            prompt_hash: String::new(),
            prompt_tokens: 0,
            kv: parse_kv_request(object.get("kv_transfer_params")),
            request_id: None,
            store: false,
            background: false,
            previous_response_id: None,
            text_output: false,
        };
        let value = match &prompt {
            Prompt::Field(field) => object.get(*field).unwrap_or(&Value::Null),
            Prompt::Built(prompt) => prompt,
        };
        request.prompt_hash = prompt_hash(value);
        request.prompt_tokens = count_tokens(value).max(1);
        request.prompt = prompt;
        request
    }

    /// The prompt (`body` is the request's body).
    pub(crate) fn prompt<'a>(&'a self, body: &'a Value) -> &'a Value {
        match &self.prompt {
            Prompt::Field(field) => body.get(*field).unwrap_or(&Value::Null),
            Prompt::Built(prompt) => prompt,
        }
    }

    /// Replaces the prompt (a Responses request continuing a stored conversation).
    pub(crate) fn set_built_prompt(&mut self, prompt: Value) {
        self.prompt_hash = prompt_hash(&prompt);
        self.prompt_tokens = count_tokens(&prompt).max(1);
        self.prompt = Prompt::Built(prompt);
    }

    fn parse_openai(endpoint: Endpoint, object: &Map<String, Value>) -> Result<Self, ApiError> {
        let field = required_prompt(endpoint, object)?;
        let limits_present = limits_present(object)?;
        let max_tokens = effective_max_tokens(endpoint, object)?;
        let stream = optional_bool(object, "stream")?.unwrap_or(false);
        check_min_tokens(object, &["min_tokens", "min_completion_tokens"], max_tokens)?;
        let include_usage = stream_include_usage(object, stream)?;
        let limits = Limits {
            max_tokens,
            present: limits_present,
        };
        let mut request = Self::new(endpoint, object, Prompt::Field(field), limits);
        request.stream = stream;
        request.include_usage = include_usage;
        Ok(request)
    }

    /// `/v1/responses`: the prompt is `instructions` + `input` (a string or a list of
    /// items), limited by `max_output_tokens`.
    fn parse_responses(object: &Map<String, Value>) -> Result<Self, ApiError> {
        let input = match object.get("input") {
            Some(input @ (Value::String(_) | Value::Array(_))) => input,
            None | Some(Value::Null) => {
                return Err(ApiError::validation("input", "missing", "Field required"));
            }
            Some(_) => {
                return Err(ApiError::validation(
                    "input",
                    "string_type",
                    "Input should be a valid string or a list of items",
                ));
            }
        };
        let instructions = optional_string(object, "instructions")?;
        let limits = Limits::of(object, Endpoint::Responses)?;
        let stream = optional_bool(object, "stream")?.unwrap_or(false);
        let store = optional_bool(object, "store")?.unwrap_or(true);
        let background = optional_bool(object, "background")?.unwrap_or(false);
        if background && !store {
            // vLLM's model validator raises a VLLMValidationError, which pydantic does not
            // wrap: its own handler answers it, with `(parameter=...)` in the message.
            return Err(ApiError {
                param: Some("background".into()),
                ..ApiError::bad_request(
                    "background can only be used when `store` is true (parameter=background)",
                )
            });
        }
        let mut items: Vec<Value> = instructions.map(Value::from).into_iter().collect();
        items.push(input.clone());
        let mut request = Self::new(
            Endpoint::Responses,
            object,
            Prompt::Built(Value::Array(items)),
            limits,
        );
        request.stream = stream;
        request.store = store;
        request.background = background;
        request.previous_response_id = optional_string(object, "previous_response_id")?;
        request.request_id = optional_string(object, "request_id")?;
        Ok(request)
    }

    /// `/v1/messages`: the prompt is `system` + `messages`; `model` and `max_tokens` are
    /// required.
    fn parse_messages(object: &Map<String, Value>) -> Result<Self, ApiError> {
        let prompt = anthropic_prompt(object)?;
        let max_tokens = match object.get("max_tokens") {
            None | Some(Value::Null) => {
                return Err(ApiError::validation(
                    "max_tokens",
                    "missing",
                    "Field required",
                ));
            }
            Some(value) => match value.as_i64() {
                Some(tokens) if tokens <= 0 => {
                    return Err(ApiError::validation(
                        "max_tokens",
                        "value_error",
                        "Value error, max_tokens must be positive",
                    ));
                }
                Some(_) => checked_limit("max_tokens", value.as_u64().unwrap_or(0))?,
                None => {
                    return Err(ApiError::validation(
                        "max_tokens",
                        "int_type",
                        "Input should be a valid integer",
                    ));
                }
            },
        };
        let limits = Limits {
            max_tokens,
            present: vec![("max_tokens", u64::from(max_tokens))],
        };
        let stream = optional_bool(object, "stream")?.unwrap_or(false);
        let mut request = Self::new(Endpoint::Messages, object, prompt, limits);
        request.stream = stream;
        Ok(request)
    }

    /// `/inference/v1/generate`: the prompt is `token_ids`; the limits are in
    /// `sampling_params`.
    fn parse_generate(object: &Map<String, Value>) -> Result<Self, ApiError> {
        check_token_ids(object.get("token_ids"))?;
        let sampling = match object.get("sampling_params") {
            Some(Value::Object(sampling)) => sampling,
            None | Some(Value::Null) => {
                return Err(ApiError::validation(
                    "sampling_params",
                    "missing",
                    "Field required",
                ));
            }
            Some(_) => {
                return Err(ApiError::validation(
                    "sampling_params",
                    "dataclass_type",
                    "Input should be a dictionary or an instance of SamplingParams",
                ));
            }
        };
        let limits = Limits::of(sampling, Endpoint::Generate)?;
        check_min_tokens(sampling, &["min_tokens"], limits.max_tokens)?;
        let stream = optional_bool(object, "stream")?.unwrap_or(false);
        let include_usage = match object.get("stream_options") {
            Some(Value::Object(options)) => {
                optional_bool(options, "include_usage")?.unwrap_or(false)
            }
            _ => false,
        };
        let text_output = match object.get("output_mode") {
            None | Some(Value::Null) => false,
            Some(Value::String(mode)) if mode == "tokens" => false,
            Some(Value::String(mode)) if mode == "text" => true,
            Some(_) => {
                return Err(ApiError::validation(
                    "output_mode",
                    "literal_error",
                    "Input should be 'tokens' or 'text'",
                ));
            }
        };
        let mut request = Self::new(
            Endpoint::Generate,
            object,
            Prompt::Field("token_ids"),
            limits,
        );
        request.stream = stream;
        request.include_usage = include_usage;
        request.text_output = text_output;
        request.request_id = optional_string(object, "request_id")?;
        Ok(request)
    }
}

/// A request's length limit, and every limit field it names.
struct Limits {
    max_tokens: u32,
    present: Vec<(&'static str, u64)>,
}

impl Limits {
    /// The limit fields of `endpoint` in `object` (the body, or generate's
    /// `sampling_params`), [`DEFAULT_MAX_TOKENS`] without one.
    fn of(object: &Map<String, Value>, endpoint: Endpoint) -> Result<Limits, ApiError> {
        let mut present = Vec::new();
        for field in endpoint.limit_fields() {
            if let Some(value) = optional_u64(object, field)? {
                present.push((*field, value));
            }
        }
        Ok(Limits {
            max_tokens: effective_max_tokens(endpoint, object)?,
            present,
        })
    }
}

/// The Messages API's prompt: `messages`, after `system` when there is one.
fn anthropic_prompt(object: &Map<String, Value>) -> Result<Prompt, ApiError> {
    match object.get("model") {
        Some(Value::String(model)) if !model.is_empty() => {}
        None | Some(Value::Null) => {
            return Err(ApiError::validation("model", "missing", "Field required"));
        }
        Some(_) => {
            return Err(ApiError::validation(
                "model",
                "value_error",
                "Value error, Model is required",
            ));
        }
    }
    match object.get("messages") {
        Some(Value::Array(_)) => {}
        None | Some(Value::Null) => {
            return Err(ApiError::validation(
                "messages",
                "missing",
                "Field required",
            ));
        }
        Some(_) => {
            return Err(ApiError::validation(
                "messages",
                "list_type",
                "Input should be a valid list",
            ));
        }
    }
    match object.get("system") {
        None | Some(Value::Null) => Ok(Prompt::Field("messages")),
        Some(system @ (Value::String(_) | Value::Array(_))) => {
            let messages = object.get("messages").cloned().unwrap_or(Value::Null);
            Ok(Prompt::Built(json!([system, messages])))
        }
        Some(_) => Err(ApiError::validation(
            "system",
            "string_type",
            "Input should be a valid string or a list of content blocks",
        )),
    }
}

/// The prompt tokens of an Anthropic body (`/v1/messages/count_tokens`).
pub(crate) fn anthropic_input_tokens(body: &Value) -> Result<u64, ApiError> {
    let Some(object) = body.as_object() else {
        return Err(ApiError::bad_request("request body must be a JSON object"));
    };
    let prompt = anthropic_prompt(object)?;
    Ok(match &prompt {
        Prompt::Field(field) => count_tokens(object.get(*field).unwrap_or(&Value::Null)),
        Prompt::Built(prompt) => count_tokens(prompt),
    }
    .max(1))
}

fn check_token_ids(token_ids: Option<&Value>) -> Result<(), ApiError> {
    let Some(token_ids) = token_ids.filter(|ids| !ids.is_null()) else {
        return Err(ApiError::validation(
            "token_ids",
            "missing",
            "Field required",
        ));
    };
    let Some(ids) = token_ids.as_array() else {
        return Err(ApiError::validation(
            "token_ids",
            "list_type",
            "Input should be a valid list",
        ));
    };
    if ids.is_empty() {
        return Err(ApiError::validation(
            "token_ids",
            "too_short",
            "List should have at least 1 item after validation, not 0",
        ));
    }
    if !ids.iter().all(|id| id.as_u64().is_some()) {
        return Err(ApiError::validation(
            "token_ids",
            "value_error",
            "Value error, token_ids must not contain negative values",
        ));
    }
    Ok(())
}

fn optional_string(object: &Map<String, Value>, field: &str) -> Result<Option<String>, ApiError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(ApiError::validation(
            field,
            "string_type",
            "Input should be a valid string",
        )),
    }
}

/// The field holding the prompt of a completion (`prompt`) or chat (`messages`) request.
fn required_prompt(
    endpoint: Endpoint,
    object: &Map<String, Value>,
) -> Result<&'static str, ApiError> {
    let (field, expected) = match endpoint {
        Endpoint::Chat => ("messages", "an array of messages"),
        _ => ("prompt", "a string or an array"),
    };
    match (endpoint, object.get(field)) {
        (Endpoint::Chat, Some(Value::Array(_)))
        | (Endpoint::Completions, Some(Value::String(_) | Value::Array(_))) => Ok(field),
        _ => Err(ApiError::bad_request(format!(
            "field `{field}` is required ({expected})"
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

fn check_min_tokens(
    object: &Map<String, Value>,
    fields: &[&str],
    max_tokens: u32,
) -> Result<(), ApiError> {
    for field in fields {
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
        cached_tokens: object
            .get("remote_prefill_cached_tokens")
            .and_then(Value::as_u64),
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
    /// What the answer repeats of the request: the Responses API's request fields
    /// ([`super::responses::echo_fields`]); generate's `output_mode: "text"`.
    pub(crate) echo: Value,
    /// Responses: the id of the output message item.
    pub(crate) item_id: String,
}

/// An SSE answer: events sent at once, then one string of events per token (after the
/// token's delay), then the closing events.
#[derive(Debug, Clone, Default)]
pub(crate) struct StreamFrames {
    pub(crate) head: Vec<String>,
    pub(crate) tokens: Vec<String>,
    pub(crate) tail: Vec<String>,
}

/// `data: <payload>`, one SSE event.
pub(crate) fn sse_data(payload: &str) -> String {
    format!("data: {payload}\n\n")
}

/// `event: <name>` and `data: <payload>`, one named SSE event.
pub(crate) fn sse_named(event: &str, payload: &Value) -> String {
    format!("event: {event}\ndata: {payload}\n\n")
}

impl Generation {
    /// The usage object of the OpenAI APIs.
    pub(crate) fn usage(&self) -> Value {
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

    /// The non-streaming answer.
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
            Endpoint::Responses => return super::responses::finished_response(self),
            Endpoint::Messages => return super::messages::full_response(self),
            Endpoint::Generate => return super::tokens::full_response(self),
        };
        let mut body = self.envelope(object, json!([choice]));
        body.insert("usage".into(), self.usage());
        body.insert("kv_transfer_params".into(), self.kv_transfer_params.clone());
        body.insert("sim".into(), self.sim.clone());
        Value::Object(body)
    }

    /// The streamed answer's events.
    pub(crate) fn stream_frames(&self) -> StreamFrames {
        match self.endpoint {
            Endpoint::Completions | Endpoint::Chat => self.openai_frames(),
            Endpoint::Responses => super::responses::stream_frames(self),
            Endpoint::Messages => super::messages::stream_frames(self),
            Endpoint::Generate => super::tokens::stream_frames(self),
        }
    }

    /// One chunk per token, the final chunk, the usage chunk when asked for, `[DONE]`.
    fn openai_frames(&self) -> StreamFrames {
        let tokens = (0..self.tokens)
            .map(|index| sse_data(&self.token_chunk(index).to_string()))
            .collect();
        let mut tail = vec![sse_data(&self.final_chunk().to_string())];
        if self.include_usage {
            tail.push(sse_data(&self.usage_chunk().to_string()));
        }
        tail.push(sse_data("[DONE]"));
        StreamFrames {
            head: Vec::new(),
            tokens,
            tail,
        }
    }

    fn chunk_object(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            _ => "text_completion",
        }
    }

    fn chunk_choice(&self, piece: Option<String>, first: bool, finish_reason: Value) -> Value {
        match self.endpoint {
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
            _ => {
                json!({"index": 0, "text": piece.unwrap_or_default(), "logprobs": null, "finish_reason": finish_reason})
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

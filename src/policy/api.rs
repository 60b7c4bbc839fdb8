//! The generation APIs that take two hops (`docs/semantics.md` §1, §4, §6): vLLM
//! disaggregates each of them alike — `kv_transfer_params` on the request and on the answer —
//! but each names its prompt, its output limit and its errors its own way.

use std::borrow::Cow;

use super::json::JsonObject;

/// A generation API: a path whose body is read and which takes the prefill hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    ChatCompletions,
    /// OpenAI's Responses API; a stored response lives on the decode worker that made it
    /// (`policy::responses`).
    Responses,
    /// Anthropic's Messages API.
    Messages,
    /// vLLM's token-in, token-out API: its limits sit in `sampling_params`.
    Generate,
}

/// How a client of the path reads an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorShape {
    /// `{"error": {"message", "type", "code"}}`: OpenAI's, and vLLM's on every OpenAI path.
    #[default]
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}`: Anthropic's.
    Anthropic,
}

impl Api {
    pub const ALL: [Api; 5] = [
        Api::Completions,
        Api::ChatCompletions,
        Api::Responses,
        Api::Messages,
        Api::Generate,
    ];

    /// The plain spelling of its path, the one both hops are sent to.
    pub fn path(self) -> &'static str {
        match self {
            Api::Completions => "/v1/completions",
            Api::ChatCompletions => "/v1/chat/completions",
            Api::Responses => "/v1/responses",
            Api::Messages => "/v1/messages",
            Api::Generate => "/inference/v1/generate",
        }
    }

    /// The API served at `canonical`, a path as `policy::paths` reads it.
    pub fn at(canonical: &str) -> Option<Api> {
        Api::ALL.into_iter().find(|api| api.path() == canonical)
    }

    /// The members holding the prompt, in the order the engine puts them before the model:
    /// the instructions a Messages or Responses request keeps apart come first.
    pub fn prompt_fields(self) -> &'static [&'static str] {
        match self {
            Api::Completions => &["prompt"],
            Api::ChatCompletions => &["messages"],
            Api::Responses => &["instructions", "input"],
            Api::Messages => &["system", "messages"],
            Api::Generate => &["token_ids"],
        }
    }

    /// The prompt as the client wrote it, what placement hashes (§5): its members' raw JSON,
    /// one after the other (borrowed when there is one). Empty when there is none.
    pub fn prompt<'a>(self, request: &JsonObject<'a>) -> Cow<'a, [u8]> {
        let parts: Vec<&'a [u8]> = self
            .prompt_fields()
            .iter()
            .filter_map(|field| request.get(field))
            .map(|raw| raw.get().as_bytes())
            .collect();
        match parts.as_slice() {
            [] => Cow::Borrowed(&[]),
            [one] => Cow::Borrowed(one),
            several => Cow::Owned(several.concat()),
        }
    }

    /// The member that caps the output, set to 1 on the prefill hop; `sampling_params` holds
    /// `max_tokens` for [`Api::Generate`].
    pub fn limit_field(self) -> &'static str {
        match self {
            Api::Completions | Api::ChatCompletions | Api::Messages => "max_tokens",
            Api::Responses => "max_output_tokens",
            Api::Generate => "sampling_params",
        }
    }
}

impl ErrorShape {
    /// The shape of errors on `canonical`: Anthropic's below `/v1/messages`
    /// (`count_tokens` included), OpenAI's elsewhere.
    pub fn of_path(canonical: &str) -> ErrorShape {
        let anthropic = Api::Messages.path();
        match canonical.strip_prefix(anthropic) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => ErrorShape::Anthropic,
            _ => ErrorShape::OpenAi,
        }
    }
}

#[cfg(test)]
#[path = "tests/api.rs"]
mod tests;

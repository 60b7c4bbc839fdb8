//! Which paths reach a worker, and which take the two-hop flow (`docs/semantics.md` §1):
//! the generation APIs' paths, however a client spells them, a stored response's, and the
//! rest of the inference surface an operator routes.
//!
//! A worker's HTTP server decodes `%xx` before it matches a route, so `/v1/%63ompletions`
//! reaches the completions handler. The filter therefore decides on the path as a server
//! could read it — percent-decoded, repeated slashes merged, dot segments resolved — so no
//! spelling carries a completion request past the body rules.

use super::api::Api;

/// The other paths routed by default: the inference surface that generates nothing and keeps
/// no state — embeddings, the model list, token counts, the renderings of a prompt (vLLM
/// serves `render` and `derender` with `--enable-scale-out`) and health. vLLM's control
/// endpoints (`/reset_prefix_cache`, `/sleep`, `/collective_rpc`,
/// `/inference/v1/abort_requests`, ...) are not.
pub const INFERENCE_PATHS: &[&str] = &[
    "/v1/embeddings",
    MODEL_LIST,
    "/v1/messages/count_tokens",
    "/tokenize",
    "/detokenize",
    "/v1/completions/render",
    "/v1/chat/completions/render",
    "/v1/messages/render",
    "/v1/responses/render",
    "/v1/completions/derender",
    "/v1/chat/completions/derender",
    "/health",
];

/// The model list, which the gateway answers itself when the registry names models.
pub const MODEL_LIST: &str = "/v1/models";

/// Where stored responses are read and cancelled: `/v1/responses/{id}` and
/// `/v1/responses/{id}/cancel`.
const STORED_RESPONSES: &str = "/v1/responses/";
const CANCEL: &str = "/cancel";

/// Where a request's path takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// A generation API: two hops, both sent to its plain spelling (with no query), so a
    /// worker never sees one it would route elsewhere (a trailing slash, a dot segment, an
    /// escape) and no prefill runs for a decode hop that would not find its handler.
    Generation(Api),
    /// A stored response, read (`GET`) or cancelled (`POST .../cancel`): one hop to the
    /// worker that stored it, sent to `path`, the plain spelling.
    StoredResponse(StoredResponse),
    /// The model list, when routed: the registry's models (`super::models::list`), or one hop
    /// as [`Destination::Other`] when the registry names none.
    ModelList,
    /// Another routed path: one hop, as the client sent it.
    Other,
    /// Not routed: its canonical spelling, for the 404.
    NotRouted(String),
}

/// Where a path in its canonical spelling ([`canonical_path`] of a request's `:path`) goes,
/// given the other paths an operator routes: exact paths, or prefixes written `/prefix/*`.
pub fn destination_of(canonical: String, routed: &[String]) -> Destination {
    if let Some(api) = Api::at(&canonical) {
        return Destination::Generation(api);
    }
    if routed.iter().any(|route| matches_route(route, &canonical)) {
        return match canonical.as_str() {
            MODEL_LIST => Destination::ModelList,
            _ => Destination::Other,
        };
    }
    match StoredResponse::at(&canonical) {
        Some(stored) => Destination::StoredResponse(stored),
        None => Destination::NotRouted(canonical),
    }
}

/// A request about one stored response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The response id, as the path names it.
    pub id: String,
    /// `POST /v1/responses/{id}/cancel`, else `GET /v1/responses/{id}`.
    pub cancel: bool,
    /// The plain spelling of the path, without the query (vLLM reads `stream` and
    /// `starting_after` from a `GET`'s).
    pub path: String,
}

impl StoredResponse {
    fn at(canonical: &str) -> Option<StoredResponse> {
        let rest = canonical.strip_prefix(STORED_RESPONSES)?;
        let (id, cancel) = match rest.strip_suffix(CANCEL) {
            Some(id) => (id, true),
            None => (rest, false),
        };
        (!id.is_empty() && !id.contains('/')).then(|| StoredResponse {
            id: id.to_string(),
            cancel,
            path: canonical.to_string(),
        })
    }

    /// The method the path takes.
    pub fn method(&self) -> &'static str {
        if self.cancel { "POST" } else { "GET" }
    }
}

fn matches_route(route: &str, canonical: &str) -> bool {
    match route.strip_suffix('*') {
        Some(prefix) => canonical.starts_with(prefix),
        None => route == canonical,
    }
}

/// `raw` without its query or fragment, percent-decoded once, with repeated slashes merged
/// and `.` and `..` segments resolved.
pub fn canonical_path(raw: &str) -> String {
    match is_canonical(raw) {
        true => raw.to_owned(),
        false => canonicalised(raw),
    }
}

fn canonicalised(raw: &str) -> String {
    let path = raw.split(['?', '#']).next().unwrap_or_default();
    let decoded = percent_decoded(path);
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/').filter(|s| !s.is_empty() && *s != ".") {
        if segment == ".." {
            segments.pop();
        } else {
            segments.push(segment);
        }
    }
    format!("/{}", segments.join("/"))
}

/// Whether `raw` is its own canonical path, as almost every client's is: `/` and segments
/// none of which is empty, `.` or `..`, with nothing to decode and no query or fragment.
fn is_canonical(raw: &str) -> bool {
    let Some(segments) = raw.strip_prefix('/') else {
        return false;
    };
    !raw.contains(['%', '?', '#'])
        && segments
            .split('/')
            .all(|segment| !matches!(segment, "" | "." | ".."))
}

fn percent_decoded(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        let escaped = bytes
            .get(at + 1..at + 3)
            .and_then(|hex| std::str::from_utf8(hex).ok());
        match escaped
            .filter(|_| byte == b'%')
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            Some(decoded) => {
                out.push(decoded);
                at += 3;
            }
            None => {
                out.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
#[path = "tests/paths.rs"]
mod tests;

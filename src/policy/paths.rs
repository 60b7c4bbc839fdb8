//! Which paths reach a worker, and which take the two-hop flow (`docs/semantics.md` §1):
//! the completion paths, however a client spells them, and the rest of the inference
//! surface an operator routes.
//!
//! A worker's HTTP server decodes `%xx` before it matches a route, so `/v1/%63ompletions`
//! reaches the completions handler. The filter therefore decides on the path as a server
//! could read it — percent-decoded, repeated slashes merged, dot segments resolved — so no
//! spelling carries a completion request past the body rules.

/// The paths whose body is read and which take the prefill hop.
pub const COMPLETION_PATHS: &[&str] = &["/v1/completions", "/v1/chat/completions"];

/// The other paths routed by default: the OpenAI-compatible inference surface. vLLM's
/// control endpoints (`/reset_prefix_cache`, `/sleep`, `/collective_rpc`, ...) are not.
pub const INFERENCE_PATHS: &[&str] = &[
    "/v1/embeddings",
    "/v1/models",
    "/tokenize",
    "/detokenize",
    "/health",
];

/// Where a request's path takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// A completion path, in its plain spelling: two hops, both sent to that spelling (with no
    /// query), so a worker never sees one it would route elsewhere (a trailing slash, a dot
    /// segment, an escape) and no prefill runs for a decode hop that would not find its handler.
    Completion(&'static str),
    /// Another routed path: one hop, as the client sent it.
    Other,
    /// Not routed: its canonical spelling, for the 404.
    NotRouted(String),
}

/// Where `raw` (a request's `:path`) goes, given the other paths an operator routes: exact
/// paths, or prefixes written `/prefix/*`.
pub fn destination(raw: &str, routed: &[String]) -> Destination {
    let canonical = canonical_path(raw);
    if let Some(path) = COMPLETION_PATHS.iter().find(|path| **path == canonical) {
        return Destination::Completion(path);
    }
    if routed.iter().any(|route| matches_route(route, &canonical)) {
        Destination::Other
    } else {
        Destination::NotRouted(canonical)
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

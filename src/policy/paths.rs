//! Which requests take the two-hop flow (`docs/semantics.md` §1): the completion paths, however a
//! client spells them.
//!
//! A worker's HTTP server decodes `%xx` before it matches a route, so `/v1/%63ompletions`
//! reaches the completions handler. The filter therefore decides on the path as a server
//! could read it — percent-decoded, repeated slashes merged, dot segments resolved — so no
//! spelling carries a completion request past the body rules.

/// The paths whose body is read and which take the prefill hop.
pub const COMPLETION_PATHS: &[&str] = &["/v1/completions", "/v1/chat/completions"];

/// The completion path `raw` (a request's `:path`) names, if it names one.
pub fn completion_path(raw: &str) -> Option<&'static str> {
    let canonical = canonical_path(raw);
    COMPLETION_PATHS
        .iter()
        .copied()
        .find(|path| *path == canonical)
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

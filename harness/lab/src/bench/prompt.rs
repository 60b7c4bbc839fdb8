//! The benchmark's prompt text, shared by the load generator and the policy micro-benchmark
//! (`benches/policy.rs` includes this file by path: std only, so it builds for wasm too).

const WORDS: [&str; 16] = [
    "the",
    "prefill",
    "worker",
    "computes",
    "a",
    "cache",
    "that",
    "decode",
    "streams",
    "to",
    "client",
    "with",
    "pinned",
    "routes",
    "caf\u{e9}",
    "\\n",
];

/// Words (and `\n` escapes, and a non-ASCII one) up to `len` bytes of JSON string content.
pub fn prompt_text(len: usize) -> String {
    let mut text = String::with_capacity(len + 16);
    for word in WORDS.iter().cycle() {
        if text.len() + word.len() + 1 > len {
            break;
        }
        text.push_str(word);
        text.push(' ');
    }
    text
}

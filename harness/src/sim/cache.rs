//! The simulated prefix cache: what a worker still holds of the prompts it computed or
//! received, so that routing quality is measurable without GPUs.
//!
//! A prompt is a sequence of tokens (words of its strings, as `prompt_tokens` counts
//! them), cut into [`BLOCK_TOKENS`]-token blocks identified by chained hashes, as vLLM's
//! automatic prefix caching does: a block is reused only with every block before it. Each
//! worker keeps a bounded least-recently-used set of blocks; a prompt's cached tokens are
//! those of its longest run of leading blocks in the set.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::state::lock;

/// Tokens per cached block (vLLM's default block size).
pub const BLOCK_TOKENS: u64 = 16;

/// A prompt's whole blocks, as chained hashes, and its token count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptBlocks {
    pub hashes: Vec<u64>,
    pub tokens: u64,
}

impl PromptBlocks {
    /// The blocks of `prompt` (a completion's `prompt` or a chat's `messages`), walked in
    /// order: strings word by word, numbers as one token, objects by key.
    pub fn of(prompt: &Value) -> PromptBlocks {
        let mut hasher = BlockHasher::default();
        hasher.feed(prompt);
        PromptBlocks {
            hashes: hasher.hashes,
            tokens: hasher.tokens,
        }
    }

    /// Tokens in the first `blocks` blocks.
    pub fn tokens_in(blocks: usize) -> u64 {
        blocks as u64 * BLOCK_TOKENS
    }
}

#[derive(Default)]
struct BlockHasher {
    hashes: Vec<u64>,
    tokens: u64,
    /// The running hash of the current block, seeded by the previous block's.
    current: u64,
}

impl BlockHasher {
    fn feed(&mut self, value: &Value) {
        match value {
            Value::String(text) => {
                let words = text.as_bytes().split(|b| *b <= b' ');
                words.filter(|w| !w.is_empty()).for_each(|w| self.token(w));
            }
            Value::Number(number) => self.token(number.to_string().as_bytes()),
            Value::Array(items) => items.iter().for_each(|item| self.feed(item)),
            Value::Object(map) => map.values().for_each(|item| self.feed(item)),
            Value::Null | Value::Bool(_) => {}
        }
    }

    fn token(&mut self, word: &[u8]) {
        self.current = xxh3_64_with_seed(word, self.current);
        self.tokens += 1;
        if self.tokens.is_multiple_of(BLOCK_TOKENS) {
            self.hashes.push(self.current);
        }
    }
}

/// A worker's cached blocks, least recently used evicted first.
pub struct PrefixCache {
    capacity: usize,
    inner: Mutex<Lru>,
}

#[derive(Default)]
struct Lru {
    clock: u64,
    /// Block hash → when it was last used.
    used: HashMap<u64, u64>,
    /// Uses in time order; an entry whose time is not the block's latest is stale.
    order: VecDeque<(u64, u64)>,
}

impl PrefixCache {
    /// A cache of `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        PrefixCache {
            capacity: capacity.max(1),
            inner: Mutex::new(Lru::default()),
        }
    }

    /// How many leading blocks of `hashes` the cache holds (it is not touched).
    pub fn cached_blocks(&self, hashes: &[u64]) -> usize {
        let inner = lock(&self.inner);
        hashes
            .iter()
            .take_while(|h| inner.used.contains_key(h))
            .count()
    }

    /// Marks every block of `hashes` used now, adding the missing ones. The last block is
    /// marked first, so that eviction takes a prompt's tail before its beginning.
    pub fn store(&self, hashes: &[u64]) {
        let mut inner = lock(&self.inner);
        for hash in hashes.iter().rev() {
            inner.clock += 1;
            let now = inner.clock;
            inner.used.insert(*hash, now);
            inner.order.push_back((now, *hash));
        }
        inner.evict(self.capacity);
    }

    pub fn clear(&self) {
        *lock(&self.inner) = Lru::default();
    }

    /// Its size in blocks.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.inner).used.len()
    }
}

impl Lru {
    fn evict(&mut self, capacity: usize) {
        while self.used.len() > capacity {
            let Some((at, hash)) = self.order.pop_front() else {
                break;
            };
            if self.used.get(&hash) == Some(&at) {
                self.used.remove(&hash);
            }
        }
        if self.order.len() > 4 * capacity + 64 {
            self.order
                .retain(|(at, hash)| self.used.get(hash) == Some(at));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use serde_json::json;

    use super::*;

    fn words(n: usize, salt: &str) -> String {
        (0..n).map(|i| format!("{salt}{i} ")).collect()
    }

    #[test]
    fn a_prompt_is_cut_in_whole_blocks_of_tokens() {
        let blocks = PromptBlocks::of(&json!(words(40, "w")));
        assert_eq!((blocks.tokens, blocks.hashes.len()), (40, 2));
        let chat = json!([{"role": "system", "content": words(31, "s")}, {"role": "user", "content": "hi"}]);
        assert_eq!(PromptBlocks::of(&chat).tokens, 31 + 1 + 1 + 1);
    }

    #[test]
    fn a_longer_prompt_keeps_the_blocks_of_its_beginning() {
        let first = json!([{"role": "user", "content": words(50, "a")}]);
        let next = json!([{"role": "user", "content": words(50, "a")}, {"role": "assistant", "content": words(30, "b")}]);
        let (first, next) = (PromptBlocks::of(&first), PromptBlocks::of(&next));
        assert_eq!(first.hashes[..], next.hashes[..first.hashes.len()]);
        let other = PromptBlocks::of(&json!([{"role": "user", "content": words(50, "c")}]));
        assert_ne!(first.hashes[0], other.hashes[0]);
    }

    #[test]
    fn only_a_run_of_leading_blocks_counts() {
        let cache = PrefixCache::new(100);
        cache.store(&[1, 2, 3]);
        assert_eq!(cache.cached_blocks(&[1, 2, 3, 4]), 3);
        assert_eq!(cache.cached_blocks(&[1, 9, 3]), 1);
        assert_eq!(cache.cached_blocks(&[9, 2, 3]), 0);
        assert_eq!(cache.cached_blocks(&[]), 0);
    }

    #[test]
    fn the_least_recently_used_blocks_go_first_tails_before_heads() {
        let cache = PrefixCache::new(4);
        cache.store(&[1, 2, 3]);
        cache.store(&[7, 8]);
        assert_eq!(cache.len(), 4);
        assert_eq!(
            cache.cached_blocks(&[1, 2, 3]),
            2,
            "the oldest prompt lost its tail"
        );
        cache.store(&[1, 2]);
        cache.store(&[9]);
        assert_eq!(cache.cached_blocks(&[1, 2]), 2, "used again, kept");
        assert_eq!(cache.cached_blocks(&[7, 8]), 1, "its tail went first");
        for i in 0..1000 {
            cache.store(&[i % 3, 100 + i]);
        }
        assert_eq!(cache.len(), 4);
        assert!(lock(&cache.inner).order.len() <= 4 * 4 + 64 + 2);
        cache.clear();
        assert_eq!(cache.cached_blocks(&[9]), 0);
    }
}

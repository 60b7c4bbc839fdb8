//! A prompt's beginning as chained block hashes (`docs/semantics.md` §5): what prefix
//! affinity places requests by, and what the turn memory knows a conversation by.
//!
//! The prompt is hashed as the client wrote it (the raw JSON of its API's prompt member,
//! `policy::api`),
//! never re-serialised: two requests share a hash at a depth exactly when their prompts
//! share every byte up to it. Only the first `prefix_affinity_bytes` (at most
//! [`MAX_WINDOW_BYTES`]) are read, in [`BLOCK_BYTES`] blocks, into a fixed array.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Bytes per hashed block.
pub const BLOCK_BYTES: usize = 256;
/// The longest beginning hashed.
pub const MAX_WINDOW_BYTES: usize = 16 * 1024;
const MAX_BLOCKS: usize = MAX_WINDOW_BYTES / BLOCK_BYTES;
/// The seed of the first block's hash (any fixed value: replicas must agree).
const SEED: u64 = 0x7069_6e72_6f75_7465;

/// The hashes of a prompt's first blocks.
#[derive(Clone, PartialEq, Eq)]
pub struct PromptPrefix {
    /// `chain[i]` hashes block `i` seeded by `chain[i - 1]`: it stands for all the bytes
    /// up to the end of block `i`.
    chain: [u64; MAX_BLOCKS],
    blocks: usize,
    /// The prompt's length in bytes.
    pub bytes: usize,
}

impl std::fmt::Debug for PromptPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptPrefix")
            .field("chain", &self.chain.get(..self.blocks))
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl PromptPrefix {
    /// Hashes the whole blocks of the first `window` bytes of `prompt`.
    pub fn new(prompt: &[u8], window: usize) -> Self {
        Self::of_model(prompt, window, None)
    }

    /// As [`PromptPrefix::new`], for a request naming `model`: one prompt sent to two models
    /// (a base model and its adapter, whose KV differ) hashes apart.
    pub fn of_model(prompt: &[u8], window: usize, model: Option<&str>) -> Self {
        let window = window.min(MAX_WINDOW_BYTES);
        let hashed = prompt.get(..window).unwrap_or(prompt);
        let mut chain = [0u64; MAX_BLOCKS];
        let mut blocks = 0;
        let mut previous = model.map_or(SEED, |m| xxh3_64_with_seed(m.as_bytes(), SEED));
        for (slot, block) in chain.iter_mut().zip(hashed.chunks_exact(BLOCK_BYTES)) {
            previous = xxh3_64_with_seed(block, previous);
            *slot = previous;
            blocks += 1;
        }
        Self {
            chain,
            blocks,
            bytes: prompt.len(),
        }
    }

    /// A prompt that is not hashed (affinity off, or a request without one).
    pub fn unhashed(bytes: usize) -> Self {
        Self {
            chain: [0; MAX_BLOCKS],
            blocks: 0,
            bytes,
        }
    }

    /// The hashes at every depth from `min_bytes` (rounded up to a block) to the end of the
    /// hashed beginning, shallowest first: empty when the prompt is shorter than `min_bytes`.
    pub fn depths(&self, min_bytes: usize) -> &[u64] {
        let first = min_bytes.div_ceil(BLOCK_BYTES).saturating_sub(1);
        self.chain.get(first..self.blocks).unwrap_or_default()
    }

    /// The hash at the deepest depth of the form `min_bytes × 2^k` (in blocks) the prompt
    /// covers, and the one at the depth before it: the keys of the turn memory. A growing
    /// conversation keeps a key until its prompt doubles, and the turn that doubles it still
    /// finds the last turn under the previous key.
    pub fn memory_keys(&self, min_bytes: usize) -> (Option<u64>, Option<u64>) {
        let mut depth = min_bytes.div_ceil(BLOCK_BYTES).max(1);
        let (mut deepest, mut previous) = (None, None);
        while depth <= self.blocks {
            previous = deepest;
            deepest = self.chain.get(depth - 1).copied();
            depth *= 2;
        }
        (deepest, previous)
    }
}

/// The hash of the [`BLOCK_BYTES`] of `prompt` that end one byte before `end`: the last
/// bytes a continuation of a prompt `end` bytes long shares with it (its closing `]` or `"`
/// is not shared). `None` when `prompt` is too short.
pub fn tail_hash(prompt: &[u8], end: usize) -> Option<u64> {
    let stop = end.checked_sub(1)?;
    let start = stop.checked_sub(BLOCK_BYTES)?;
    prompt
        .get(start..stop)
        .map(|tail| xxh3_64_with_seed(tail, SEED))
}

#[cfg(test)]
#[path = "tests/prefix.rs"]
mod tests;

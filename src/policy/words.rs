//! The encoding of the tables kept in proxy-wasm shared data (passive health, requests in
//! flight, the in-flight limit): entries of `N` little-endian u64 words, one after another.

/// The entries in `bytes`; bytes that do not form a whole entry are ignored.
pub fn decode<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = [u64; N]> + '_ {
    bytes.chunks_exact(N * 8).map(|entry| {
        std::array::from_fn(|i| {
            entry
                .get(i * 8..(i + 1) * 8)
                .and_then(|word| word.try_into().ok())
                .map_or(0, u64::from_le_bytes)
        })
    })
}

pub fn encode<const N: usize>(entries: impl Iterator<Item = [u64; N]>) -> Vec<u8> {
    entries.flatten().flat_map(u64::to_le_bytes).collect()
}

#[cfg(test)]
#[path = "tests/words.rs"]
mod tests;

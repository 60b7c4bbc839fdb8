//! The turn memory (`docs/semantics.md` §5): which workers served a conversation's last turn
//! through this gateway, so that its next turn — the same prompt with a few messages added
//! — can go back to them, and skip the prefill hop when its decode worker already holds
//! all but a short suffix (§4).

use super::prefix::{PromptPrefix, tail_hash};
use super::registry::WorkerId;

/// A served turn, as remembered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// The prompt's memory key ([`PromptPrefix::memory_keys`]): which slot it is kept in.
    pub key: u64,
    pub prompt_bytes: u64,
    /// [`tail_hash`] of the prompt at its own length.
    pub tail: u64,
    /// The prefill worker first chosen for it; `None` when it took no prefill hop.
    pub prefill: Option<WorkerId>,
    pub decode: WorkerId,
    /// When it was routed, in host nanoseconds.
    pub at: u64,
    /// What the conversation's graded draws are made by (`docs/semantics.md` §5): the
    /// deepest hash of its first turn through this gateway, carried from turn to turn.
    pub draw_key: u64,
}

/// What the last turn tells about a request that continues it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastTurn {
    pub prefill: Option<WorkerId>,
    pub decode: WorkerId,
    /// Bytes the request's prompt adds to the last turn's.
    pub added_bytes: u64,
    pub draw_key: u64,
}

/// Memory slots: a key is kept in slot `key % SLOTS`, the newest turn winning.
pub const SLOTS: u64 = 4096;
const ENCODED_BYTES: usize = 64;

impl Turn {
    /// The turn to remember for a request, when its prompt has a memory key.
    pub fn of(
        prefix: &PromptPrefix,
        prompt: &[u8],
        min_bytes: usize,
        workers: (Option<WorkerId>, WorkerId),
        (now, draw_key): (u64, u64),
    ) -> Option<Turn> {
        let key = prefix.memory_keys(min_bytes).0?;
        Some(Turn {
            key,
            prompt_bytes: prompt.len() as u64,
            tail: tail_hash(prompt, prompt.len())?,
            prefill: workers.0,
            decode: workers.1,
            at: now,
            draw_key,
        })
    }

    pub fn slot(key: u64) -> u64 {
        key % SLOTS
    }

    /// What this turn tells about `prompt`, when `prompt` continues it: the same key, longer,
    /// the same bytes where this turn's prompt ended, and remembered for less than
    /// `memory_nanos`.
    pub fn continued_by(
        &self,
        key: u64,
        prompt: &[u8],
        now: u64,
        memory_nanos: u64,
    ) -> Option<LastTurn> {
        let fresh = now >= self.at && now - self.at < memory_nanos;
        let length = usize::try_from(self.prompt_bytes).ok()?;
        let continues = self.key == key
            && prompt.len() > length
            && tail_hash(prompt, length) == Some(self.tail);
        (fresh && continues).then(|| LastTurn {
            prefill: self.prefill,
            decode: self.decode,
            added_bytes: prompt.len().saturating_sub(length) as u64,
            draw_key: self.draw_key,
        })
    }

    pub fn encode(&self) -> [u8; ENCODED_BYTES] {
        let mut out = [0u8; ENCODED_BYTES];
        let fields = [
            self.key,
            self.prompt_bytes,
            self.tail,
            u64::from(self.prefill.is_some()),
            self.prefill.unwrap_or(0),
            self.decode,
            self.at,
            self.draw_key,
        ];
        for (chunk, field) in out.chunks_exact_mut(8).zip(fields) {
            chunk.copy_from_slice(&field.to_le_bytes());
        }
        out
    }

    /// `None` for anything [`Turn::encode`] did not write.
    pub fn decode(bytes: &[u8]) -> Option<Turn> {
        if bytes.len() != ENCODED_BYTES {
            return None;
        }
        let mut fields = bytes
            .chunks_exact(8)
            .map(|chunk| chunk.try_into().map(u64::from_le_bytes).unwrap_or(0));
        let mut next = || fields.next().unwrap_or(0);
        let (key, prompt_bytes, tail, has_prefill, prefill, decode, at, draw_key) = (
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
            next(),
        );
        Some(Turn {
            key,
            prompt_bytes,
            tail,
            prefill: (has_prefill == 1).then_some(prefill),
            decode,
            at,
            draw_key,
        })
    }
}

#[cfg(test)]
#[path = "tests/turns.rs"]
mod tests;

//! The proxy-wasm "pairs" wire format used for header maps, local-reply headers and
//! http-call headers:
//!
//! ```text
//! u32 count | count × (u32 key_len, u32 value_len) | count × (key NUL value NUL)
//! ```
//!
//! All integers are little-endian. An empty byte string is an empty map.

use std::fmt;

/// A malformed pairs buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairsError(pub String);

impl fmt::Display for PairsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed header pairs: {}", self.0)
    }
}

impl std::error::Error for PairsError {}

/// Serializes pairs in the proxy-wasm format.
pub fn serialize<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> Vec<u8> {
    let mut size = 4;
    for (k, v) in pairs {
        size += 8 + k.as_ref().len() + 1 + v.as_ref().len() + 1;
    }
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&len_u32(pairs.len()).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&len_u32(k.as_ref().len()).to_le_bytes());
        out.extend_from_slice(&len_u32(v.as_ref().len()).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_ref());
        out.push(0);
        out.extend_from_slice(v.as_ref());
        out.push(0);
    }
    out
}

fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Parses a pairs buffer strictly: every length must fit, every string must be followed by
/// NUL, and nothing may trail. Keys must be UTF-8 (header names are ASCII).
pub fn deserialize(bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, PairsError> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let mut reader = Reader { bytes, pos: 0 };
    let count = reader.u32()? as usize;
    let mut sizes = Vec::new();
    for _ in 0..count {
        let k = reader.u32()? as usize;
        let v = reader.u32()? as usize;
        sizes.push((k, v));
    }
    let mut pairs = Vec::with_capacity(count);
    for (k, v) in sizes {
        let key = reader.string(k)?;
        let value = reader.string(v)?;
        let key = String::from_utf8(key.to_vec())
            .map_err(|_| PairsError("a key is not UTF-8".to_string()))?;
        pairs.push((key, value.to_vec()));
    }
    if reader.pos != bytes.len() {
        return Err(PairsError(format!(
            "{} trailing bytes after {count} pairs",
            bytes.len() - reader.pos
        )));
    }
    Ok(pairs)
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], PairsError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or_else(|| PairsError("length overflow".to_string()))?;
        let slice = self.bytes.get(self.pos..end).ok_or_else(|| {
            PairsError(format!(
                "needs {n} bytes at offset {} of {}",
                self.pos,
                self.bytes.len()
            ))
        })?;
        self.pos = end;
        Ok(slice)
    }

    fn u32(&mut self) -> Result<u32, PairsError> {
        let raw = self.take(4)?;
        let mut word = [0u8; 4];
        word.copy_from_slice(raw);
        Ok(u32::from_le_bytes(word))
    }

    fn string(&mut self, n: usize) -> Result<&'a [u8], PairsError> {
        let s = self.take(n)?;
        match self.take(1)? {
            [0] => Ok(s),
            _ => Err(PairsError(format!(
                "missing NUL after a {n}-byte string at offset {}",
                self.pos - 1
            ))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_sdk_layout() {
        let bytes = serialize(&[(":method", "GET"), ("a", "")]);
        #[rustfmt::skip]
        let expected: &[u8] = &[
            2, 0, 0, 0,
            7, 0, 0, 0, 3, 0, 0, 0,
            1, 0, 0, 0, 0, 0, 0, 0,
            b':', b'm', b'e', b't', b'h', b'o', b'd', 0, b'G', b'E', b'T', 0,
            b'a', 0, 0,
        ];
        assert_eq!(bytes, expected);
        let back = deserialize(&bytes).unwrap();
        assert_eq!(
            back,
            vec![
                (":method".to_string(), b"GET".to_vec()),
                ("a".to_string(), vec![])
            ]
        );
    }

    #[test]
    fn empty_forms() {
        assert!(deserialize(&[]).unwrap().is_empty());
        assert!(deserialize(&[0, 0, 0, 0]).unwrap().is_empty());
        assert_eq!(serialize::<&str, &str>(&[]), vec![0, 0, 0, 0]);
    }

    #[test]
    fn rejects_malformed() {
        assert!(deserialize(&[1, 0, 0]).is_err());
        // count 1 but no sizes
        assert!(deserialize(&[1, 0, 0, 0]).is_err());
        // missing NUL
        let mut bytes = serialize(&[("k", "v")]);
        let last = bytes.len() - 1;
        bytes[last] = b'x';
        assert!(deserialize(&bytes).is_err());
        // trailing garbage
        let mut bytes = serialize(&[("k", "v")]);
        bytes.push(0);
        assert!(deserialize(&bytes).is_err());
    }

    #[test]
    fn binary_values_round_trip() {
        let value: Vec<u8> = (0u8..=255).collect();
        let bytes = serialize(&[("bin", value.as_slice())]);
        assert_eq!(deserialize(&bytes).unwrap()[0].1, value);
    }
}

//! An ordered header map with Envoy's observable behaviour: keys are lower-cased, pseudo-headers
//! (`:path`, ...) stay in front of regular headers, a key may repeat, `get` answers the first
//! value, `replace` drops every value of the key and appends the new one, `remove` drops all.

/// An HTTP header map (or the headers of an http call, or of a local reply).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderMap {
    entries: Vec<(String, Vec<u8>)>,
}

impl HeaderMap {
    /// An empty map.
    pub fn new() -> HeaderMap {
        HeaderMap::default()
    }

    /// Builds a map the way Envoy's codec would hand it to the filter: keys lower-cased,
    /// pseudo-headers first, order otherwise kept.
    pub fn from_pairs<K: AsRef<str>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.add(k.as_ref(), v.as_ref());
        }
        map
    }

    /// The first value of `key` (case-insensitive).
    pub fn get(&self, key: &str) -> Option<&[u8]> {
        let key = key.to_ascii_lowercase();
        self.entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_slice())
    }

    /// The first value of `key` as UTF-8, if it is.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Every value of `key`, in order.
    pub fn get_all(&self, key: &str) -> Vec<&[u8]> {
        let key = key.to_ascii_lowercase();
        self.entries
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| v.as_slice())
            .collect()
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// All entries, in iteration order.
    pub fn entries(&self) -> &[(String, Vec<u8>)] {
        &self.entries
    }

    /// Entries as `(&str, String)` with values decoded lossily: handy in assertions.
    pub fn to_strings(&self) -> Vec<(String, String)> {
        self.entries
            .iter()
            .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
            .collect()
    }

    /// Number of entries (a repeated key counts each time), what the ABI reports as
    /// `num_headers`.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Appends a value (Envoy's `addCopy`).
    pub fn add(&mut self, key: &str, value: &[u8]) {
        let key = key.to_ascii_lowercase();
        if key.starts_with(':') {
            let at = self
                .entries
                .iter()
                .position(|(k, _)| !k.starts_with(':'))
                .unwrap_or(self.entries.len());
            self.entries.insert(at, (key, value.to_vec()));
        } else {
            self.entries.push((key, value.to_vec()));
        }
    }

    /// Replaces every value of `key` by one value (Envoy's `setCopy`).
    pub fn replace(&mut self, key: &str, value: &[u8]) {
        self.remove(key);
        self.add(key, value);
    }

    /// Removes every value of `key`.
    pub fn remove(&mut self, key: &str) {
        let key = key.to_ascii_lowercase();
        self.entries.retain(|(k, _)| *k != key);
    }

    /// Replaces the whole map (`proxy_set_header_map_pairs`).
    pub fn set_all(&mut self, pairs: &[(String, Vec<u8>)]) {
        self.entries.clear();
        for (k, v) in pairs {
            self.add(k, v);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn envoy_like_operations() {
        let mut map = HeaderMap::from_pairs(&[("X-A", "1"), (":path", "/"), ("x-a", "2")]);
        assert_eq!(map.entries()[0].0, ":path");
        assert_eq!(map.get("x-a"), Some(&b"1"[..]));
        assert_eq!(map.get_all("X-A"), vec![&b"1"[..], &b"2"[..]]);
        map.replace("x-a", b"3");
        assert_eq!(map.get_all("x-a"), vec![&b"3"[..]]);
        map.add(":method", b"GET");
        assert_eq!(map.entries()[1].0, ":method");
        map.remove("x-a");
        assert!(!map.contains("x-a"));
        assert_eq!(map.len(), 2);
    }
}

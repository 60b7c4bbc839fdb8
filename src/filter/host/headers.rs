//! A header map as the host hands it over, in one piece: every name in one string, every
//! value in one buffer, so reading a map of any size costs three allocations, not two a
//! header.

/// Header names and values in the host's order. A name that is not UTF-8 is kept as
/// [`String::from_utf8_lossy`] spells it; values are bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    names: String,
    values: Vec<u8>,
    /// Where each header's name and value are in `names` and `values`.
    spans: Vec<Span>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    name: (usize, usize),
    value: (usize, usize),
}

impl Headers {
    /// An empty map with room for `headers` headers whose names take `name_bytes` bytes and
    /// values `value_bytes`.
    pub fn with_capacity(headers: usize, name_bytes: usize, value_bytes: usize) -> Self {
        Self {
            names: String::with_capacity(name_bytes),
            values: Vec::with_capacity(value_bytes),
            spans: Vec::with_capacity(headers),
        }
    }

    pub fn push(&mut self, name: &[u8], value: &[u8]) {
        let (name_start, value_start) = (self.names.len(), self.values.len());
        match std::str::from_utf8(name) {
            Ok(name) => self.names.push_str(name),
            Err(_) => self.names.push_str(&String::from_utf8_lossy(name)),
        }
        self.values.extend_from_slice(value);
        self.spans.push(Span {
            name: (name_start, self.names.len()),
            value: (value_start, self.values.len()),
        });
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> + Clone {
        self.spans.iter().map(|Span { name, value }| {
            (
                self.names.get(name.0..name.1).unwrap_or_default(),
                self.values.get(value.0..value.1).unwrap_or_default(),
            )
        })
    }

    /// The headers whose value is UTF-8, as text.
    pub fn texts(&self) -> impl Iterator<Item = (&str, &str)> + Clone {
        self.iter()
            .filter_map(|(name, value)| Some((name, std::str::from_utf8(value).ok()?)))
    }

    /// The value of the first header named `name`.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        let names = self.names.as_bytes();
        let Span { value, .. } = self
            .spans
            .iter()
            .find(|span| names.get(span.name.0..span.name.1) == Some(name.as_bytes()))?;
        self.values.get(value.0..value.1)
    }

    /// The headers `keep` keeps, in one allocation each for names, values and places.
    pub fn filtered(&self, mut keep: impl FnMut(&str, &[u8]) -> bool) -> Self {
        let mut kept = Self::with_capacity(self.spans.len(), self.names.len(), self.values.len());
        for (name, value) in self.iter().filter(|(name, value)| keep(name, value)) {
            kept.push(name.as_bytes(), value);
        }
        kept
    }
}

impl<N: AsRef<[u8]>, V: AsRef<[u8]>> FromIterator<(N, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (N, V)>>(pairs: I) -> Self {
        let mut headers = Self::default();
        for (name, value) in pairs {
            headers.push(name.as_ref(), value.as_ref());
        }
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_keep_their_order_names_and_values() {
        let headers: Headers = [(":path", "/v1/completions"), ("x-a", ""), ("x-a", "2")]
            .into_iter()
            .collect();
        let read: Vec<(&str, &[u8])> = headers.iter().collect();
        assert_eq!(
            read,
            [
                (":path", &b"/v1/completions"[..]),
                ("x-a", b""),
                ("x-a", b"2")
            ]
        );
        assert_eq!(headers.get("x-a"), Some(&b""[..]));
        assert_eq!(headers.get("x-b"), None);
        assert_eq!(headers.iter().count(), 3);
    }

    #[test]
    fn a_name_that_is_not_utf8_is_spelled_lossily_and_texts_skip_binary_values() {
        let headers: Headers = [(&b"x-\xff"[..], &b"v"[..]), (b"x-bin", b"\xfe")]
            .into_iter()
            .collect();
        assert_eq!(headers.get("x-\u{fffd}"), Some(&b"v"[..]));
        assert_eq!(headers.texts().collect::<Vec<_>>(), [("x-\u{fffd}", "v")]);
    }

    #[test]
    fn filtering_keeps_the_kept_headers_in_order() {
        let headers: Headers = [("a", "1"), ("b", "2"), ("a", "3")].into_iter().collect();
        let kept = headers.filtered(|name, _| name != "b");
        assert_eq!(kept.texts().collect::<Vec<_>>(), [("a", "1"), ("a", "3")]);
        let none = headers.filtered(|name, _| name == "c");
        assert_eq!(none, Headers::default());
    }
}

//! The simulated KV cache handed from a prefill worker to a decode worker.
//!
//! A prefill worker stores one [`KvEntry`] per prefill hop; the decode worker takes it
//! back over HTTP (`GET /sim/kv/{id}`) and checks that it was computed for the same
//! prompt.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use xxhash_rust::xxh3::Xxh3Default;

use super::state::lock;

pub(crate) const KV_TTL: Duration = Duration::from_secs(60);
pub(crate) const KV_CAPACITY: usize = 10_000;

/// What a prefill worker "computed" for one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEntry {
    /// The `remote_request_id` handed out in `kv_transfer_params`.
    pub request_id: String,
    /// [`prompt_hash`] of the prompt that was prefilled.
    pub prompt_hash: String,
    pub worker_id: u64,
    pub dp_rank: u32,
    /// The `remote_engine_id` handed out in `kv_transfer_params`.
    pub engine_id: String,
    pub prompt_tokens: u64,
}

/// Bounded, expiring store of KV entries, each taken at most once.
pub(crate) struct KvStore {
    ttl: Duration,
    capacity: usize,
    inner: Mutex<KvInner>,
}

#[derive(Default)]
struct KvInner {
    entries: HashMap<String, (Instant, KvEntry)>,
    /// Insertion order; may still name entries that were taken already.
    order: VecDeque<(Instant, String)>,
}

impl KvStore {
    pub(crate) fn new() -> Self {
        Self::with_limits(KV_TTL, KV_CAPACITY)
    }

    pub(crate) fn with_limits(ttl: Duration, capacity: usize) -> Self {
        KvStore {
            ttl,
            capacity: capacity.max(1),
            inner: Mutex::new(KvInner::default()),
        }
    }

    pub(crate) fn insert(&self, entry: KvEntry) {
        let now = Instant::now();
        let mut inner = lock(&self.inner);
        inner.drop_expired(now, self.ttl);
        inner.make_room(self.capacity);
        inner.order.push_back((now, entry.request_id.clone()));
        inner.entries.insert(entry.request_id.clone(), (now, entry));
    }

    /// Removes and returns a live entry.
    pub(crate) fn take(&self, request_id: &str) -> Option<KvEntry> {
        let mut inner = lock(&self.inner);
        let (created, entry) = inner.entries.remove(request_id)?;
        (created.elapsed() < self.ttl).then_some(entry)
    }

    pub(crate) fn len(&self) -> usize {
        let mut inner = lock(&self.inner);
        inner.drop_expired(Instant::now(), self.ttl);
        inner.entries.len()
    }
}

impl KvInner {
    fn drop_expired(&mut self, now: Instant, ttl: Duration) {
        while let Some((created, id)) = self.order.front() {
            let expired = now.duration_since(*created) >= ttl;
            if !expired && self.entries.contains_key(id) {
                break;
            }
            if expired {
                self.entries.remove(id);
            }
            self.order.pop_front();
        }
    }

    fn make_room(&mut self, capacity: usize) {
        while self.entries.len() >= capacity {
            let Some((_, oldest)) = self.order.pop_front() else {
                break;
            };
            self.entries.remove(&oldest);
        }
    }
}

/// A hash of a prompt (`prompt` of a completion, `messages` of a chat) that does not
/// depend on object key order or formatting: xxh3 over a canonical walk of the value.
/// (xxh3 rather than a byte-at-a-time hash: benchmarks send 256 KB prompts, and the
/// workers must cost far less than the gateway they measure.)
pub fn prompt_hash(prompt: &Value) -> String {
    let mut hasher = PromptHasher(Xxh3Default::new());
    hasher.feed_value(prompt);
    format!("{:016x}", hasher.0.digest())
}

struct PromptHasher(Xxh3Default);

impl PromptHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn write_tagged(&mut self, tag: u8, bytes: &[u8]) {
        self.write(&[tag]);
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
    }

    fn feed_value(&mut self, value: &Value) {
        match value {
            Value::Null => self.write(b"n"),
            Value::Bool(flag) => self.write(if *flag { b"t" } else { b"f" }),
            Value::Number(number) => self.write_tagged(b'#', number.to_string().as_bytes()),
            Value::String(text) => self.write_tagged(b's', text.as_bytes()),
            Value::Array(items) => {
                self.write_tagged(b'a', &(items.len() as u64).to_le_bytes());
                items.iter().for_each(|item| self.feed_value(item));
            }
            Value::Object(map) => {
                self.write_tagged(b'o', &(map.len() as u64).to_le_bytes());
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                for key in keys {
                    self.write_tagged(b'k', key.as_bytes());
                    if let Some(item) = map.get(key) {
                        self.feed_value(item);
                    }
                }
            }
        }
    }
}

/// Takes entry `request_id` from the prefill simulator at `host:port`.
/// `Ok(None)` when that worker has no such entry (404).
pub(crate) async fn fetch_remote_kv(
    http: &reqwest::Client,
    host: &str,
    port: u16,
    request_id: &str,
) -> anyhow::Result<Option<KvEntry>> {
    let url = kv_url(host, port, request_id)?;
    let response = http.get(url).send().await.context("KV fetch failed")?;
    if response.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    let response = response
        .error_for_status()
        .context("KV fetch answered an error")?;
    let entry = response
        .json::<KvEntry>()
        .await
        .context("KV fetch returned an invalid entry")?;
    Ok(Some(entry))
}

fn kv_url(host: &str, port: u16, request_id: &str) -> anyhow::Result<reqwest::Url> {
    let authority = match host.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port).to_string(),
        Err(_) => format!("{host}:{port}"),
    };
    let mut url = reqwest::Url::parse(&format!("http://{authority}/"))
        .with_context(|| format!("invalid remote_host {host:?}"))?;
    url.path_segments_mut()
        .map_err(|()| anyhow::anyhow!("remote_host {host:?} does not make an HTTP URL"))?
        .extend(["sim", "kv", request_id]);
    Ok(url)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(id: &str) -> KvEntry {
        KvEntry {
            request_id: id.to_string(),
            prompt_hash: "h".to_string(),
            worker_id: 1,
            dp_rank: 0,
            engine_id: "sim-1-0".to_string(),
            prompt_tokens: 3,
        }
    }

    #[test]
    fn entry_is_taken_once() {
        let store = KvStore::new();
        store.insert(entry("a"));
        assert_eq!(store.take("a").unwrap().request_id, "a");
        assert!(store.take("a").is_none());
        assert!(store.take("missing").is_none());
    }

    #[test]
    fn entries_expire() {
        let store = KvStore::with_limits(Duration::from_millis(20), 10);
        store.insert(entry("a"));
        std::thread::sleep(Duration::from_millis(30));
        assert!(store.take("a").is_none());
        store.insert(entry("b"));
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn capacity_evicts_the_oldest() {
        let store = KvStore::with_limits(KV_TTL, 2);
        store.insert(entry("a"));
        store.insert(entry("b"));
        store.insert(entry("c"));
        assert_eq!(store.len(), 2);
        assert!(store.take("a").is_none());
        assert!(store.take("b").is_some());
        assert!(store.take("c").is_some());
    }

    #[test]
    fn prompt_hash_ignores_key_order_but_not_content() {
        let one = json!([{"role": "user", "content": "hi"}]);
        let same: Value = serde_json::from_str(r#"[{"content":"hi","role":"user"}]"#).unwrap();
        let other = json!([{"role": "user", "content": "ho"}]);
        assert_eq!(prompt_hash(&one), prompt_hash(&same));
        assert_ne!(prompt_hash(&one), prompt_hash(&other));
        assert_ne!(prompt_hash(&json!("1")), prompt_hash(&json!(1)));
    }

    #[test]
    fn kv_url_escapes_the_id_and_brackets_ipv6() {
        assert_eq!(
            kv_url("127.0.0.1", 8080, "a/b").unwrap().as_str(),
            "http://127.0.0.1:8080/sim/kv/a%2Fb"
        );
        assert_eq!(
            kv_url("::1", 81, "x").unwrap().as_str(),
            "http://[::1]:81/sim/kv/x"
        );
    }
}

//! State shared by all requests of one simulated worker.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use tokio::sync::watch;

use super::cache::PrefixCache;
use super::config::{Fault, MetricsFault, RecordedRequest, SimConfig};
use super::engine::Engine;
use super::kv::KvStore;
use super::load::{EngineLoad, LoadGuard};
use super::responses::ResponseStore;

/// The header vLLM reads to pick a data-parallel engine.
pub(crate) const DP_RANK_HEADER: &str = "x-data-parallel-rank";
const KV_FETCH_TIMEOUT: Duration = Duration::from_secs(2);

/// Locks a mutex, ignoring poisoning (the data stays usable for a simulator).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or(0)
}

/// The rank a completion request is served on, or the invalid rank it asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RankSelection {
    Rank(u32),
    OutOfRange(i64),
}

impl RankSelection {
    /// The rank reported in `x-sim-dp-rank` and `sim.dp_rank`.
    pub(crate) fn label(self) -> i64 {
        match self {
            RankSelection::Rank(rank) => i64::from(rank),
            RankSelection::OutOfRange(requested) => requested,
        }
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) kv_produced: AtomicU64,
    pub(crate) kv_loaded: AtomicU64,
    pub(crate) generated_tokens: AtomicU64,
    /// Prompt tokens this worker prefilled that its prefix cache held.
    pub(crate) cached_prompt_tokens: AtomicU64,
    /// Prompt tokens this worker computed.
    pub(crate) computed_prompt_tokens: AtomicU64,
    /// Requests a [`Fault::Hostile`](super::Fault) worker answered: which bad answer is next.
    pub(crate) hostile_answers: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

pub(crate) fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

pub(crate) struct SimState {
    pub(crate) config: SimConfig,
    /// Where other simulators reach this one (`remote_host` / `remote_port`).
    pub(crate) advertised: SocketAddr,
    pub(crate) kv: KvStore,
    pub(crate) counters: Counters,
    pub(crate) rank_requests: Vec<AtomicU64>,
    pub(crate) http: reqwest::Client,
    pub(crate) cache: Option<PrefixCache>,
    pub(crate) engine: Arc<Engine>,
    /// Completion requests being served (a stream until its last chunk).
    pub(crate) in_flight: Arc<AtomicU64>,
    /// The requests of each rank waiting for or running on its engine.
    pub(crate) load: Arc<EngineLoad>,
    /// Responses API responses kept with `store: true`.
    pub(crate) responses: Arc<ResponseStore>,
    recorded: Mutex<Vec<RecordedRequest>>,
    fault: Mutex<Fault>,
    metrics_fault: Mutex<MetricsFault>,
    next_rank: AtomicU32,
    next_id: AtomicU64,
    /// Distinguishes ids handed out by different runs of the same worker.
    epoch: u64,
    shutdown: watch::Receiver<bool>,
}

impl SimState {
    pub(crate) fn new(
        config: SimConfig,
        bound: SocketAddr,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(KV_FETCH_TIMEOUT)
            .timeout(KV_FETCH_TIMEOUT)
            .build()?;
        let rank_requests = (0..config.dp_size).map(|_| AtomicU64::new(0)).collect();
        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|t| t.as_micros() as u64)
            .unwrap_or(0);
        let cache = (config.cache_blocks > 0).then(|| PrefixCache::new(config.cache_blocks));
        Ok(SimState {
            cache,
            engine: Arc::new(Engine::new(config.step())),
            in_flight: Arc::default(),
            load: Arc::new(EngineLoad::new(config.dp_size, config.max_num_seqs)),
            responses: Arc::new(ResponseStore::new()),
            config,
            advertised: advertised_address(bound),
            kv: KvStore::new(),
            counters: Counters::default(),
            rank_requests,
            http,
            recorded: Mutex::new(Vec::new()),
            fault: Mutex::new(Fault::None),
            metrics_fault: Mutex::new(MetricsFault::None),
            next_rank: AtomicU32::new(0),
            next_id: AtomicU64::new(0),
            epoch,
            shutdown,
        })
    }

    pub(crate) fn record(&self, path: &str, headers: &HeaderMap, body: serde_json::Value) {
        let headers = headers
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_ascii_lowercase(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect();
        lock(&self.recorded).push(RecordedRequest {
            path: path.to_string(),
            headers,
            body,
        });
        bump(&self.counters.requests, 1);
    }

    pub(crate) fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.recorded).clone()
    }

    pub(crate) fn clear_requests(&self) {
        lock(&self.recorded).clear();
    }

    pub(crate) fn fault(&self) -> Fault {
        *lock(&self.fault)
    }

    pub(crate) fn set_fault(&self, fault: Fault) {
        log::info!("sim worker {}: fault set to {fault:?}", self.config.id);
        *lock(&self.fault) = fault;
    }

    pub(crate) fn metrics_fault(&self) -> MetricsFault {
        *lock(&self.metrics_fault)
    }

    pub(crate) fn set_metrics_fault(&self, fault: MetricsFault) {
        log::info!(
            "sim worker {}: metrics fault set to {fault:?}",
            self.config.id
        );
        *lock(&self.metrics_fault) = fault;
    }

    /// The fraction of the prefix cache's blocks in use (0 without a cache).
    /// The KV cache's size in blocks; none without a prefix cache.
    pub(crate) fn kv_capacity_blocks(&self) -> Option<usize> {
        self.cache.as_ref().map(PrefixCache::capacity)
    }

    /// vLLM's rule: a numeric `X-data-parallel-rank` must be in `[0, dp_size)`, a
    /// non-numeric one is ignored; without one, ranks take turns.
    pub(crate) fn select_rank(&self, headers: &HeaderMap) -> RankSelection {
        match requested_rank(headers) {
            Some(requested) => match u32::try_from(requested) {
                Ok(rank) if rank < self.config.dp_size => RankSelection::Rank(rank),
                _ => RankSelection::OutOfRange(requested),
            },
            None => RankSelection::Rank(
                self.next_rank.fetch_add(1, Ordering::Relaxed) % self.config.dp_size,
            ),
        }
    }

    /// The rank named by the header when it is valid, else 0 (for non-completion paths).
    pub(crate) fn header_rank_or_zero(&self, headers: &HeaderMap) -> u32 {
        requested_rank(headers)
            .and_then(|requested| u32::try_from(requested).ok())
            .filter(|rank| *rank < self.config.dp_size)
            .unwrap_or(0)
    }

    pub(crate) fn count_rank_request(&self, rank: u32) {
        if let Some(counter) = self.rank_requests.get(rank as usize) {
            bump(counter, 1);
        }
    }

    /// A fresh id, unique across runs of this worker.
    pub(crate) fn fresh_id(&self, kind: &str) -> (u64, String) {
        let sequence = self.next_id.fetch_add(1, Ordering::Relaxed);
        (
            sequence,
            format!("{kind}-sim{}-{:x}-{sequence}", self.config.id, self.epoch),
        )
    }

    /// Waits until the worker stops.
    pub(crate) async fn stopped(&self) {
        let mut shutdown = self.shutdown.clone();
        super::server::stop_requested(&mut shutdown).await;
    }
}

/// Counts one completion request in flight until dropped and, once it has a rank, in
/// that rank's engine load.
pub(crate) struct InFlight {
    counter: Arc<AtomicU64>,
    load: Option<LoadGuard>,
}

impl InFlight {
    pub(crate) fn start(state: &SimState) -> Self {
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            counter: state.in_flight.clone(),
            load: None,
        }
    }

    /// Served on `rank`: waiting for its engine until [`InFlight::run`].
    pub(crate) fn queue_on(&mut self, state: &SimState, rank: u32) {
        self.load = Some(state.load.arrive(rank));
    }

    /// Its compute starts: running on its rank rather than waiting, holding `blocks` of
    /// the KV cache.
    pub(crate) fn run(&mut self, blocks: usize) {
        if let Some(load) = &mut self.load {
            load.run(blocks as u64);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The rank a request asks for; `None` when the header is absent or not a number.
fn requested_rank(headers: &HeaderMap) -> Option<i64> {
    let text = headers.get(DP_RANK_HEADER)?.to_str().ok()?.trim();
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let overflow = if text.starts_with('-') {
        i64::MIN
    } else {
        i64::MAX
    };
    Some(text.parse::<i64>().unwrap_or(overflow))
}

fn advertised_address(bound: SocketAddr) -> SocketAddr {
    let ip = match bound.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, bound.port())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn with_rank(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(DP_RANK_HEADER, value.parse().unwrap());
        headers
    }

    #[test]
    fn requested_rank_follows_python_int() {
        assert_eq!(requested_rank(&with_rank("1")), Some(1));
        assert_eq!(requested_rank(&with_rank(" 2 ")), Some(2));
        assert_eq!(requested_rank(&with_rank("-1")), Some(-1));
        assert_eq!(requested_rank(&with_rank("abc")), None);
        assert_eq!(requested_rank(&with_rank("")), None);
        assert_eq!(
            requested_rank(&with_rank("99999999999999999999")),
            Some(i64::MAX)
        );
        assert_eq!(requested_rank(&HeaderMap::new()), None);
    }

    #[test]
    fn unspecified_bind_address_is_advertised_as_loopback() {
        let bound: SocketAddr = "0.0.0.0:8100".parse().unwrap();
        assert_eq!(advertised_address(bound), "127.0.0.1:8100".parse().unwrap());
        let bound: SocketAddr = "10.1.2.3:8100".parse().unwrap();
        assert_eq!(advertised_address(bound), bound);
    }
}

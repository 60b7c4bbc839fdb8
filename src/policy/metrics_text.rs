//! An engine's load read from its Prometheus metrics page (`docs/semantics.md` §5, "Load
//! as the engines report it"): vLLM's three gauges per data-parallel rank (`engine` label),
//! in one pass over the page, holding one figure per gauge and rank. A page of any size or
//! content costs time in its length and memory in the worker's rank count, never more.

use thiserror::Error;

/// Requests queued for the engine.
pub const WAITING: &str = "vllm:num_requests_waiting";
/// Requests in the engine's running batch.
pub const RUNNING: &str = "vllm:num_requests_running";
/// The share of the KV cache in use, 0 to 1.
pub const KV_USAGE: &str = "vllm:kv_cache_usage_perc";

/// The most requests one figure may count: a worker cannot make a sum overflow.
const MAX_REQUESTS: f64 = 1e9;
/// The most ranks read of one worker, whatever its `dp_size`.
pub const MAX_RANKS: u32 = 1024;

/// One data-parallel rank's load as its engine reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RankLoad {
    pub rank: u32,
    pub waiting: u64,
    pub running: u64,
    /// KV cache in use, in thousandths.
    pub kv_permille: u64,
}

impl RankLoad {
    /// Requests the rank holds, queued or running.
    pub fn requests(&self) -> u64 {
        self.waiting.saturating_add(self.running)
    }
}

/// Why a worker's figures were not taken; its last ones stay until they are stale.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ScrapeError {
    #[error("no answer ({0})")]
    NoAnswer(String),
    #[error("answered status {0}")]
    Status(String),
    #[error("the page's {bytes} bytes are over the limit of {limit}")]
    TooLarge { bytes: usize, limit: usize },
    #[error("the page has no {WAITING} or {RUNNING} sample for any rank below {ranks}")]
    NoFigures { ranks: u32 },
}

#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    waiting: Option<u64>,
    running: Option<u64>,
    kv_permille: Option<u64>,
}

/// The load of each of the worker's `ranks` ranks the page reports: a rank counts when it
/// has a waiting or running sample. The last sample of a gauge and rank wins; samples that
/// are not finite non-negative numbers, name a rank outside `0..ranks` (at most
/// [`MAX_RANKS`]) or are not UTF-8 (as the text format requires) are skipped.
pub fn parse(page: &[u8], ranks: u32) -> Result<Vec<RankLoad>, ScrapeError> {
    let ranks = ranks.min(MAX_RANKS);
    let mut seen = vec![Seen::default(); ranks as usize];
    for line in page.split(|b| *b == b'\n') {
        let Some((gauge, sample)) = gauge_of(line) else {
            continue;
        };
        if std::str::from_utf8(sample).is_err() {
            continue;
        }
        let Some((rank, value)) = read_sample(sample) else {
            continue;
        };
        let Some(slot) = seen.get_mut(rank as usize) else {
            continue;
        };
        match gauge {
            Gauge::Waiting => slot.waiting = Some(requests(value)),
            Gauge::Running => slot.running = Some(requests(value)),
            Gauge::KvUsage => slot.kv_permille = Some((value.min(1.0) * 1000.0).round() as u64),
        }
    }
    let loads: Vec<RankLoad> = (0u32..)
        .zip(seen)
        .filter(|(_, s)| s.waiting.is_some() || s.running.is_some())
        .map(|(rank, s)| RankLoad {
            rank,
            waiting: s.waiting.unwrap_or(0),
            running: s.running.unwrap_or(0),
            kv_permille: s.kv_permille.unwrap_or(0),
        })
        .collect();
    if loads.is_empty() {
        return Err(ScrapeError::NoFigures { ranks });
    }
    Ok(loads)
}

#[derive(Debug, Clone, Copy)]
enum Gauge {
    Waiting,
    Running,
    KvUsage,
}

/// The gauge a sample line is of, and the rest of it (labels and value).
fn gauge_of(line: &[u8]) -> Option<(Gauge, &[u8])> {
    [
        (WAITING, Gauge::Waiting),
        (RUNNING, Gauge::Running),
        (KV_USAGE, Gauge::KvUsage),
    ]
    .into_iter()
    .find_map(|(name, gauge)| {
        let rest = line.strip_prefix(name.as_bytes())?;
        matches!(rest.first(), Some(b'{' | b' ' | b'\t')).then_some((gauge, rest))
    })
}

/// The rank (`engine` label, 0 when absent) and value of a sample's labels and value.
fn read_sample(sample: &[u8]) -> Option<(u32, f64)> {
    let (rank, rest) = match sample.strip_prefix(b"{") {
        Some(labels) => {
            let (engine, rest) = engine_label(labels)?;
            (engine.map_or(Some(0), parse_rank)?, rest)
        }
        None => (0, sample),
    };
    let value = rest
        .split(|b| b.is_ascii_whitespace())
        .find(|t| !t.is_empty())?;
    let value: f64 = std::str::from_utf8(value).ok()?.parse().ok()?;
    (value.is_finite() && value >= 0.0).then_some((rank, value))
}

/// The raw value of the `engine` label (if any) of a label set, and what follows its `}`.
fn engine_label(labels: &[u8]) -> Option<(Option<&[u8]>, &[u8])> {
    let mut engine = None;
    let mut rest = labels;
    loop {
        rest = rest.trim_ascii_start();
        if let Some(after) = rest.strip_prefix(b"}") {
            return Some((engine, after));
        }
        let equals = rest.iter().position(|b| *b == b'=')?;
        let name = rest.get(..equals)?.trim_ascii();
        let quoted = rest
            .get(equals + 1..)?
            .trim_ascii_start()
            .strip_prefix(b"\"")?;
        let end = closing_quote(quoted)?;
        if name == b"engine" {
            engine = quoted.get(..end);
        }
        rest = quoted.get(end + 1..)?.trim_ascii_start();
        rest = rest.strip_prefix(b",").unwrap_or(rest);
    }
}

/// Where a label value's closing quote is, past its escapes.
fn closing_quote(value: &[u8]) -> Option<usize> {
    let mut escaped = false;
    for (at, byte) in value.iter().enumerate() {
        match (escaped, byte) {
            (true, _) => escaped = false,
            (false, b'\\') => escaped = true,
            (false, b'"') => return Some(at),
            _ => {}
        }
    }
    None
}

fn parse_rank(raw: &[u8]) -> Option<u32> {
    std::str::from_utf8(raw).ok()?.parse().ok()
}

fn requests(value: f64) -> u64 {
    value.min(MAX_REQUESTS).round() as u64
}

#[cfg(test)]
#[path = "tests/metrics_text.rs"]
mod tests;

//! What a load run measures: status classes and latency histograms (HDR, microseconds).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Longest latency the histograms hold exactly (longer ones are clamped to it).
const MAX_TRACKED_MICROS: u64 = 10 * 60 * 1_000_000;
const SIGNIFICANT_DIGITS: u8 = 3;

/// How a request ended, by HTTP status class or by transport failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusClass {
    /// 1xx as a final answer.
    Informational,
    /// 2xx.
    Success,
    /// 3xx.
    Redirection,
    /// 4xx.
    ClientError,
    /// 5xx.
    ServerError,
    /// No complete response: connect, send or body error.
    Transport,
    /// No response within the run's request timeout.
    Timeout,
}

impl StatusClass {
    pub fn of_status(status: u16) -> StatusClass {
        match status {
            100..=199 => StatusClass::Informational,
            200..=299 => StatusClass::Success,
            300..=399 => StatusClass::Redirection,
            400..=499 => StatusClass::ClientError,
            _ => StatusClass::ServerError,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StatusClass::Informational => "1xx",
            StatusClass::Success => "2xx",
            StatusClass::Redirection => "3xx",
            StatusClass::ClientError => "4xx",
            StatusClass::ServerError => "5xx",
            StatusClass::Transport => "transport",
            StatusClass::Timeout => "timeout",
        }
    }
}

impl fmt::Display for StatusClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A latency histogram in microseconds.
#[derive(Debug, Clone)]
pub struct Latencies {
    histogram: Histogram<u64>,
}

impl Default for Latencies {
    fn default() -> Self {
        Self::new()
    }
}

impl Latencies {
    pub fn new() -> Self {
        let histogram = Histogram::new_with_bounds(1, MAX_TRACKED_MICROS, SIGNIFICANT_DIGITS)
            .or_else(|_| Histogram::new(SIGNIFICANT_DIGITS))
            .unwrap_or_else(|_| fallback_histogram());
        Self { histogram }
    }

    pub fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.histogram
            .saturating_record(micros.clamp(1, MAX_TRACKED_MICROS));
    }

    pub fn add(&mut self, other: &Latencies) {
        if let Err(e) = self.histogram.add(&other.histogram) {
            log::warn!("merging latency histograms: {e}");
        }
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// Milliseconds at `quantile` (0.0..=1.0); 0 when empty.
    pub fn quantile_ms(&self, quantile: f64) -> f64 {
        micros_to_ms(self.histogram.value_at_quantile(quantile))
    }

    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            p50_ms: self.quantile_ms(0.50),
            p90_ms: self.quantile_ms(0.90),
            p99_ms: self.quantile_ms(0.99),
            max_ms: micros_to_ms(self.histogram.max()),
            mean_ms: self.histogram.mean() / 1000.0,
        }
    }
}

/// Never used in practice (the bounds above are valid): keeps the constructor total
/// without a panic path by trying ever coarser auto-resizing histograms.
fn fallback_histogram() -> Histogram<u64> {
    let mut digits = SIGNIFICANT_DIGITS;
    loop {
        if let Ok(histogram) = Histogram::new(digits) {
            return histogram;
        }
        digits = digits.saturating_sub(1).max(1);
    }
}

fn micros_to_ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

/// Percentiles of one latency, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

/// Requests counted by how they ended, and how many failed the workload's own check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcomes {
    pub total: u64,
    pub classes: BTreeMap<StatusClass, u64>,
    /// Requests whose outcome the workload did not expect (wrong class, bad body...).
    pub unexpected: u64,
}

impl Outcomes {
    pub fn record(&mut self, class: StatusClass, expected: bool) {
        self.total += 1;
        *self.classes.entry(class).or_default() += 1;
        if !expected {
            self.unexpected += 1;
        }
    }

    pub fn add(&mut self, other: &Outcomes) {
        self.total += other.total;
        self.unexpected += other.unexpected;
        for (class, count) in &other.classes {
            *self.classes.entry(*class).or_default() += count;
        }
    }

    pub fn count(&self, class: StatusClass) -> u64 {
        self.classes.get(&class).copied().unwrap_or(0)
    }
}

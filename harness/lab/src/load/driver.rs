//! The closed loop: `concurrency` virtual users, each sending its next request as soon as
//! the previous one ended, for a number of requests or a duration after a warm-up.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::client::{ClientTls, Connections, Exchange, TransportError};
use super::stats::{Latencies, LatencySummary, Outcomes, StatusClass};

/// Distinct problem descriptions kept per run.
const KEPT_PROBLEMS: usize = 10;

/// When a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// After this many requests completed (after the warm-up).
    Requests(u64),
    /// After this long (after the warm-up); requests still in flight then are not counted.
    Duration(Duration),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadSpec {
    pub concurrency: usize,
    pub stop: Stop,
    /// Requests completed in this first period are not counted (connections open, caches
    /// and allocators warm up).
    pub warmup: Duration,
    /// A request not finished in this long counts as [`StatusClass::Timeout`].
    pub request_timeout: Duration,
}

/// One virtual user: its identity and its keep-alive connections.
pub struct VirtualUser {
    pub id: usize,
    pub connections: Connections,
}

/// What one logical request (possibly several HTTP exchanges) produced.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The kind of request in a mix (`"completion"`, `"bad_pin"`...).
    pub label: &'static str,
    /// The class of the exchange that decided the outcome.
    pub class: StatusClass,
    /// From the start of the request to the first byte of the final response body.
    pub first_byte: Duration,
    /// From the start of the request to the end of the final response body.
    pub last_byte: Duration,
    /// Whether the workload got what it expected (class, headers, body).
    pub expected: bool,
    /// Why not, when `expected` is false.
    pub problem: Option<String>,
}

impl Sample {
    /// A sample for a finished exchange; `problem` is `None` when it is what was expected.
    pub fn from_exchange(
        label: &'static str,
        started: Instant,
        exchange: &Exchange,
        problem: Option<String>,
    ) -> Sample {
        Sample {
            label,
            class: StatusClass::of_status(exchange.status.as_u16()),
            first_byte: exchange
                .first_byte_or_end()
                .saturating_duration_since(started),
            last_byte: exchange.last_byte.saturating_duration_since(started),
            expected: problem.is_none(),
            problem,
        }
    }

    /// A sample for a request that got no complete response.
    pub fn transport_failure(
        label: &'static str,
        started: Instant,
        error: &TransportError,
    ) -> Sample {
        let elapsed = started.elapsed();
        Sample {
            label,
            class: StatusClass::Transport,
            first_byte: elapsed,
            last_byte: elapsed,
            expected: false,
            problem: Some(error.to_string()),
        }
    }

    fn timeout(label: &'static str, after: Duration) -> Sample {
        Sample {
            label,
            class: StatusClass::Timeout,
            first_byte: after,
            last_byte: after,
            expected: false,
            problem: Some(format!("no complete response within {after:?}")),
        }
    }
}

/// A request mix: what a virtual user sends as its `seq`-th request, and what it expects.
pub trait Workload: Send + Sync + 'static {
    fn call(&self, user: &mut VirtualUser, seq: u64) -> impl Future<Output = Sample> + Send;

    /// The label of the `seq`-th request (used when it times out).
    fn label(&self, _seq: u64) -> &'static str {
        "request"
    }

    /// TLS on every connection of every virtual user; `None`: clear text.
    fn client_tls(&self) -> Option<ClientTls> {
        None
    }
}

/// Everything measured in one run. Latencies are of expected requests only.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub concurrency: usize,
    /// The measured period (after the warm-up).
    pub elapsed: Duration,
    pub outcomes: Outcomes,
    pub by_label: BTreeMap<&'static str, Outcomes>,
    pub first_byte: Latencies,
    pub last_byte: Latencies,
    /// The first distinct problems of unexpected requests.
    pub problems: Vec<String>,
    pub connections_opened: u64,
}

impl LoadReport {
    /// Completed requests per second over the measured period.
    pub fn throughput(&self) -> f64 {
        match self.elapsed.as_secs_f64() {
            secs if secs > 0.0 => self.outcomes.total as f64 / secs,
            _ => 0.0,
        }
    }

    pub fn first_byte_summary(&self) -> LatencySummary {
        self.first_byte.summary()
    }

    pub fn last_byte_summary(&self) -> LatencySummary {
        self.last_byte.summary()
    }

    fn merge(&mut self, recorder: Recorder) {
        self.outcomes.add(&recorder.outcomes);
        for (label, outcomes) in &recorder.by_label {
            self.by_label.entry(label).or_default().add(outcomes);
        }
        self.first_byte.add(&recorder.first_byte);
        self.last_byte.add(&recorder.last_byte);
        for problem in recorder.problems {
            if self.problems.len() < KEPT_PROBLEMS && !self.problems.contains(&problem) {
                self.problems.push(problem);
            }
        }
        self.connections_opened += recorder.connections_opened;
    }
}

/// Runs `workload` with `spec.concurrency` virtual users on the current tokio runtime.
pub async fn run_load<W: Workload>(workload: Arc<W>, spec: &LoadSpec) -> LoadReport {
    let window = Arc::new(Window::new(spec));
    let users = (0..spec.concurrency.max(1)).map(|id| {
        let (workload, window, timeout) = (workload.clone(), window.clone(), spec.request_timeout);
        tokio::spawn(async move { run_user(&*workload, id, &window, timeout).await })
    });
    let handles: Vec<_> = users.collect();
    let mut report = LoadReport {
        concurrency: spec.concurrency.max(1),
        ..LoadReport::default()
    };
    for handle in handles {
        match handle.await {
            Ok(recorder) => report.merge(recorder),
            Err(e) => log::error!("a virtual user task failed: {e}"),
        }
    }
    report.elapsed = window.measured();
    report
}

/// The measured period, shared by the virtual users.
struct Window {
    begin: Instant,
    measure_from: Instant,
    stop: Stop,
    counted: AtomicU64,
    /// Nanoseconds from `measure_from` to the last counted completion (request-count runs).
    last_counted_nanos: AtomicU64,
    done: AtomicBool,
}

impl Window {
    fn new(spec: &LoadSpec) -> Self {
        let begin = Instant::now();
        Window {
            begin,
            measure_from: begin + spec.warmup,
            stop: spec.stop,
            counted: AtomicU64::new(0),
            last_counted_nanos: AtomicU64::new(0),
            done: AtomicBool::new(false),
        }
    }

    /// Whether a new request may start.
    fn open(&self) -> bool {
        match self.stop {
            Stop::Duration(length) => {
                self.begin.elapsed() < self.measure_from.duration_since(self.begin) + length
            }
            Stop::Requests(_) => !self.done.load(Ordering::Relaxed),
        }
    }

    /// Whether a request completed `at` is counted.
    fn counts(&self, at: Instant) -> bool {
        if at < self.measure_from {
            return false;
        }
        match self.stop {
            Stop::Duration(length) => at <= self.measure_from + length,
            Stop::Requests(wanted) => {
                let index = self.counted.fetch_add(1, Ordering::Relaxed);
                if index + 1 >= wanted {
                    self.done.store(true, Ordering::Relaxed);
                }
                if index < wanted {
                    let nanos = u64::try_from(at.duration_since(self.measure_from).as_nanos())
                        .unwrap_or(u64::MAX);
                    self.last_counted_nanos.fetch_max(nanos, Ordering::Relaxed);
                }
                index < wanted
            }
        }
    }

    fn measured(&self) -> Duration {
        match self.stop {
            Stop::Duration(length) => length,
            Stop::Requests(_) => {
                Duration::from_nanos(self.last_counted_nanos.load(Ordering::Relaxed))
            }
        }
    }
}

/// One virtual user's measurements, merged into the report at the end.
#[derive(Default)]
struct Recorder {
    outcomes: Outcomes,
    by_label: BTreeMap<&'static str, Outcomes>,
    first_byte: Latencies,
    last_byte: Latencies,
    problems: Vec<String>,
    connections_opened: u64,
}

impl Recorder {
    fn record(&mut self, sample: Sample) {
        self.outcomes.record(sample.class, sample.expected);
        self.by_label
            .entry(sample.label)
            .or_default()
            .record(sample.class, sample.expected);
        if sample.expected {
            self.first_byte.record(sample.first_byte);
            self.last_byte.record(sample.last_byte);
        }
        if let Some(problem) = sample.problem
            && self.problems.len() < KEPT_PROBLEMS
            && !self.problems.contains(&problem)
        {
            self.problems.push(problem);
        }
    }
}

async fn run_user<W: Workload>(
    workload: &W,
    id: usize,
    window: &Window,
    timeout: Duration,
) -> Recorder {
    let mut user = VirtualUser {
        id,
        connections: Connections::new(workload.client_tls()),
    };
    let mut recorder = Recorder::default();
    let mut seq = 0u64;
    while window.open() {
        let sample = match tokio::time::timeout(timeout, workload.call(&mut user, seq)).await {
            Ok(sample) => sample,
            Err(_) => {
                user.connections.reset();
                Sample::timeout(workload.label(seq), timeout)
            }
        };
        if window.counts(Instant::now()) {
            recorder.record(sample);
        }
        seq += 1;
    }
    recorder.connections_opened = user.connections.opened;
    recorder
}

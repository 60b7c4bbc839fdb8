//! A reusable closed-loop HTTP load generator.
//!
//! `concurrency` virtual users each send their next request as soon as the previous one
//! ended (closed loop), for a fixed number of requests or a duration after a warm-up. A
//! [`Workload`] decides what the `seq`-th request of a user is — one HTTP exchange or
//! several (the benchmark's "floor" sends the prefill and then the decode hop itself) —
//! and whether its outcome is what it expected. The driver records, per request, the
//! latency to the first and to the last byte of the final response body in HDR
//! histograms (microsecond resolution), the status class (2xx, 4xx, 5xx, transport,
//! timeout) overall and per request label, and keeps the first distinct problems.
//!
//! Each virtual user owns one keep-alive HTTP/1.1 connection per server ([`Connections`]),
//! so the generator adds no pool contention of its own; request bodies are shared
//! [`bytes::Bytes`] chunks ([`ChunkedBody`]), so a 256 KB prompt is never copied.
//!
//! ```no_run
//! # async fn demo() {
//! use std::{sync::Arc, time::{Duration, Instant}};
//! use pinroute_lab::load::*;
//!
//! struct Health(std::net::SocketAddr);
//! impl Workload for Health {
//!     async fn call(&self, user: &mut VirtualUser, _seq: u64) -> Sample {
//!         let started = Instant::now();
//!         let request = http::Request::get("/health").header("host", "sim")
//!             .body(ChunkedBody::empty()).unwrap_or_default();
//!         match user.connections.exchange(self.0, request).await {
//!             Ok(exchange) => {
//!                 let problem = (!exchange.status.is_success()).then(|| format!("{}", exchange.status));
//!                 Sample::from_exchange("health", started, &exchange, problem)
//!             }
//!             Err(error) => Sample::transport_failure("health", started, &error),
//!         }
//!     }
//! }
//! let spec = LoadSpec { concurrency: 16, stop: Stop::Duration(Duration::from_secs(5)),
//!                       warmup: Duration::from_secs(1), request_timeout: Duration::from_secs(10) };
//! let report = run_load(Arc::new(Health("127.0.0.1:8000".parse().unwrap())), &spec).await;
//! println!("{:.0} req/s, p99 {} ms", report.throughput(), report.last_byte_summary().p99_ms);
//! # }
//! ```

mod body;
mod client;
mod driver;
mod stats;

#[cfg(test)]
mod tests;

pub use body::ChunkedBody;
pub use client::{
    ClientTls, Connections, Exchange, FailedExchange, KEPT_BODY_BYTES, TAIL_BYTES, TransportError,
};
pub use driver::{LoadReport, LoadSpec, Sample, Stop, VirtualUser, Workload, run_load};
pub use stats::{Latencies, LatencySummary, Outcomes, StatusClass};

//! Watching Envoy during the soak: its memory (RSS from `/proc`, and its allocator's own
//! stats), the wasm VM failure stats, and error lines in its log.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use super::chaos::Progress;
pub use pinroute_harness::envoy::vm::{
    VM_ACTIVE, VM_CREATED, VM_FAILURE_COUNTERS, VM_FAILURE_MARKERS,
};
use pinroute_harness::envoy::{Envoy, admin_stat};

/// Counters that show what the faults set in motion (retries, fallbacks, passive health).
pub const CONTEXT_COUNTERS: [&str; 15] = [
    "cluster.pinroute_decode_pool.upstream_rq_retry",
    "cluster.pinroute_decode_pool.upstream_rq_retry_success",
    "cluster.pinroute_decode_pool.upstream_rq_retry_overflow",
    "cluster.pinroute_decode_pool.upstream_cx_connect_fail",
    "cluster.pinroute_decode.upstream_cx_connect_fail",
    "cluster.pinroute_prefill.upstream_cx_connect_fail",
    "wasmcustom.pinroute.prefill.retried",
    "wasmcustom.pinroute.prefill.aggregated_fallback",
    "wasmcustom.pinroute.workers.connect_failed",
    "wasmcustom.pinroute.workers.marked_unhealthy",
    "wasmcustom.pinroute.workers.panic_prefill",
    "wasmcustom.pinroute.workers.panic_decode",
    "wasmcustom.pinroute.decode.failed",
    SCRAPED,
    "wasmcustom.pinroute.engine.scrape_failed",
];
/// Workers' metrics pages the gateway read for the engines' load.
pub const SCRAPED: &str = "wasmcustom.pinroute.engine.scraped";
/// Requests Envoy still has open: downstream, and upstream on each of pinroute's clusters
/// (the prefill hops are the filter's calls).
const OPEN_REQUESTS: [&str; 4] = [
    "http.pinroute.downstream_rq_active",
    "cluster.pinroute_prefill.upstream_rq_active",
    "cluster.pinroute_decode.upstream_rq_active",
    "cluster.pinroute_decode_pool.upstream_rq_active",
];
/// The filter's VMs' linear memory, summed (`docs/metrics.md`).
const VM_MEMORY: &str = "wasmcustom.pinroute.vm.memory_bytes";
const MEMORY_ALLOCATED: &str = "server.memory_allocated";
const MEMORY_HEAP: &str = "server.memory_heap_size";
const RSS_POLL: Duration = Duration::from_millis(100);
const OPEN_POLL: Duration = Duration::from_millis(250);
/// RSS is called warm once this fraction of the requests has been sent.
const WARM_FRACTION: f64 = 0.1;

/// The Envoy stats the report compares from start to end.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EnvoyStats {
    pub vm_failure_counters: Vec<(String, u64)>,
    pub vm_created: u64,
    pub vm_active: u64,
    pub memory_allocated: u64,
    pub memory_heap_size: u64,
    /// [`CONTEXT_COUNTERS`] (0 when Envoy has not created the stat yet).
    pub context: Vec<(String, u64)>,
    /// Requests open in Envoy ([`OPEN_REQUESTS`]): after the soak, ones left hanging.
    pub open_requests: u64,
    pub vm_memory_bytes: u64,
}

impl EnvoyStats {
    /// Envoy's stats now; with `wasm`, the wasm VMs' too (a missing one is an error), else
    /// (the native module: no VM) those read 0.
    pub async fn read(envoy: &Envoy, wasm: bool) -> Result<EnvoyStats> {
        let vm_stat = async |name| match wasm {
            true => stat(envoy, name).await,
            false => Ok(0),
        };
        let mut counters = Vec::new();
        for name in VM_FAILURE_COUNTERS {
            counters.push((name.to_string(), vm_stat(name).await?));
        }
        let mut context = Vec::new();
        for name in CONTEXT_COUNTERS {
            context.push((name.to_string(), stat_or_zero(envoy, name).await?));
        }
        Ok(EnvoyStats {
            context,
            open_requests: open_requests(envoy).await?,
            vm_memory_bytes: stat_or_zero(envoy, VM_MEMORY).await?,
            vm_failure_counters: counters,
            vm_created: vm_stat(VM_CREATED).await?,
            vm_active: vm_stat(VM_ACTIVE).await?,
            memory_allocated: stat(envoy, MEMORY_ALLOCATED).await?,
            memory_heap_size: stat(envoy, MEMORY_HEAP).await?,
        })
    }

    /// VM failures between `self` (start) and `end`: reload counters, plus VMs created or
    /// lost since the start.
    pub fn vm_failures_until(&self, end: &EnvoyStats) -> u64 {
        let sum = |stats: &EnvoyStats| {
            stats
                .vm_failure_counters
                .iter()
                .map(|(_, value)| value)
                .sum::<u64>()
        };
        let reloads = sum(end).saturating_sub(sum(self));
        let created = end.vm_created.saturating_sub(self.vm_created);
        let lost = self.vm_active.abs_diff(end.vm_active);
        reloads + created + lost
    }
}

/// How much each context counter grew from `start` to `end`.
pub fn context_growth(start: &EnvoyStats, end: &EnvoyStats) -> Vec<(String, u64)> {
    end.context
        .iter()
        .map(|(name, value)| {
            let before = start
                .context
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0, |(_, v)| *v);
            (name.clone(), value.saturating_sub(before))
        })
        .collect()
}

/// Requests Envoy has open now ([`OPEN_REQUESTS`], summed).
async fn open_requests(envoy: &Envoy) -> Result<u64> {
    let mut open = 0;
    for name in OPEN_REQUESTS {
        open += stat_or_zero(envoy, name).await?;
    }
    Ok(open)
}

/// Waits until Envoy has no request open, for at most `limit`: a request still waiting on a
/// worker within its own timeout is slow, not left hanging. Returns how many were open when
/// the wait began and how long they took to end (`None`: some were open at `limit`).
pub async fn wait_for_open_requests(
    envoy: &Envoy,
    limit: Duration,
) -> Result<(u64, Option<Duration>)> {
    let started = std::time::Instant::now();
    let open_at_start = open_requests(envoy).await?;
    let mut open = open_at_start;
    while open > 0 {
        if started.elapsed() >= limit {
            return Ok((open_at_start, None));
        }
        tokio::time::sleep(OPEN_POLL).await;
        open = open_requests(envoy).await?;
    }
    Ok((open_at_start, Some(started.elapsed())))
}

/// A stat Envoy may not have created yet (0 then).
async fn stat_or_zero(envoy: &Envoy, name: &str) -> Result<u64> {
    let value = envoy
        .stat(name)
        .await
        .with_context(|| format!("reading Envoy stat {name}"))?;
    Ok(value.unwrap_or(0))
}

async fn stat(envoy: &Envoy, name: &str) -> Result<u64> {
    let value = envoy
        .stat(name)
        .await
        .with_context(|| format!("reading Envoy stat {name}"))?;
    value.with_context(|| format!("Envoy has no stat {name}"))
}

/// Envoy's resident memory over the run, in KiB.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct RssKib {
    pub start: u64,
    /// Once a tenth of the requests was sent: connections open, allocator warm.
    pub warm: u64,
    pub peak: u64,
    pub end: u64,
    /// The filter's VM memory (`pinroute.vm.memory_bytes`) at `warm`, in bytes.
    pub vm_warm_bytes: u64,
}

/// `VmRSS` of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .with_context(|| format!("no VmRSS in {path}"))?;
    let kib = line
        .split_whitespace()
        .nth(1)
        .and_then(|value| value.parse().ok());
    kib.with_context(|| format!("unreadable {line:?} in {path}"))
}

/// Samples the RSS of Envoy (`pid`) until the load is done, and the filter's VM memory
/// once warm.
pub async fn watch_rss(
    admin: SocketAddr,
    pid: u32,
    progress: &Progress,
    total: u64,
) -> Result<RssKib> {
    let start = rss_kib(pid)?;
    let mut rss = RssKib {
        start,
        warm: 0,
        peak: start,
        end: start,
        vm_warm_bytes: 0,
    };
    let warm_after = (total as f64 * WARM_FRACTION) as u64;
    while !progress.is_done() {
        tokio::time::sleep(RSS_POLL).await;
        let now = rss_kib(pid)?;
        rss.peak = rss.peak.max(now);
        if rss.warm == 0 && progress.sent() >= warm_after {
            rss.warm = now;
            rss.vm_warm_bytes = admin_stat(admin, VM_MEMORY).await?.unwrap_or(0);
        }
    }
    rss.end = rss_kib(pid)?;
    rss.peak = rss.peak.max(rss.end);
    if rss.warm == 0 {
        rss.warm = rss.end;
    }
    Ok(rss)
}

/// Error lines of Envoy's log, and those that tell of a wasm VM failure.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LogScan {
    pub error_lines: u64,
    pub vm_failure_lines: u64,
    /// The first error lines, for the report.
    pub first_errors: Vec<String>,
}

const KEPT_LOG_LINES: usize = 10;

pub fn scan_log(path: &Path) -> Result<LogScan> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut scan = LogScan::default();
    for line in text
        .lines()
        .filter(|line| line.contains("[error]") || line.contains("[critical]"))
    {
        scan.error_lines += 1;
        if VM_FAILURE_MARKERS
            .iter()
            .any(|marker| line.contains(marker))
        {
            scan.vm_failure_lines += 1;
        }
        if scan.first_errors.len() < KEPT_LOG_LINES {
            scan.first_errors.push(line.chars().take(400).collect());
        }
    }
    Ok(scan)
}

/// Envoy's response flags by request id, from the access log (JSON lines with `flags` and
/// `request_id`).
pub fn access_log_flags(path: &Path) -> Result<HashMap<String, String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text.lines().filter_map(flags_of_line).collect())
}

fn flags_of_line(line: &str) -> Option<(String, String)> {
    let entry: serde_json::Value = serde_json::from_str(line).ok()?;
    let text = |field: &str| entry.get(field)?.as_str().map(str::to_string);
    Some((text("request_id")?, text("flags")?))
}

//! Load as the engines report it (`docs/semantics.md` §5): every worker's metrics page
//! scraped on a period by one thread at a time, the figures shared with every thread, and
//! each thread's copy read by its requests without a host call.

use std::rc::Rc;

use super::host::Host;
use super::metrics::{Counter, Metrics};
use super::shared;
use crate::policy::config::Config;
use crate::policy::engine_load::{EngineLoadSource, EngineReport, EngineTable};
use crate::policy::metrics_text::{self, ScrapeError};
use crate::policy::registry::{Worker, WorkerId};

/// When the next scrape round is due (u64 LE nanoseconds): the thread that moves it forward
/// scrapes.
const LEASE_KEY: &str = "pinroute.engine.next_scrape";

/// A worker's scrape in flight.
struct Scrape {
    token: u32,
    worker: WorkerId,
    ranks: u32,
    /// This gateway's requests in flight to the worker when the scrape was sent.
    sent: u64,
}

/// This thread's side: the round it has in flight, and the shared table as it last read it.
#[derive(Default)]
pub struct EngineScraper {
    in_flight: Vec<Scrape>,
    answered: Vec<EngineReport>,
    table: Rc<EngineTable>,
    version: Option<u32>,
}

impl EngineScraper {
    /// The figures a new request reads.
    pub fn table(&self) -> Rc<EngineTable> {
        self.table.clone()
    }

    /// Takes the table another thread wrote, and starts a round when this thread's turn
    /// has come.
    pub fn tick(&mut self, host: &impl Host, config: &Config, source: &EngineLoadSource) {
        self.adopt_shared(host);
        if self.in_flight.is_empty()
            && host.polls_sources()
            && shared::claim_period(host, LEASE_KEY, source.period())
        {
            self.start_round(host, config, source);
        }
    }

    /// Takes the table another thread wrote, if newer than this thread's.
    pub fn adopt_shared(&mut self, host: &impl Host) {
        if let Some((table, version)) = shared::engine_table(host, self.version) {
            self.table = Rc::new(table);
            self.version = Some(version);
        }
    }

    fn start_round(&mut self, host: &impl Host, config: &Config, source: &EngineLoadSource) {
        let loads = shared::loads(host);
        let cluster = source.cluster(&config.settings.prefill_cluster);
        for worker in config.registry.workers() {
            if let Some(token) = dispatch(host, cluster, source, worker) {
                self.in_flight.push(Scrape {
                    token,
                    worker: worker.id,
                    ranks: worker.dp_size,
                    sent: loads.outstanding(worker.id),
                });
            }
        }
        self.finish_if_answered(host, config);
    }

    /// The answer of call `token`, if it is one of this thread's scrapes (true).
    pub fn on_answer(
        &mut self,
        host: &impl Host,
        token: u32,
        body_size: usize,
        config: &Config,
        metrics: &Metrics,
    ) -> bool {
        let Some(at) = self.in_flight.iter().position(|s| s.token == token) else {
            return false;
        };
        let scrape = self.in_flight.swap_remove(at);
        let Some(source) = &config.settings.engine_load else {
            return true;
        };
        match read_answer(host, body_size, source.max_bytes, scrape.ranks) {
            Ok(ranks) => {
                metrics.count(host, Counter::EngineScraped);
                self.answered.push(EngineReport {
                    worker: scrape.worker,
                    scraped_at: host.now_nanos(),
                    sent: scrape.sent,
                    ranks,
                    average_milli: 0,
                });
            }
            Err(why) => {
                metrics.count(host, Counter::EngineScrapeFailed);
                log::warn!(
                    "pinroute: the engine load of worker {} was not read: {why}",
                    scrape.worker
                );
            }
        }
        self.finish_if_answered(host, config);
        true
    }

    /// Shares the round's reports once every scrape of it has its answer. This thread takes
    /// them at its next look, like every other thread (`docs/semantics.md` §5).
    fn finish_if_answered(&mut self, host: &impl Host, config: &Config) {
        if !self.in_flight.is_empty() || self.answered.is_empty() {
            return;
        }
        let reports = std::mem::take(&mut self.answered);
        let listed = |id| config.registry.get(id).is_some();
        let source = config.settings.engine_load.as_ref();
        let stale_nanos = source.map_or(0, |s| s.rule().stale_nanos);
        if let Err(status) = shared::merge_engine_reports(host, reports, listed, stale_nanos) {
            log::warn!("pinroute: the engines' load not shared: {status:?}");
        }
    }
}

fn dispatch(
    host: &impl Host,
    cluster: &str,
    source: &EngineLoadSource,
    worker: &Worker,
) -> Option<u32> {
    let address = worker.address.to_string();
    let headers = [
        (":method", "GET"),
        (":path", source.path.as_str()),
        (":authority", address.as_str()),
        ("x-envoy-original-dst-host", address.as_str()),
        ("accept-encoding", "identity"),
    ];
    host.dispatch(cluster, &headers, None, source.timeout())
        .map_err(|status| {
            log::warn!(
                "pinroute: cannot scrape worker {} through cluster {cluster:?}: {status:?}",
                worker.id
            );
        })
        .ok()
}

/// A scrape's answer read as the worker's ranks' load, never more than `max_bytes` of it.
fn read_answer(
    host: &impl Host,
    body_size: usize,
    max_bytes: usize,
    ranks: u32,
) -> Result<Vec<metrics_text::RankLoad>, ScrapeError> {
    let headers = host
        .call_response_headers()
        .map_err(|s| ScrapeError::NoAnswer(format!("{s:?}")))?;
    let status = headers
        .get(":status")
        .map(|v| String::from_utf8_lossy(v).into_owned());
    match status.as_deref() {
        Some("200") => {}
        Some(other) => return Err(ScrapeError::Status(other.into())),
        None => return Err(ScrapeError::NoAnswer("no status".into())),
    }
    if body_size > max_bytes {
        return Err(ScrapeError::TooLarge {
            bytes: body_size,
            limit: max_bytes,
        });
    }
    let page = host
        .call_response_body(body_size)
        .map_err(|s| ScrapeError::NoAnswer(format!("unreadable body ({s:?})")))?;
    metrics_text::parse(&page, ranks)
}

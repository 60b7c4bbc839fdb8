//! An engine's metrics page (docs/semantics.md §5, "Load as the engines report it"): bytes a
//! worker writes, read by the filter's scraper.
//!
//! Input: four bytes of the worker's rank count (u32 LE), then the page.
//!
//! Properties:
//! - the figures name distinct ranks in increasing order, fewer than the worker's rank count
//!   and than `MAX_RANKS`; counts are at most 10^9 and KV use at most 1000 ‰;
//! - a well-formed sample appended to any page sets its gauge of its rank, whatever came
//!   before (the last sample wins, and no byte before a newline can swallow the next line);
//! - a worker's report survives the shared table's encoding unchanged.

use pinroute::policy::engine_load::{EngineReport, EngineTable};
use pinroute::policy::metrics_text::{self, MAX_RANKS};

use crate::violated;

pub fn check(data: &[u8]) {
    let (count, page) = data.split_at(data.len().min(4));
    let mut word = [0u8; 4];
    for (slot, byte) in word.iter_mut().zip(count) {
        *slot = *byte;
    }
    let ranks = u32::from_le_bytes(word) % 2048;
    let read = metrics_text::parse(page, ranks);
    if let Ok(loads) = &read {
        check_bounds(loads, ranks);
        check_encoding(loads);
    }
    if ranks == 0 {
        if read.is_ok() {
            violated("a worker without ranks has figures");
        }
        return;
    }
    let rank = (ranks - 1).min(MAX_RANKS - 1);
    let mut appended = page.to_vec();
    appended.extend_from_slice(
        format!("\nvllm:num_requests_waiting{{engine=\"{rank}\",model_name=\"m\"}} 7\n").as_bytes(),
    );
    let Ok(loads) = metrics_text::parse(&appended, ranks) else {
        violated(format!("a well-formed sample of rank {rank} was not read"));
    };
    match loads.iter().find(|l| l.rank == rank) {
        Some(load) if load.waiting == 7 => {}
        other => violated(format!(
            "rank {rank} read as {other:?} after the appended sample"
        )),
    }
}

fn check_bounds(loads: &[metrics_text::RankLoad], ranks: u32) {
    let limit = ranks.min(MAX_RANKS);
    if loads
        .windows(2)
        .any(|w| matches!(w, [a, b] if a.rank >= b.rank))
    {
        violated(format!("ranks out of order: {loads:?}"));
    }
    for load in loads {
        if load.rank >= limit || load.waiting > 1_000_000_000 || load.running > 1_000_000_000 {
            violated(format!("{load:?} out of bounds for {ranks} ranks"));
        }
        if load.kv_permille > 1000 {
            violated(format!("{load:?}: KV use over 1000 ‰"));
        }
    }
}

fn check_encoding(loads: &[metrics_text::RankLoad]) {
    let mut table = EngineTable::default();
    let report = EngineReport {
        worker: 42,
        scraped_at: 7,
        sent: 3,
        ranks: loads.to_vec(),
        average_milli: 0,
    };
    table.merge(vec![report.clone()], |_| true, 0);
    let merged = table.report(42);
    let back = EngineTable::decode(&table.encode());
    if merged.map(|r| &r.ranks) != Some(&report.ranks) || back.report(42) != merged {
        violated(format!("{report:?} read back as {:?}", back.report(42)));
    }
}

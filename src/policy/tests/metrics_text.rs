#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;
use crate::policy::testing::test;

/// A page as vLLM 0.32 prints it for a worker with two data-parallel ranks.
const TWO_RANKS: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 0.0
# HELP vllm:num_requests_waiting_by_reason Requests waiting, by reason.
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 50.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.9875
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 1234.0
"#;

fn load(rank: u32, waiting: u64, running: u64, kv_permille: u64) -> RankLoad {
    RankLoad {
        rank,
        waiting,
        running,
        kv_permille,
    }
}

#[test]
fn each_rank_reads_its_own_three_gauges_and_nothing_else() {
    assert_eq!(
        parse(TWO_RANKS.as_bytes(), 2).unwrap(),
        vec![load(0, 2, 3, 250), load(1, 0, 1, 988)]
    );
}

#[test]
fn ranks_outside_the_worker_are_skipped() {
    assert_eq!(
        parse(TWO_RANKS.as_bytes(), 1).unwrap(),
        vec![load(0, 2, 3, 250)]
    );
    let wild = "vllm:num_requests_waiting{engine=\"99999999999\"} 5\nvllm:num_requests_waiting{engine=\"-1\"} 5\n";
    assert_eq!(
        parse(wild.as_bytes(), u32::MAX),
        Err(ScrapeError::NoFigures { ranks: MAX_RANKS })
    );
}

#[test]
fn a_page_without_the_engine_label_is_rank_0_and_timestamps_are_ignored() {
    let page = "vllm:num_requests_running 4 1700000000000\nvllm:num_requests_waiting\t1e0\n";
    assert_eq!(parse(page.as_bytes(), 1).unwrap(), vec![load(0, 1, 4, 0)]);
}

#[test]
fn labels_with_escapes_commas_and_braces_are_read_whole() {
    let page = r#"vllm:num_requests_waiting{model_name="a \"}\" b, engine=\"7\"",engine="1"} 6.0"#;
    assert_eq!(parse(page.as_bytes(), 2).unwrap(), vec![load(1, 6, 0, 0)]);
}

#[test]
fn values_that_are_not_finite_non_negative_numbers_are_skipped() {
    for value in ["NaN", "+Inf", "-1", "", "abc", "1e400"] {
        let page = format!(
            "vllm:num_requests_waiting{{engine=\"0\"}} {value}\nvllm:num_requests_running{{engine=\"0\"}} 2\n"
        );
        assert_eq!(
            parse(page.as_bytes(), 1).unwrap(),
            vec![load(0, 0, 2, 0)],
            "{value:?}"
        );
    }
}

#[test]
fn huge_figures_are_capped_and_kv_use_is_at_most_all_of_it() {
    let page = "vllm:num_requests_waiting 1e300\nvllm:num_requests_running 1e300\nvllm:kv_cache_usage_perc 7\n";
    let [rank] = parse(page.as_bytes(), 1).unwrap()[..] else {
        panic!("one rank")
    };
    assert_eq!((rank.waiting, rank.kv_permille), (1_000_000_000, 1000));
    assert_eq!(rank.requests(), 2_000_000_000);
}

#[test]
fn garbage_is_no_figures() {
    let mut page: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
    page.extend_from_slice(b"\nvllm:num_requests_waiting{engine=\"0\"\nvllm:num_requests_running{");
    page.extend(std::iter::repeat_n(b'x', 10_000));
    page.extend_from_slice(
        b"\nvllm:num_requests_running{engine=\"0\",model_name=\"\xff\xfe\"} 1.0\n",
    );
    assert_eq!(parse(&page, 4), Err(ScrapeError::NoFigures { ranks: 4 }));
    assert_eq!(parse(b"", 1), Err(ScrapeError::NoFigures { ranks: 1 }));
}

#[test]
fn the_last_sample_of_a_gauge_and_rank_wins() {
    let page = "vllm:num_requests_waiting 5\nvllm:num_requests_waiting 1\n".repeat(1000);
    assert_eq!(parse(page.as_bytes(), 1).unwrap(), vec![load(0, 1, 0, 0)]);
}

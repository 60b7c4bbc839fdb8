//! `pinroute-lab`: the measurements, apart from `pinroute-harness` so that its `up` builds
//! none of their dependencies; each subcommand lives in `commands/<name>.rs` as an `Args`
//! struct and a `run` function.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "pinroute-lab", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmark pinroute against the floor, Envoy alone and a Python proxy (docs/benchmarks.md).
    Bench(commands::bench::Args),
    /// Soak: many requests with pins, sessions, streams and bad input while workers are killed (docs/soak.md).
    Soak(commands::soak::Args),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let command = Cli::parse().command;
    let result = runtime().and_then(|rt| {
        rt.block_on(async {
            match command {
                Command::Bench(args) => commands::bench::run(&args).await,
                Command::Soak(args) => commands::soak::run(&args).await,
            }
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pinroute-lab: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

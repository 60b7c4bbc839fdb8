//! `pinroute-harness`: one subcommand per task; each lives in `commands/<name>.rs` as an
//! `Args` struct and a `run` function.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pinroute_harness::cli::{exit_code, init_logging, runtime};

#[derive(Parser)]
#[command(name = "pinroute-harness", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the filter, start Envoy with sim workers (1 prefill, 2 decode) or a real vLLM pair
    /// (`--workers vllm`, on CPU or `--gpu`) and send a request.
    Up(commands::up::Args),
    /// Run every test suite (builds the filter and installs Envoy first).
    Test(commands::test::Args),
    /// Print the Envoy bootstrap that runs the pinroute filter for a worker registry (with
    /// `--picker`, behind an endpoint picker).
    EnvoyConfig(Box<commands::envoy_config::Args>),
    /// Run one simulated vLLM worker until Ctrl-C.
    SimWorker(commands::sim_worker::Args),
}

fn main() -> ExitCode {
    init_logging();
    let result = match Cli::parse().command {
        Command::Up(args) => runtime().and_then(|rt| rt.block_on(commands::up::run(&args))),
        Command::Test(args) => commands::test::run_all(&args),
        Command::EnvoyConfig(args) => commands::envoy_config::run(&args),
        Command::SimWorker(args) => {
            runtime().and_then(|rt| rt.block_on(commands::sim_worker::run(&args)))
        }
    };
    exit_code("pinroute-harness", result)
}

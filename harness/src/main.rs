//! `pinroute-harness`: one subcommand per task; each lives in `commands/<name>.rs` as an
//! `Args` struct and a `run` function.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "pinroute-harness", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the Envoy bootstrap that runs the pinroute filter for a worker registry.
    EnvoyConfig(commands::envoy_config::Args),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let result = match Cli::parse().command {
        Command::EnvoyConfig(args) => commands::envoy_config::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pinroute-harness: {e:#}");
            ExitCode::FAILURE
        }
    }
}

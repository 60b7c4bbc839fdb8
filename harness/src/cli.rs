//! What the executables `pinroute-harness` and `pinroute-lab` share around their
//! subcommands: logging, the tokio runtime, the exit status.

use std::process::ExitCode;

/// Logs at `info` unless `RUST_LOG` says otherwise.
pub fn init_logging() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
}

/// The multi-threaded runtime of the subcommands that serve or send requests.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Success, or the error chain on stderr after the program's name and a failure status.
pub fn exit_code(program: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

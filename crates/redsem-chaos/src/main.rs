//! `redsem-chaos`: see the crate docs (`src/lib.rs`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use redsem_chaos::cli::{CheckArgs, RunArgs};
use redsem_chaos::worker::WorkerArgs;

/// Chaos runner and checker for redsem: worker processes share semaphores under injected
/// faults, and a checker proves the guarantees from their logs.
#[derive(Parser)]
#[command(name = "redsem-chaos", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run (the default).
    Run(RunArgs),
    /// Check the logs of a previous run again.
    Check(CheckArgs),
    /// One worker process (started by the runner).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Some(Cmd::Worker(w)) => redsem_chaos::worker::run(w).map(|()| 0),
        Some(Cmd::Check(c)) => redsem_chaos::cli::check(c),
        Some(Cmd::Run(r)) => redsem_chaos::cli::run(r),
        None => redsem_chaos::cli::run(cli.run),
    };
    match res {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("redsem-chaos: {e:#}");
            ExitCode::from(2)
        }
    }
}

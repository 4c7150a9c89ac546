//! `redsem-bench`: see the crate docs (`src/lib.rs`) and `README.md` beside `Cargo.toml`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use redsem_bench::scenarios::RunArgs;
use redsem_bench::worker::WorkerArgs;

/// Benchmark of redsem against the reference design's Redis semaphores.
#[derive(Parser)]
#[command(name = "redsem-bench", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the benchmark (the default).
    Run(RunArgs),
    /// One contract worker process (what the benchmark and driver.py start).
    Worker(WorkerArgs),
    /// Print the tables of a saved run (the file `--json` wrote) without running anything.
    Report {
        /// The JSON report of a run, e.g. docs/bench/results.json.
        json: std::path::PathBuf,
    },
    /// The `redsem` command line (crates/redsem-cli) run in this process, exactly as the
    /// `redsem` binary runs it: the `admin` scenario's `run` rows start `redsem-bench redsem
    /// run ...`, so they need no separately built binary.
    #[command(hide = true)]
    Redsem {
        /// The arguments of `redsem`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Some(Cmd::Redsem { args }) => {
            let argv = std::iter::once(std::ffi::OsString::from("redsem")).chain(args);
            return ExitCode::from(redsem_cli::main(argv));
        }
        Some(Cmd::Worker(w)) => redsem_bench::worker::run(w).map(|()| 0),
        Some(Cmd::Run(r)) => redsem_bench::run(r),
        Some(Cmd::Report { json }) => redsem_bench::print_saved(&json).map(|()| 0),
        None => redsem_bench::run(cli.run),
    };
    match res {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("redsem-bench: {e:#}");
            ExitCode::from(1)
        }
    }
}

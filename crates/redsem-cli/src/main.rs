//! The `redsem` binary: the command line of [`redsem_cli::main`].

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(redsem_cli::main(std::env::args_os()))
}

"""`python -m redsem ...` and the `redsem` console script: the redsem command line (the Rust
CLI of crates/redsem-cli, run in this process; same subcommands, flags, environment
variables, messages and exit statuses as the `redsem` binary)."""

from __future__ import annotations

import signal
import sys

from . import _native


def main() -> None:
    """Runs the CLI with `sys.argv[1:]` and exits with its status."""
    # Give the CLI the signal dispositions a Rust binary starts with: Python's own SIGINT
    # handler would turn a Ctrl-C into a KeyboardInterrupt traceback after the CLI returned.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    sys.stdout.flush()
    sys.exit(_native.cli_main(["redsem", *sys.argv[1:]]))


if __name__ == "__main__":
    main()

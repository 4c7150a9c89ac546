"""The package's entry points of the redsem CLI: `python -m redsem` and the `redsem` console
script run the Rust CLI in-process. Its behaviour is tested once, by crates/redsem-cli/tests,
which scripts/test.sh also runs through `python -m redsem` (REDSEM_CLI_LAUNCHER); these tests
check what the Python entry points add: argv, stdio, exit status and signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import redsem
from conftest import Server


def env_for(server: Server, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDSEM_", "REDIS_URL"))}
    env["REDSEM_URL"] = server.url
    env.update(extra)
    return env


def entry_points() -> list[list[str]]:
    script = os.path.join(os.path.dirname(sys.executable), "redsem")
    assert os.path.exists(script), "the console script `redsem` is installed next to python"
    return [[sys.executable, "-m", "redsem"], [script]]


@pytest.mark.parametrize("entry", entry_points(), ids=["python -m redsem", "console script"])
def test_the_command_gets_its_slots_and_its_exit_status_is_kept(server: Server, name: str, entry: list[str]) -> None:
    r = subprocess.run(
        [*entry, "run", name, "--limit", "2", "--", "sh", "-c", 'echo "$REDSEM_NAME|$REDSEM_SLOTS|$REDSEM_FENCES"; exit 3'],
        env=env_for(server), capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 3, r.stderr
    got_name, slots, fences = r.stdout.strip().split("|")
    assert (got_name, slots) == (name, "0") and fences.startswith("0:")
    r = subprocess.run([*entry, "stats", name, "--json"], env=env_for(server), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["grants_total"] == 1


def test_errors_are_the_clis_messages_and_statuses_not_tracebacks(server: Server, name: str) -> None:
    r = subprocess.run([sys.executable, "-m", "redsem", "stats", name], env=env_for(server, REDSEM_URL="http://nowhere/"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 125 and "Traceback" not in r.stderr and r.stderr.startswith("redsem: "), r.stderr
    r = subprocess.run([sys.executable, "-m", "redsem", "stats", name + "-none"], env=env_for(server),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 125 and "unknown semaphore" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "redsem", "run", name, "--", "/no/such/program"], env=env_for(server),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 127, r.stderr
    r = subprocess.run([sys.executable, "-m", "redsem", "run", name], env=env_for(server, REDSEM_TIMEOUT="bogus"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 125 and "is not a duration" in r.stderr, r.stderr


def test_signals_to_the_python_process_reach_the_command(server: Server, name: str) -> None:
    p = subprocess.Popen(
        [sys.executable, "-m", "redsem", "run", name, "--limit", "1", "--", "sh", "-c",
         'trap "echo got INT; exit 7" INT; echo ready; while :; do sleep 0.05; done'],
        env=env_for(server), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        assert (p.returncode, out.strip()) == (7, "got INT"), err
        assert "KeyboardInterrupt" not in err and "Traceback" not in err, err
    finally:
        p.kill()
        p.wait()
    with redsem.sync.Client(server.url) as c:
        assert c.inspect(name).in_use == 0, "released as soon as the command exited"


def test_the_cli_is_the_rust_one() -> None:
    r = subprocess.run([sys.executable, "-m", "redsem", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("redsem "), r

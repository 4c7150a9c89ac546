"""Fixtures: a private redis-server on a free loopback port (never 6379), and helpers.

The server binary is `$REDSEM_TEST_SERVER` if set (e.g. a valkey-server), else `redis-server`
on PATH. Tests import the *installed* `redsem` package (this directory is not a package and
the source tree is not on sys.path).
"""

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A throw-away redis-server without persistence."""

    def __init__(self) -> None:
        binary = os.environ.get("REDSEM_TEST_SERVER") or shutil.which("redis-server")
        if not binary:
            pytest.fail("no redis-server on PATH (run scripts/install-deps.sh)")
        for _ in range(5):
            self.port = _free_port()
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                    return
                except OSError:
                    time.sleep(0.02)
            self.stop()  # the port was taken meanwhile: try another
        pytest.fail("could not start a redis-server")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def own_server():
    """A server of the test's own (for tests that pause or break it)."""
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def name() -> str:
    """A semaphore name no other test uses."""
    return "t-" + uuid.uuid4().hex[:10]


def run(coro):
    """Runs a coroutine to completion in a fresh event loop."""
    return asyncio.run(coro)


def python() -> str:
    return sys.executable


def pytest_report_header(config):
    import redis
    import redsem

    return f"redsem {redsem.__version__} from {os.path.dirname(redsem.__file__)}; redis-py {redis.__version__}"

"""Fixtures: a private redis-server on a free loopback port (never 6379), and helpers.

The server binary is `$REDSEM_TEST_SERVER` if set (e.g. a valkey-server), else `redis-server`
on PATH. Tests import the *installed* `redsem` package (the compiled binding); this directory
is not a package.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator

import pytest


def _free_port(bus: bool = False) -> int:
    """A free loopback port; with `bus`, one whose cluster bus port (port + 10000) is free and
    valid too (the kernel's ephemeral ports reach 60999: a cluster node above 55535 cannot
    start, and a busy bus port makes it exit after its main port answered)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if not bus:
            return port
        if port + 10000 > 65535:
            continue
        with socket.socket() as b:
            try:
                b.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class Server:
    """A throw-away redis-server without persistence."""

    def __init__(self, extra: list[str] | None = None, binary: str | None = None) -> None:
        binary = binary or os.environ.get("REDSEM_TEST_SERVER") or shutil.which("redis-server")
        if not binary:
            pytest.fail("no redis-server on PATH (run scripts/install-deps.sh)")
        for _ in range(5):
            self.port = _free_port(bus="--cluster-enabled" in (extra or []))
            self.tls_port = _free_port()
            tls = [a.replace("{tls_port}", str(self.tls_port)) for a in extra or []]
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *tls],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                    if any("{tls_port}" in a for a in extra or []):
                        socket.create_connection(("127.0.0.1", self.tls_port), timeout=0.2).close()
                    return
                except OSError:
                    time.sleep(0.02)
            self.stop()  # the port was taken meanwhile: try another
        pytest.fail("could not start a redis-server")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/"

    def command(self, *args: str | int) -> object:
        """Sends one command with a plain RESP2 connection and returns the reply (bulk
        strings as str, integers as int, arrays as lists; errors raise RuntimeError)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            parts = [str(a).encode() for a in args]
            s.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))
            f = s.makefile("rb")
            return _read_reply(f)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _read_reply(f: object) -> object:
    line: bytes = f.readline()  # type: ignore[attr-defined]
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data: bytes = f.read(n + 2)  # type: ignore[attr-defined]
        return data[:-2].decode()
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_reply(f) for _ in range(n)]
    raise RuntimeError(f"unexpected reply {line!r}")


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def own_server() -> Iterator[Server]:
    """A server of the test's own (for tests that pause or break it)."""
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def name() -> str:
    """A semaphore name no other test uses."""
    return "t-" + uuid.uuid4().hex[:10]


async def until(cond: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Polls the async predicate `cond` until it holds; fails the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def python() -> str:
    return sys.executable


def pytest_report_header(config: pytest.Config) -> str:
    import redsem

    return f"redsem {redsem.__version__} from {os.path.dirname(redsem.__file__)}"

"""Other deployments reach the Rust crate's backends through the URL: a Redis Cluster
(`redis+cluster://`) of three masters, started by the test (redis-server and redis-cli)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import redsem
from conftest import Server, until


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[Server]]:
    redis_server, redis_cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not redis_server or not redis_cli:
        pytest.skip("no redis-server / redis-cli")
    nodes: list[Server] = []
    try:
        for i in range(3):
            nodes.append(Server(["--cluster-enabled", "yes", "--cluster-config-file", str(tmp_path / f"nodes-{i}.conf"),
                                 "--dir", str(tmp_path)], binary=redis_server))
        out = subprocess.run([redis_cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes),
                              "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out
        deadline = time.monotonic() + 30
        while not all("cluster_state:ok" in str(n.command("CLUSTER", "INFO")) for n in nodes):
            assert time.monotonic() < deadline, "the cluster did not become ok"
            time.sleep(0.1)
        yield nodes
    finally:
        for n in nodes:
            n.stop()


async def test_a_semaphore_on_a_redis_cluster(cluster: list[Server], name: str) -> None:
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in cluster[:2])
    c1, c2 = await redsem.connect(url), await redsem.connect(url)
    s1 = await c1.semaphore(name, limit=2)
    s2 = await c2.semaphore(name, limit=2)
    held = [await s1.acquire(), await s2.acquire()]
    assert sorted(p.slots[0] for p in held) == [0, 1]
    waiting = asyncio.ensure_future(s2.acquire(timeout=30))

    async def queued() -> bool:
        return len((await s1.stats()).waiters) == 1

    await until(queued)
    await held[0].release()
    p = await waiting
    assert p.slots == held[0].slots
    assert name in await c1.list_semaphores()
    await p.release()
    await held[1].release()
    await c1.close()
    await c2.close()

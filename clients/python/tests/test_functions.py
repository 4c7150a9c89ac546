"""redsem's Lua code as a Redis Functions library (`FCALL`, the default) or as scripts
(`EVALSHA`, `scripts_only=True`), and `Client.load_library`, each on a server of its own (so
that the library and the command counts are this test's alone)."""

from __future__ import annotations

import pytest

import redsem
import redsem.sync
from conftest import Server


def libraries(server: Server) -> list[str]:
    """The names of the redsem libraries in `FUNCTION LIST`."""
    reply = server.command("FUNCTION", "LIST")
    assert isinstance(reply, list), reply
    names = []
    for lib in reply:
        assert isinstance(lib, list), lib
        fields = dict(zip(lib[::2], lib[1::2]))
        name = fields.get("library_name")
        if isinstance(name, str) and name.startswith("redsem_"):
            names.append(name)
    return names


def calls(server: Server, command: str) -> int:
    """How many times `command` ran (`INFO commandstats`; 0 when it never did)."""
    info = server.command("INFO", "commandstats")
    assert isinstance(info, str), info
    for line in info.splitlines():
        key, _, stats = line.partition(":")
        if key == f"cmdstat_{command}":
            fields = dict(f.split("=", 1) for f in stats.split(","))
            return int(fields["calls"])
    return 0


async def acquire_and_release(client: redsem.Client, name: str) -> None:
    sem = await client.semaphore(name, limit=2)
    async with sem.acquire(timeout=10) as permit:
        assert permit.slots == [0]
    assert (await sem.stats()).in_use == 0


async def test_by_default_the_library_is_loaded_and_its_functions_called(own_server: Server, name: str) -> None:
    assert libraries(own_server) == []
    async with await redsem.connect(own_server.url) as c:
        await acquire_and_release(c, name)
    [library] = libraries(own_server)
    assert library.startswith("redsem_")
    assert calls(own_server, "fcall") > 0
    assert calls(own_server, "evalsha") == 0


async def test_scripts_only_runs_evalsha_and_no_fcall(own_server: Server, name: str) -> None:
    async with await redsem.connect(own_server.url, scripts_only=True) as c:
        await acquire_and_release(c, name)
    assert calls(own_server, "evalsha") > 0
    assert calls(own_server, "fcall") == 0
    assert libraries(own_server) == []


async def test_clients_of_both_kinds_share_a_semaphore(own_server: Server, name: str) -> None:
    async with (
        await redsem.connect(own_server.url) as functions,
        await redsem.connect(own_server.url, scripts_only=True) as scripts,
    ):
        a = await functions.semaphore(name, limit=1)
        b = await scripts.semaphore(name, limit=1)
        held = await a.acquire()
        with pytest.raises(redsem.NoPermits):
            await b.try_acquire()
        await held.release()
        async with b.acquire(timeout=10):
            with pytest.raises(redsem.NoPermits):
                await a.try_acquire()
    assert calls(own_server, "fcall") > 0
    assert calls(own_server, "evalsha") > 0


async def test_load_library_returns_the_name_of_the_loaded_library(own_server: Server, name: str) -> None:
    async with await redsem.connect(own_server.url) as c:
        library = await c.load_library()
        assert library.startswith("redsem_")
        assert libraries(own_server) == [library]
        assert await c.load_library() == library, "idempotent"
        await acquire_and_release(c, name)
    assert libraries(own_server) == [library], "the clients call the library it loaded"
    assert calls(own_server, "fcall") > 0


async def test_load_library_needs_function_load(own_server: Server) -> None:
    # the loader rule of docs/security.md without +function|load
    own_server.command("ACL", "SETUSER", "nofn", "on", ">pw", "resetkeys", "resetchannels", "-@all", "+ping")
    url = f"redis://nofn:pw@127.0.0.1:{own_server.port}/"
    async with await redsem.connect(url) as c:
        with pytest.raises(redsem.NoPermission):
            await c.load_library()
    assert libraries(own_server) == []


def test_the_sync_wrapper_takes_scripts_only_and_loads_the_library(own_server: Server, name: str) -> None:
    with redsem.sync.Client(own_server.url, scripts_only=True) as c:
        sem = c.semaphore(name, limit=1)
        with sem.acquire(timeout=10) as permit:
            assert permit.slots == [0]
        assert calls(own_server, "evalsha") > 0
        assert calls(own_server, "fcall") == 0
        assert libraries(own_server) == []
        library = c.load_library()
        assert library.startswith("redsem_")
        assert libraries(own_server) == [library]

"""Hand-off by id: `Permit.export`, `Semaphore.adopt`, `Semaphore.release_handoff` (the
asyncio API, `redsem.sync`, and another OS process)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

import redsem
import redsem.sync
from conftest import Server, until


async def test_an_exported_permit_is_adopted_by_another_client(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as worker:
        sem_w = await worker.semaphore(name, limit=3, lease=0.6)
        scheduler = await redsem.connect(server.url)
        sem_s = await scheduler.semaphore(name, limit=3, lease=0.6)
        p = await sem_s.acquire(permits=2)
        holder_id, fences = p.holder_id, p.fences
        token = await p.export()
        assert isinstance(token, str) and token.startswith("redsem-handoff-1:")
        assert p.released
        with pytest.raises(redsem.InvalidArgument):
            await p.export()  # once only
        await scheduler.close()  # the exporter goes away; the permit stays

        q = await sem_w.adopt(token)
        assert (q.holder_id, q.fences, q.permits) == (holder_id, fences, 2)
        await asyncio.sleep(3)  # five leases: the adopter renews it
        assert not q.is_lost()
        st = await sem_w.stats()
        assert [h.id for h in st.holders] == [holder_id] and st.expired_total == 0
        await q.release()
        assert (await sem_w.stats()).in_use == 0


async def test_release_by_token_frees_at_once_and_errors_are_typed(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=1, lease=60)
        other = await c.semaphore(name + "-other", limit=1, lease=60)
        token = await (await sem.acquire()).export()
        with pytest.raises(redsem.InvalidArgument):
            await other.adopt(token)
        with pytest.raises(redsem.InvalidArgument):
            await sem.adopt("not a token")
        waiter = asyncio.ensure_future(sem.acquire(timeout=20))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        assert await sem.release_handoff(token) is True
        p = await asyncio.wait_for(waiter, 10)  # well before the 60 s lease
        assert await sem.release_handoff(token) is False
        with pytest.raises(redsem.HandoffGone) as gone:
            await sem.adopt(token)
        assert gone.value.semaphore == name and gone.value.holder_id in token
        await p.release()


async def test_adopted_twice_the_first_adopter_loses_it(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as a, await redsem.connect(server.url) as b:
        sem_a = await a.semaphore(name, limit=1, lease=0.9)
        sem_b = await b.semaphore(name, limit=1, lease=0.9)
        token = await (await sem_a.acquire()).export()
        first = await sem_a.adopt(token)
        second = await sem_b.adopt(token)
        assert await asyncio.wait_for(first.wait_lost(), 5) == "handed_off"
        assert first.lost_reason == "handed_off"
        await first.release()  # the winner's permit is not released by the loser
        await asyncio.sleep(1)
        assert not second.is_lost()
        assert (await sem_b.stats()).in_use == 1
        await second.release()


def test_the_sync_api_hands_off_to_another_process(server: Server, name: str) -> None:
    with redsem.sync.Client(server.url) as c:
        sem = c.semaphore(name, limit=1, lease=5)
        p = sem.acquire()
        fences = [str(f) for f in p.fences]
        token = p.export()
        child = textwrap.dedent(
            f"""
            import sys
            import redsem.sync
            with redsem.sync.Client({server.url!r}) as c:
                sem = c.semaphore({name!r}, limit=1, lease=5)
                p = sem.adopt(sys.argv[1])
                print(" ".join(str(f) for f in p.fences))
                p.release()
            """
        )
        out = subprocess.run(
            [sys.executable, "-c", child, token], capture_output=True, text=True, timeout=60, check=True
        )
        assert out.stdout.split() == fences
        # released by the child: free again at once
        sem.try_acquire().release()
        assert sem.release_handoff(token) is False


async def test_an_unadopted_token_frees_its_slot_within_about_a_lease(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=1, lease=1)
        await (await sem.acquire()).export()
        with pytest.raises(redsem.NoPermits):
            await sem.try_acquire()
        p = await sem.acquire(timeout=8)
        await until(lambda: _expired(sem, 1))
        await p.release()


async def _expired(sem: redsem.Semaphore, n: int) -> bool:
    return (await sem.stats()).expired_total == n

"""The asyncio API of the binding against a private redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import subprocess
import sys
import textwrap
import time
import warnings
from typing import Any

import pytest

import redsem
from conftest import Server, until


async def n_waiting(sem: redsem.Semaphore, n: int) -> bool:
    return len((await sem.stats()).waiters) == n


async def in_use(sem: redsem.Semaphore, n: int) -> bool:
    return (await sem.stats()).in_use == n


async def test_acquire_holds_slots_and_fences_until_released(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=2, lease=2.0)
        async with sem.acquire() as p:
            assert (p.slots, p.ticket, p.permits, p.semaphore) == ([0], 1, 1, name)
            first = p.fences[0].generation
            assert str(p.fences[0]) == f"0:{first}" and first > 0
            assert not p.is_lost() and not p.lost.is_set() and p.lost_reason is None
            assert 0 < p.lease_left() <= 2.0 and p.lease() == 2.0
            st = await sem.stats()
            assert (st.in_use, st.available, [h.id for h in st.holders]) == (1, 1, [p.holder_id])
        assert p.released
        assert (await sem.stats()).in_use == 0
        p = await sem.acquire()
        assert p.fences[0].slot == 0
        assert p.fences[0].generation > first, "the slot's generation grows with every grant"
        await p.release()
        await p.release()  # idempotent
        st = await sem.stats()
        assert (st.in_use, st.grants_total) == (0, 2)


async def test_acquire_can_be_a_task_of_its_own(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=1)
        task = asyncio.create_task(sem.acquire(timeout=5))
        p = await task
        assert p.slots == [0]
        waiting = asyncio.ensure_future(sem.acquire(timeout=30))
        await until(lambda: n_waiting(sem, 1))
        await p.release()
        q = await waiting
        assert q.ticket == 2
        await q.release()


async def test_waiters_of_two_clients_are_granted_in_ticket_order(server: Server, name: str) -> None:
    c1, c2 = await redsem.connect(server.url), await redsem.connect(server.url)
    s1 = await c1.semaphore(name, limit=1)
    s2 = await c2.semaphore(name, limit=1)
    first = await s1.acquire()
    order: list[tuple[int, int]] = []

    async def waiter(sem: redsem.Semaphore, i: int) -> None:
        async with sem.acquire(timeout=30) as p:
            order.append((i, p.ticket))
            await asyncio.sleep(0.01)

    tasks = []
    for i in range(6):
        tasks.append(asyncio.ensure_future(waiter(s1 if i % 2 else s2, i)))
        await until(lambda: n_waiting(s1, i + 1))
    await first.release()
    await asyncio.gather(*tasks)
    assert [i for i, _ in order] == list(range(6))
    assert [t for _, t in order] == list(range(2, 8))
    await c1.close()
    await c2.close()


async def test_acquires_of_one_loop_queue_in_the_order_they_were_made(server: Server, name: str) -> None:
    # Each native call is first polled as it is made: were it first polled by whichever
    # runtime worker picks its task up, a later call could queue ahead of an earlier one.
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=1)
        for round in range(3):
            first = await sem.acquire()
            order: list[int] = []
            tickets: list[int] = []

            async def worker(i: int) -> None:
                async with sem.acquire(timeout=60) as p:
                    order.append(i)
                    tickets.append(p.ticket)

            tasks = [asyncio.create_task(worker(i)) for i in range(40)]
            await until(lambda: n_waiting(sem, 40))
            await first.release()
            await asyncio.gather(*tasks)
            assert order == list(range(40)), f"round {round}: granted out of call order: {order}"
            assert tickets == sorted(tickets), f"round {round}: tickets {tickets}"


async def test_a_snapshot_lists_at_most_what_it_is_asked(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=1)
        first = await sem.acquire()
        tasks = []
        for i in range(3):
            tasks.append(asyncio.ensure_future(sem.acquire(timeout=30)))
            await until(lambda: n_waiting(sem, i + 1))
        full = await sem.stats()
        assert len(full.waiters) == 3 <= redsem.STATS_LISTED
        counts = await sem.stats(0)
        assert (counts.holder_count, counts.waiter_count) == (1, 3)
        assert (counts.holders, counts.waiters, counts.oldest_wait) == ([], [], None)
        head = await c.inspect(name, 1)
        assert [w.id for w in head.waiters] == [full.waiters[0].id]
        assert head.oldest_wait is not None
        with pytest.raises(redsem.InvalidArgument, match="at most 1000"):
            await sem.stats(redsem.MAX_LISTED + 1)
        with pytest.raises(redsem.InvalidArgument, match="0 or more"):
            await c.inspect(name, -1)
        await first.release()
        for t in tasks:
            await (await t).release()


async def test_priority_classes_are_served_first_fifo_within_a_class(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=1)
        first = await sem.acquire()
        order: list[str] = []

        async def waiter(label: str, priority: int) -> None:
            async with sem.acquire(timeout=30, label=label, priority=priority):
                order.append(label)

        requests = [("a0", 0), ("b2", 2), ("c1", 1), ("d2", 2)]
        tasks = []
        for i, (label, priority) in enumerate(requests):
            tasks.append(asyncio.ensure_future(waiter(label, priority)))
            await until(lambda: n_waiting(sem, i + 1))
        st = await sem.stats()
        assert [(w.label, w.priority) for w in st.waiters] == [("b2", 2), ("d2", 2), ("c1", 1), ("a0", 0)]
        await first.release()
        await asyncio.gather(*tasks)
        assert order == ["b2", "d2", "c1", "a0"]
        with pytest.raises(redsem.InvalidArgument, match="priority 10 is outside 0..=9"):
            await sem.acquire(priority=10)
        with pytest.raises(redsem.InvalidArgument, match="outside 0..=9"):
            await sem.acquire(priority=-1)


async def test_a_timeout_or_a_cancelled_wait_gives_the_ticket_up(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=1)
        held = await sem.acquire()
        with pytest.raises(redsem.Timeout) as err:
            await sem.acquire(timeout=0.3)
        assert isinstance(err.value, TimeoutError) and err.value.timeout == pytest.approx(0.3)
        await c.flush()
        await until(lambda: n_waiting(sem, 0))
        # Cancelling the Python task drops the Rust future, which gives the ticket up.
        task = asyncio.ensure_future(sem.acquire())
        await until(lambda: n_waiting(sem, 1))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await c.flush()
        await until(lambda: n_waiting(sem, 0))
        assert sem.local_counts() == (1, 0)
        # the same through asyncio.wait_for
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sem.acquire(), 0.3)
        await c.flush()
        await until(lambda: n_waiting(sem, 0))
        await held.release()
        async with sem.acquire(timeout=5) as p:
            assert p.slots == [0]


async def test_try_acquire_takes_only_permits_nobody_queues_for(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=2)
        held = await sem.try_acquire()
        second = await sem.try_acquire()
        with pytest.raises(redsem.NoPermits) as err:
            await sem.try_acquire()
        assert err.value.reason == "none_free" and err.value.retryable
        await second.release()
        big = asyncio.ensure_future(sem.acquire(2))  # queued: one of two is free
        await until(lambda: n_waiting(sem, 1))
        with pytest.raises(redsem.NoPermits) as err:
            await sem.try_acquire()  # one is free, but FIFO: the queued request comes first
        assert err.value.reason == "queued_first"
        await held.release()
        p = await big
        assert p.slots == [0, 1]
        await p.release()


async def test_several_permits_at_once(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=4)
        p = await sem.acquire(3)
        assert (p.slots, p.permits, len(p.fences)) == ([0, 1, 2], 3, 3)
        assert (await sem.stats()).in_use == 3
        with pytest.raises(redsem.Timeout):
            await sem.acquire(2, timeout=0.2)
        with pytest.raises(redsem.TooManyPermits) as err:
            await sem.acquire(5)
        assert (err.value.limit, err.value.requested, err.value.semaphore) == (4, 5, name)
        with pytest.raises(redsem.InvalidArgument, match=r"permits 0 is out of range \(1\.\.4294967295\)"):
            sem.acquire(0)  # at the call, as -1
        await p.release()
        async with sem.acquire(4) as p:
            assert p.slots == [0, 1, 2, 3]


async def test_per_acquisition_lease_and_label(server: Server, name: str) -> None:
    async with await redsem.connect(server.url, label="client-label") as c:
        sem = await c.semaphore(name, limit=2, lease=3.0)
        p = await sem.acquire_with(redsem.AcquireOptions(lease=6.0, label="job-7"))
        q = await sem.acquire()
        assert p.lease() == 6.0 and q.lease() == 3.0
        st = await sem.stats()
        labels = {h.id: h.label for h in st.holders}
        assert labels == {p.holder_id: "job-7", q.holder_id: "client-label"}
        assert 3.0 < max(h.lease_left for h in st.holders if h.id == p.holder_id) <= 6.0
        await p.set_lease(4.0)
        assert p.lease() == 4.0
        with pytest.raises(redsem.InvalidArgument):
            await sem.acquire_with(redsem.AcquireOptions(timeout=1.0, try_only=True))
        with pytest.raises(redsem.InvalidArgument):
            await sem.acquire(lease=-1.0)
        # the shortest lease (the engine's rule), for a handle and for one acquisition
        assert redsem.MIN_LEASE == 0.25
        with pytest.raises(redsem.InvalidArgument, match="MIN_LEASE"):
            await c.semaphore(name + "-short", limit=1, lease=0.1)
        with pytest.raises(redsem.InvalidArgument, match="MIN_LEASE"):
            await sem.acquire(lease=0.2)
        with pytest.raises(redsem.InvalidArgument, match="control character"):
            await sem.acquire(label="two\nlines")
        # one wording for the limit's range on every path (the library's), negatives included
        for limit in (0, -3, 100001):
            with pytest.raises(redsem.InvalidArgument, match=f"limit {limit} is outside 1..=100000"):
                await c.semaphore(name + "-bad", limit=limit)
        with pytest.raises(redsem.InvalidArgument, match="control character"):
            await c.semaphore(name + "-bad", limit=1, label="a\tb")
        await p.release()
        await q.release()


async def test_the_stored_limit_is_shared(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        await c.semaphore(name, limit=2)
        with pytest.raises(redsem.LimitConflict) as err:
            await c.semaphore(name, limit=3)
        assert (err.value.stored, err.value.requested, err.value.semaphore) == (2, 3, name)
        assert str(err.value) == (
            f'semaphore "{name}" already exists with limit 2, not 3: open it with limit 2, or resize it'
        )


async def test_limit_policy_adopts_or_resizes_the_stored_limit(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        with pytest.raises(redsem.UnknownSemaphore):
            await c.semaphore(name, limit=5, limit_policy="adopt")  # creates nothing
        assert name not in await c.list_semaphores()
        await c.semaphore(name, limit=2)
        adopted = await c.semaphore(name, limit=5, limit_policy="create_or_adopt")
        assert adopted.limit == 2
        assert (await c.semaphore(name, limit=9, limit_policy="adopt")).limit == 2
        resized = await c.semaphore(name, limit=4, limit_policy="resize")
        assert resized.limit == 4
        assert (await c.inspect(name)).limit == 4
        with pytest.raises(redsem.InvalidArgument, match="limit_policy"):
            await c.semaphore(name, limit=4, limit_policy="sometimes")  # type: ignore[arg-type]


async def test_resize_add_permits_list_inspect_and_delete(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=1)
        p = await sem.acquire()
        waiter = asyncio.ensure_future(sem.acquire(timeout=30))
        await until(lambda: n_waiting(sem, 1))
        grown = await sem.resize(2)  # growing grants the waiter at once
        assert (grown.previous, grown.limit, grown.rejected) == (1, 2, ())
        q = await waiter
        assert q.slots == [1]
        assert (await sem.add_permits(3)).limit == 5
        assert (await c.resize_existing(name, 3)).previous == 5
        assert (await c.inspect(name)).limit == 3
        assert name in await c.list_semaphores()
        with pytest.raises(redsem.InUse) as err:
            await c.delete_semaphore(name)
        assert (err.value.holders, err.value.waiters) == (2, 0)
        assert await sem.force_release(q.holder_id)
        assert await c.force_release(name, "no-such-holder") is None
        await p.release()
        assert await c.delete_semaphore(name) == 0  # nobody evicted
        with pytest.raises(redsem.UnknownSemaphore) as unknown:
            await c.inspect(name)
        assert unknown.value.prefix == "redsem" and unknown.value.semaphore == name
        with pytest.raises(redsem.UnknownSemaphore):
            await c.resize_existing(name, 2)


async def test_add_permits_existing_and_foreign_data(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        await (await c.semaphore(name, limit=2)).close()
        assert (await c.add_permits_existing(name, 3)).limit == 5
        assert (await c.add_permits_existing(name, -4)).previous == 5
        with pytest.raises(redsem.InvalidArgument):
            await c.add_permits_existing(name, -1)
        with pytest.raises(redsem.UnknownSemaphore):
            await c.add_permits_existing(name + "-none", 1)
        assert (await c.inspect(name)).limit == 1
        foreign = name + "-fruit"
        server.command("HSET", f"redsem:{{{foreign}}}:cfg", "limit", "banana")
        with pytest.raises(redsem.NotASemaphore) as err:
            await c.delete_semaphore(foreign, force=True)
        assert err.value.semaphore == foreign
        assert server.command("EXISTS", f"redsem:{{{foreign}}}:cfg") == 1
        assert await c.purge_keys(foreign) == 0
        assert server.command("EXISTS", f"redsem:{{{foreign}}}:cfg") == 0


async def test_an_operator_removes_a_waiter_and_a_shrink_rejects_larger_requests(
    server: Server, name: str
) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=2)
        p = await sem.acquire()
        pair = asyncio.ensure_future(sem.acquire(permits=2, label="two seats", timeout=30))
        await until(lambda: n_waiting(sem, 1))
        shrunk = await c.resize_existing(name, 1)
        assert (shrunk.previous, shrunk.limit) == (2, 1)
        assert [(w.permits, w.label) for w in shrunk.rejected] == [(2, "two seats")]
        with pytest.raises(redsem.TooManyPermits) as too_many:
            await pair
        assert too_many.value.limit == 1
        waiter = asyncio.ensure_future(sem.acquire(timeout=30))
        await until(lambda: n_waiting(sem, 1))
        waiting = (await c.inspect(name)).waiters[0].id
        assert await c.force_release(name, waiting) == "waiter"
        with pytest.raises(redsem.RemovedFromQueue) as removed:
            await waiter
        assert removed.value.semaphore == name
        assert (await c.inspect(name)).waiters == []
        await p.release()


async def test_a_lost_permit_cancels_the_body(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=1, lease=0.6)
        started = time.monotonic()
        with pytest.raises(redsem.LeaseLost) as err:
            async with sem.acquire() as p:
                assert await c.force_release(name, p.holder_id) == "holder"
                await asyncio.sleep(30)
        assert time.monotonic() - started < 10
        assert err.value.reason == "not_holder" == p.lost_reason
        assert err.value.semaphore == name
        assert p.lost.is_set() and p.is_lost()

        p = await sem.acquire()
        await c.force_release(name, p.holder_id)
        with pytest.raises(redsem.LeaseLost):
            await p.run(asyncio.sleep(30))
        assert await p.lost.wait()
        # the work's own result when nothing is lost
        p = await sem.acquire()
        assert await p.run(asyncio.sleep(0.01, result=42)) == 42
        assert p.released
        assert await sem.run(asyncio.sleep(0.01, result="ran")) == "ran"


async def test_max_hold_loses_the_permit_and_frees_the_slot(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c, await redsem.connect(server.url) as other:
        sem = await c.semaphore(name, limit=1, lease=30.0)
        other_sem = await other.semaphore(name, limit=1, lease=30.0)
        started = time.monotonic()
        with pytest.raises(redsem.LeaseLost) as err:
            async with sem.acquire(max_hold=1.0) as p:
                await asyncio.sleep(30)
        assert 1.0 <= time.monotonic() - started < 15
        assert err.value.reason == "max_hold" == p.lost_reason
        assert p.lost.is_set() and p.is_lost()
        # released on leaving the block: another client gets the slot long before the 30 s lease
        q = await other_sem.acquire(timeout=10)
        await q.release()
        # through AcquireOptions, the permit kept after the loss, then released
        p = await sem.acquire_with(redsem.AcquireOptions(max_hold=1.0))
        assert not p.is_lost()
        assert await p.lost.wait()
        assert p.lost_reason == "max_hold"
        await p.release()
        q = await other_sem.acquire(timeout=10)
        await q.release()
        for bad in (0.0, -1.0):
            with pytest.raises(redsem.InvalidArgument, match="max_hold"):
                await sem.acquire(max_hold=bad)
        assert await in_use(sem, 0)


async def test_the_callers_own_cancellation_is_not_a_lost_lease(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=1)

        async def body() -> None:
            async with sem.acquire():
                await asyncio.sleep(30)

        task = asyncio.ensure_future(body())
        await until(lambda: in_use(sem, 1))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: in_use(sem, 0))


async def test_a_holder_that_cannot_reach_redis_stops_by_its_local_deadline(own_server: Server, name: str) -> None:
    async with await redsem.connect(own_server.url, response_timeout=30) as c:
        sem = await c.semaphore(name, limit=1, lease=0.6)
        with pytest.raises(redsem.LeaseLost) as err:
            async with sem.acquire() as p:
                own_server.command("CLIENT", "PAUSE", 4000, "ALL")  # renewals hang
                paused = time.monotonic()
                await asyncio.sleep(30)
        # lost by the local deadline, not when a hung renewal finally returned after the pause
        assert time.monotonic() - paused < 3.5
        assert err.value.reason == "unreachable" == p.lost_reason
        own_server.command("CLIENT", "UNPAUSE")


async def test_a_release_that_fails_on_leaving_a_block_does_not_hide_its_exception(own_server: Server, name: str) -> None:
    # Redis gone while holding: leaving the block with an exception raises that exception,
    # not the release's Unreachable (the release is left to the background)
    c = await redsem.connect(own_server.url, connect_timeout=1, response_timeout=1)
    sem = await c.semaphore(name, limit=1, lease=30.0)
    with pytest.raises(ValueError, match="the block's own"):
        async with sem.acquire(cancel_on_loss=False):
            own_server.stop()
            raise ValueError("the block's own")
    # a coroutine given to run() is closed unrun when no permit comes

    async def work() -> None:
        pass

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(redsem.RedsemError):
            await sem.run(work(), timeout=0.5)
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)], [str(w.message) for w in caught]
    # (close() would try the background release for several seconds: Redis is gone)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(c.close(), 0.5)


HOLDER = textwrap.dedent("""
    import asyncio, sys, redsem
    async def main():
        c = await redsem.connect(sys.argv[1])
        sem = await c.semaphore(sys.argv[2], limit=1, lease=1.0)
        p = await sem.acquire()
        print("held", p.holder_id, p.fences[0].generation, flush=True)
        await asyncio.sleep(600)
    asyncio.run(main())
""")


async def test_a_killed_holders_slot_is_back_within_one_lease(server: Server, name: str) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, server.url, name], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        word, _, generation = holder.stdout.readline().split()
        assert word == "held"
        holder.kill()
        holder.wait()
        killed = time.monotonic()
        async with await redsem.connect(server.url) as c:
            sem = await c.semaphore(name, limit=1, lease=1.0)
            async with sem.acquire(timeout=30) as p:
                waited = time.monotonic() - killed
                assert p.fences[0].generation > int(generation)
            st = await sem.stats()
            assert st.expired_total == 1, "the killed holder's lease expired and was reaped"
        assert waited < 3.0, f"granted {waited:.2f}s after the holder died (lease 1s)"
    finally:
        holder.kill()
        holder.wait()


async def test_stats_lists_holders_and_waiters(server: Server, name: str) -> None:
    async with await redsem.connect(server.url, label="py-test") as c:
        sem = await c.semaphore(name, limit=2)
        p = await sem.acquire(2)
        w = asyncio.ensure_future(sem.acquire())
        await until(lambda: n_waiting(sem, 1))
        st = await sem.stats()
        assert (st.name, st.limit, st.in_use, st.available, st.grants_total) == (name, 2, 2, 0, 1)
        (h,) = st.holders
        assert (h.id, h.label, h.permits, h.fences) == (p.holder_id, "py-test", 2, p.fences)
        assert 0 < h.lease_left <= 10
        (wi,) = st.waiters
        assert (wi.position, wi.ticket, wi.permits, wi.label) == (0, 2, 1, "py-test")
        assert st.oldest_wait is not None
        js = st.to_json()
        assert js["holders"][0]["fences"] == [{"slot": f.slot, "generation": f.generation} for f in p.fences]
        assert set(js) == {
            "name", "limit", "in_use", "available", "holders", "waiters", "holder_count",
            "waiter_count", "grants_total", "expired_total", "repairs_total", "server_time_ms",
        }
        assert (st.holder_count, st.waiter_count) == (len(st.holders), len(st.waiters))
        assert (await c.inspect(name)).in_use == 2
        await p.release()
        await (await w).release()


async def test_a_semaphore_of_another_protocol_version_is_refused(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        await c.semaphore(name, limit=1)
        server.command("HSET", f"redsem:{{{name}}}:cfg", "ver", 999)
        with pytest.raises(redsem.ProtocolMismatch) as err:
            await c.semaphore(name, limit=1)
        assert "999" in str(err.value) and err.value.semaphore == name


async def test_bad_arguments_are_refused_before_anything_is_sent(server: Server) -> None:
    async with await redsem.connect(server.url) as c:
        bad: list[dict[str, Any]] = [{"lease": 0.001}, {"renew_every": 6.0}, {"lease": float("nan")}]
        for kwargs in bad:
            with pytest.raises(redsem.InvalidArgument) as err:
                await c.semaphore("ok", limit=1, **kwargs)
            assert isinstance(err.value, ValueError)
            assert str(err.value).startswith("invalid argument: ")
        with pytest.raises(redsem.InvalidArgument):
            await c.semaphore("ok", limit=0)
        with pytest.raises(redsem.InvalidArgument):
            await c.semaphore("x" * (redsem.MAX_NAME_LEN + 1), limit=1)
    with pytest.raises(redsem.InvalidArgument):
        await redsem.connect("http://nowhere/")
    with pytest.raises(redsem.InvalidArgument):
        await redsem.connect(server.url, prefix="")


async def test_a_wrong_number_names_its_argument_and_sends_nothing(server: Server, name: str) -> None:
    """A bool is not a number of permits, a float or a str not a whole number, and a value
    too large for any limit is out of range: each error names the argument (it used to be a
    bare `OverflowError` or `TypeError`, and `limit=True` opened a semaphore of 1)."""
    async with await redsem.connect(server.url) as c:
        opened: list[tuple[str, dict[str, Any], type[Exception]]] = [
            ("limit", {"limit": True}, TypeError),
            ("limit", {"limit": 1.5}, TypeError),
            ("limit", {"limit": "3"}, TypeError),
            ("limit", {"limit": 2**70}, redsem.InvalidArgument),
            ("local_cap", {"limit": 2, "local_cap": -1}, redsem.InvalidArgument),
            ("local_cap", {"limit": 2, "local_cap": 2**40}, redsem.InvalidArgument),
            ("lease", {"limit": 2, "lease": "3"}, TypeError),
            ("lease", {"limit": 2, "lease": True}, TypeError),
            ("renew_every", {"limit": 2, "renew_every": False}, TypeError),
        ]
        for arg, kwargs, kind in opened:
            with pytest.raises(kind) as err:
                await c.semaphore(name, **kwargs)
            assert arg in str(err.value), (kwargs, err.value)
        assert server.command("EXISTS", f"redsem:{{{name}}}:cfg") == 0
        sem = await c.semaphore(name, limit=2)
        acquired: list[tuple[str, dict[str, Any], type[Exception]]] = [
            ("permits", {"permits": True}, TypeError),
            ("permits", {"permits": -1}, redsem.InvalidArgument),
            ("permits", {"permits": 2**40}, redsem.InvalidArgument),
            ("priority", {"priority": True}, TypeError),
            ("priority", {"priority": 2**70}, redsem.InvalidArgument),
            ("timeout", {"timeout": "1"}, TypeError),
            ("max_hold", {"max_hold": True}, TypeError),
        ]
        for arg, kwargs, kind in acquired:
            with pytest.raises(kind) as err:
                await sem.acquire(**kwargs)
            assert arg in str(err.value), (kwargs, err.value)
        for call, arg in [
            (lambda: sem.stats(True), "listed"),
            (lambda: c.inspect(name, 2**70), "listed"),
            (lambda: sem.resize(True), "new_limit"),
            (lambda: c.resize_existing(name, 2.0), "new_limit"),  # type: ignore[arg-type]
            (lambda: sem.add_permits(2**70), "delta"),
            (lambda: c.add_permits_existing(name, "1"), "delta"),  # type: ignore[arg-type]
        ]:
            with pytest.raises((TypeError, redsem.InvalidArgument)) as err:
                await call()  # type: ignore[no-untyped-call]
            assert arg in str(err.value), err.value
        st = await sem.stats()
        assert (st.limit, st.in_use, st.grants_total) == (2, 0, 0)
        # an int subclass with __index__ (numpy's integers) is a whole number
        class Two(int):
            pass

        async with sem.acquire(permits=Two(2)) as p:
            assert p.permits == 2


async def test_an_unreachable_server_is_a_retryable_error(name: str) -> None:
    with socket_closed_port() as url:
        with pytest.raises(redsem.Unreachable) as err:
            await redsem.connect(url, connect_timeout=2.0)
        assert err.value.retryable and err.value.semaphore is None


class socket_closed_port:
    """A loopback URL on which nothing listens."""

    def __enter__(self) -> str:
        import socket

        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        return f"redis://127.0.0.1:{self.s.getsockname()[1]}/"

    def __exit__(self, *exc: object) -> None:
        self.s.close()


async def test_an_evicting_maxmemory_policy_is_refused_unless_allowed(own_server: Server, name: str) -> None:
    own_server.command("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    async with await redsem.connect(own_server.url) as c:
        with pytest.raises(redsem.EvictingPolicy) as err:
            await c.semaphore(name, limit=1)
        assert err.value.policy == "allkeys-lru" and err.value.semaphore == name
        sem = await c.semaphore(name, limit=1, allow_evicting_policy=True)
        async with sem.acquire(timeout=5) as p:
            assert p.slots == [0]


async def test_closing_a_handle_or_the_client_ends_its_acquisitions(server: Server, name: str) -> None:
    c = await redsem.connect(server.url)
    sem = await c.semaphore(name, limit=1)
    p = await sem.acquire()
    waiting = asyncio.ensure_future(sem.acquire())
    await until(lambda: n_waiting(sem, 1))
    await c.close()
    with pytest.raises(redsem.Closed) as err:
        await waiting
    assert err.value.semaphore == name
    assert p.lost_reason == "shutdown" and c.is_closed()
    # every later call of the closed client raises Closed (and sends nothing)
    for call in [c.ping, lambda: c.inspect(name), lambda: c.resize_existing(name, 3), c.list_semaphores,
                 sem.stats]:
        with pytest.raises(redsem.Closed):
            await call()
    async with await redsem.connect(server.url) as other:
        st = await other.inspect(name)
        assert (st.in_use, st.waiters) == (0, [])


async def test_close_closes_both_connections_while_the_objects_live(own_server: Server, name: str) -> None:
    # (before, the command connection lasted until the client and its handles were collected)
    def connected() -> int:
        info = own_server.command("INFO", "clients")
        assert isinstance(info, str)
        return int(info.split("connected_clients:")[1].split()[0])

    baseline = connected()
    kept = []
    for _ in range(10):
        c = await redsem.connect(own_server.url)
        sem = await c.semaphore(name, limit=2)
        await (await sem.acquire()).release()
        await c.close()
        kept.append((c, sem))

    async def closed() -> bool:
        return connected() <= baseline

    await until(closed)


async def test_a_key_overwritten_by_another_program_loses_the_permit_at_once(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=1, lease=60.0, renew_every=0.3)
        p = await sem.acquire()
        server.command("DEL", f"redsem:{{{name}}}:queue")
        server.command("SET", f"redsem:{{{name}}}:queue", "written by another program")
        # far before its lease (60 s) could have run out
        assert await asyncio.wait_for(p.wait_lost(), 20) == "overwritten"
        assert p.lost_reason == "overwritten" and p.lost.is_set()
        with pytest.raises(redsem.WrongType):
            await sem.acquire()
        await p.release()
        await c.purge_keys(name)


async def test_a_fenced_store_refuses_a_stale_holder(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=1)
        store = c.fenced_store(f"{{{name}}}:fence")
        old = await sem.acquire()
        assert await store.write(old.fences[0], f"{{{name}}}:data", b"old")
        await c.force_release(name, old.holder_id)
        new = await sem.acquire(timeout=10)
        assert await store.write(new.fences[0], f"{{{name}}}:data", "new")
        assert not await store.check(old.fences[0])
        assert not await store.write(old.fences[0], f"{{{name}}}:data", b"stale")
        assert server.command("GET", f"{{{name}}}:data") == "new"
        # a fence as its text (`$REDSEM_FENCES`), and bad ones refused as bad input
        assert await store.check(str(new.fences[0]))
        assert not await store.check(str(old.fences[0]))
        for bad in ["0:", "x:1", "1", "0:-5"]:
            with pytest.raises(redsem.InvalidArgument, match="not a fence"):
                await store.check(bad)
        with pytest.raises(redsem.InvalidArgument, match="out of range"):
            await store.check(redsem.Fence(0, -5))
        await new.release()


async def test_a_burst_of_3000_acquires_on_one_client_all_queue_and_complete(server: Server, name: str) -> None:
    async with await redsem.connect(server.url) as c:
        sem = await c.semaphore(name, limit=20)
        done = 0
        peak = 0
        holding = 0

        async def one() -> None:
            nonlocal done, peak, holding
            async with sem.acquire(timeout=300) as p:
                holding += 1
                peak = max(peak, holding)
                assert len(p.slots) == 1 and 0 <= p.slots[0] < 20
                await asyncio.sleep(0.001)
                holding -= 1
            done += 1

        await asyncio.gather(*(one() for _ in range(3000)))
        assert done == 3000 and peak <= 20
        st = await sem.stats()
        assert (st.in_use, st.waiters, st.grants_total) == (0, [], 3000)


FORKED = textwrap.dedent("""
    import asyncio, os, sys, redsem
    async def use(url):
        c = await redsem.connect(url)
        await c.ping()
        await c.close()
    asyncio.run(use(sys.argv[1]))
    pid = os.fork()
    if pid == 0:
        try:
            asyncio.run(use(sys.argv[1]))
            os._exit(0)
        except redsem.InvalidArgument as e:
            print("child:", e, flush=True)
            os._exit(7)
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
""")


def test_a_forked_child_gets_a_clear_error_instead_of_a_hang(server: Server) -> None:
    out = subprocess.run([sys.executable, "-c", FORKED, server.url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 7, out
    assert "forked" in out.stdout


def test_a_sync_client_dropped_without_close_stops_its_thread(server: Server, name: str) -> None:
    """A `redsem.sync.Client` the program forgets without `close()` stops its loop thread
    when it is collected (it kept a thread and 3 fds for the life of the process)."""
    import gc
    import threading

    from redsem.sync import Client

    def redsem_threads() -> int:
        return sum(t.name == "redsem" for t in threading.enumerate())

    before = redsem_threads()
    for _ in range(20):
        c = Client(server.url)
        with c.semaphore(name, limit=2).acquire(timeout=5):
            pass
        del c
    gc.collect()
    deadline = time.monotonic() + 10
    while redsem_threads() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert redsem_threads() == before
    # and what it held was released (in the background, as a dropped asyncio client does)
    with Client(server.url) as c:
        deadline = time.monotonic() + 10
        while c.inspect(name).in_use and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.inspect(name).in_use == 0


def test_the_sync_wrapper(server: Server, name: str) -> None:
    from redsem.sync import Client

    with Client(server.url) as c:
        sem = c.semaphore(name, limit=1, lease=1.0)
        with sem.acquire(timeout=5) as p:
            assert p.slots == [0] and str(p.fences[0]).startswith("0:")
            with pytest.raises(redsem.NoPermits):
                sem.try_acquire()
            time.sleep(1.5)  # longer than the lease: renewed in the background
            assert not p.is_lost()
        assert sem.stats().in_use == 0
        p = sem.acquire()
        assert not p.lost.wait(0.2)
        assert c.force_release(name, p.holder_id)
        assert p.lost.wait(10)
        assert p.lost_reason == "not_holder" and p.is_lost()
        assert sem.resize(2).previous == 1
        assert c.inspect(name).limit == 2
        assert name in c.list_semaphores()
        # the rest of the asyncio API's surface
        assert c.prefix == "redsem" and c.id and not c.is_closed()
        q = sem.acquire(lease=2.0)
        assert (q.semaphore, q.lease(), q.released) == (name, 2.0, False)
        assert sem.local_counts() == (1, 0) and sem.available_permits() == 1
        assert q.wait_lost(timeout=0.2) is None
        assert c.force_release(name, q.holder_id)
        assert q.wait_lost(timeout=10) == "not_holder"
        q.release()
        assert q.released and q.lease() is None
        with pytest.raises(TypeError):
            c.semaphore(name, limt=2)  # type: ignore[call-arg]
        assert not sem.is_closed()
        sem.close()
        assert sem.is_closed()
    assert c.is_closed()

    # after close: a release does nothing (close released it), other calls raise Closed
    c = Client(server.url)
    sem = c.semaphore(name, limit=2, lease=1.0)
    p = sem.acquire()
    c.close()
    p.release()
    p.release()
    with pytest.raises(redsem.Closed):
        sem.stats()
    with pytest.raises(redsem.Closed):
        c.ping()


def test_the_sync_api_has_every_call_of_the_asyncio_api() -> None:
    import redsem.sync as sync

    def public(cls: type) -> set[str]:
        return {n for n in dir(cls) if not n.startswith("_")}

    # what only an event loop can do: run a coroutine under a permit; the sync Client is its
    # own from_url (it connects at once); a sync Permit's slots, fences and lost are set per
    # instance
    asyncio_only = {
        redsem.Client: {"from_url"},
        redsem.Semaphore: {"run"},
        redsem.Permit: {"run", "slots", "fences", "lost"},
        redsem.FencedStore: set(),
    }
    for cls, only in asyncio_only.items():
        twin = getattr(sync, cls.__name__)
        assert public(cls) - public(twin) == only, cls.__name__


LAST_CALL_CLOSE = textwrap.dedent("""
    import asyncio, sys, redsem
    async def main():
        c = await redsem.connect(sys.argv[1])
        sem = await c.semaphore(sys.argv[2], limit=2)
        async def one():
            async with sem.acquire(timeout=30, cancel_on_loss=False):
                await asyncio.sleep(0.005)
        await asyncio.gather(*(one() for _ in range(8)))
        await c.close()  # the last call: the interpreter finalises right after
    asyncio.run(main())
""")


def test_a_program_whose_last_call_is_close_exits_cleanly(server: Server, name: str) -> None:
    # The runtime's thread that resolves the last awaited call must not be attached to the
    # interpreter while it finalises (that aborted about one run in ten, see src/bridge.rs).
    for i in range(25):
        r = subprocess.run([sys.executable, "-c", LAST_CALL_CLOSE, server.url, f"{name}-{i}"],
                           capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stderr) == (0, ""), f"run {i}: {r}"


FORKED_BEFORE_USE = textwrap.dedent("""
    import asyncio, os, sys, redsem
    async def use(url):
        c = await redsem.connect(url)
        await c.ping()
        await c.close()
    pid = os.fork()  # imported, never used: the child may use it
    if pid == 0:
        asyncio.run(use(sys.argv[1]))
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
""")


def test_a_child_forked_before_any_use_can_use_the_package(server: Server) -> None:
    out = subprocess.run([sys.executable, "-c", FORKED_BEFORE_USE, server.url], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out

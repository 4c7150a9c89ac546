"""The asyncio API against a private redis-server."""

import asyncio
import subprocess
import sys
import textwrap
import time

import pytest
import redis

import redsem
from redsem.errors import NOT_HOLDER, UNREACHABLE
from conftest import run


async def until(cond, timeout=10.0):
    """Polls the async predicate `cond` until it holds; fails the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def with_sem(server, name, test, client_kwargs=None, **kwargs):
    """Runs `await test(client, sem)` with a fresh client and the semaphore `name` opened with
    `kwargs`; returns its result."""
    async def main():
        async with redsem.Client.from_url(server.url, **(client_kwargs or {})) as c:
            return await test(c, await c.semaphore(name, **kwargs))
    return run(main())


async def _n_waiting(sem, n):
    return len((await sem.stats()).waiters) == n


async def _in_use(sem, n):
    return (await sem.stats()).in_use == n


def test_acquire_holds_slots_and_fences_until_released(server, name):
    async def body(c, sem):
        async with sem.acquire() as p:
            assert (p.slots, p.ticket, p.permits) == ([0], 1, 1)
            first = p.fences[0].generation
            assert str(p.fences[0]) == f"0:{first}" and first > 0
            assert not p.is_lost() and not p.lost.is_set()
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
    with_sem(server, name, body, limit=2, lease=2.0)


def test_waiters_of_two_clients_are_granted_in_ticket_order(server, name):
    async def main():
        c1, c2 = await redsem.connect(server.url), await redsem.connect(server.url)
        s1 = await c1.semaphore(name, limit=1)
        s2 = await c2.semaphore(name, limit=1)
        first = await s1.acquire()
        order = []

        async def waiter(sem, i):
            async with sem.acquire(timeout=30) as p:
                order.append((i, p.ticket))
                await asyncio.sleep(0.01)

        tasks = []
        for i in range(6):
            tasks.append(asyncio.ensure_future(waiter(s1 if i % 2 else s2, i)))
            await until(lambda: _n_waiting(s1, i + 1))
        await first.release()
        await asyncio.gather(*tasks)
        assert [i for i, _ in order] == list(range(6))
        assert [t for _, t in order] == list(range(2, 8))
        await c1.close()
        await c2.close()

    run(main())


def test_a_timeout_or_a_cancelled_wait_gives_the_ticket_up(server, name):
    async def body(c, sem):
        held = await sem.acquire()
        with pytest.raises(redsem.Timeout) as err:
            await sem.acquire(timeout=0.3)
        assert isinstance(err.value, TimeoutError)
        await c.flush()
        assert (await sem.stats()).waiters == []
        task = asyncio.ensure_future(sem.acquire())
        await until(lambda: _n_waiting(sem, 1))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await c.flush()
        assert (await sem.stats()).waiters == []
        await held.release()
        async with sem.acquire(timeout=0.3) as p:
            assert p.slots == [0]
    with_sem(server, name, body, limit=1)


def test_try_acquire_takes_only_permits_nobody_queues_for(server, name):
    async def body(c, sem):
        held = await sem.try_acquire()
        second = await sem.try_acquire()
        with pytest.raises(redsem.NoPermits):
            await sem.try_acquire()
        await second.release()
        big = asyncio.ensure_future(sem.acquire(n=2))  # queued: one of two is free
        await until(lambda: _n_waiting(sem, 1))
        with pytest.raises(redsem.NoPermits):
            await sem.try_acquire()  # one is free, but FIFO: the queued request comes first
        await held.release()
        p = await big
        assert p.slots == [0, 1]
        await p.release()
    with_sem(server, name, body, limit=2)


def test_several_permits_at_once(server, name):
    async def body(c, sem):
        p = await sem.acquire(n=3)
        assert (p.slots, p.permits, len(p.fences)) == ([0, 1, 2], 3, 3)
        assert (await sem.stats()).in_use == 3
        with pytest.raises(redsem.Timeout):
            await sem.acquire(n=2, timeout=0.2)
        with pytest.raises(redsem.TooManyPermits) as err:
            await sem.acquire(n=5)
        assert err.value.limit == 4
        with pytest.raises(redsem.InvalidArgument):
            await sem.acquire(n=0)
        await p.release()
        async with sem.acquire(n=4) as p:
            assert p.slots == [0, 1, 2, 3]
    with_sem(server, name, body, limit=4)


def test_the_stored_limit_is_shared(server, name):
    async def main():
        async with redsem.Client.from_url(server.url) as c:
            await c.semaphore(name, limit=2)
            with pytest.raises(redsem.LimitConflict) as err:
                await c.semaphore(name, limit=3)
            assert (err.value.stored, err.value.requested) == (2, 3)
    run(main())


def test_a_lost_permit_cancels_the_body(server, name):
    async def body(c, sem):
        started = time.monotonic()
        with pytest.raises(redsem.LeaseLost) as err:
            async with sem.acquire() as p:
                assert await c.force_release(name, p.holder_id)
                await asyncio.sleep(30)
        assert time.monotonic() - started < 10
        assert err.value.reason == NOT_HOLDER == p.lost_reason
        assert p.lost.is_set() and p.is_lost()

        p = await sem.acquire()
        await c.force_release(name, p.holder_id)
        with pytest.raises(redsem.LeaseLost):
            await p.run(asyncio.sleep(30))
        # the work's own result when nothing is lost
        p = await sem.acquire()
        assert await p.run(asyncio.sleep(0.01, result=42)) == 42
        assert p.released
    with_sem(server, name, body, limit=1, lease=0.6)


def test_the_callers_own_cancellation_is_not_a_lost_lease(server, name):
    async def body(c, sem):

        async def body():
            async with sem.acquire():
                await asyncio.sleep(30)

        task = asyncio.ensure_future(body())
        await until(lambda: _in_use(sem, 1))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await sem.stats()).in_use == 0
    with_sem(server, name, body, limit=1)


def test_a_holder_that_cannot_reach_redis_stops_by_its_local_deadline(own_server, name):
    async def main():
        admin = redis.Redis.from_url(own_server.url)
        async with redsem.Client.from_url(own_server.url, response_timeout=30) as c:
            sem = await c.semaphore(name, limit=1, lease=0.6)
            with pytest.raises(redsem.LeaseLost) as err:
                async with sem.acquire() as p:
                    admin.execute_command("CLIENT", "PAUSE", 4000, "ALL")  # renewals hang
                    paused = time.monotonic()
                    await asyncio.sleep(30)
            # lost by the deadline (trusted confirmation + lease - margin), not when a hung
            # renewal finally returned after the pause
            assert time.monotonic() - paused < 3.5
            assert err.value.reason == UNREACHABLE == p.lost_reason
            admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
    run(main())


HOLDER = textwrap.dedent("""
    import asyncio, sys, redsem
    async def main():
        c = await redsem.connect(sys.argv[1])
        sem = await c.semaphore(sys.argv[2], limit=1, lease=1.0)
        p = await sem.acquire()
        print("held", p.holder_id, flush=True)
        await asyncio.sleep(600)
    asyncio.run(main())
""")


def test_a_killed_holders_slot_is_back_within_one_lease(server, name):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, server.url, name], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().startswith("held")
        admin = redis.Redis.from_url(server.url)
        # the generation of the latest grant (protocol 3 keeps it in cfg, not per slot)
        killed_generation = int(admin.hget(f"redsem:{{{name}}}:cfg", "gen"))
        assert admin.exists(f"redsem:{{{name}}}:fence") == 0
        admin.close()
        holder.kill()
        holder.wait()
        killed = time.monotonic()

        async def main():
            async with redsem.Client.from_url(server.url) as c:
                sem = await c.semaphore(name, limit=1, lease=1.0)
                async with sem.acquire(timeout=30) as p:
                    waited = time.monotonic() - killed
                    assert p.fences[0].generation > killed_generation
                st = await sem.stats()
                assert st.expired_total == 1, "the killed holder's lease expired and was reaped"
                return waited

        waited = run(main())
        assert waited < 3.0, f"granted {waited:.2f}s after the holder died (lease 1s)"
    finally:
        holder.kill()
        holder.wait()


def test_stats_lists_holders_and_waiters(server, name):
    async def body(c, sem):
        p = await sem.acquire(n=2)
        w = asyncio.ensure_future(sem.acquire())
        await until(lambda: _n_waiting(sem, 1))
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
        assert [f.slot for f in p.fences] == [0, 1]
        assert set(js) == {"name", "limit", "in_use", "available", "holders", "waiters", "grants_total",
                           "expired_total", "repairs_total", "server_time_ms"}
        assert (await c.inspect(name)).in_use == 2
        with pytest.raises(redsem.UnknownSemaphore):
            await c.inspect(name + "-nothing")
        await p.release()
        await (await w).release()
    with_sem(server, name, body, client_kwargs=dict(label="py-test"), limit=2)


def test_a_semaphore_of_another_protocol_version_is_refused(server, name):
    async def main():
        async with redsem.Client.from_url(server.url) as c:
            await c.semaphore(name, limit=1)
            await c.redis.hset(f"redsem:{{{name}}}:cfg", "ver", redsem.PROTOCOL + 1)
            with pytest.raises(redsem.ProtocolMismatch) as err:
                await c.semaphore(name, limit=1)
            assert f"protocol version {redsem.PROTOCOL + 1}" in str(err.value)
    run(main())


def test_bad_arguments_are_refused_before_anything_is_sent(server):
    async def main():
        async with redsem.Client.from_url(server.url) as c:
            for kwargs in ({"limit": 0}, {"limit": 1, "lease": 0.001}, {"limit": 1, "renew_every": 6.0},
                           {"limit": 1, "renew_every": 3.4}):  # above a third of the 10 s lease
                with pytest.raises(redsem.InvalidArgument):
                    await c.semaphore("ok", **kwargs)
            with pytest.raises(redsem.InvalidArgument):
                await c.semaphore("bad name", limit=1)
    run(main())


def test_the_sync_wrapper(server, name):
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
        assert c.force_release(name, p.holder_id)
        assert p.lost.wait(10), "the loop thread sets the threading.Event"
        assert p.lost_reason == NOT_HOLDER


def test_a_waiter_whose_subscriber_reconnects_still_gets_its_grant_at_once(own_server, name):
    async def main():
        admin = redis.Redis.from_url(own_server.url)
        async with redsem.Client.from_url(own_server.url) as c:
            # renewals and fallback polls every 20 s: only the notice (or the re-check made
            # when the subscriber comes back) can grant the waiter within the bound below
            sem = await c.semaphore(name, limit=1, lease=60.0, fallback_poll=30.0)
            held = await sem.acquire()
            waiting = asyncio.ensure_future(sem.acquire(timeout=30))
            await until(lambda: _n_waiting(sem, 1))
            await asyncio.sleep(0.1)
            assert admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub") >= 1
            await held.release()
            released = time.monotonic()
            p = await waiting
            assert time.monotonic() - released < 10
            await p.release()
        admin.close()
    run(main())


def test_failed_renewals_are_retried_at_a_steady_pace_until_the_permit_is_lost(own_server, name, caplog):
    async def body(c, sem):
        with pytest.raises(redsem.LeaseLost) as err:
            async with sem.acquire() as p:
                own_server.stop()  # every call now fails at once
                await asyncio.sleep(30)
        assert err.value.reason == UNREACHABLE == p.lost_reason
        return len([r for r in caplog.records if "renewal of" in r.getMessage()])

    with caplog.at_level("WARNING", logger="redsem"):
        failed = with_sem(own_server, name, body, limit=1, lease=1.0)
    # about one retry per 200 ms until the deadline (0.9 s), not a tight loop
    assert 1 <= failed <= 20, failed


def test_waiters_keep_their_tickets_while_renewals_run_concurrently(server, name, caplog):
    async def body(c, sem):
        held = await sem.acquire()  # renewed every 40 ms while the waiters queue (and so are they)
        waiting = []
        for _ in range(60):
            waiting.append(asyncio.ensure_future(sem.acquire(timeout=60)))
            await asyncio.sleep(0.005)
        await until(lambda: _n_waiting(sem, 60))
        await held.release()
        # in grant order: on a loaded machine two acquires may reach Redis in another order
        # than they were started (they go out on different pooled connections), and awaiting
        # them in start order would wait for a permit queued behind the one held
        tickets = []
        for next_grant in asyncio.as_completed(waiting):
            p = await next_grant
            tickets.append(p.ticket)
            await p.release()
        return tickets

    with caplog.at_level("INFO", logger="redsem"):
        # frequent renewals (every 40 ms) racing the acquires; a lease long enough (1.2 s) that
        # a loaded machine does not let a waiter's lease run out: then it would rightly queue
        # again, and this test is about renewals, not about expiry
        tickets = with_sem(server, name, body, limit=1, lease=1.2, renew_every=0.04)
    assert tickets == list(range(2, 62)), "granted in ticket order, each waiter with its first ticket"
    assert not [r for r in caplog.records if "vanished" in r.getMessage()]


def test_a_permit_whose_grant_was_lost_does_not_adopt_a_fresh_grant(server, name):
    """Redis loses a grant while the entry waited there (a failover to a replica that missed
    it) and grants the same id afresh: the permit of the lost grant is lost, not renewed."""
    keys = ["cfg", "queue", "exp", "meta", "slots", "free", "own"]
    r = redis.Redis(port=server.port)

    def copy(src, dst):
        for k in keys:
            r.delete(f"{dst}{k}")
            r.copy(f"{src}{k}", f"{dst}{k}")

    async def body(c, sem):
        first = await sem.acquire()
        waiting = asyncio.ensure_future(sem.acquire())
        await until(lambda: _n_waiting(sem, 1))
        live, saved = f"redsem:{{{name}}}:", f"redsem:{{{name}}}:saved-"
        copy(live, saved)  # the replica's copy: `first` holds, the waiter is queued
        first_id = first.holder_id
        await first.release()
        second = await waiting
        old = second.fences[0]
        copy(saved, live)  # the failover
        assert await c.force_release(name, first_id)  # the waiter is granted afresh
        await asyncio.wait_for(second.lost.wait(), 5)
        assert second.lost_reason == NOT_HOLDER
        await second.release()
        nxt = await asyncio.wait_for(sem.acquire(), 5)
        assert nxt.fences[0].generation > old.generation
        await nxt.release()
    with_sem(server, name, body, limit=1, lease=3.0, renew_every=0.15)


def test_an_evicting_maxmemory_policy_is_refused_unless_allowed(own_server, name):
    r = redis.Redis(port=own_server.port)
    r.config_set("maxmemory-policy", "allkeys-lru")

    async def main():
        async with redsem.Client.from_url(own_server.url) as c:
            with pytest.raises(redsem.EvictingPolicy) as err:
                await c.semaphore(name, limit=1)
            assert err.value.policy == "allkeys-lru" and "noeviction" in str(err.value)
            assert r.exists(f"redsem:{{{name}}}:cfg") == 0  # nothing created
            sem = await c.semaphore(name, limit=1, allow_evicting_policy=True)
            async with sem.acquire():
                pass
            # volatile-*: refused only while one of its keys carries a TTL
            r.config_set("maxmemory-policy", "volatile-lru")
            await c.semaphore(name, limit=1)
            r.pexpire(f"redsem:{{{name}}}:cfg", 60_000)
            with pytest.raises(redsem.EvictingPolicy) as err:
                await c.semaphore(name, limit=1)
            assert f"redsem:{{{name}}}:cfg" in str(err.value)
    run(main())


async def enqueue(sem, **kwargs):
    """Starts `sem.acquire(**kwargs)` and waits until Redis queued it; returns its task."""
    before = len((await sem.stats()).waiters)
    task = asyncio.ensure_future(sem.acquire(**kwargs))
    await until(lambda: _n_waiting(sem, before + 1))
    return task


def spy_renewals(client):
    """Records every `renew.lua` call made through `client`: `(sessions, ids)` each, sessions
    as `(session id, lease ms)` pairs and ids as the entries it checks."""
    calls = []
    call = client._call

    async def spy(script, keys, limit, args, **kwargs):
        if script == "renew":
            k = int(args[0])
            sessions = [(str(args[1 + 2 * i]), int(args[2 + 2 * i])) for i in range(k)]
            calls.append((sessions, [str(a) for a in args[1 + 2 * k:]]))
        return await call(script, keys, limit, args, **kwargs)

    client._call = spy
    return calls


def test_a_queued_waiter_lives_on_its_sessions_renewals_without_being_checked_each_time(server, name):
    async def main():
        async with redsem.Client.from_url(server.url) as holding, redsem.Client.from_url(server.url) as waiting:
            held = await (await holding.semaphore(name, limit=1, lease=0.6)).acquire()
            sem = await waiting.semaphore(name, limit=1, lease=0.6, renew_every=0.05)
            calls = spy_renewals(waiting)
            task = await enqueue(sem, timeout=30)
            (w,) = (await sem.stats()).waiters
            await asyncio.sleep(1.5)  # more than two leases: only renewals keep the waiter alive
            st = await sem.stats()
            assert [(x.id, x.ticket) for x in st.waiters] == [(w.id, w.ticket)]
            assert st.expired_total == 0, "the waiter's session lease was renewed"
            renewals = [(s, ids) for s, ids in calls if s]
            assert len(renewals) >= 10, renewals
            session = f"{sem._suffix}~600"
            assert all(s == [(session, 600)] for s, _ in renewals), renewals
            assert not [ids for _, ids in calls if w.id in ids], "the waiter was checked one by one"
            await held.release()
            p = await task  # by its notification
            assert p.holder_id == w.id and p.ticket == w.ticket
            await p.release()
    run(main())


def test_a_waiter_whose_grant_notice_was_lost_is_granted_by_the_head_of_queue_rule(server, name, monkeypatch):
    monkeypatch.setattr(redsem._protocol, "parse_notices", lambda payload: [])  # every notice is lost

    async def main():
        async with redsem.Client.from_url(server.url) as holding, redsem.Client.from_url(server.url) as waiting:
            held = await (await holding.semaphore(name, limit=1, lease=3.0)).acquire()
            sem = await waiting.semaphore(name, limit=1, lease=3.0, renew_every=0.1)
            calls = spy_renewals(waiting)
            first, second = await enqueue(sem, timeout=30), await enqueue(sem, timeout=30)
            w1, w2 = (await sem.stats()).waiters
            await asyncio.sleep(0.3)
            assert not [ids for _, ids in calls if ids], "nobody in doubt while both wait"

            await held.release()  # grants w1 in Redis; its notice is lost
            released = time.monotonic()
            p1 = await first
            assert time.monotonic() - released < 5
            assert (p1.holder_id, p1.ticket) == (w1.id, w1.ticket)
            # found by a check right after a renewal whose head of the queue (w2's ticket)
            # was above w1's ticket: a check without sessions, that left w2 alone
            checks = [(s, ids) for s, ids in calls if w1.id in ids]
            assert checks and all(s == [] and w2.id not in ids for s, ids in checks), checks
            assert not second.done()

            calls.clear()
            await p1.release()  # grants w2, its notice lost too: now nobody waits (head -1)
            p2 = await second
            assert (p2.holder_id, p2.ticket) == (w2.id, w2.ticket)
            checks = [(s, ids) for s, ids in calls if w2.id in ids]
            assert checks and all(s == [] for s, _ in checks), checks
            await p2.release()
            st = await sem.stats()
            assert (st.in_use, st.waiters, st.expired_total) == (0, [], 0)
    run(main())


def test_a_waiter_removed_by_an_operator_learns_it_from_its_sessions_renewal(server, name, caplog):
    async def main():
        async with redsem.Client.from_url(server.url) as c:
            sem = await c.semaphore(name, limit=1, lease=3.0, renew_every=0.1)
            held = await sem.acquire()
            calls = spy_renewals(c)
            first, second = await enqueue(sem, timeout=30), await enqueue(sem, timeout=30)
            w1, w2 = (await sem.stats()).waiters
            # the head of the queue stays w1's ticket: only the renewal's list of removed
            # entries tells that w2 is gone (a forced release sends no notice)
            assert await c.force_release(name, w2.id)
            await until(lambda: _n_waiting(sem, 2))
            st = await sem.stats()
            assert [x.ticket for x in st.waiters] == [w1.ticket, w2.ticket + 1], "w2 queued again, at the back"
            assert not [ids for _, ids in calls if w2.id in ids], "learnt without a check"
            await held.release()
            for t in (first, second):
                await (await t).release()

    with caplog.at_level("INFO", logger="redsem"):
        run(main())
    assert [r for r in caplog.records if "vanished" in r.getMessage()]


def test_closing_a_handle_removes_its_entries_and_ends_its_sessions(server, name):
    async def main():
        async with redsem.Client.from_url(server.url) as c:
            sem = await c.semaphore(name, limit=1, lease=5.0)
            other = await c.semaphore(name, limit=1, lease=5.0)
            await sem.acquire()
            waiting = asyncio.ensure_future(sem.acquire())
            await until(lambda: _n_waiting(sem, 1))
            assert await c.redis.zrange(f"redsem:{{{name}}}:exp", 0, -1) == [f"{sem._suffix}~5000".encode()]
            await sem.close()
            with pytest.raises(redsem.Closed):
                await waiting
            await c.flush()
            st = await other.stats()
            assert (st.in_use, st.waiters, st.expired_total) == (0, [], 0)
            assert await c.redis.zcard(f"redsem:{{{name}}}:exp") == 0, "its session ended"
            assert await c.redis.zrange(f"redsem:{{{name}}}:own", 0, -1) == [b"#"], "nothing indexed"
    run(main())

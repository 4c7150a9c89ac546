"""`Semaphore`: one open handle of a distributed semaphore, with its notification listener
and its heartbeat (two asyncio tasks), as docs/PROTOCOL.md "What a client must do" asks.

- The listener reads the handle's own channel and delivers grants (`g:`) and rejections
  (`x:`) to the waiting acquires; after the subscriber reconnects it makes the heartbeat
  re-check every waiter (notifications are at-most-once).
- The heartbeat renews the handle's session (protocol 3: one lease per handle and lease
  length, which keeps every entry of the handle alive) and checks every local holder in one
  `renew.lua` call: every renewal interval while anything is held or queued, at least every
  fallback interval while anything waits, and once the nearest lease in Redis is due to
  expire (so a crashed holder's slot is taken over without delay). Waiters are not listed
  one by one: only those in doubt are checked, in a follow-up call right after the reply
  (all of them after a reconnect of the subscriber or when the session had lost its lease;
  otherwise those whose ticket is below the head of the queue the reply reports: they were
  granted, or removed, and their notification was lost).
- A holder whose lease was not confirmed by `the trusted confirmation + lease - margin`
  (margin = lease/10, at most 1 s; monotonic clock) is lost at that moment, even while a
  renewal call hangs. The trusted confirmation is one answered at least one renewal interval
  before a later one was sent: a failover to a replica lagging by less than an interval
  cannot have lost it (it may have lost the last one, and every other one that came close
  before it). A holder's renewal is due one renewal interval after the answer to
  its anchor confirmation, which it makes trusted (see `_lease.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from . import _protocol
from .errors import (
    CLOSED,
    NOT_HOLDER,
    UNREACHABLE,
    Closed,
    EvictingPolicy,
    InvalidArgument,
    LimitConflict,
    NoPermits,
    RedsemError,
    Timeout,
    TooManyPermits,
)
from ._lease import _Confirmations
from .permit import AcquireContext, Permit
from .stats import Stats

if TYPE_CHECKING:
    from .client import Client

log = logging.getLogger("redsem")

#: Delay before retrying a failed renewal.
RETRY = 0.2
#: Told to an acquire whose ticket vanished while it waited: it queues again, at the back.
_REQUEUE = object()


@dataclass
class _Waiter:
    n: int
    future: "asyncio.Future[Any]"
    #: The calls that confirmed the waiter's lease (its registration, then renewals of its
    #: session, each sent and answered): a grant keeps that lease, so the holder's lease
    #: clock starts with these (docs/PROTOCOL.md rule 4).
    confirmations: _Confirmations
    #: The ticket `acquire.lua` answered "queued" with: only then may the heartbeat check
    #: it (a check that reached Redis before the acquire would find it "gone").
    ticket: Optional[int] = None

    @property
    def queued(self) -> bool:
        return self.ticket is not None

    def confirm(self, sent: float, answered: float) -> None:
        """A call sent at `sent` and answered at `answered` confirmed the waiter."""
        self.confirmations.confirm(sent, answered)


class Semaphore:
    """A handle on the distributed semaphore `name`, made by `Client.semaphore()`.

    `acquire()` waits in FIFO order (tickets are shared by every process and language);
    `try_acquire()` takes permits only if free now and nobody is queued. Close it with
    `await sem.close()` (the client's `close()` closes all its handles).
    """

    def __init__(self, client: "Client", name: str, *, limit: int, lease: float, renew_every: Optional[float],
                 fallback_poll: float, label: str):
        try:
            self._keys = _protocol.Keys(client.prefix, name)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        if not isinstance(limit, int) or not 1 <= limit <= _protocol.MAX_LIMIT:
            raise InvalidArgument(f"limit must be between 1 and {_protocol.MAX_LIMIT}, not {limit!r}")
        if lease < _protocol.MIN_LEASE:
            raise InvalidArgument(f"lease {lease}s is shorter than the minimum of {_protocol.MIN_LEASE}s")
        renew_every = lease / 3 if renew_every is None else renew_every
        if not 0 < renew_every <= lease / 3:
            raise InvalidArgument(
                f"renewal interval {renew_every}s must be greater than zero and at most a third of the lease ({lease}s)")
        if fallback_poll < 0.001:
            raise InvalidArgument("fallback poll interval must be at least 1ms")
        if len(label.encode()) > _protocol.MAX_LABEL_LEN:
            raise InvalidArgument(f"label is {len(label.encode())} bytes long; the maximum is {_protocol.MAX_LABEL_LEN}")
        self._client = client
        self.name = name
        self.limit = limit
        """The limit stored in Redis when the handle was opened."""
        self._lease = lease
        self._lease_ms = int(round(lease * 1000))
        self._renew_every = renew_every
        self._fallback = min(fallback_poll, renew_every)
        self._margin = min(lease / 10, 1.0)
        self._label = label
        self._suffix = client._next_suffix()
        self._channel = self._keys.channel(self._suffix)
        self._waiters: Dict[str, _Waiter] = {}
        self._holders: Dict[str, Permit] = {}
        self._wake = asyncio.Event()
        self._force = False
        self._next_check: Optional[float] = None
        self._waiters_checked_at = time.monotonic()
        #: Check every queued waiter at the next heartbeat (a reconnect, a session that had
        #: lost its lease, a failed renewal).
        self._check_all = False
        #: The head of the queue at the last renewal: a waiter with a lower ticket was
        #: granted or removed meanwhile, and is checked (infinite: nobody was waiting).
        self._doubt_below: float = 0
        #: Every lease length (ms) this handle's entries use: one session each in Redis.
        self._leases = {self._lease_ms}
        self._retry_at: Optional[float] = None
        self._beat_task: Optional[asyncio.Task] = None
        self._tasks: List[asyncio.Task] = []
        self._pubsub: Any = None
        self._closed = False

    # -- opening and closing ------------------------------------------------------------------

    async def _maxmemory_policy(self) -> Optional[str]:
        """The server's `maxmemory-policy`, from `INFO memory` (allowed where `CONFIG GET` is
        not); `None` when it does not say."""
        try:
            info = await self._client.redis.info("memory")
        except Exception as e:
            from .errors import from_redis
            raise from_redis(e, self.name) from e
        policy = info.get("maxmemory_policy")
        return policy.decode() if isinstance(policy, bytes) else policy

    async def _open(self, allow_evicting_policy: bool = False) -> None:
        """Check the eviction policy, subscribe (confirmed), then `open.lua`; start the listener
        and the heartbeat."""
        policy = None if allow_evicting_policy else await self._maxmemory_policy()
        if policy and policy.startswith("allkeys-"):
            raise EvictingPolicy(self.name, policy, "it evicts any key under memory pressure")
        self._pubsub = self._client.redis.pubsub()
        try:
            try:
                await self._pubsub.subscribe(self._channel)
                deadline = time.monotonic() + 10
                while True:  # wait for the confirmation: no grant published later is missed
                    msg = await self._pubsub.get_message(timeout=1.0)
                    if msg and msg["type"] in ("subscribe", b"subscribe"):
                        break
                    if time.monotonic() > deadline:
                        raise RedsemError(f"no confirmation of SUBSCRIBE {self._channel}")
            except Exception as e:
                if isinstance(e, RedsemError):
                    raise
                from .errors import from_redis
                raise from_redis(e, self.name) from e
            opened = await self._call("open", [])
            stored, _created = _protocol.parse_open(opened)
            with_ttl = opened[2] if len(opened) > 2 else b""
            with_ttl = with_ttl.decode() if isinstance(with_ttl, bytes) else str(with_ttl)
            if policy and policy.startswith("volatile-") and with_ttl:
                raise EvictingPolicy(
                    self.name, policy,
                    f"the key {with_ttl} carries a TTL, which makes it evictable "
                    "(redsem never sets one: remove it with PERSIST)")
            if stored != self.limit:
                raise LimitConflict(self.name, self.limit, stored)
        except BaseException:
            await self._close_pubsub()
            raise
        self._tasks = [asyncio.ensure_future(self._listen()), asyncio.ensure_future(self._heartbeat())]

    async def _close_pubsub(self) -> None:
        if self._pubsub is not None:
            try:
                close = getattr(self._pubsub, "aclose", None) or self._pubsub.close
                await close()
            except Exception:  # closing anyway
                pass

    async def close(self) -> None:
        """Stops the handle: pending acquires fail with `Closed` (their tickets are given up),
        held permits are released (and marked lost: nothing renews them any more), and the
        handle's session ends in Redis. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for t in self._tasks + ([self._beat_task] if self._beat_task else []):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        waiters = list(self._waiters.items())
        self._waiters.clear()
        for id, w in waiters:
            if not w.future.done():
                w.future.set_exception(Closed())
        holders = list(self._holders.values())
        self._holders.clear()
        for p in holders:
            p._lose(CLOSED)
            p._released = True
        # one call: remove what is left of the handle's entries (the waiters' tickets too),
        # then end its sessions (each only once no entry is left in it)
        self._release_later([p.holder_id for p in holders] + [id for id, _ in waiters], end=self._session_ids())
        await self._close_pubsub()
        if self in self._client._semaphores:
            self._client._semaphores.remove(self)

    async def __aenter__(self) -> "Semaphore":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- calls ----------------------------------------------------------------------------------

    async def _call(self, script: str, args: List[Any]) -> Any:
        return await self._client._call(script, self._keys, self.limit, args, name=self.name)

    def _sessions(self) -> List[Tuple[str, int]]:
        """The sessions of this handle, with their leases in ms."""
        return [(_protocol.session_id(self._suffix, ms), ms) for ms in sorted(self._leases)]

    def _session_ids(self) -> List[str]:
        return [sid for sid, _ in self._sessions()]

    def _release_later(self, ids: List[str], end: Sequence[str] = ()) -> None:
        """Removes `ids` (and ends the sessions `end`) in the background."""
        async def release() -> None:
            try:
                await self._call("release", _protocol.release_args(ids, end=end))
            except RedsemError as e:  # the leases expire by themselves
                log.warning("redsem: release of %s failed (%s); the lease will expire", ids or end, e)

        self._client._spawn(release())

    async def _release_holder(self, id: str) -> None:
        self._holders.pop(id, None)
        try:
            await self._call("release", _protocol.release_args([id]))
        except RedsemError as e:
            log.warning("redsem: release of %s failed (%s); retrying in the background", id, e)
            self._release_later([id])

    def _poke(self) -> None:
        self._wake.set()

    # -- acquiring ------------------------------------------------------------------------------

    def acquire(self, n: int = 1, *, timeout: Optional[float] = None, cancel_on_loss: bool = True) -> AcquireContext:
        """Waits for `n` permits in FIFO order, at most `timeout` seconds (None: forever).

        `permit = await sem.acquire()` returns a `Permit` to release yourself;
        `async with sem.acquire() as permit:` releases it on exit and, if the permit is lost
        while the body runs, cancels the body and raises `LeaseLost` (unless
        `cancel_on_loss=False`).

        Raises `Timeout` (the ticket is given up), `TooManyPermits` (n > limit), `Closed`,
        `Unreachable`... Cancelling the waiting task gives the ticket up too.
        """
        return AcquireContext(lambda: self._acquire(n, timeout, False), cancel_on_loss)

    async def try_acquire(self, n: int = 1) -> Permit:
        """`n` permits if free right now and nobody is queued (FIFO), else `NoPermits`.
        One round trip."""
        return await self._acquire(n, None, True)

    def try_acquire_ctx(self, n: int = 1, *, cancel_on_loss: bool = True) -> AcquireContext:
        """`try_acquire` as `async with sem.try_acquire_ctx() as permit:`."""
        return AcquireContext(lambda: self._acquire(n, None, True), cancel_on_loss)

    async def _acquire(self, n: int, timeout: Optional[float], try_only: bool) -> Permit:
        if self._closed:
            raise Closed()
        if not isinstance(n, int) or n < 1:
            raise InvalidArgument(f"acquire at least one permit, not {n!r}")
        if timeout is not None and timeout < 0:
            raise InvalidArgument(f"timeout must not be negative, not {timeout!r}")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            id = _protocol.new_entry_id(self._suffix)
            w: Optional[_Waiter] = None
            if not try_only:
                now = time.monotonic()
                w = _Waiter(n, loop.create_future(), _Confirmations(now, now, self._renew_every))
                self._waiters[id] = w  # before the call: the grant may be published first
            req = _protocol.Request(id, n, self._lease_ms, self._lease_ms, self._suffix, self._label, try_only)
            sent = time.monotonic()
            try:
                reply = _protocol.parse_acquire(await self._call("acquire", _protocol.acquire_args([req])))[0]
            except BaseException:
                self._give_up(id, w)
                raise
            answered = time.monotonic()
            if isinstance(reply, _protocol.Held):
                if w is None:
                    return self._new_holder(id, n, reply.grant, _Confirmations(sent, answered, self._renew_every))
                self._deliver(id, reply.grant, (sent, answered))
            elif isinstance(reply, _protocol.Queued):
                if w is not None:
                    if not any(other.queued for other in self._waiters.values()):
                        self._waiters_checked_at = sent  # the first queued waiter: poll from now
                    w.confirm(sent, answered)
                    w.ticket = reply.ticket
                self._expect_expiry(reply.next_expiry_ms)
                self._poke()
            elif isinstance(reply, _protocol.Busy):
                self._waiters.pop(id, None)
                raise NoPermits(self.name)
            else:
                self._waiters.pop(id, None)
                raise TooManyPermits(n, reply.limit)
            assert w is not None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                result = await asyncio.wait_for(asyncio.shield(w.future), left)
            except asyncio.TimeoutError:
                if not w.future.done():
                    self._give_up(id, w)
                    raise Timeout(self.name, timeout or 0.0) from None
                result = w.future.result()  # delivered right at the deadline
            except asyncio.CancelledError:
                self._give_up(id, w)
                raise
            if result is _REQUEUE:
                log.info("redsem: the ticket of %s vanished while it waited; queueing again", id)
                continue
            return result

    def _give_up(self, id: str, w: Optional[_Waiter]) -> None:
        """The acquire will not take its permit: cancel the ticket, or release a grant that
        arrived meanwhile."""
        if self._waiters.pop(id, None) is not None:
            self._release_later([id])
        elif w is not None and w.future.done() and not w.future.cancelled():
            if w.future.exception() is None and isinstance(w.future.result(), Permit):
                permit = w.future.result()
                self._holders.pop(id, None)
                permit._released = True
                self._release_later([id])

    def _new_holder(self, id: str, n: int, grant: _protocol.Grant, confirmations: _Confirmations) -> Permit:
        permit = Permit(self, id, n, grant.ticket, grant.slots, grant.fences, confirmations)
        self._holders[id] = permit
        self._poke()
        return permit

    def _deliver(self, id: str, grant: _protocol.Grant,
                 confirmed: Optional[Tuple[float, float]] = None) -> None:
        """A grant for `id` (from a reply, a notification or a renewal); `confirmed`: the
        (sent, answered) times of the call that brought it, if it confirmed the waiter."""
        w = self._waiters.pop(id, None)
        if w is None:
            if id not in self._holders:  # nobody waits for it any more: give the slots back
                self._release_later([id])
            return
        if confirmed is not None:
            w.confirm(*confirmed)
        permit = self._new_holder(id, w.n, grant, w.confirmations)
        if not w.future.done():
            w.future.set_result(permit)

    def _reject(self, id: str) -> None:
        w = self._waiters.pop(id, None)
        if w is not None and not w.future.done():
            w.future.set_exception(TooManyPermits(w.n, None))

    def _expect_expiry(self, next_expiry_ms: int) -> None:
        if next_expiry_ms >= 0:
            at = time.monotonic() + next_expiry_ms / 1000 + 0.002
            self._next_check = at if self._next_check is None else min(self._next_check, at)
            self._poke()

    # -- notifications --------------------------------------------------------------------------

    async def _listen(self) -> None:
        while True:
            try:
                msg = await self._pubsub.get_message(timeout=5.0)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # redis-py reconnects and resubscribes on the next read
                log.warning("redsem: subscriber of %s failed (%s); reconnecting", self.name, e)
                await asyncio.sleep(RETRY)
                continue
            if not msg:
                continue
            kind = msg["type"].decode() if isinstance(msg["type"], bytes) else msg["type"]
            if kind == "subscribe":
                # (re)subscribed: a grant published while we were not may be lost; look now,
                # at every waiter
                self._force = True
                self._check_all = True
                self._poke()
            elif kind == "message":
                for notice in _protocol.parse_notices(msg["data"]):
                    if notice.grant is not None:
                        self._deliver(notice.id, notice.grant)
                    else:
                        self._reject(notice.id)

    # -- heartbeat ------------------------------------------------------------------------------

    def _next_wakeup(self, in_flight: bool) -> Optional[float]:
        times = [p._deadline() for p in self._holders.values()]
        if in_flight:
            pass
        elif self._retry_at is not None:
            times.append(self._retry_at)  # after a failed call, nothing is due before the retry
        else:
            # one renewal interval after the answer to each holder's anchor confirmation
            # (the heartbeat's other beats neither delay nor hasten it)
            times += [p._renewal_due() for p in self._holders.values()]
            if any(w.queued for w in self._waiters.values()):
                times.append(self._waiters_checked_at + self._fallback)
                if self._next_check is not None:
                    times.append(self._next_check)
        return min(times) if times else None

    def _lose_overdue(self, now: float) -> None:
        for permit in list(self._holders.values()):
            if permit._deadline() <= now:
                self._lose(permit, UNREACHABLE)

    def _lose(self, permit: Permit, reason: str) -> None:
        if self._holders.pop(permit.holder_id, None) is None:
            return  # released meanwhile
        log.warning("redsem: lease lost: %r (%s)", permit, reason)
        permit._lose(reason)
        self._release_later([permit.holder_id])

    async def _heartbeat(self) -> None:
        while True:
            self._wake.clear()
            now = time.monotonic()
            self._lose_overdue(now)
            if self._beat_task is None:
                wake = self._next_wakeup(False)
                if self._force or (wake is not None and wake <= now):
                    self._force = False
                    self._beat_task = asyncio.ensure_future(self._beat())
            wake = self._next_wakeup(self._beat_task is not None)
            delay = None if wake is None else max(0.0, wake - time.monotonic())
            waits = [asyncio.ensure_future(self._wake.wait())]
            if self._beat_task is not None:
                waits.append(self._beat_task)
            try:
                await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waits[0].cancel()
            if self._beat_task is not None and self._beat_task.done():
                task, self._beat_task = self._beat_task, None
                if not task.cancelled() and task.exception() is not None:
                    log.error("redsem: heartbeat of %s failed", self.name, exc_info=task.exception())
                    self._retry_at = time.monotonic() + RETRY

    async def _beat(self) -> None:
        """One renewal of every session of this handle and check of every local holder (one
        call), then a check of the waiters in doubt, if any (one more call per
        `WAITERS_PER_CALL` of them). A queued waiter is not listed otherwise: its session's
        renewal keeps it alive, and its grant comes by notification."""
        holders = list(self._holders.items())
        if not holders and not any(w.queued for w in self._waiters.values()):
            return
        sessions = self._sessions()
        checked: set = set()
        doubted = self._in_doubt(checked)
        chunk = doubted[:_protocol.WAITERS_PER_CALL]
        answered = first_answered = await self._renew_call(sessions, holders, chunk)
        checked.update(chunk)
        # The reply may have put waiters in doubt (a head of the queue above their tickets, a
        # session without a lease, the rest of a long list): check them now.
        while answered is not None:
            doubted = self._in_doubt(checked)
            if not doubted:
                break
            chunk = doubted[:_protocol.WAITERS_PER_CALL]
            answered = await self._renew_call([], [], chunk)
            checked.update(chunk)
        if answered is not None and first_answered is not None:
            # from the first answer, as the holders' renewals (one interval after the answer
            # to their anchor): with a fallback poll of one renewal interval, both are due
            # together and share a call
            self._waiters_checked_at = first_answered
        else:
            self._check_all = True  # retried as a whole

    def _in_doubt(self, checked: set) -> List[str]:
        """The queued waiters a check in Redis must look at, except those in `checked`: all of
        them after a reconnect or when a session had lost its lease, else those whose ticket
        is below the head of the queue (granted or removed while their notification was
        lost). Takes the "all" flag."""
        all_, self._check_all = self._check_all, False
        return [id for id, w in self._waiters.items()
                if w.ticket is not None and (all_ or w.ticket < self._doubt_below) and id not in checked]

    async def _renew_call(self, sessions: List[Tuple[str, int]], holders: List[Tuple[str, Permit]],
                          waiters: List[str]) -> Optional[float]:
        """One `renew.lua` call: renews `sessions`, checks `holders` and `waiters`, delivers
        grants and losses. Returns when Redis answered (`None`: it did not)."""
        sent = time.monotonic()
        ids = [h for h, _ in holders] + waiters
        try:
            renewal = _protocol.parse_renew(await self._call("renew", _protocol.renew_args(sessions, ids)),
                                            len(sessions), len(ids))
        except (RedsemError, ValueError) as e:
            log.warning("redsem: renewal of %s failed (%s); retrying", self.name, e)
            self._retry_at = time.monotonic() + RETRY
            return None
        answered = time.monotonic()
        self._retry_at = None
        self._next_check = None
        self._expect_expiry(renewal.next_expiry_ms)
        self._doubt_below = float("inf") if renewal.head is None else renewal.head
        if not all(renewal.had_lease):
            self._check_all = True  # a session had expired: its waiters may have been reaped
        elif sessions:
            # every session's lease runs from `sent` on: so does every waiter's (whose grant,
            # if any, keeps it until it is renewed as a holder)
            for w in self._waiters.values():
                w.confirm(sent, answered)
        states = renewal.states
        for (id, permit), state in zip(holders, states):
            if isinstance(state, _protocol.Held) and permit._is_grant(state.grant):
                permit._confirm(sent, answered)
            else:
                # gone, or granted afresh under the same id after Redis lost this grant
                # (a failover to a replica that missed it): not this permit's slots
                self._lose(permit, NOT_HOLDER)
        for id, state in zip(waiters, states[len(holders):]):
            if isinstance(state, _protocol.Held):
                self._deliver(id, state.grant)
            elif isinstance(state, _protocol.Gone):
                self._requeue(id)
        # removed by an operator or rejected after a shrink: a holder is lost, a waiter queues
        # again (and learns then if it can never be granted)
        for id in renewal.removed:
            permit = self._holders.get(id)
            if permit is not None:
                self._lose(permit, NOT_HOLDER)
            else:
                self._requeue(id)
        return answered

    def _requeue(self, id: str) -> None:
        """The ticket of waiter `id` is lost: its acquire queues again."""
        w = self._waiters.pop(id, None)
        if w is not None and not w.future.done():
            w.future.set_result(_REQUEUE)

    # -- operators ------------------------------------------------------------------------------

    async def stats(self) -> Stats:
        """A consistent snapshot of the semaphore: limit, holders, queue. One round trip."""
        return Stats._from_raw(self.name, _protocol.parse_stats(await self._call("stats", [])))

    def __repr__(self) -> str:
        return f"Semaphore({self.name!r}, limit={self.limit}, holders={len(self._holders)}, waiters={len(self._waiters)})"

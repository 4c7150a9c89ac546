"""The asyncio API: thin, typed wrappers over the compiled `redsem._native` (the Rust crate).

Every call that does I/O is an `async def` awaiting the native call, whose Rust future runs on
a process-wide Tokio runtime; cancelling the awaiting task drops that future, with the cancel
safety the Rust crate documents (a cancelled `acquire` gives its ticket up, a cancelled
`release` is finished in the background).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import operator
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, NamedTuple, TypeVar, overload

from . import _native
from .errors import InvalidArgument

T = TypeVar("T")

DEFAULT_URL = "redis://127.0.0.1:6379/"

_I64 = 2**63
_U32 = 2**32


def _whole(name: str, value: object, *, lo: int = -_I64, hi: int = _I64 - 1) -> int:
    """The int argument `name` as the native call takes it: a bool, float, str or other
    non-integer is a `TypeError` naming the argument (`True` is not 1 permit), a value the
    native parameter cannot hold (outside `lo..hi`) an `InvalidArgument` naming it. The
    library checks what the value means (a limit of 0, 2 permits of a limit of 1)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not bool")
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}") from None
    if not lo <= n <= hi:
        raise InvalidArgument(f"invalid argument: {name} {n} is out of range ({lo}..{hi})")
    return n


@overload
def _seconds(name: str, value: object, *, default: Literal[False]) -> float: ...
@overload
def _seconds(name: str, value: object) -> float | None: ...
def _seconds(name: str, value: object, *, default: bool = True) -> float | None:
    """The duration argument `name` in seconds (an int or a float; `None` for the default,
    where it has one): a bool, str or other type is a `TypeError` naming the argument. The
    library checks the range (negative, NaN, too long: `InvalidArgument`)."""
    if value is None and default:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds (int or float), not {type(value).__name__}")
    return float(value)


def default_url() -> str:
    """`$REDSEM_URL`, else `$REDIS_URL`, else `redis://127.0.0.1:6379/` (as the CLI)."""
    return os.environ.get("REDSEM_URL") or os.environ.get("REDIS_URL") or DEFAULT_URL


class Fence(NamedTuple):
    """A fencing token: `slot` and its `generation` (strictly increasing across the holders of
    the slot). `str(fence)` is `slot:generation`, as the Rust `Fence` and `$REDSEM_FENCES`."""

    slot: int
    generation: int

    def __str__(self) -> str:
        return f"{self.slot}:{self.generation}"

    @classmethod
    def parse(cls, text: str) -> Fence:
        """The fence written as `slot:generation` (`str(fence)`, an element of
        `$REDSEM_FENCES`). Raises `InvalidArgument` for anything else."""
        slot, sep, generation = text.strip().partition(":")
        if sep and slot.isdigit() and generation.isdigit():
            return _checked_fence(cls(int(slot), int(generation)))
        raise InvalidArgument(f"not a fence: {text!r} (a fence is slot:generation, e.g. 0:1796343399139180)")


def _checked_fence(fence: Fence | str) -> Fence:
    """`fence` as a `Fence` (its text `slot:generation` is parsed), checked to be in range."""
    if isinstance(fence, str):
        return Fence.parse(fence)
    if not isinstance(fence, tuple) or len(fence) != 2:
        raise TypeError(f"a fence is a Fence (or its text slot:generation), not {type(fence).__name__}")
    slot, generation = fence
    if not (isinstance(slot, int) and 0 <= slot < 2**32 and isinstance(generation, int) and 0 <= generation < 2**64):
        raise InvalidArgument(f"fence {slot}:{generation} is out of range (slot 0..2^32, generation 0..2^64)")
    return Fence(slot, generation)


@dataclass
class HolderInfo:
    """One holder in `Stats`. Durations in seconds."""

    id: str
    label: str
    permits: int
    fences: list[Fence]
    held: float
    """Time since the grant."""
    lease_left: float
    """Time until its lease expires unless renewed."""


@dataclass
class WaiterInfo:
    """One waiter in `Stats`. Durations in seconds."""

    id: str
    label: str
    permits: int
    position: int
    """0 = next to be granted."""
    ticket: int
    waited: float
    lease_left: float
    priority: int = 0
    """Its priority class (0, the default, to 9)."""


@dataclass
class Stats:
    """A consistent snapshot of one semaphore (`redsem::Stats`), taken by one read-only call:
    entries whose lease has passed are left out (and counted as expired)."""

    name: str
    limit: int
    in_use: int
    available: int
    holders: list[HolderInfo] = field(default_factory=list)
    """Oldest acquisition first; at most 100, or the `listed` asked (`holder_count` counts
    them all)."""
    waiters: list[WaiterInfo] = field(default_factory=list)
    """In queue (FIFO) order, from the head; at most 100, or the `listed` asked
    (`waiter_count` counts them all)."""
    holder_count: int = 0
    """Every holder, listed or not."""
    waiter_count: int = 0
    """Every queued waiter, listed or not."""
    grants_total: int = 0
    expired_total: int = 0
    repairs_total: int = 0
    """Times the scripts repaired the semaphore's keys after some were lost."""
    server_time_ms: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    """The snapshot as the Rust crate serialises it (the schema of `redsem stats --json`)."""

    @property
    def oldest_wait(self) -> float | None:
        """The longest wait (seconds) among the waiters listed (the first of the queue), if
        anyone waits: the head's without priority classes; with them, a lower class's waiter
        that was overtaken, when it is listed (`redsem::Stats::oldest_wait`)."""
        return max((w.waited for w in self.waiters), default=None)

    def to_json(self) -> dict[str, Any]:
        """The snapshot in the schema of `redsem stats --json`."""
        return dict(self.raw)

    @classmethod
    def _from_json(cls, text: str) -> Stats:
        d = json.loads(text)
        return cls(
            name=d["name"],
            limit=d["limit"],
            in_use=d["in_use"],
            available=d["available"],
            holders=[
                HolderInfo(
                    id=h["id"],
                    label=h["label"],
                    permits=h["permits"],
                    fences=[Fence(f["slot"], f["generation"]) for f in h["fences"]],
                    held=h["held"] / 1000,
                    lease_left=h["lease_left"] / 1000,
                )
                for h in d["holders"]
            ],
            waiters=[
                WaiterInfo(
                    id=w["id"],
                    label=w["label"],
                    permits=w["permits"],
                    position=w["position"],
                    ticket=w["ticket"],
                    waited=w["waited"] / 1000,
                    lease_left=w["lease_left"] / 1000,
                    priority=w["priority"],
                )
                for w in d["waiters"]
            ],
            holder_count=d["holder_count"],
            waiter_count=d["waiter_count"],
            grants_total=d["grants_total"],
            expired_total=d["expired_total"],
            repairs_total=d["repairs_total"],
            server_time_ms=d["server_time_ms"],
            raw=d,
        )


@dataclass(frozen=True)
class RejectedWaiter:
    """A queued request that a shrink of the limit rejected: it asked for more permits than
    the new limit, so it could never be granted (its acquire fails with `TooManyPermits`,
    naming the new limit)."""

    id: str
    permits: int
    label: str


@dataclass(frozen=True)
class Resized:
    """What a change of the limit did (`Semaphore.resize`, `Semaphore.add_permits`,
    `Client.resize_existing`): the limit before and after, and the queued requests it
    rejected, in queue order (empty unless the limit shrank)."""

    previous: int
    limit: int
    rejected: tuple[RejectedWaiter, ...]

    @classmethod
    def _from_native(cls, t: tuple[int, int, list[tuple[str, int, str]]]) -> Resized:
        # (previous limit, new limit, [(id, permits, label) of each rejected waiter])
        previous, limit, rejected = t
        return cls(previous, limit, tuple(RejectedWaiter(*w) for w in rejected))


ForceReleased = Literal["holder", "waiter"]
"""What an operator's release by id found (`Client.force_release`; `None`: nothing)."""


@dataclass(frozen=True)
class AcquireOptions:
    """Per-acquisition options (`redsem::AcquireOptions`), for `Semaphore.acquire_with`.

    `permits`: how many at once (one slot each); `lease`: this acquisition's lease (seconds;
    default the handle's); `label`: shown to operators in `stats` (default the handle's);
    `timeout`: give up the place in the queue after this many seconds (`Timeout`);
    `try_only`: only if free now and nobody is queued first (`NoPermits`), one round trip;
    `priority`: the class, 0 (the default) to 9, higher served first, FIFO within a class,
    and a request is overtaken by at most 1000 later ones per class above its own (aging:
    nothing starves; see `redsem::AcquireOptions::priority`).
    `max_hold`: the longest the permits may be held, in seconds, counted from the grant (as
    this process learns it): then the permit is lost with reason `"max_hold"` (the work of
    `Permit.run` and `async with` is cancelled) and Redis stops renewing it (its slots free
    within one lease even if the permit is kept; releasing it frees them at once). Costs
    one timer per such permit. Zero or above 365 days: `InvalidArgument`.
    """

    permits: int = 1
    lease: float | None = None
    label: str | None = None
    timeout: float | None = None
    try_only: bool = False
    priority: int = 0
    max_hold: float | None = None


class LostSignal:
    """The read side of an `asyncio.Event` that is set when the permit is lost: `is_set()`
    (no I/O) and `await wait()`. Nothing runs in the background until `wait()` is awaited."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.Permit) -> None:
        self._native = native

    def is_set(self) -> bool:
        return self._native.lost_reason() is not None

    async def wait(self) -> bool:
        await self._native.wait_lost()
        return True


class Permit:
    """One acquisition's permits (`redsem::Permit`). Renewed in the background while it lives;
    release it with `await permit.release()`, `async with permit:`, or by leaving the
    `async with sem.acquire()` block. If it is garbage-collected unreleased, it is released in
    the background (one batched call), as a dropped Rust permit."""

    __slots__ = ("_native", "fences", "lost", "slots")

    def __init__(self, native: _native.Permit) -> None:
        self._native = native
        self.fences: list[Fence] = [Fence(s, g) for s, g in native.fences]
        """Fencing tokens, one per slot: send them with every request to a fenced resource."""
        self.slots: list[int] = [f.slot for f in self.fences]
        """Slot numbers in `0..limit`, unique among live holders."""
        self.lost = LostSignal(native)
        """Set when the permit is lost: `permit.lost.is_set()`, `await permit.lost.wait()`."""

    @property
    def semaphore(self) -> str:
        """The semaphore's name."""
        return self._native.semaphore

    @property
    def holder_id(self) -> str:
        """The holder id in Redis, as `stats` lists it (for `force_release`)."""
        return self._native.holder_id

    @property
    def ticket(self) -> int:
        """The FIFO ticket this acquisition was served under."""
        return self._native.ticket

    @property
    def permits(self) -> int:
        """How many permits it holds."""
        return self._native.permits

    @property
    def lost_reason(self) -> str | None:
        """Why it was lost (`"not_holder"`, `"unreachable"`, `"shutdown"`, `"refused"`,
        `"deleted"`, `"handed_off"`: another handle adopted its hand-off token, `"max_hold"`,
        `"overwritten"`: a key of the semaphore was overwritten by another program's data),
        or `None` while it is not."""
        return self._native.lost_reason()

    @property
    def released(self) -> bool:
        """Whether it was released (or detached) through this object."""
        return self._native.released

    def is_lost(self) -> bool:
        """Lost, or its lease could have run out in Redis (its local deadline passed; the
        crate's `Permit::is_lost`). No I/O."""
        return self._native.is_lost()

    def lease_left(self) -> float:
        """Seconds before the lease could run out if no further renewal succeeded; 0 once
        lost or released. No I/O."""
        return self._native.lease_left()

    def lease(self) -> float | None:
        """The length of its lease in seconds (`None` once released)."""
        return self._native.lease()

    async def set_lease(self, lease: float) -> None:
        """Changes the length of its lease (one script call; `LeaseLost` if already lost)."""
        await self._native.set_lease(_seconds("lease", lease, default=False))

    async def wait_lost(self) -> str:
        """Waits until the permit is lost and returns why (never returns if it is not)."""
        return await self._native.wait_lost()

    async def run(self, coro: Awaitable[T]) -> T:
        """Runs `coro` as a task while holding the permit, then releases it. If the permit is
        lost first, the task is cancelled and `LeaseLost` raised (as the Rust `Permit::run`)."""
        work = asyncio.ensure_future(coro)
        lost = asyncio.ensure_future(self._native.wait_lost())
        try:
            await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
            if lost.done() or not work.done():
                work.cancel()
                try:
                    await work
                except asyncio.CancelledError:
                    pass
                err = self._native.lost_error()
                if err is not None:
                    raise err
            return work.result()
        finally:
            lost.cancel()
            if not work.done():
                work.cancel()
            # (the exception in flight, if any: the work's, or the loss's LeaseLost)
            await self._release_on_exit(sys.exc_info()[1])

    async def release(self) -> None:
        """Releases now and waits for Redis to confirm (releases made meanwhile share one
        call). Idempotent. Cancelled, it is finished in the background."""
        await self._native.release()

    def detach(self) -> None:
        """Stops renewing without releasing: the slot frees when the lease expires."""
        self._native.detach()

    async def export(self) -> str:
        """Hands the permit to another process (the crate's `Permit::export`): returns a
        hand-off token, a `str` (`redsem-handoff-1:...`, the same in Rust and Node.js) that
        `Semaphore.adopt` takes over or `Semaphore.release_handoff` releases. This process
        stops renewing it and detaches it in Redis (one script call), without releasing it:
        a token nobody adopts frees its slots within one lease, so adopt it sooner. The
        permit counts as released here. Raises `LeaseLost` if it is already lost; on any
        error (and if cancelled) it is released in the background and no token exists."""
        return await self._native.export()

    async def __aenter__(self) -> Permit:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._release_on_exit(exc)

    async def _release_on_exit(self, exc: BaseException | None) -> None:
        """Leaving a block: a lost permit is released in the background (nothing to wait
        for: Redis may be unreachable, as the Rust `Permit::run`); with an exception in
        flight, a release that fails is left to the background too (where a failed release
        goes anyway), so that it does not hide the block's exception; else `release()`."""
        if self._native.is_lost():
            self._native.release_nowait()
        elif exc is not None:
            try:
                await self.release()
            except Exception:
                self._native.release_nowait()
        else:
            await self.release()

    def __repr__(self) -> str:
        return (
            f"Permit(semaphore={self.semaphore!r}, holder_id={self.holder_id!r}, "
            f"ticket={self.ticket}, fences={[str(f) for f in self.fences]})"
        )


class AcquireContext(Coroutine[Any, Any, Permit]):
    """What `Semaphore.acquire()` returns: `await` it for a `Permit` (it is a coroutine, so
    `asyncio.create_task(sem.acquire())` works too), or `async with` it to hold the permit
    for the block.

    In `async with`, with `cancel_on_loss` (the default), losing the permit cancels the task
    running the block, which gets `CancelledError` at its next `await`, and the block raises
    `LeaseLost` instead; a cancellation from elsewhere stays a `CancelledError`."""

    __slots__ = ("_cancel_on_loss", "_coro", "_permit", "_start", "_task", "_watch")

    def __init__(self, start: Callable[[], Awaitable[_native.Permit]], cancel_on_loss: bool) -> None:
        self._start = start
        self._cancel_on_loss = cancel_on_loss
        self._coro: Coroutine[Any, Any, Permit] | None = None
        self._permit: Permit | None = None
        self._watch: asyncio.Future[bool] | None = None
        self._task: asyncio.Task[Any] | None = None

    async def _acquire(self) -> Permit:
        return Permit(await self._start())

    def _get(self) -> Coroutine[Any, Any, Permit]:
        if self._coro is None:
            self._coro = self._acquire()
        return self._coro

    def __await__(self) -> Generator[Any, None, Permit]:
        return self._get().__await__()

    def send(self, value: Any) -> Any:
        return self._get().send(value)

    def throw(self, *args: Any) -> Any:
        return self._get().throw(*args)

    def close(self) -> None:
        if self._coro is not None:
            self._coro.close()

    async def __aenter__(self) -> Permit:
        permit = await self._acquire()
        self._permit = permit
        if self._cancel_on_loss:
            task = asyncio.current_task()
            if task is not None:
                self._task = task
                self._watch = asyncio.ensure_future(self._watch_loss(permit, task))
        return permit

    @staticmethod
    async def _watch_loss(permit: Permit, task: asyncio.Task[Any]) -> bool:
        await permit._native.wait_lost()
        task.cancel()
        return True

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        permit, watch, task = self._permit, self._watch, self._task
        self._permit = self._watch = self._task = None
        cancelled_by_loss = False
        if watch is not None:
            if watch.done() and not watch.cancelled():
                cancelled_by_loss = True
            else:
                watch.cancel()
        if permit is not None:
            # (cancelled by the loss: the permit is lost, released in the background)
            await permit._release_on_exit(exc)
        if cancelled_by_loss and permit is not None:
            if task is not None:
                task.uncancel()
            err = permit._native.lost_error()
            if err is not None:
                raise err from exc


class Semaphore:
    """A handle on one semaphore (`redsem::Semaphore`), opened by `Client.semaphore`.

    Per handle: one renewal call per renewal interval while it holds or waits, whatever the
    number of holders and waiters; acquisitions made while a call is in flight share the next
    call. Open it once and share it between tasks."""

    __slots__ = ("_client", "_native")

    def __init__(self, client: Client, native: _native.Semaphore) -> None:
        self._client = client
        self._native = native

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def limit(self) -> int:
        """The limit as last seen by this handle (`stats()` reads the stored one)."""
        return self._native.limit

    def available_permits(self) -> int:
        """Permits free as last seen by this handle (no I/O)."""
        return self._native.available_permits()

    def acquire(
        self,
        permits: int = 1,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        label: str | None = None,
        priority: int = 0,
        max_hold: float | None = None,
        cancel_on_loss: bool = True,
    ) -> AcquireContext:
        """Waits in FIFO order for `permits` permits (at most `timeout` seconds: `Timeout`);
        `lease`/`label` override the handle's for this acquisition; `priority` is its class and
        `max_hold` bounds how long the permits may be held (see `AcquireOptions`). A timeout or
        a cancelled wait gives the ticket up."""
        return self.acquire_with(
            AcquireOptions(
                permits=permits, timeout=timeout, lease=lease, label=label, priority=priority, max_hold=max_hold
            ),
            cancel_on_loss=cancel_on_loss,
        )

    def try_acquire(
        self,
        permits: int = 1,
        *,
        lease: float | None = None,
        label: str | None = None,
        priority: int = 0,
        max_hold: float | None = None,
        cancel_on_loss: bool = True,
    ) -> AcquireContext:
        """Only if `permits` are free now and nobody is queued ahead (FIFO; with `priority`,
        ahead of its place), else `NoPermits` (with `.reason`); one round trip."""
        return self.acquire_with(
            AcquireOptions(
                permits=permits, lease=lease, label=label, try_only=True, priority=priority, max_hold=max_hold
            ),
            cancel_on_loss=cancel_on_loss,
        )

    def acquire_with(self, options: AcquireOptions, *, cancel_on_loss: bool = True) -> AcquireContext:
        """`acquire` with every per-acquisition option (`redsem::Semaphore::acquire_with`)."""
        sem = self._native
        # (0 too is refused here, at the call, as -1 is: not when the acquisition is awaited)
        permits = _whole("permits", options.permits, lo=1, hi=_U32 - 1)
        priority = _whole("priority", options.priority)
        lease = _seconds("lease", options.lease)
        timeout = _seconds("timeout", options.timeout)
        max_hold = _seconds("max_hold", options.max_hold)

        def start() -> Awaitable[_native.Permit]:
            return sem.acquire(
                permits=permits,
                lease=lease,
                label=options.label,
                timeout=timeout,
                try_only=options.try_only,
                priority=priority,
                max_hold=max_hold,
            )

        return AcquireContext(start, cancel_on_loss)

    async def run(self, coro: Awaitable[T], *, timeout: float | None = None) -> T:
        """Acquires one permit, runs `coro` under it (see `Permit.run`) and releases it.
        If no permit comes (a timeout, an error), `coro` is closed unrun."""
        try:
            permit = await self.acquire(timeout=timeout)
        except BaseException:
            if inspect.iscoroutine(coro):
                coro.close()
            raise
        return await permit.run(coro)

    async def stats(self, listed: int = _native.STATS_LISTED) -> Stats:
        """A snapshot of the semaphore (one read-only script call): the counts of every holder
        and waiter, and at most `listed` of each (0: the counts alone; 1: the head of the
        queue, what `oldest_wait` needs; at most `MAX_LISTED`, 1000). Its Redis time grows with the entries
        listed, never with the queue."""
        return Stats._from_json(await self._native.stats(_whole("listed", listed)))

    async def resize(self, new_limit: int) -> Resized:
        """Changes the limit for every process; returns the previous and new limit and the
        queued requests a shrink rejected (larger than the new limit). Growing grants
        waiters at once; shrinking lets holders finish (no new grants until under the limit)."""
        return Resized._from_native(await self._native.resize(_whole("new_limit", new_limit)))

    async def add_permits(self, delta: int) -> Resized:
        """Adds `delta` (may be negative) to the limit atomically (concurrent changes all
        count); returns what `resize` returns. `InvalidArgument`, and no change, when the
        limit would leave 1..MAX_LIMIT."""
        return Resized._from_native(await self._native.add_permits(_whole("delta", delta)))

    async def force_release(self, holder_id: str) -> bool:
        """An operator's release of `holder_id`: its slots go to the queue, their fences
        advance; the holder finds its permit lost at its next renewal. The id of a queued
        waiter removes it from the queue (its acquire raises `RemovedFromQueue`). False if
        no such entry."""
        return await self._native.force_release(holder_id)

    async def adopt(self, token: str) -> Permit:
        """Takes over a permit another process exported (`Permit.export`'s token): this
        handle renews it from now on, with the token's slots, fences, holder id and lease
        (the crate's `Semaphore::adopt`; one script call). Adopted twice, the last adopter
        holds it; an earlier one finds it lost (`lost_reason` `"handed_off"`) at its next
        renewal. Raises `HandoffGone` when the permit is no longer in Redis (its lease ran
        out before adoption, or it was released), `InvalidArgument` for a token of another
        semaphore or text that is not a token."""
        return Permit(await self._native.adopt(str(token)))

    async def release_handoff(self, token: str) -> bool:
        """Releases the permit of a hand-off token without adopting it (one script call;
        its slots go to the queue at once). Idempotent: False if it was gone already.
        `InvalidArgument` for a token of another semaphore."""
        return await self._native.release_handoff(str(token))

    async def close(self) -> None:
        """Closes this handle: pending and later acquires fail with `Closed`."""
        self._native.close()

    def is_closed(self) -> bool:
        return self._native.is_closed()

    def local_counts(self) -> tuple[int, int]:
        """(holders, waiters) of this handle in this process (no I/O)."""
        return self._native.local_counts()

    def __repr__(self) -> str:
        return f"Semaphore(name={self.name!r}, limit={self.limit})"


class FencedStore:
    """Fencing-token checks and fenced writes for a resource stored in Redis
    (`redsem::fencing::FencedStore`); the highest generation per slot is kept in the hash at
    `fence_key` (on a cluster, give it and the written keys one hash tag)."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.FencedStore) -> None:
        self._native = native

    async def check(self, fence: Fence | str) -> bool:
        """True when `fence` (a `Fence`, or its text `slot:generation`, as in
        `$REDSEM_FENCES`) is current for its slot (and records it); False if stale."""
        f = _checked_fence(fence)
        return await self._native.check(f.slot, f.generation)

    async def write(self, fence: Fence | str, key: str, value: bytes | str) -> bool:
        """`SET key value` only if `fence` (as for `check`) is current; returns whether it
        was written."""
        f = _checked_fence(fence)
        data = value.encode() if isinstance(value, str) else bytes(value)
        return await self._native.write(f.slot, f.generation, key, data)


class Client:
    """A connection to one Redis or Valkey deployment (`redsem::Client`): two connections
    (commands; notifications) and a few background tasks whatever the number of semaphores,
    waiters and holders. Make one per process with `await redsem.connect(url)`."""

    __slots__ = ("_connect", "_label", "_lock", "_native")

    def __init__(self, connect: Callable[[], Awaitable[_native.Client]], label: str | None) -> None:
        self._connect = connect
        self._label = label
        self._native: _native.Client | None = None
        self._lock: asyncio.Lock | None = None

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        prefix: str | None = None,
        label: str | None = None,
        connect_timeout: float | None = None,
        response_timeout: float | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_ca_pem: bytes | None = None,
        tls_cert_pem: bytes | None = None,
        tls_key_pem: bytes | None = None,
        synced_replicas: int | None = None,
        synced_timeout: float = 1.0,
        scripts_only: bool = False,
    ) -> Client:
        """A client that connects at its first use (no I/O here); see `redsem.connect`."""
        target = url if url is not None else default_url()

        def connect() -> Awaitable[_native.Client]:
            return _native.connect(
                target,
                prefix=prefix,
                connect_timeout=connect_timeout,
                response_timeout=response_timeout,
                tls_ca=None if tls_ca is None else os.fspath(tls_ca),
                tls_cert=None if tls_cert is None else os.fspath(tls_cert),
                tls_key=None if tls_key is None else os.fspath(tls_key),
                tls_ca_pem=tls_ca_pem,
                tls_cert_pem=tls_cert_pem,
                tls_key_pem=tls_key_pem,
                synced_replicas=synced_replicas,
                synced_timeout=synced_timeout,
                scripts_only=scripts_only,
            )

        return cls(connect, label)

    async def _get(self) -> _native.Client:
        if self._native is None:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if self._native is None:
                    self._native = await self._connect()
        return self._native

    @property
    def prefix(self) -> str:
        """The key prefix of this client's semaphores."""
        if self._native is None:
            raise InvalidArgument("the client is not connected yet (await redsem.connect(...))")
        return self._native.prefix

    @property
    def id(self) -> str:
        """This client's unique id (it names its notification channel and its holder ids)."""
        if self._native is None:
            raise InvalidArgument("the client is not connected yet (await redsem.connect(...))")
        return self._native.id

    async def ping(self) -> None:
        """PING on the command connection (on a cluster, every master)."""
        await (await self._get()).ping()

    async def semaphore(
        self,
        name: str,
        *,
        limit: int,
        lease: float | None = None,
        renew_every: float | None = None,
        fallback_poll: float | None = None,
        local_cap: int | None = None,
        label: str | None = None,
        allow_evicting_policy: bool = False,
        limit_policy: Literal["require", "adopt", "create_or_adopt", "resize"] = "require",
    ) -> Semaphore:
        """Opens a handle on semaphore `name`, creating it with `limit` if it does not exist
        (`LimitConflict`, with `.stored`, if it exists with another limit). `lease` (seconds,
        default 10): a crashed holder's slot is free again at most one lease after its last
        renewal. `renew_every` (default lease/3), `fallback_poll` (how often waiters re-check
        when a notice may be lost), `local_cap` (at most this many permits held or requested
        by this handle), `label` (shown in `stats`; default the client's, else host:pid).
        `EvictingPolicy` when Redis may evict the keys, unless `allow_evicting_policy`.
        `limit_policy` says what a stored limit other than `limit` does: "require" (the
        default: `LimitConflict`), "adopt" (use the stored one; `UnknownSemaphore` if the
        semaphore does not exist, and nothing is created), "create_or_adopt" (create with
        `limit` if absent, else use the stored one: for rolling deploys), "resize" (create,
        or set the stored limit to `limit` for everyone). See the Rust crate's
        `LimitPolicy`."""
        limit = _whole("limit", limit)
        cap = None if local_cap is None else _whole("local_cap", local_cap, lo=0, hi=_U32 - 1)
        lease, renew_every = _seconds("lease", lease), _seconds("renew_every", renew_every)
        fallback_poll = _seconds("fallback_poll", fallback_poll)
        native = await (await self._get()).semaphore(
            name,
            limit,
            lease=lease,
            renew_every=renew_every,
            fallback_poll=fallback_poll,
            local_cap=cap,
            label=label if label is not None else self._label,
            allow_evicting_policy=allow_evicting_policy,
            limit_policy=limit_policy,
        )
        return Semaphore(self, native)

    async def list_semaphores(self) -> list[str]:
        """Names of the semaphores under this client's prefix (SCAN; never creates one)."""
        return await (await self._get()).list_semaphores()

    async def load_library(self) -> str:
        """Loads redsem's Redis Functions library (`FUNCTION LOAD`; on a cluster, on every
        master) and returns its name, `redsem_<hash of its text>` (each redsem version has its
        own): for a separate loader user where the applications' user may not load code (the
        rules are in docs/security.md; the CLI's `redsem load-library`). Idempotent; one round
        trip per master. Not needed otherwise: a client whose call finds the library missing
        loads it itself, or runs the scripts where it may not. `NoPermission` when this user
        may not run `FUNCTION LOAD`; `BackendError` when the server has no Functions (Redis
        before 7.0) or refuses the library."""
        return await (await self._get()).load_library()

    async def inspect(self, name: str, listed: int = _native.STATS_LISTED) -> Stats:
        """`Stats` of an existing semaphore, never creating it (`UnknownSemaphore`), listing
        at most `listed` holders and waiters (as `Semaphore.stats`)."""
        return Stats._from_json(await (await self._get()).inspect(name, _whole("listed", listed)))

    async def resize_existing(self, name: str, new_limit: int) -> Resized:
        """`Semaphore.resize` of an existing semaphore (`UnknownSemaphore`, never creating
        it)."""
        return Resized._from_native(await (await self._get()).resize_existing(name, _whole("new_limit", new_limit)))

    async def force_release(self, name: str, holder_id: str) -> ForceReleased | None:
        """`Semaphore.force_release` on an existing semaphore, without opening a handle:
        `"holder"` (released), `"waiter"` (removed from the queue: its acquire raises
        `RemovedFromQueue`) or `None` (no such entry: it finished, expired or never was)."""
        found = await (await self._get()).force_release_existing(name, holder_id)
        if found == "holder":
            return "holder"
        if found == "waiter":
            return "waiter"
        return None

    async def add_permits_existing(self, name: str, delta: int) -> Resized:
        """`Semaphore.add_permits` of an existing semaphore (`UnknownSemaphore`, never
        creating it): an atomic relative change, whatever the current limit."""
        return Resized._from_native(await (await self._get()).add_permits_existing(name, _whole("delta", delta)))

    async def delete_semaphore(self, name: str, *, force: bool = False) -> int:
        """Deletes the semaphore's keys; returns how many entries were evicted. Without
        `force`, `InUse` while it has holders or waiters; with it, they are evicted. Never
        deletes another program's data under the same key names (`NotASemaphore`)."""
        return await (await self._get()).delete_semaphore(name, force=force)

    async def purge_keys(self, name: str) -> int:
        """Deletes every key the semaphore `name` would use, whatever it holds — another
        program's data included (what `delete_semaphore(force=True)` refuses). Holders and
        waiters are evicted as by a forced delete; returns how many. Only for an operator
        who has checked that the data may go (`redsem delete --force --delete-foreign-data`)."""
        return await (await self._get()).purge_keys(name)

    def fenced_store(self, fence_key: str) -> FencedStore:
        """A `FencedStore` on this client (no I/O). The client must be connected."""
        if self._native is None:
            raise InvalidArgument("the client is not connected yet (await redsem.connect(...))")
        return FencedStore(self._native.fenced_store(fence_key))

    async def flush(self) -> None:
        """Waits until the background releases queued so far are done."""
        await (await self._get()).flush_releases()

    async def close(self) -> None:
        """Shuts down (`redsem::Client::shutdown`): every handle is closed (pending acquires
        fail with `Closed`), held permits are declared lost (`"shutdown"`) and released, and
        every release is waited for, and both connections are closed; later calls of the
        client (`ping`, `inspect`, the other operator calls) and of its handles (`stats`, ...)
        raise `Closed` and send nothing. Idempotent. Call it before the process exits."""
        if self._native is not None:
            await self._native.shutdown()

    def is_closed(self) -> bool:
        return self._native is not None and self._native.is_shut_down()

    async def __aenter__(self) -> Client:
        await self._get()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "unconnected" if self._native is None else repr(self._native.id)
        return f"Client({state})"


async def connect(
    url: str | None = None,
    *,
    prefix: str | None = None,
    label: str | None = None,
    connect_timeout: float | None = None,
    response_timeout: float | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    tls_ca_pem: bytes | None = None,
    tls_cert_pem: bytes | None = None,
    tls_key_pem: bytes | None = None,
    synced_replicas: int | None = None,
    synced_timeout: float = 1.0,
    scripts_only: bool = False,
) -> Client:
    """Connects to Redis or Valkey. `url` (default `$REDSEM_URL`, `$REDIS_URL`,
    `redis://127.0.0.1:6379/`) chooses the deployment: `redis://host:port/db`,
    `unix:///path`, `redis+cluster://host:port[,host:port…]`,
    `redis+sentinel://host:port[,…]/master-name[/db]`; `rediss…` for TLS, with `tls_ca` /
    `tls_cert` / `tls_key` (PEM files) or `tls_*_pem` (PEM bytes) for a private CA and client
    certificates. `prefix`: key prefix (default `redsem`). `label`: the default label of
    this client's semaphores. `connect_timeout` (default 3 s), `response_timeout` (5 s).
    `synced_replicas`: wait after each grant until that many replicas acknowledged it
    (`WAIT`, at most `synced_timeout` seconds; `NotReplicated` otherwise).
    `scripts_only`: run redsem's Lua code as scripts (`EVALSHA`) instead of its Redis
    Functions library (`FCALL`, the default). The library's helpers are created once, when it
    is loaded (`FUNCTION LOAD`, once per server and redsem version, by the first client that
    finds it missing), where a script re-creates them on every call: scripts cost Redis more
    CPU per call. A client falls back to the scripts by itself, with one log line, where the
    library cannot be used (Redis before 7.0, an ACL or a managed service that refuses
    `FCALL` or `FUNCTION LOAD`; docs/security.md): set this only to skip the attempt. Clients
    of either kind share a semaphore."""
    client = Client.from_url(
        url,
        prefix=prefix,
        label=label,
        connect_timeout=connect_timeout,
        response_timeout=response_timeout,
        tls_ca=tls_ca,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_ca_pem=tls_ca_pem,
        tls_cert_pem=tls_cert_pem,
        tls_key_pem=tls_key_pem,
        synced_replicas=synced_replicas,
        synced_timeout=synced_timeout,
        scripts_only=scripts_only,
    )
    await client._get()
    return client

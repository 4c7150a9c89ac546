"""`Permit`: a held share of a semaphore, its slots, fences and lease."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, List, NamedTuple, Optional, Tuple, TypeVar

from .errors import LeaseLost

if TYPE_CHECKING:
    from ._lease import _Confirmations
    from . import _protocol
    from .semaphore import Semaphore

T = TypeVar("T")


class Fence(NamedTuple):
    """A slot and its fencing token: the generation of that slot, incremented in Redis every
    time the slot is granted. `str(fence)` is `slot:generation` (as `REDSEM_FENCES`).

    A resource that must never be used by a stale holder keeps the highest generation seen
    per slot and rejects lower ones.
    """

    slot: int
    generation: int

    def __str__(self) -> str:
        return f"{self.slot}:{self.generation}"


class Permit:
    """A held permit (one or more permits of one acquisition).

    Its lease is renewed in the background while it is held. If a renewal finds the entry
    gone, or no renewal is confirmed before `trusted confirmation + lease - margin` (the
    trusted confirmation: one answered at least one renewal interval before a later one was
    sent, docs/PROTOCOL.md rule 4), the permit is *lost*: `lost` is set, `lost_reason` says
    why, and the work guarded by `run()` or by `async with sem.acquire()` is cancelled.

    Release it with `await permit.release()` (the `async with` form does it for you).
    """

    def __init__(self, sem: "Semaphore", holder_id: str, n: int, ticket: int,
                 slots: Tuple[int, ...], fences: Tuple[int, ...], confirmations: "_Confirmations"):
        self._sem = sem
        self.holder_id = holder_id
        """The holder id in Redis, as `stats()` lists it."""
        self.permits = n
        """How many permits this holds."""
        self.ticket = ticket
        """The FIFO ticket this permit was granted under."""
        self.fences: List[Fence] = [Fence(s, g) for s, g in zip(slots, fences)]
        """The fencing token of each slot held, same order as `slots`."""
        self.lost = asyncio.Event()
        """Set once the lease is lost (never set by a release)."""
        self.lost_reason: Optional[str] = None
        #: The calls that confirmed the lease (for a granted waiter, its own: the grant keeps
        #: the waiter's lease).
        self._confirmations = confirmations
        self._released = False
        self._on_lost: List[Callable[[], Any]] = []

    def _is_grant(self, grant: "_protocol.Grant") -> bool:
        """Whether Redis's answer is this permit's grant (and not a fresh one under its id)."""
        return (grant.ticket == self.ticket
                and tuple(grant.slots) == tuple(f.slot for f in self.fences)
                and tuple(grant.fences) == tuple(f.generation for f in self.fences))

    @property
    def slots(self) -> List[int]:
        """The slot numbers held, in `0..limit`, ascending; no other live holder has them."""
        return [f.slot for f in self.fences]

    @property
    def released(self) -> bool:
        return self._released

    def _deadline(self) -> float:
        # from the trusted confirmation: a failover to a replica lagging by less than one
        # renewal interval may have lost every confirmation answered less than an interval
        # before the newest was sent
        return self._confirmations.trusted_from + self._sem._lease - self._sem._margin

    def _renewal_due(self) -> float:
        """When the next renewal is due: one renewal interval after the answer to the anchor
        confirmation (the earliest moment a renewal makes the anchor trusted)."""
        return self._confirmations.anchor_answered + self._sem._renew_every

    def _confirm(self, sent: float, answered: float) -> None:
        """A call sent at `sent` and answered at `answered` confirmed the lease."""
        self._confirmations.confirm(sent, answered)

    def lease_left(self) -> float:
        """Seconds until the local loss deadline, counted from the trusted confirmation: one
        answered at least one renewal interval before a later one was sent (docs/PROTOCOL.md
        rule 4)."""
        return max(0.0, self._deadline() - time.monotonic())

    def is_lost(self) -> bool:
        """Whether the lease is known lost, or its local deadline passed unconfirmed. No I/O."""
        return self.lost.is_set() or (not self._released and self._deadline() <= time.monotonic())

    def _lose(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        for cb in self._on_lost:
            cb()
        self._on_lost.clear()

    def add_lost_callback(self, callback: Callable[[], Any]) -> None:
        """Calls `callback()` (in the event loop) once the permit is lost; at once if it is."""
        if self.lost.is_set():
            callback()
        else:
            self._on_lost.append(callback)

    async def wait_lost(self) -> str:
        """Waits until the permit is lost, and returns why. Never returns while it is held."""
        await self.lost.wait()
        assert self.lost_reason is not None
        return self.lost_reason

    async def release(self) -> None:
        """Releases the permit now (one round trip). Idempotent. Errors are not raised: the
        release is retried in the background and, at worst, the lease expires."""
        if self._released:
            return
        self._released = True
        if self.lost.is_set():
            return  # its release was queued in the background when it was lost
        await self._sem._release_holder(self.holder_id)

    async def run(self, work: Awaitable[T]) -> T:
        """Runs `work` while holding the permit, then releases the permit.

        If the lease is lost first, the task running `work` is cancelled (at its next
        `await`; code between awaits is not pre-empted) and `LeaseLost` is raised, as the
        Rust crate's `Permit::run`.
        """
        task = asyncio.ensure_future(work)
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise LeaseLost(self.lost_reason or "")
        finally:
            lost.cancel()
            if not task.done():  # we were cancelled ourselves
                task.cancel()
            await self.release()

    def __repr__(self) -> str:
        fences = ",".join(map(str, self.fences))
        state = "lost" if self.lost.is_set() else "released" if self._released else "held"
        return f"Permit({self._sem.name!r}, holder={self.holder_id}, ticket={self.ticket}, fences={fences}, {state})"


class AcquireContext:
    """What `Semaphore.acquire()` returns: await it for a `Permit`, or use it as
    `async with sem.acquire(...) as permit:` (released on exit; the body is cancelled and
    `LeaseLost` raised if the permit is lost while it runs).
    """

    def __init__(self, make: Callable[[], Awaitable[Permit]], cancel_on_loss: bool = True):
        self._make = make
        self._cancel_on_loss = cancel_on_loss
        self._permit: Optional[Permit] = None
        self._task: Optional[asyncio.Task] = None
        self._cancelled_by_loss = False

    def __await__(self):
        return self._make().__await__()

    async def __aenter__(self) -> Permit:
        self._permit = permit = await self._make()
        self._task = asyncio.current_task()
        if self._cancel_on_loss:
            permit.add_lost_callback(self._cancel_body)
        return permit

    def _cancel_body(self) -> None:
        if self._task is not None and not self._cancelled_by_loss:
            self._cancelled_by_loss = True
            self._task.cancel()

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        task, self._task = self._task, None  # no cancellation from here on
        permit = self._permit
        assert permit is not None
        try:
            await asyncio.shield(permit.release())
        except asyncio.CancelledError:
            pass  # the release goes on in the background
        if not self._cancelled_by_loss:
            return False
        if exc_type is asyncio.CancelledError or exc_type is None:
            uncancel = getattr(task, "uncancel", None)
            if uncancel is not None and uncancel() > 0:
                return False  # cancelled by someone else too: let that cancellation go on
            raise LeaseLost(permit.lost_reason or "") from exc
        return False

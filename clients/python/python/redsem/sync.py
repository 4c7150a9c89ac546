"""The blocking API, for code without an event loop: the asyncio API runs on an event loop in
a daemon thread of the client's, and each call waits for its result (the Rust work itself
runs on the package's Tokio runtime, as in the asyncio API).

    from redsem.sync import Client

    with Client("redis://127.0.0.1:6379/") as client:
        sem = client.semaphore("licence-server", limit=4)
        with sem.acquire(timeout=30) as permit:
            work(permit.slots[0])
            if permit.is_lost():
                raise SystemExit("lost the slot")

Blocking work cannot be cancelled from outside: check `permit.is_lost()` (or
`permit.lost.is_set()`). Ctrl-C (KeyboardInterrupt) during a blocking call cancels the call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

from . import _client, _native
from ._client import AcquireOptions, Fence, ForceReleased, Resized, Stats
from .errors import Closed

T = TypeVar("T")


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Stops a client's loop thread and closes its loop (its selector and self-pipe): on
    `close()`, or when a client that was never closed is collected. Never references the
    client, so that it can be its finalizer."""
    if loop.is_closed():
        return
    loop.call_soon_threadsafe(loop.stop)
    if thread is threading.current_thread():
        return  # collected by the loop's own thread: it stops after this callback
    thread.join()
    loop.close()

__all__ = ["Client", "FencedStore", "LostSignal", "Permit", "Semaphore"]


class Client:
    """`redsem.Client` behind a private event loop thread. Same arguments as
    `redsem.connect` (`url` defaults as there); connects at once. Close it (or use `with`)."""

    def __init__(self, url: str | None = None, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="redsem", daemon=True)
        self._thread.start()
        # a client dropped without close() stops its thread and closes its loop all the same
        # (they would otherwise live as long as the process: a thread and 3 fds each)
        self._finalizer = weakref.finalize(self, _stop_loop, self._loop, self._thread)
        try:
            self._client = self._run(_client.connect(url, **kwargs))
        except BaseException:
            self._stop()
            raise

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._loop.is_closed():
            # after close(): what the asyncio API says of a closed client, not the loop's error
            coro.close()
            raise Closed("the client was closed: open a new redsem.sync.Client")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except BaseException:  # KeyboardInterrupt, a timeout: cancel the call in the loop too
            fut.cancel()
            raise

    def ping(self) -> None:
        self._run(self._client.ping())

    @property
    def prefix(self) -> str:
        """The key prefix (`redsem.Client.prefix`)."""
        return self._client.prefix

    @property
    def id(self) -> str:
        """This client's id (`redsem.Client.id`)."""
        return self._client.id

    def is_closed(self) -> bool:
        """Whether `close()` was called."""
        return self._loop.is_closed() or self._client.is_closed()

    def semaphore(
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
        """Opens a semaphore: see `redsem.Client.semaphore` (same arguments)."""
        return Semaphore(
            self,
            self._run(
                self._client.semaphore(
                    name,
                    limit=limit,
                    lease=lease,
                    renew_every=renew_every,
                    fallback_poll=fallback_poll,
                    local_cap=local_cap,
                    label=label,
                    allow_evicting_policy=allow_evicting_policy,
                    limit_policy=limit_policy,
                )
            ),
        )

    def list_semaphores(self) -> list[str]:
        return self._run(self._client.list_semaphores())

    def load_library(self) -> str:
        """Loads redsem's Functions library and returns its name: see
        `redsem.Client.load_library`."""
        return self._run(self._client.load_library())

    def inspect(self, name: str, listed: int = _native.STATS_LISTED) -> Stats:
        return self._run(self._client.inspect(name, listed))

    def resize_existing(self, name: str, new_limit: int) -> Resized:
        return self._run(self._client.resize_existing(name, new_limit))

    def force_release(self, name: str, holder_id: str) -> ForceReleased | None:
        return self._run(self._client.force_release(name, holder_id))

    def add_permits_existing(self, name: str, delta: int) -> Resized:
        return self._run(self._client.add_permits_existing(name, delta))

    def delete_semaphore(self, name: str, *, force: bool = False) -> int:
        return self._run(self._client.delete_semaphore(name, force=force))

    def purge_keys(self, name: str) -> int:
        return self._run(self._client.purge_keys(name))

    def fenced_store(self, fence_key: str) -> FencedStore:
        return FencedStore(self, self._client.fenced_store(fence_key))

    def flush(self) -> None:
        self._run(self._client.flush())

    def _stop(self) -> None:
        self._finalizer()

    def close(self) -> None:
        """Shuts the client down (see `redsem.Client.close`) and stops the loop thread."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.close())
        finally:
            self._stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Semaphore:
    """A blocking `redsem.Semaphore`."""

    def __init__(self, client: Client, sem: _client.Semaphore) -> None:
        self._client, self._sem = client, sem

    @property
    def name(self) -> str:
        return self._sem.name

    @property
    def limit(self) -> int:
        return self._sem.limit

    def available_permits(self) -> int:
        """`redsem.Semaphore.available_permits`: the free permits as last seen (no I/O)."""
        return self._sem.available_permits()

    def is_closed(self) -> bool:
        """Whether `close()` was called on it (or on its client)."""
        return self._sem.is_closed()

    def local_counts(self) -> tuple[int, int]:
        """`redsem.Semaphore.local_counts`: (holders, waiters) of this handle (no I/O)."""
        return self._sem.local_counts()

    def acquire(
        self,
        permits: int = 1,
        *,
        timeout: float | None = None,
        lease: float | None = None,
        label: str | None = None,
        priority: int = 0,
        max_hold: float | None = None,
    ) -> Permit:
        """Blocks until `permits` permits are granted (FIFO within a `priority` class), at most
        `timeout` seconds; `max_hold`: see `AcquireOptions`."""
        return self.acquire_with(
            AcquireOptions(
                permits=permits, timeout=timeout, lease=lease, label=label, priority=priority, max_hold=max_hold
            )
        )

    def try_acquire(
        self,
        permits: int = 1,
        *,
        lease: float | None = None,
        label: str | None = None,
        priority: int = 0,
        max_hold: float | None = None,
    ) -> Permit:
        """Only if free now and nobody is queued ahead, else `NoPermits`."""
        return self.acquire_with(
            AcquireOptions(
                permits=permits, lease=lease, label=label, try_only=True, priority=priority, max_hold=max_hold
            )
        )

    def acquire_with(self, options: AcquireOptions) -> Permit:
        async def go() -> _client.Permit:
            return await self._sem.acquire_with(options, cancel_on_loss=False)

        return Permit(self._client, self._client._run(go()))

    def stats(self, listed: int = _native.STATS_LISTED) -> Stats:
        return self._client._run(self._sem.stats(listed))

    def resize(self, new_limit: int) -> Resized:
        return self._client._run(self._sem.resize(new_limit))

    def add_permits(self, delta: int) -> Resized:
        return self._client._run(self._sem.add_permits(delta))

    def force_release(self, holder_id: str) -> bool:
        return self._client._run(self._sem.force_release(holder_id))

    def adopt(self, token: str) -> Permit:
        """`redsem.Semaphore.adopt`: takes over an exported permit."""
        return Permit(self._client, self._client._run(self._sem.adopt(token)))

    def release_handoff(self, token: str) -> bool:
        """`redsem.Semaphore.release_handoff`: releases an exported permit by its token."""
        return self._client._run(self._sem.release_handoff(token))

    def close(self) -> None:
        self._client._run(self._sem.close())


class LostSignal:
    """The read side of a `threading.Event` set when the permit is lost."""

    def __init__(self, client: Client, permit: _client.Permit) -> None:
        self._client, self._permit = client, permit

    def is_set(self) -> bool:
        return self._permit.lost.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until lost (True) or `timeout` seconds passed (False)."""
        try:
            self._client._run(self._permit.lost.wait(), timeout)
            return True
        except concurrent.futures.TimeoutError:
            return False


class Permit:
    """A blocking `redsem.Permit`; a context manager that releases it on exit."""

    def __init__(self, client: Client, permit: _client.Permit) -> None:
        self._client, self._permit = client, permit
        self.slots: list[int] = permit.slots
        self.fences: list[Fence] = permit.fences
        self.lost = LostSignal(client, permit)

    @property
    def semaphore(self) -> str:
        """The semaphore's name."""
        return self._permit.semaphore

    @property
    def holder_id(self) -> str:
        return self._permit.holder_id

    @property
    def ticket(self) -> int:
        return self._permit.ticket

    @property
    def released(self) -> bool:
        """Whether it was released (or detached) through this object."""
        return self._permit.released

    @property
    def permits(self) -> int:
        return self._permit.permits

    @property
    def lost_reason(self) -> str | None:
        return self._permit.lost_reason

    def is_lost(self) -> bool:
        return self._permit.is_lost()

    def lease_left(self) -> float:
        return self._permit.lease_left()

    def lease(self) -> float | None:
        """The length of its lease in seconds (`None` once released)."""
        return self._permit.lease()

    def wait_lost(self, timeout: float | None = None) -> str | None:
        """Blocks until the permit is lost and returns why, or `None` after `timeout` seconds
        (`None`: as long as it takes)."""
        if self._permit.is_lost() and self._permit.lost_reason is not None:
            return self._permit.lost_reason
        try:
            return self._client._run(self._permit.wait_lost(), timeout)
        except concurrent.futures.TimeoutError:
            return None

    def set_lease(self, lease: float) -> None:
        self._client._run(self._permit.set_lease(lease))

    def release(self) -> None:
        """Releases the permits (idempotent; after the client's close(), which released
        them, it does nothing)."""
        if self._client._loop.is_closed():
            return
        self._client._run(self._permit.release())

    def detach(self) -> None:
        self._permit.detach()

    def export(self) -> str:
        """`redsem.Permit.export`: the hand-off token (a `str`) for another process."""
        return self._client._run(self._permit.export())

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        """Releases, as `redsem.Permit`'s `async with` does: a lost permit in the background,
        and a failed release does not hide the block's exception."""
        if self._client._loop.is_closed():
            return
        self._client._run(self._permit._release_on_exit(exc))

    def __repr__(self) -> str:
        return repr(self._permit)


class FencedStore:
    """A blocking `redsem.FencedStore`."""

    def __init__(self, client: Client, store: _client.FencedStore) -> None:
        self._client, self._store = client, store

    def check(self, fence: Fence | str) -> bool:
        return self._client._run(self._store.check(fence))

    def write(self, fence: Fence | str, key: str, value: bytes | str) -> bool:
        return self._client._run(self._store.write(fence, key, value))

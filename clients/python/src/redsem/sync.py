"""A blocking wrapper for code without an event loop: the asyncio client runs on an event
loop in a background thread, and each call waits for its result.

    from redsem.sync import Client

    with Client("redis://127.0.0.1:6379/") as client:
        sem = client.semaphore("licence-server", limit=4)
        with sem.acquire(timeout=30) as permit:
            work(permit.slots[0])
            if permit.lost.is_set():   # a threading.Event here
                ...

The work of a blocking caller cannot be cancelled from outside: check `permit.is_lost()` or
`permit.lost` (set by the background loop the moment the permit is lost).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Optional, TypeVar

from . import client as _client
from .permit import Permit as _AsyncPermit
from .stats import Stats

T = TypeVar("T")


class Client:
    """`redsem.Client` behind a private event loop thread. Same arguments as `Client.from_url`
    (`url` defaults as in `redsem.connect`). Close it (or use `with`)."""

    def __init__(self, url: Optional[str] = None, **kwargs: Any):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="redsem", daemon=True)
        self._thread.start()
        try:
            self._client = self._run(_client.connect(url, **kwargs))
        except BaseException:
            self._stop()
            raise

    def _run(self, coro: Awaitable[T]) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        try:
            return fut.result()
        except BaseException:  # e.g. KeyboardInterrupt: cancel the call in the loop too
            fut.cancel()
            raise

    def semaphore(self, name: str, **kwargs: Any) -> "Semaphore":
        """Opens a semaphore: see `redsem.Client.semaphore`."""
        return Semaphore(self, self._run(self._client.semaphore(name, **kwargs)))

    def inspect(self, name: str) -> Stats:
        return self._run(self._client.inspect(name))

    def force_release(self, name: str, holder_id: str) -> bool:
        return self._run(self._client.force_release(name, holder_id))

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def close(self) -> None:
        """Closes the handles (releasing held permits) and stops the loop thread."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.close())
        finally:
            self._stop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Semaphore:
    """A blocking `redsem.Semaphore`."""

    def __init__(self, client: Client, sem: Any):
        self._client, self._sem = client, sem
        self.name, self.limit = sem.name, sem.limit

    def acquire(self, n: int = 1, *, timeout: Optional[float] = None) -> "Permit":
        """Blocks until `n` permits are granted (FIFO), at most `timeout` seconds."""
        return Permit(self._client, self._client._run(self._sem._acquire(n, timeout, False)))

    def try_acquire(self, n: int = 1) -> "Permit":
        return Permit(self._client, self._client._run(self._sem.try_acquire(n)))

    def stats(self) -> Stats:
        return self._client._run(self._sem.stats())

    def close(self) -> None:
        self._client._run(self._sem.close())


class Permit:
    """A blocking `redsem.Permit`; a context manager that releases it on exit. `lost` is a
    `threading.Event`."""

    def __init__(self, client: Client, permit: _AsyncPermit):
        self._client, self._permit = client, permit
        self.holder_id, self.ticket, self.permits = permit.holder_id, permit.ticket, permit.permits
        self.slots, self.fences = permit.slots, permit.fences
        self.lost = threading.Event()
        client._loop.call_soon_threadsafe(permit.add_lost_callback, self.lost.set)

    @property
    def lost_reason(self) -> Optional[str]:
        return self._permit.lost_reason

    def is_lost(self) -> bool:
        return self.lost.is_set() or self._permit.is_lost()

    def release(self) -> None:
        self._client._run(self._permit.release())

    def __enter__(self) -> "Permit":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return repr(self._permit)

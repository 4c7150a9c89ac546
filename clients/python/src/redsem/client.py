"""`Client`: the Redis connection shared by the semaphore handles of one process."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any, Dict, List, Optional, Set

import redis
import redis.asyncio as aioredis

from . import _protocol
from .errors import InvalidArgument, RedsemError, UnknownSemaphore, from_redis
from .semaphore import Semaphore
from .stats import Stats


def default_label() -> str:
    """`host:pid`, the label of a process's holders and waiters unless one is given."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Client:
    """A connection pool to one Redis (standalone, or a Sentinel-managed primary through a
    redis-py client), shared by every semaphore handle opened from it.

    Make one with `await redsem.connect(url)` or `redsem.Client.from_url(url)` (no I/O until
    first use), and close it with `await client.close()` (or `async with`), which closes the
    handles and waits for the releases still in flight. Redis Cluster is not supported.
    """

    def __init__(self, redis_client: "aioredis.Redis", *, prefix: str = _protocol.DEFAULT_PREFIX,
                 label: Optional[str] = None, owns_connection: bool = False):
        try:
            _protocol.check_prefix(prefix)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        self.redis = redis_client
        """The redis-py asyncio client (usable for the caller's own commands)."""
        self.prefix = prefix
        self.label = label if label is not None else default_label()
        self.id = _protocol.new_client_id()
        self._owns = owns_connection
        self._handles = 0
        self._scripts: Dict[str, Any] = {}
        self._semaphores: List[Semaphore] = []
        self._background: Set[asyncio.Task] = set()
        self._closed = False

    @classmethod
    def from_url(cls, url: str, *, prefix: str = _protocol.DEFAULT_PREFIX, label: Optional[str] = None,
                 response_timeout: float = 5.0, connect_timeout: float = 3.0, **redis_kwargs: Any) -> "Client":
        """A client for `url` (`redis://[user:password@]host:port[/db]`, `rediss://` for TLS,
        `unix:///path`). No I/O. `response_timeout` bounds every call (a renewal that takes
        longer fails and is retried); extra keyword arguments go to redis-py."""
        r = aioredis.Redis.from_url(url, socket_timeout=response_timeout,
                                    socket_connect_timeout=connect_timeout, **redis_kwargs)
        return cls(r, prefix=prefix, label=label, owns_connection=True)

    async def ping(self) -> None:
        """Checks that Redis answers; raises `Unreachable` / `AuthError` otherwise."""
        try:
            await self.redis.ping()
        except redis.RedisError as e:
            raise from_redis(e, "") from e

    async def __aenter__(self) -> "Client":
        await self.ping()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- semaphores ---------------------------------------------------------------------------

    async def semaphore(self, name: str, *, limit: int, lease: float = 10.0, renew_every: Optional[float] = None,
                        fallback_poll: float = 1.0, label: Optional[str] = None,
                        allow_evicting_policy: bool = False) -> Semaphore:
        """Opens the semaphore `name`, creating it with `limit` permits if it does not exist.

        `lease` (seconds, default 10): a crashed holder's slot is free again at most one
        lease after its last renewal. `renew_every` (default and at most lease/3) is the
        renewal interval; `fallback_poll` (default 1 s) the longest a waiter relies on
        notifications alone. Costs three round trips (`INFO memory`, SUBSCRIBE, one script).

        Opening is refused with `EvictingPolicy` when Redis's `maxmemory-policy` can evict the
        semaphore's keys (`allkeys-*`, or `volatile-*` while one of its keys has a TTL), unless
        `allow_evicting_policy`: an evicted key never lets more than the limit in (the scripts
        repair from what survives), but a holder whose record was evicted learns it only at its
        next renewal.

        Raises `LimitConflict` if it exists with another limit (`.stored` says which),
        `InvalidArgument` for bad arguments, `EvictingPolicy`, `WrongType`, `ProtocolMismatch`,
        `Unreachable`.
        """
        if self._closed:
            raise RedsemError("the client is closed")
        sem = Semaphore(self, name, limit=limit, lease=lease, renew_every=renew_every,
                        fallback_poll=fallback_poll, label=label if label is not None else self.label)
        await sem._open(allow_evicting_policy)
        self._semaphores.append(sem)
        return sem

    def _next_suffix(self) -> str:
        n = self._handles
        self._handles += 1
        return _protocol.channel_suffix(self.id, n)

    async def inspect(self, name: str) -> Stats:
        """A snapshot of the existing semaphore `name`, without knowing its limit. Never creates
        it: raises `UnknownSemaphore` when it does not exist. One round trip."""
        keys = self._keys(name)
        raw = await self._call("stats", keys, 1, [], name=name, operator=True)
        if raw is None:
            raise UnknownSemaphore(name, self.prefix)
        return Stats._from_raw(name, _protocol.parse_stats(raw))

    async def force_release(self, name: str, holder_id: str) -> bool:
        """An operator's release of a holder (or waiter) of `name`: its permits go to the queue
        at once, and the slots' next holders get higher fences. The evicted holder finds its
        permit lost at its next renewal (an evicted waiter queues again, at the back). Returns
        whether the id existed; `UnknownSemaphore` if `name` does not exist."""
        keys = self._keys(name)
        removed = await self._call("release", keys, 1, _protocol.release_args([holder_id], force=True),
                                   name=name, operator=True)
        if removed is None:
            raise UnknownSemaphore(name, self.prefix)
        return int(removed) > 0

    def _keys(self, name: str) -> _protocol.Keys:
        try:
            return _protocol.Keys(self.prefix, name)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None

    # -- calls --------------------------------------------------------------------------------

    async def _call(self, script: str, keys: _protocol.Keys, limit: int, args: List[Any], *, name: str,
                    operator: bool = False) -> Any:
        """Runs a script with the common header; redis-py errors become redsem errors."""
        key = script + ("!op" if operator else "")
        s = self._scripts.get(key)
        if s is None:
            s = self._scripts[key] = self.redis.register_script(_protocol.script_source(script, operator))
        try:
            return await s(keys=keys.all, args=_protocol.header(keys, limit) + list(args))
        except redis.RedisError as e:
            raise from_redis(e, name) from e

    def _spawn(self, coro: Any) -> None:
        """Runs `coro` in the background; `close()` and `flush()` wait for it."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def flush(self, timeout: float = 3.0) -> None:
        """Waits (at most `timeout` seconds) for the releases still in flight."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout)

    async def close(self) -> None:
        """Closes every semaphore handle (pending acquires fail with `Closed`, held permits are
        released), waits for the releases in flight, and closes the connections this client
        opened."""
        if self._closed:
            return
        self._closed = True
        for sem in list(self._semaphores):
            await sem.close()
        await self.flush()
        if self._owns:
            close = getattr(self.redis, "aclose", None) or self.redis.close
            await close()


async def connect(url: Optional[str] = None, **kwargs: Any) -> Client:
    """`Client.from_url(url, **kwargs)`, checked with a PING. `url` defaults to
    `$REDSEM_URL`, then `$REDIS_URL`, then `redis://127.0.0.1:6379/`."""
    url = url or os.environ.get("REDSEM_URL") or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/"
    client = Client.from_url(url, **kwargs)
    try:
        await client.ping()
    except BaseException:
        await client.close()
        raise
    return client

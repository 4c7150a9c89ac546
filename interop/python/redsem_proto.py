"""A Python client of the redsem protocol (docs/PROTOCOL.md), written from that document.

It shares semaphores with the Rust crate: same keys, the same Lua scripts (loaded from the
repository, prelude + "\\n" + body, exactly as the crate builds them), its own notification
channel, its own heartbeat. It is used by the interoperability tests
(crates/redsem/tests/interop.rs); it is small on purpose and not a supported library.

    client = Client("redis://127.0.0.1:6379/")
    sem = client.semaphore("licensed-api", limit=4, lease_ms=10_000)
    with sem.acquire(timeout=5.0) as permit:
        call_licensed_api(permit.slots[0])
    client.close()

Threads: one pub/sub listener and one heartbeat per semaphore handle; acquire() blocks the
calling thread. Standalone Redis/Valkey only (PUBLISH/SUBSCRIBE).
"""

from __future__ import annotations

import itertools
import logging
import os
import pathlib
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional

import redis

PROTOCOL = 1
SCRIPTS_DIR = pathlib.Path(__file__).resolve().parents[2] / "crates" / "redsem" / "src" / "scripts"
KEY_SUFFIXES = ("cfg", "queue", "exp", "meta", "slots", "free", "fence")

log = logging.getLogger("redsem_proto")


class RedsemError(Exception):
    """Base class of this client's errors."""


class NoPermits(RedsemError):
    """try mode: no permit free now (or others are queued)."""


class TooManyPermits(RedsemError):
    """More permits requested than the limit."""


class Timeout(RedsemError):
    """No grant within the timeout; the ticket was given up."""


class LimitConflict(RedsemError):
    """The semaphore exists with another limit."""


class LeaseLost(RedsemError):
    """The permit's lease could not be kept."""


def _load_scripts(r: redis.Redis) -> dict:
    prelude = (SCRIPTS_DIR / "prelude.lua").read_text()
    return {
        name: r.register_script(prelude + "\n" + (SCRIPTS_DIR / f"{name}.lua").read_text())
        for name in ("open", "acquire", "renew", "release", "resize", "stats")
    }


def _ints(v) -> list:
    return [int(x) for x in (v or [])]


@dataclass
class Grant:
    ticket: int
    slots: list
    fences: list


def parse_notices(payload: str) -> list:
    """`g:<id>:<ticket>:<slots>:<fences>;x:<id>` -> [("g", id, Grant) | ("x", id, None)]."""
    out = []
    for rec in payload.split(";"):
        parts = rec.split(":")
        try:
            if parts[0] == "g" and len(parts) == 5:
                nums = lambda s: [int(x) for x in s.split(",")] if s else []
                out.append(("g", parts[1], Grant(int(parts[2]), nums(parts[3]), nums(parts[4]))))
            elif parts[0] == "x" and len(parts) == 2:
                out.append(("x", parts[1], None))
            # unknown record types are ignored (PROTOCOL.md, Versioning)
        except ValueError:
            continue
    return out


class Client:
    """Connections shared by the semaphores of one process."""

    def __init__(self, url: str, prefix: str = "redsem", label: Optional[str] = None,
                 response_timeout: float = 5.0):
        self.r = redis.Redis.from_url(url, decode_responses=True,
                                      socket_timeout=response_timeout,
                                      socket_connect_timeout=3.0)
        self.url = url
        self.prefix = prefix
        self.id = "py" + uuid.uuid4().hex[:14]
        self.label = label or f"{socket.gethostname()}:{os.getpid()}:python"
        self.scripts = _load_scripts(self.r)
        self._handles = itertools.count()
        self._open = []

    def semaphore(self, name: str, limit: int, lease_ms: int = 10_000,
                  renew_every_ms: Optional[int] = None, fallback_poll_ms: int = 1000) -> "Semaphore":
        sem = Semaphore(self, name, limit, lease_ms,
                        renew_every_ms or lease_ms // 3, fallback_poll_ms)
        sem._open()
        self._open.append(sem)
        return sem

    def close(self) -> None:
        for sem in self._open:
            sem.close()
        self._open.clear()


@dataclass
class _Waiter:
    event: threading.Event = field(default_factory=threading.Event)
    renewed_at: float = field(default_factory=time.monotonic)
    outcome: Optional[tuple] = None  # ("granted", Permit) | ("rejected",) | ("lost",)


class Permit:
    """A held permit: its slots, fences and ticket. Release it (or use `with`)."""

    def __init__(self, sem: "Semaphore", id: str, n: int, grant: Grant, renewed_at: float):
        self.sem, self.id, self.n = sem, id, n
        self.ticket, self.slots, self.fences = grant.ticket, grant.slots, grant.fences
        self.renewed_at = renewed_at
        self.lost_reason: Optional[str] = None
        self.lost = threading.Event()

    def release(self) -> None:
        self.sem._forget(self.id)
        self.sem._release([self.id])

    def __enter__(self) -> "Permit":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Permit(id={self.id}, ticket={self.ticket}, slots={self.slots}, fences={self.fences})"


class Semaphore:
    """One open handle: its channel, its waiters and holders, its heartbeat."""

    def __init__(self, client: Client, name: str, limit: int, lease_ms: int,
                 renew_every_ms: int, fallback_poll_ms: int):
        if not name or len(name) > 200 or any(c in name for c in "{} \t\r\n"):
            raise ValueError(f"bad semaphore name {name!r}")
        if renew_every_ms <= 0 or renew_every_ms > lease_ms // 2:
            raise ValueError("the renewal interval must be at most half the lease")
        self.client, self.name, self.limit = client, name, limit
        self.lease_ms, self.renew_every, self.fallback_poll = (
            lease_ms, renew_every_ms / 1000, fallback_poll_ms / 1000)
        self.margin = min(lease_ms / 10, 1000) / 1000
        base = f"{client.prefix}:{{{name}}}:"
        self.keys = [base + s for s in KEY_SUFFIXES]
        self.channel_base = base + "c:"
        self.suffix = f"{client.id}.{next(client._handles)}"
        self.channel = self.channel_base + self.suffix
        self._lock = threading.Lock()
        self._waiters: dict = {}
        self._holders: dict = {}
        self._next_check: Optional[float] = None
        self._waiters_checked_at = time.monotonic()
        self._retry_at: Optional[float] = None
        self._poke = threading.Event()
        self._stop = threading.Event()

    # -- protocol calls -----------------------------------------------------------------

    def _call(self, script: str, *args):
        header = [self.limit, self.channel_base, "PUBLISH"]
        return self.client.scripts[script](keys=self.keys, args=header + list(args))

    def _release(self, ids: list, force: bool = False) -> int:
        try:
            return int(self._call("release", "1" if force else "0", *ids))
        except redis.RedisError as e:  # the leases expire by themselves
            log.warning("release of %s failed: %s", ids, e)
            return 0

    def _open(self) -> None:
        self._pubsub = self.client.r.pubsub()
        self._pubsub.subscribe(self.channel)
        deadline = time.monotonic() + 5
        while True:  # wait for the confirmation: no grant published afterwards is missed
            msg = self._pubsub.get_message(timeout=1.0)
            if msg and msg["type"] == "subscribe":
                break
            if time.monotonic() > deadline:
                raise RedsemError(f"no confirmation of SUBSCRIBE {self.channel}")
        stored, _created = _ints(self._call("open"))
        if stored != self.limit:
            self.close()
            raise LimitConflict(f"semaphore {self.name!r} exists with limit {stored}, not {self.limit}")
        self._threads = [threading.Thread(target=self._listen, daemon=True),
                         threading.Thread(target=self._heartbeat, daemon=True)]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        self._stop.set()
        self._poke.set()
        for t in getattr(self, "_threads", []):
            t.join(timeout=2)
        try:
            self._pubsub.unsubscribe(self.channel)
            self._pubsub.close()
        except (redis.RedisError, AttributeError):
            pass

    # -- acquiring ----------------------------------------------------------------------

    def acquire(self, n: int = 1, timeout: Optional[float] = None, try_only: bool = False) -> Permit:
        if n < 1:
            raise ValueError("acquire at least one permit")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            id = f"{self.suffix}-{uuid.uuid4().hex[:12]}"
            waiter = None
            if not try_only:
                waiter = _Waiter()
                with self._lock:
                    if not self._waiters:
                        self._waiters_checked_at = time.monotonic()
                    self._waiters[id] = waiter  # before the call: a grant may be published first
                self._poke.set()
            sent = time.monotonic()
            try:
                # acquire.lua takes a batch: the count, then 7 values per request
                reply = self._call("acquire", 1, id, n, self.lease_ms, self.lease_ms, self.suffix,
                                   self.client.label, "try" if try_only else "wait")[0]
            except BaseException:
                self._give_up(id)
                raise
            kind = int(reply[0])
            if kind == 1:
                grant = Grant(int(reply[3]), _ints(reply[1]), _ints(reply[2]))
                if try_only:
                    permit = Permit(self, id, n, grant, sent)
                    with self._lock:
                        self._holders[id] = permit
                    self._poke.set()
                    return permit
                self._deliver(id, "granted", grant)
            elif kind == 0:
                if int(reply[2]) >= 0:
                    with self._lock:
                        at = time.monotonic() + int(reply[2]) / 1000 + 0.002
                        self._next_check = min(self._next_check or at, at)
                    self._poke.set()
            elif kind == -1:
                self._give_up(id, release=False)
                raise NoPermits(f"no permit of {self.name!r} free now")
            else:
                self._give_up(id, release=False)
                raise TooManyPermits(f"{n} permits requested, the limit is {int(reply[1])}")

            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not waiter.event.wait(left):
                with self._lock:
                    still_waiting = self._waiters.pop(id, None) is not None
                if still_waiting:
                    self._release([id])
                    raise Timeout(f"no permit of {self.name!r} within {timeout}s")
            outcome = waiter.outcome
            if outcome[0] == "granted":
                return outcome[1]
            if outcome[0] == "rejected":
                raise TooManyPermits(f"{n} permits requested, more than the limit")
            log.info("ticket of %s lost while waiting; queueing again", id)  # "lost"

    def _give_up(self, id: str, release: bool = True) -> None:
        with self._lock:
            self._waiters.pop(id, None)
        if release:
            self._release([id])

    def _deliver(self, id: str, kind: str, grant: Optional[Grant] = None) -> None:
        with self._lock:
            waiter = self._waiters.pop(id, None)
            if waiter is None:
                orphan = kind == "granted" and id not in self._holders
            else:
                orphan = False
                if kind == "granted":
                    permit = Permit(self, id, len(grant.slots), grant, waiter.renewed_at)
                    self._holders[id] = permit
                    waiter.outcome = ("granted", permit)
                else:
                    waiter.outcome = (kind,)
                waiter.event.set()
        if orphan:  # a grant nobody waits for any more: give the slot back
            self._release([id])
        self._poke.set()

    def _forget(self, id: str) -> None:
        with self._lock:
            self._holders.pop(id, None)

    # -- notifications ------------------------------------------------------------------

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self._pubsub.get_message(timeout=0.2)
            except (redis.ConnectionError, redis.TimeoutError) as e:
                log.warning("subscriber connection failed (%s); re-checking waiters", e)
                time.sleep(0.2)
                try:
                    self._pubsub.subscribe(self.channel)  # redis-py reconnects on use
                except redis.RedisError:
                    pass
                with self._lock:
                    self._next_check = time.monotonic()
                self._poke.set()
                continue
            if msg and msg["type"] == "message":
                for kind, id, grant in parse_notices(msg["data"]):
                    self._deliver(id, "granted" if kind == "g" else "rejected", grant)

    # -- heartbeat ----------------------------------------------------------------------

    def _next_wakeup(self) -> Optional[float]:
        with self._lock:
            times = []
            if self._retry_at is not None:
                times.append(self._retry_at)
            for p in self._holders.values():
                times.append(p.renewed_at + self.renew_every)
                times.append(p.renewed_at + self.lease_ms / 1000 - self.margin)
            if self._waiters:
                # waiters hold leases too: renew them at least every renewal interval
                times.append(self._waiters_checked_at + min(self.fallback_poll, self.renew_every))
                if self._next_check is not None:
                    times.append(self._next_check)
            return min(times) if times else None

    def _heartbeat(self) -> None:
        while not self._stop.is_set():
            wake = self._next_wakeup()
            delay = None if wake is None else max(0.0, wake - time.monotonic())
            self._poke.wait(delay)
            self._poke.clear()
            if self._stop.is_set():
                return
            wake = self._next_wakeup()
            if wake is not None and wake <= time.monotonic():
                self._beat()

    def _beat(self) -> None:
        with self._lock:
            holders = list(self._holders.items())
            waiters = list(self._waiters)
        if not holders and not waiters:
            return
        sent = time.monotonic()
        try:
            next_expiry, states = self._call("renew", *[h for h, _ in holders], *waiters)
            ok = True
        except redis.RedisError as e:
            log.warning("renewal of %s failed: %s; retrying", self.name, e)
            ok = False
        now = time.monotonic()
        with self._lock:
            self._retry_at = None if ok else now + 0.2
            if ok:
                self._waiters_checked_at = now
                ne = int(next_expiry)
                self._next_check = now + ne / 1000 + 0.002 if ne >= 0 else None
        if ok:
            for (id, permit), state in zip(holders, states[: len(holders)]):
                if int(state[0]) == 1:
                    permit.renewed_at = max(permit.renewed_at, sent)
                else:
                    self._lose(permit, "not_holder")
            for id, state in zip(waiters, states[len(holders):]):
                kind = int(state[0])
                if kind == 1:
                    self._deliver(id, "granted", Grant(int(state[3]), _ints(state[1]), _ints(state[2])))
                elif kind == -1:
                    self._deliver(id, "lost")
                else:
                    with self._lock:
                        w = self._waiters.get(id)
                        if w:
                            w.renewed_at = max(w.renewed_at, sent)
        # a holder whose lease could have expired without a confirmed renewal is lost
        for id, permit in holders:
            if permit.renewed_at + self.lease_ms / 1000 - self.margin <= time.monotonic():
                self._lose(permit, "unreachable")

    def _lose(self, permit: Permit, reason: str) -> None:
        with self._lock:
            if self._holders.pop(permit.id, None) is None:
                return  # released meanwhile
        log.warning("lease lost: %s (%s)", permit, reason)
        permit.lost_reason = reason
        permit.lost.set()
        self._release([permit.id])

    # -- operators ----------------------------------------------------------------------

    def stats(self) -> dict:
        now, limit, in_use, grants, expired, holders, waiters = self._call("stats")
        import json
        return {"now_ms": int(now), "limit": int(limit), "in_use": int(in_use),
                "grants": int(grants), "expired": int(expired),
                "holders": json.loads(holders), "waiters": json.loads(waiters)}

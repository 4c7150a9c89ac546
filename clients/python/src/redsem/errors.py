"""The errors of redsem, mirroring the Rust crate's `redsem::Error` variants.

Every error is a `RedsemError`. Bad arguments raise `InvalidArgument` (also a `ValueError`)
before anything is sent; `Timeout` is also a builtin `TimeoutError`.
"""

from __future__ import annotations

from typing import Optional

import redis

from . import _protocol


class RedsemError(Exception):
    """Base class of every redsem error."""


class InvalidArgument(RedsemError, ValueError):
    """An argument is out of range (a name, limit, lease, label...). Nothing was sent."""


class LimitConflict(RedsemError):
    """The semaphore exists in Redis with another limit; every user must open it with the
    stored one (`stored`)."""

    def __init__(self, name: str, requested: int, stored: int):
        super().__init__(
            f"semaphore {name!r} already exists with limit {stored}, not {requested}: "
            f"open it with limit {stored}, or resize it"
        )
        self.name, self.requested, self.stored = name, requested, stored


class TooManyPermits(RedsemError):
    """More permits were requested at once than the limit: it could never be granted."""

    def __init__(self, requested: int, limit: Optional[int]):
        lim = f"the limit is {limit}" if limit is not None else "more than the limit"
        super().__init__(f"requested {requested} permits at once, but {lim}")
        self.requested, self.limit = requested, limit


class NoPermits(RedsemError):
    """`try_acquire`: no permits free right now, or others are queued first (FIFO)."""

    def __init__(self, name: str):
        super().__init__(f"semaphore {name!r}: no permits available right now")
        self.name = name


class Timeout(RedsemError, TimeoutError):
    """No grant within the timeout; the place in the queue was given up."""

    def __init__(self, name: str, timeout: float):
        super().__init__(f"semaphore {name!r}: timed out after {timeout:g}s waiting for permits")
        self.name, self.timeout = name, timeout


#: `LeaseLost.reason` when a renewal reached Redis and found the entry gone.
NOT_HOLDER = "the renewal found the lease gone (expired or removed)"
#: `LeaseLost.reason` when no renewal was confirmed before the local deadline.
UNREACHABLE = "renewals failed until the lease could have expired (Redis unreachable or slow)"
#: `LeaseLost.reason` when the semaphore handle was closed while the permit was held.
CLOSED = "the semaphore handle was closed"


class LeaseLost(RedsemError):
    """The permit's slot was lost while the work ran; `reason` says how."""

    def __init__(self, reason: str):
        super().__init__(f"the semaphore slot was lost: {reason}")
        self.reason = reason


class Closed(RedsemError):
    """The semaphore handle (or its client) was closed."""

    def __init__(self) -> None:
        super().__init__("the semaphore was closed")


class UnknownSemaphore(RedsemError):
    """No semaphore of that name under the key prefix (operator calls never create one)."""

    def __init__(self, name: str, prefix: str):
        super().__init__(
            f"no semaphore named {name!r} under key prefix {prefix!r} (check the name and the key prefix)"
        )
        self.name, self.prefix = name, prefix


class WrongType(RedsemError):
    """A key of the semaphore holds a value redsem did not write: another program uses it."""

    def __init__(self, name: str, detail: str):
        super().__init__(
            f"a key of semaphore {name!r} holds another type of value ({detail}): use another name or key prefix"
        )
        self.name, self.detail = name, detail


class ProtocolMismatch(RedsemError):
    """The semaphore was created under another protocol version. Nothing was changed."""

    def __init__(self, name: str, detail: str):
        super().__init__(f"semaphore {name!r}: {detail}")
        self.name, self.detail = name, detail


class Corrupt(RedsemError):
    """The semaphore's keys contradict each other and the scripts could not repair them (keys
    evicted, deleted or restored apart). Nothing was granted. Losses that can be repaired are
    repaired silently and counted in `Stats.repairs_total`."""

    def __init__(self, name: str, detail: str):
        super().__init__(f"semaphore {name!r}: its keys are inconsistent and could not be repaired: {detail}")
        self.name, self.detail = name, detail


class EvictingPolicy(RedsemError):
    """Redis's `maxmemory-policy` may evict the semaphore's keys (`allkeys-*`, or `volatile-*`
    while one of its keys carries a TTL). Use `noeviction`, or open with
    `allow_evicting_policy=True` to accept the risk (as the Rust crate's
    `SemaphoreBuilder::allow_evicting_policy`)."""

    def __init__(self, name: str, policy: str, detail: str):
        super().__init__(
            f"semaphore {name!r}: Redis's maxmemory-policy is {policy} and {detail}: set "
            "maxmemory-policy to noeviction, or open with allow_evicting_policy=True to accept the risk")
        self.name, self.policy, self.detail = name, policy, detail


class NoPermission(RedsemError):
    """The Redis user may not run a command or touch a key or channel redsem needs."""


class AuthError(RedsemError):
    """Authentication failed: check the user name and password in the URL."""


class Unreachable(RedsemError):
    """Redis could not be reached or did not answer in time; the call can be retried."""


class BackendError(RedsemError):
    """Any other error reported by Redis or redis-py."""


def from_redis(err: Exception, name: str) -> RedsemError:
    """The redsem error for an exception raised by redis-py during a call on semaphore `name`."""
    text = str(err)
    if isinstance(err, redis.AuthenticationError) or text.startswith(("WRONGPASS", "NOAUTH")):
        return AuthError(f"Redis authentication failed ({text}): check the user name and password in the URL")
    if isinstance(err, (redis.ConnectionError, redis.TimeoutError, OSError)) or text.startswith(
        ("LOADING", "BUSY", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "READONLY")
    ):
        return Unreachable(f"Redis is unreachable or did not answer in time: {text}")
    detail = _protocol.protocol_error_detail(text)
    if detail is not None:
        return ProtocolMismatch(name, detail)
    if text.startswith("REDSEM_CORRUPT"):
        return Corrupt(name, text[len("REDSEM_CORRUPT"):].strip().split(" script: ")[0])
    if "WRONGTYPE" in text:
        return WrongType(name, text.split(" script: ")[0])
    if "NOPERM" in text or "no permissions" in text:
        return NoPermission(
            f"Redis refused a command for lack of permission ({text}): grant the ACL rule from the README's Security section"
        )
    return BackendError(f"Redis error: {text}")

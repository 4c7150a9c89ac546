"""The exceptions of redsem: one class per variant of the Rust crate's `redsem::Error`.

The compiled module raises them (its one mapping function, `to_py` in `src/lib.rs`): the
message is the Rust error's text, and the variant's fields are attributes. Every exception
is a `RedsemError`; `InvalidArgument` is also a `ValueError` and `Timeout` also a
`TimeoutError`. `semaphore` names the semaphore when the error is about one; `retryable`
says whether the same call may succeed later (Redis unreachable, a timeout, no permits now,
not replicated in time).
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "BackendError",
    "Closed",
    "Corrupt",
    "EvictingPolicy",
    "HandoffGone",
    "InUse",
    "InvalidArgument",
    "LeaseLost",
    "LimitConflict",
    "NoPermission",
    "NoPermits",
    "NotASemaphore",
    "NotReplicated",
    "ProtocolMismatch",
    "RedsemError",
    "RemovedFromQueue",
    "Timeout",
    "TooManyPermits",
    "UnknownSemaphore",
    "Unreachable",
    "WrongType",
]


class RedsemError(Exception):
    """Base class of every redsem error."""

    semaphore: str | None = None
    """The semaphore's name, when the error is about one."""
    retryable: bool = False
    """True when retrying the same call later can succeed."""


class InvalidArgument(RedsemError, ValueError):
    """An argument or configuration value is out of range; nothing was sent."""


class LimitConflict(RedsemError):
    """The semaphore exists with another limit (`stored`): open it with that limit, or
    change it for everyone with `Semaphore.resize`."""

    requested: int = 0
    stored: int = 0


class TooManyPermits(RedsemError):
    """More permits requested at once (`requested`) than the limit (`limit`)."""

    requested: int = 0
    limit: int = 0


class NoPermits(RedsemError):
    """`try_acquire`: not possible right now. `reason`: `"none_free"`, `"queued_first"`
    (free, but others are queued first: FIFO) or `"local_cap"`."""

    reason: str = ""


class Timeout(RedsemError, TimeoutError):
    """No grant within `timeout` seconds; the place in the queue was given up."""

    timeout: float = 0.0


class LeaseLost(RedsemError):
    """The permit's slot was lost while the work ran. `reason`: `"not_holder"` (the entry
    was gone: expired, force-released, data lost), `"unreachable"` (renewals failed until the
    lease could have expired), `"shutdown"` (the client was closed), `"refused"` (ACL),
    `"deleted"` (a forced delete of the semaphore), `"max_hold"` (the acquisition's maximum
    hold time was reached: its renewals stopped)."""

    reason: str = ""


class RemovedFromQueue(RedsemError):
    """An operator removed this request from the queue (`force_release` of a waiter's id,
    `redsem release`) before it was granted: the acquisition was cancelled on purpose and
    nothing is left in Redis. Do not simply retry."""


class HandoffGone(RedsemError):
    """`Semaphore.adopt`: the hand-off token's permit (`holder_id`) is no longer in Redis:
    its lease ran out before it was adopted, or it was released. Acquire a new permit."""

    holder_id: str = ""


class Closed(RedsemError):
    """The semaphore handle was closed, or its client."""


class UnknownSemaphore(RedsemError):
    """No semaphore of that name under the key prefix (`prefix`)."""

    prefix: str = ""


class InUse(RedsemError):
    """`delete_semaphore` without `force`: it has `holders` holders and `waiters` waiters."""

    holders: int = 0
    waiters: int = 0


class WrongType(RedsemError):
    """A key of the semaphore holds another type of value: use another name or prefix."""


class NotASemaphore(RedsemError):
    """The semaphore's configuration key holds another program's hash: not a redsem
    semaphore. Nothing was changed; use another name or key prefix."""


class ProtocolMismatch(RedsemError):
    """The semaphore was created under another version of the redsem protocol."""


class Corrupt(RedsemError):
    """The semaphore's keys are inconsistent and could not be repaired."""


class EvictingPolicy(RedsemError):
    """Redis's `maxmemory-policy` (`policy`) may evict the semaphore's keys."""

    policy: str = ""


class NoPermission(RedsemError):
    """The Redis user may not run a command redsem needs (ACL)."""


class AuthError(RedsemError):
    """Authentication failed: check the user name and password in the URL."""


class NotReplicated(RedsemError):
    """Synced mode: only `acked` of the `wanted` replicas acknowledged the grant in time;
    the permit was released."""

    acked: int = 0
    wanted: int = 0


class Unreachable(RedsemError):
    """Redis could not be reached or did not answer in time; calls can be retried."""


class BackendError(RedsemError):
    """Any other error reported by Redis (`code`: its error code, if it replied)."""

    code: str | None = None

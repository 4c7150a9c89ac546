"""redsem: fair, crash-safe distributed semaphores on Redis and Valkey, from Python.

The package is a thin binding over the redsem Rust crate (compiled into `redsem._native`):
the same engine, protocol and CLI as the Rust programs it shares semaphores with.

    import redsem

    async def main() -> None:
        client = await redsem.connect("redis://127.0.0.1:6379/")
        sem = await client.semaphore("licence-server", limit=4, lease=10.0)
        async with sem.acquire(timeout=30) as permit:
            print(permit.slots, [str(f) for f in permit.fences])
        await client.close()

`redsem.sync` wraps the same API for code without an event loop; `python -m redsem` is the
`redsem` command line.
"""

import atexit as _atexit
import os as _os

from . import _native
from ._client import (
    AcquireContext,
    AcquireOptions,
    Client,
    Fence,
    FencedStore,
    HolderInfo,
    LostSignal,
    ForceReleased,
    Permit,
    RejectedWaiter,
    Resized,
    Semaphore,
    Stats,
    WaiterInfo,
    connect,
    default_url,
)
from .errors import (
    AuthError,
    BackendError,
    Closed,
    Corrupt,
    EvictingPolicy,
    HandoffGone,
    InUse,
    InvalidArgument,
    LeaseLost,
    LimitConflict,
    NoPermission,
    NoPermits,
    NotASemaphore,
    NotReplicated,
    ProtocolMismatch,
    RedsemError,
    RemovedFromQueue,
    Timeout,
    TooManyPermits,
    UnknownSemaphore,
    Unreachable,
    WrongType,
)

from . import sync

__version__ = "0.3.0"

MAX_LIMIT: int = _native.MAX_LIMIT
"""The largest limit a semaphore can have."""
MAX_NAME_LEN: int = _native.MAX_NAME_LEN
"""The longest semaphore name, in bytes."""
MAX_DURATION: float = _native.MAX_DURATION
"""The longest lease, timeout or interval accepted, in seconds."""
MIN_LEASE: float = _native.MIN_LEASE
"""The shortest lease accepted, in seconds (0.25): renewed every third of it, a shorter one
leaves its renewals too little room, and its permits would be lost to an ordinary delay."""
DEFAULT_PREFIX: str = _native.DEFAULT_PREFIX
"""The default key prefix."""
STATS_LISTED: int = _native.STATS_LISTED
"""Holders and waiters a snapshot lists by default (`stats()`, `inspect(name)`)."""
MAX_LISTED: int = _native.MAX_LISTED
"""The most holders and waiters a snapshot may list (`stats(listed)`)."""

# Tokio's runtime and the parent's sockets cannot be used in a forked child: every native
# entry point refuses there with a clear error instead of hanging.
_os.register_at_fork(after_in_child=_native._mark_forked)
# Before the interpreter finalises, the runtime's threads stop delivering results to Python
# (one that attached then would abort the process); see src/bridge.rs.
_atexit.register(_native._drain)

__all__ = [
    "DEFAULT_PREFIX",
    "MAX_DURATION",
    "MAX_LIMIT",
    "MAX_LISTED",
    "MAX_NAME_LEN",
    "MIN_LEASE",
    "STATS_LISTED",
    "AcquireContext",
    "AcquireOptions",
    "AuthError",
    "BackendError",
    "Client",
    "Closed",
    "Corrupt",
    "EvictingPolicy",
    "Fence",
    "FencedStore",
    "ForceReleased",
    "HandoffGone",
    "HolderInfo",
    "InUse",
    "InvalidArgument",
    "LeaseLost",
    "LimitConflict",
    "LostSignal",
    "NoPermission",
    "NoPermits",
    "NotASemaphore",
    "NotReplicated",
    "Permit",
    "ProtocolMismatch",
    "RedsemError",
    "RejectedWaiter",
    "RemovedFromQueue",
    "Resized",
    "Semaphore",
    "Stats",
    "Timeout",
    "TooManyPermits",
    "UnknownSemaphore",
    "Unreachable",
    "WaiterInfo",
    "WrongType",
    "connect",
    "default_url",
    "sync",
]

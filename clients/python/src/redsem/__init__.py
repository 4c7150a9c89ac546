"""redsem: fair, crash-safe distributed semaphores on Redis, from Python.

Speaks the redsem protocol (docs/PROTOCOL.md in the redsem repository) with redis-py's
asyncio client, so Python and Rust processes share one semaphore: one limit, one FIFO queue.

    import redsem

    async def main():
        client = await redsem.connect("redis://127.0.0.1:6379/")
        sem = await client.semaphore("licence-server", limit=4, lease=10.0)
        async with sem.acquire(timeout=30) as permit:
            print(permit.slots, [str(f) for f in permit.fences])
        await client.close()

`redsem.sync` wraps the same API for code without an event loop.
"""

from ._protocol import PROTOCOL
from .client import Client, connect, default_label
from .errors import (
    AuthError,
    BackendError,
    Closed,
    EvictingPolicy,
    InvalidArgument,
    LeaseLost,
    LimitConflict,
    NoPermission,
    NoPermits,
    Corrupt,
    ProtocolMismatch,
    RedsemError,
    Timeout,
    TooManyPermits,
    UnknownSemaphore,
    Unreachable,
    WrongType,
)
from .permit import AcquireContext, Fence, Permit
from .semaphore import Semaphore
from .stats import HolderInfo, Stats, WaiterInfo

__version__ = "0.2.0"

__all__ = [
    "PROTOCOL",
    "AcquireContext",
    "AuthError",
    "BackendError",
    "Client",
    "Closed",
    "EvictingPolicy",
    "Fence",
    "HolderInfo",
    "InvalidArgument",
    "LeaseLost",
    "LimitConflict",
    "NoPermission",
    "NoPermits",
    "Permit",
    "Corrupt",
    "ProtocolMismatch",
    "RedsemError",
    "Semaphore",
    "Stats",
    "Timeout",
    "TooManyPermits",
    "UnknownSemaphore",
    "Unreachable",
    "WaiterInfo",
    "WrongType",
    "connect",
    "default_label",
]

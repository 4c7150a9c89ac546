"""`Stats`: a snapshot of one semaphore, as the Rust crate's `redsem::Stats`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from . import _protocol
from .permit import Fence


@dataclass
class HolderInfo:
    """One holder. Durations in seconds."""

    id: str
    label: str
    permits: int
    fences: List[Fence]
    held: float
    """Time since the grant."""
    lease_left: float
    """Time until its lease expires unless renewed."""


@dataclass
class WaiterInfo:
    """One waiter. Durations in seconds."""

    id: str
    label: str
    permits: int
    position: int
    """0 = next to be granted."""
    ticket: int
    waited: float
    lease_left: float


@dataclass
class Stats:
    """A consistent snapshot taken by one script run (expired entries are reaped first)."""

    name: str
    limit: int
    in_use: int
    available: int
    holders: List[HolderInfo] = field(default_factory=list)
    """Oldest acquisition first."""
    waiters: List[WaiterInfo] = field(default_factory=list)
    """In queue (FIFO) order."""
    grants_total: int = 0
    expired_total: int = 0
    server_time_ms: int = 0
    repairs_total: int = 0
    """Times the scripts repaired the semaphore's keys after some were lost (evicted or deleted)."""

    @property
    def oldest_wait(self) -> Optional[float]:
        """How long the head of the queue has waited (seconds), if anyone waits."""
        return self.waiters[0].waited if self.waiters else None

    @classmethod
    def _from_raw(cls, name: str, raw: _protocol.RawStats) -> "Stats":
        now = raw.now_ms
        secs = lambda ms: max(0, ms) / 1000  # noqa: E731
        holders = [
            HolderInfo(
                id=e.id,
                label=e.label,
                permits=e.n,
                fences=[Fence(s, g) for s, g in zip(e.slots, e.fences)],
                held=secs(now - (e.granted_ms if e.granted_ms is not None else now)),
                lease_left=secs((e.expires_ms if e.expires_ms is not None else now) - now),
            )
            for e in raw.holders
        ]
        holders.sort(key=lambda h: -h.held)
        waiters = [
            WaiterInfo(
                id=e.id,
                label=e.label,
                permits=e.n,
                position=i,
                ticket=e.ticket,
                waited=secs(now - e.enqueued_ms),
                lease_left=secs((e.expires_ms if e.expires_ms is not None else now) - now),
            )
            for i, e in enumerate(raw.waiters)
        ]
        return cls(name, raw.limit, raw.in_use, max(0, raw.limit - raw.in_use), holders, waiters,
                   raw.grants, raw.expired, raw.now_ms, raw.repairs)

    def to_json(self) -> Dict[str, Any]:
        """The schema of `redsem stats --json` (durations in milliseconds)."""
        ms = lambda s: int(round(s * 1000))  # noqa: E731
        return {
            "name": self.name,
            "limit": self.limit,
            "in_use": self.in_use,
            "available": self.available,
            "holders": [
                {"id": h.id, "label": h.label, "permits": h.permits,
                 "fences": [{"slot": f.slot, "generation": f.generation} for f in h.fences],
                 "held": ms(h.held), "lease_left": ms(h.lease_left)}
                for h in self.holders
            ],
            "waiters": [
                {"id": w.id, "label": w.label, "permits": w.permits, "position": w.position,
                 "ticket": w.ticket, "waited": ms(w.waited), "lease_left": ms(w.lease_left)}
                for w in self.waiters
            ],
            "grants_total": self.grants_total,
            "expired_total": self.expired_total,
            "repairs_total": self.repairs_total,
            "server_time_ms": self.server_time_ms,
        }

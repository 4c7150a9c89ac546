"""Everything specific to the redsem protocol, in one place (docs/PROTOCOL.md, version 3).

Key names, the protocol version, the channel and id shapes, how each script's source is
built and its arguments laid out, and how replies and notifications are parsed. The rest of
the package never builds a key, an argument list or parses a reply itself, so a protocol
version bump changes this module (and the copied Lua scripts) only.
"""

from __future__ import annotations

import functools
import json
import secrets
from dataclasses import dataclass
from importlib import resources
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

#: The protocol version these scripts and this module speak (`ver` in a semaphore's `cfg`).
PROTOCOL = 3

#: Key prefix used when none is given (the Rust crate's `DEFAULT_PREFIX`).
DEFAULT_PREFIX = "redsem"

#: The seven keys of a semaphore, in the order every script takes them as KEYS.
#: `exp` holds the leases of sessions (one per client handle and lease length), not of
#: entries; `own` indexes each session's entries. Fence generations live in `cfg` (`gen`).
KEY_SUFFIXES = ("cfg", "queue", "exp", "meta", "slots", "free", "own")

#: Largest limit a semaphore may have.
MAX_LIMIT = 100_000
#: Longest semaphore name and label, in bytes.
MAX_NAME_LEN = 200
MAX_LABEL_LEN = 200
#: Shortest lease, in seconds (as the Rust crate).
MIN_LEASE = 0.020

#: Publish command on a standalone server or a Sentinel-managed primary (SPUBLISH on a
#: cluster, which this client does not support).
PUBLISH = "PUBLISH"

#: The scripts a client runs with the prelude in front; `fence` has no prelude.
SCRIPTS = ("open", "acquire", "renew", "release", "resize", "stats")

#: Put between the prelude and the body for operator calls that must never create a
#: semaphore: a nil reply then means "no such semaphore".
OPERATOR_GUARD = "if redis.call('EXISTS', K_CFG) == 0 then return false end"

#: Error code of a script refusing a semaphore of another protocol version.
PROTOCOL_ERROR = "REDSEM_PROTOCOL"

#: Most waiters checked by one `renew.lua` call (as the Rust crate): more go in further calls.
WAITERS_PER_CALL = 512


# -- names and identifiers -------------------------------------------------------------------


def check_name(name: str) -> None:
    """Raises ValueError unless `name` is a valid semaphore name."""
    why = None
    if not isinstance(name, str) or not name:
        why = "is empty: give the semaphore the name of what it protects"
    elif len(name.encode()) > MAX_NAME_LEN:
        why = f"is {len(name.encode())} bytes long; the maximum is {MAX_NAME_LEN}"
    elif "{" in name or "}" in name:
        why = "contains '{' or '}', which would break the Redis Cluster hash tag"
    elif any(c.isspace() or not c.isprintable() for c in name):
        why = "contains whitespace or control characters"
    if why:
        raise ValueError(f"semaphore name {name!r} {why}")


def check_prefix(prefix: str) -> None:
    """Raises ValueError unless `prefix` is a valid key prefix."""
    if (
        not prefix
        or len(prefix.encode()) > 64
        or "{" in prefix
        or "}" in prefix
        or any(c.isspace() or not c.isprintable() for c in prefix)
    ):
        raise ValueError(f"key prefix {prefix!r} must be 1 to 64 bytes without braces or whitespace")


class Keys:
    """The keys and channels of one semaphore."""

    def __init__(self, prefix: str, name: str):
        check_prefix(prefix)
        check_name(name)
        base = f"{prefix}:{{{name}}}:"
        self.all: List[str] = [base + s for s in KEY_SUFFIXES]
        self.channel_base = base + "c:"

    def channel(self, suffix: str) -> str:
        """The notification channel of the handle whose channel suffix is `suffix`."""
        return self.channel_base + suffix


def new_client_id() -> str:
    """A random client id: 16 hex characters (the Rust crate's shape)."""
    return secrets.token_hex(8)


def channel_suffix(client_id: str, handle: int) -> str:
    """The channel suffix of a client's `handle`-th semaphore handle: `<client id>.<n>`."""
    return f"{client_id}.{handle}"


def session_id(suffix: str, lease_ms: int) -> str:
    """The session of the handle whose channel suffix is `suffix`, for leases of `lease_ms`:
    `<suffix>~<lease ms>`. A waiter belongs to the session of its waiter lease, a holder to
    that of its holder lease; the handle renews its sessions, not its entries."""
    return f"{suffix}~{int(lease_ms)}"


def new_entry_id(suffix: str) -> str:
    """A fresh entry id for one acquisition: `<suffix>-<12 hex chars>` (no `:;,` or spaces)."""
    return f"{suffix}-{secrets.token_hex(6)}"


# -- scripts ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _read(name: str) -> str:
    return (resources.files("redsem") / "scripts" / f"{name}.lua").read_text(encoding="utf-8")


def script_source(name: str, operator: bool = False) -> str:
    """The text to run for script `name`: prelude, newline, (guard, newline,) body."""
    if name == "fence":
        return _read("fence")
    parts = [_read("prelude")]
    if operator:
        parts.append(OPERATOR_GUARD)
    parts.append(_read(name))
    return "\n".join(parts)


def header(keys: Keys, limit: int) -> List[Any]:
    """ARGV 1..3, common to every script: create-limit, channel base, publish command."""
    return [limit, keys.channel_base, PUBLISH]


@dataclass(frozen=True)
class Request:
    """One acquisition request of an `acquire.lua` batch."""

    id: str
    n: int
    lease_ms: int
    wait_lease_ms: int
    suffix: str
    label: str
    try_only: bool


def acquire_args(requests: Sequence[Request]) -> List[Any]:
    """ARGV 4.. of `acquire.lua`: the count, then 7 values per request."""
    out: List[Any] = [len(requests)]
    for r in requests:
        out += [r.id, r.n, r.lease_ms, r.wait_lease_ms, r.suffix, r.label, "try" if r.try_only else "wait"]
    return out


def renew_args(sessions: Sequence[Tuple[str, int]], ids: Iterable[str]) -> List[Any]:
    """ARGV 4.. of `renew.lua`: the number of sessions, each session's id and lease (ms),
    then the ids of the entries to check (they are not renewed one by one: their sessions
    are)."""
    out: List[Any] = [len(sessions)]
    for sid, lease_ms in sessions:
        out += [sid, int(lease_ms)]
    out += list(ids)
    return out


def release_args(ids: Iterable[str], force: bool = False, end: Sequence[str] = (),
                 detach: Sequence[str] = ()) -> List[Any]:
    """ARGV 4.. of `release.lua`: the force flag, the number of sessions to end (each ends
    only once it has no entry left), the number of holders to detach, then the sessions,
    the holders to detach and the ids to remove."""
    return ["1" if force else "0", len(end), len(detach), *end, *detach, *ids]


def resize_args(limit: int) -> List[Any]:
    """ARGV 4 of `resize.lua`: the new limit."""
    return [limit]


# -- replies ---------------------------------------------------------------------------------


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def _ints(v: Any) -> List[int]:
    return [int(x) for x in (v or [])]


@dataclass(frozen=True)
class Grant:
    """What a grant carries: the ticket, and the slots with their fence generations."""

    ticket: int
    slots: Tuple[int, ...]
    fences: Tuple[int, ...]


@dataclass(frozen=True)
class Held:
    """Acquire: granted now. Renew: still (or newly) held."""

    grant: Grant


@dataclass(frozen=True)
class Queued:
    """Acquire: queued under `ticket`; `next_expiry_ms` until the nearest lease expiry (-1: none)."""

    ticket: int
    next_expiry_ms: int


@dataclass(frozen=True)
class Waiting:
    """Renew: still queued."""


@dataclass(frozen=True)
class Busy:
    """Acquire in try mode: not free now (or others queued first)."""


@dataclass(frozen=True)
class TooMany:
    """Acquire: more permits than the limit."""

    limit: int


@dataclass(frozen=True)
class Gone:
    """Renew: the entry no longer exists (expired, released, lost with Redis data)."""


AcquireReply = Union[Held, Queued, Busy, TooMany]
EntryState = Union[Held, Waiting, Gone]


def _held(r: Sequence[Any]) -> Held:
    return Held(Grant(int(r[3]), tuple(_ints(r[1])), tuple(_ints(r[2]))))


def parse_acquire(reply: Sequence[Any]) -> List[AcquireReply]:
    """The replies of one `acquire.lua` call, one per request."""
    out: List[AcquireReply] = []
    for r in reply:
        kind = int(r[0])
        if kind == 1:
            out.append(_held(r))
        elif kind == 0:
            out.append(Queued(int(r[1]), int(r[2])))
        elif kind == -1:
            out.append(Busy())
        elif kind == -2:
            out.append(TooMany(int(r[1])))
        else:
            raise ValueError(f"unreadable acquire reply {r!r}")
    return out


@dataclass(frozen=True)
class Renewal:
    """The reply of one `renew.lua` call."""

    #: Until the nearest session lease expiry in Redis, ms (-1: none).
    next_expiry_ms: int
    #: One per id sent, in order.
    states: List[EntryState]
    #: The permits free and the stored limit at the time of the call.
    free: int
    limit: int
    #: One flag per session sent: it had a lease (False: it had expired and its entries were
    #: reaped, or it was never used; its lease starts now).
    had_lease: List[bool]
    #: The ticket at the head of the queue (None: nobody waits). A waiter with a lower
    #: ticket was granted or removed meanwhile.
    head: Optional[int]
    #: Entries of the sessions sent that someone else removed since their last renewal (an
    #: operator's release, a rejection after the limit shrank).
    removed: List[str]


def parse_renew(reply: Sequence[Any], sessions: int, ids: int) -> Renewal:
    """One `renew.lua` reply for `sessions` sessions and `ids` ids:
    `{next_expiry_ms, states, free, limit, sessions, head, removed}`."""
    if len(reply) < 7:
        raise ValueError(f"unreadable renew reply {reply!r}")
    next_expiry, states, free, limit, flags, head, removed = reply[:7]
    out: List[EntryState] = []
    for s in states:
        kind = int(s[0])
        out.append(_held(s) if kind == 1 else Waiting() if kind == 0 else Gone())
    had_lease = [int(f) == 1 for f in (flags or [])]
    if len(out) != ids or len(had_lease) != sessions:
        raise ValueError(f"renew reply for {sessions} sessions and {ids} ids: {reply!r}")
    head = int(head)
    return Renewal(int(next_expiry), out, int(free), int(limit), had_lease,
                   head if head >= 0 else None, [_str(r) for r in (removed or [])])


def parse_open(reply: Sequence[Any]) -> Tuple[int, bool]:
    """`(stored_limit, created)` of `open.lua`."""
    return int(reply[0]), bool(int(reply[1]))


@dataclass(frozen=True)
class RawEntry:
    """One `meta` record as `stats.lua` lists it (times in ms, Redis time)."""

    id: str
    n: int
    label: str
    ticket: int
    enqueued_ms: int
    granted_ms: Optional[int]
    slots: Tuple[int, ...]
    fences: Tuple[int, ...]
    expires_ms: Optional[int]


@dataclass(frozen=True)
class RawStats:
    now_ms: int
    limit: int
    in_use: int
    grants: int
    expired: int
    holders: List[RawEntry]
    waiters: List[RawEntry]
    repairs: int = 0


def _entries(raw: Any) -> List[RawEntry]:
    out = []
    for e in json.loads(_str(raw)):
        opt = lambda k: None if e.get(k) is None else int(e[k])  # noqa: E731
        out.append(
            RawEntry(
                id=str(e["id"]),
                n=int(e["n"]),
                label=str(e.get("lb", "")),
                ticket=int(e.get("t", 0)),
                enqueued_ms=int(e.get("q", 0)),
                granted_ms=opt("a"),
                slots=tuple(_ints(e.get("s"))),
                fences=tuple(_ints(e.get("f"))),
                expires_ms=opt("e"),
            )
        )
    return out


def parse_stats(reply: Sequence[Any]) -> RawStats:
    """`stats.lua`'s reply: now, limit, in use, grants, expired, holders, waiters, repairs."""
    now, limit, in_use, grants, expired, holders, waiters = reply[:7]
    repairs = int(reply[7]) if len(reply) > 7 else 0
    return RawStats(int(now), int(limit), int(in_use), int(grants), int(expired), _entries(holders),
                    _entries(waiters), repairs)


# -- notifications ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Notice:
    """One record of a notification: a grant (`grant` set) or a rejection (`grant` None)."""

    id: str
    grant: Optional[Grant]


def parse_notices(payload: Union[str, bytes]) -> List[Notice]:
    """`g:<id>:<ticket>:<slots>:<fences>;x:<id>;...`; unknown or malformed records are skipped."""
    out = []
    for rec in _str(payload).split(";"):
        parts = rec.split(":")
        try:
            if parts[0] == "g" and len(parts) == 5:
                nums = lambda s: tuple(int(x) for x in s.split(",")) if s else ()  # noqa: E731
                out.append(Notice(parts[1], Grant(int(parts[2]), nums(parts[3]), nums(parts[4]))))
            elif parts[0] == "x" and len(parts) == 2:
                out.append(Notice(parts[1], None))
        except ValueError:
            continue
    return out


# -- errors ----------------------------------------------------------------------------------


def protocol_error_detail(message: str) -> Optional[str]:
    """The reason of a script's protocol-version refusal, or None for any other error."""
    if not message.startswith(PROTOCOL_ERROR):
        return None
    detail = message[len(PROTOCOL_ERROR) :].strip()
    # Redis appends " script: <sha>, on @user_script:<line>."
    return detail.split(" script: ")[0]

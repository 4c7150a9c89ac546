"""The calls that confirmed a lease, and which of them it is trusted from (docs/PROTOCOL.md
rule 4): the Python twin of the Rust crate's `Confirmations` (`engine/lease.rs`).

The trust rule. A failover may promote a replica that lags its master by less than one
renewal interval `L`: it has every write the master made until `L` before it died. A
confirmation answered at `r` is on any such replica once a later confirmation was *sent* at
or after `r + L`: that one was answered either by a master alive at its send time (so a
failover that could still take effect killed it later, and its replica has everything up to
`r`), or by a promoted replica, which then held the lease and renewed it. The lease is
trusted from the send time of the newest confirmation that a later one made trusted this way
(the first confirmation until then: a grant a failover lost is a lost grant, which the next
renewal reports). Counting from "the confirmation before the last" is not enough: two
confirmations less than `L` apart (a renewal and a heartbeat beat for waiters or an expiry)
may both be missing from the replica.

The renewal rhythm follows an anchor: the next renewal is due one interval after the
anchor's answer (the earliest moment it makes the anchor trusted), and the confirmation that
makes it trusted is the next anchor. Confirmations in between neither delay nor hasten it.
"""

from __future__ import annotations

from typing import List, Tuple

#: Most confirmations kept while they cannot be trusted yet (more are rare: beats closer
#: together than a renewal interval; one left out only keeps the trusted confirmation older,
#: never newer than it may be).
UNTRUSTED_MAX = 8


class _Confirmations:
    """The confirmations of one lease (a grant, or a waiter's registration, then renewals):
    when each was sent and answered (monotonic clock), the one the lease is trusted from, and
    the anchor of its renewal rhythm."""

    __slots__ = ("_lag", "_trusted_from", "_last_sent", "_anchor", "_untrusted")

    def __init__(self, sent: float, answered: float, lag: float):
        """A first confirmation, by a call sent at `sent` and answered at `answered`, of a
        lease renewed every `lag` (the replicas' lag it must survive)."""
        self._lag = lag
        #: Send time of the confirmation the lease is trusted from.
        self._trusted_from = sent
        #: Send time of the newest confirmation.
        self._last_sent = sent
        #: The anchor of the renewal rhythm: (sent, answered).
        self._anchor: Tuple[float, float] = (sent, max(answered, sent))
        #: Confirmations not trusted yet, (sent, answered), at most `UNTRUSTED_MAX`.
        self._untrusted: List[Tuple[float, float]] = []

    def confirm(self, sent: float, answered: float) -> None:
        """Records a confirmation by a call sent at `sent` and answered at `answered` (an
        older call answering late counts too, as what it is)."""
        answered = max(answered, sent)
        if sent <= self._trusted_from:
            return
        self._last_sent = max(self._last_sent, sent)
        if sent >= self._anchor[1] + self._lag:
            # the anchor is on every replica a failover may promote; this is the next one
            self._trusted_from = max(self._trusted_from, self._anchor[0])
            self._anchor = (sent, answered)
        if len(self._untrusted) < UNTRUSTED_MAX:
            self._untrusted.append((sent, answered))
        trusted = self._trusted_from
        for s, a in self._untrusted:
            if a + self._lag <= self._last_sent:
                trusted = max(trusted, s)
        self._trusted_from = trusted
        self._untrusted = [(s, a) for s, a in self._untrusted if s > trusted]

    @property
    def trusted_from(self) -> float:
        """Send time of the confirmation the lease is trusted from."""
        return self._trusted_from

    @property
    def last_sent(self) -> float:
        """Send time of the newest confirmation."""
        return self._last_sent

    @property
    def anchor_answered(self) -> float:
        """When the anchor confirmation was answered: the next renewal is due one renewal
        interval later."""
        return self._anchor[1]

    def copy(self) -> "_Confirmations":
        c = _Confirmations.__new__(_Confirmations)
        c._lag, c._trusted_from, c._last_sent = self._lag, self._trusted_from, self._last_sent
        c._anchor, c._untrusted = self._anchor, list(self._untrusted)
        return c

    def __repr__(self) -> str:
        return (f"_Confirmations(trusted_from={self._trusted_from}, last_sent={self._last_sent}, "
                f"anchor={self._anchor}, untrusted={self._untrusted})")

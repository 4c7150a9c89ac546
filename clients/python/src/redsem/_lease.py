"""The calls that confirmed a lease, and which of them it is trusted from (docs/PROTOCOL.md
rule 4): the Python twin of the Rust crate's `Confirmations` (`engine/lease.rs`).

The trust rule. A failover may promote a replica that lags its master by less than one
renewal interval `L`: it has every write the master made until `L` before it died. A
confirmation answered at `r` is on any such replica once a later confirmation was *sent* at
or after `r + L`: that one was answered either by a master alive at its send time (so a
failover that could still take effect killed it later, and its replica has everything up to
`r`), or by a promoted replica, which then held the lease and renewed it. Counting from "the
confirmation before the last" is not enough: two confirmations less than `L` apart (a
renewal and a heartbeat beat for waiters or an expiry) may both be missing from the replica.

The anchor: the first confirmation, then each one sent at least `L` after the anchor's
answer, which makes that anchor trusted and becomes the next anchor. The lease is trusted
from the send time of the newest anchor made trusted so (the first confirmation until then:
a grant a failover lost is a lost grant, which the next renewal reports). The next renewal
is due `L` after the anchor's answer, the earliest moment it makes the anchor trusted.
Confirmations in between (the heartbeat beating for waiters or expiries) neither delay nor
hasten it, and are not trusted themselves (as in the Rust crate, which keeps no list of
them: it would cost every waiter memory for a deadline a few milliseconds later at best).
"""

from __future__ import annotations


class _Confirmations:
    """The confirmations of one lease (a grant, or a waiter's registration, then renewals):
    the one the lease is trusted from, and the anchor of its renewal rhythm (monotonic
    clock)."""

    __slots__ = ("_lag", "_trusted_from", "_anchor_sent", "_anchor_answered")

    def __init__(self, sent: float, answered: float, lag: float):
        """A first confirmation, by a call sent at `sent` and answered at `answered`, of a
        lease renewed every `lag` (the replicas' lag it must survive)."""
        #: The lag a replica may have: one renewal interval.
        self._lag = lag
        #: Send time of the confirmation the lease is trusted from.
        self._trusted_from = sent
        #: The anchor of the renewal rhythm.
        self._anchor_sent = sent
        self._anchor_answered = max(answered, sent)

    def confirm(self, sent: float, answered: float) -> None:
        """Records a confirmation by a call sent at `sent` and answered at `answered` (an
        older call answering late changes nothing)."""
        if sent >= self._anchor_answered + self._lag:
            # the anchor is on every replica a failover may promote; this is the next one
            self._trusted_from = self._anchor_sent
            self._anchor_sent, self._anchor_answered = sent, max(answered, sent)

    @property
    def trusted_from(self) -> float:
        """Send time of the confirmation the lease is trusted from."""
        return self._trusted_from

    @property
    def anchor_answered(self) -> float:
        """When the anchor confirmation was answered: the next renewal is due one renewal
        interval later."""
        return self._anchor_answered

    def __repr__(self) -> str:
        return (f"_Confirmations(trusted_from={self._trusted_from}, "
                f"anchor=({self._anchor_sent}, {self._anchor_answered}))")

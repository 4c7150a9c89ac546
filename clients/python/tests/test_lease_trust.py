"""Which confirmation a lease is trusted from, and when it is renewed (docs/PROTOCOL.md rule
4): the Python twins of the Rust crate's tests in `engine/lease.rs` and
`engine/heartbeat.rs`. No Redis: a simulated clock, in integer milliseconds (the code is
unit-agnostic; integers keep the comparisons exact)."""

from types import SimpleNamespace

import pytest

from redsem._lease import _Confirmations
from redsem.permit import Permit
from redsem.semaphore import Semaphore, _Waiter

SECOND = 1000


def permit_of(sem, confirmations: _Confirmations) -> Permit:
    return Permit(sem, "h", 1, 1, (0,), (1,), confirmations)


def test_a_renewal_never_moves_the_confirmation_back():
    c = _Confirmations(0, 0, SECOND)
    c.confirm(2 * SECOND, 2 * SECOND)
    assert c.trusted_from == 0, "the grant"
    half = 2 * SECOND + SECOND // 2
    c.confirm(half, half)
    assert c.trusted_from == 0, "not an interval after the anchor's answer"
    c.confirm(3 * SECOND, 3 * SECOND)
    assert c.trusted_from == 2 * SECOND
    # an older call answering late changes nothing
    c.confirm(half, 4 * SECOND)
    assert c.trusted_from == 2 * SECOND
    assert c.anchor_answered == 3 * SECOND


def test_the_deadline_counts_from_a_confirmation_one_renewal_interval_older_than_a_later_one():
    """A failover to a replica that lags by less than one renewal interval may have lost
    every confirmation answered less than an interval before the newest was sent: the
    deadline counts from an anchor that a confirmation sent an interval after its answer
    made trusted, and the next renewal is due an interval after the answer to the anchor."""
    sem = SimpleNamespace(name="t", _lease=3 * SECOND, _margin=300, _renew_every=SECOND)
    permit = permit_of(sem, _Confirmations(0, 10, SECOND))
    c = permit._confirmations
    assert c.trusted_from == 0, "the grant, until a later one is trusted"
    assert permit._renewal_due() == 1010, "an interval after its answer"
    permit._confirm(1010, 1020)
    assert c.trusted_from == 0
    permit._confirm(2020, 2030)
    assert c.trusted_from == 1010, "sent after its answer + an interval"
    assert permit._deadline() == 1010 + 2700
    # the heartbeat beats 80 ms later (for its waiters): both confirmations may be missing
    # from a replica lagging 900 ms, so the trusted one stays where it was, and the renewal
    # is still due an interval after the anchor's answer
    permit._confirm(2100, 2110)
    assert c.trusted_from == 1010
    assert permit._renewal_due() == 3030
    permit._confirm(3030, 3040)
    assert c.trusted_from == 2020, "the anchor"
    assert permit._renewal_due() == 4040
    # each renewal comes before the deadline, and moves it on (renewal <= lease / 3)
    assert permit._renewal_due() < permit._deadline()
    permit._confirm(4040, 4050)
    assert permit._deadline() == 3030 + 2700
    assert permit._renewal_due() < permit._deadline()


def test_a_granted_waiter_keeps_its_confirmations():
    """The grant keeps the waiter's lease: the permit's deadline counts from the waiter's
    confirmations (its registration, then renewals of its session), not from the grant."""
    c = _Confirmations(0, 0, SECOND)  # registered at 0
    w = _Waiter(1, None, c, ticket=1)  # type: ignore[arg-type]
    w.confirm(5, 15)  # the answer to the registration call
    w.confirm(1020, 1030)
    w.confirm(1500, 1510)  # a check of the waiters in between
    w.confirm(2040, 2050)
    sem = SimpleNamespace(name="t", _lease=3 * SECOND, _margin=300, _renew_every=SECOND)
    permit = permit_of(sem, w.confirmations)
    assert permit._confirmations.trusted_from == 1020
    assert permit._deadline() == 1020 + 2700
    assert permit._renewal_due() == 2050 + SECOND


def simulate(renewals: int = 200, newest_send_rule: bool = False) -> int:
    """Drives the heartbeat's schedule (`Semaphore._next_wakeup`) of a handle with one holder
    and one queued waiter on a simulated clock: a lease of three renewal intervals, a round
    trip of 20 ms, and a beat for another reason (a lease expiring in Redis, a reconnect)
    130 ms after every third renewal. Each beat confirms the holder and the waiter's session
    as `Semaphore._beat` does. Fails if the holder's deadline ever comes before the next
    confirmation's answer; returns the simulated time taken. `newest_send_rule`: renew one
    interval after the newest confirmation's *send* instead (the rule before)."""
    renew, rtt = 300, 20
    sem = Semaphore.__new__(Semaphore)
    sem.name = "t"
    sem._lease, sem._margin = 3 * renew, 90  # margin = lease / 10
    sem._renew_every = sem._fallback = renew
    sem._retry_at = sem._next_check = None
    sem._waiters_checked_at = 0
    permit = permit_of(sem, _Confirmations(0, rtt, renew))
    waiter = _Waiter(1, None, _Confirmations(0, 0, renew), ticket=1)  # type: ignore[arg-type]
    sem._holders = {"h": permit}
    sem._waiters = {"w": waiter}
    now = rtt
    beats = 0
    newest_sent = 0
    if newest_send_rule:
        permit._renewal_due = lambda: newest_sent + renew  # type: ignore[method-assign]

    def beat(sent: int, answered: int) -> None:
        nonlocal beats, newest_sent
        assert permit._deadline() > answered, f"lost during a call at beat {beats}"
        newest_sent = max(newest_sent, sent)
        permit._confirm(sent, answered)
        waiter.confirm(sent, answered)
        sem._waiters_checked_at = answered  # as `_beat`: from the first answer
        beats += 1

    for i in range(renewals):
        wake = sem._next_wakeup(False)
        assert wake is not None
        assert wake < permit._deadline(), "the deadline comes first"
        now = max(now, wake)
        sent, now = now, now + rtt
        beat(sent, now)
        if i % 3 == 0:
            now += 130
            sent, now = now, now + rtt
            beat(sent, now)
    return now


def test_renewals_keep_the_deadline_ahead_whatever_else_the_heartbeat_does():
    """Renewals come one interval after the answer to the one before, so that each makes the
    one before trusted (one sent an interval after the *send* of the one before would not: a
    failover to a replica lagging almost an interval may have lost both); the heartbeat's
    other beats confirm the holder too, and neither delay nor hasten its renewals."""
    renew, rtt = 300, 20
    elapsed = simulate(200)
    # one renewal per interval (+ round trip), besides the other beats
    assert elapsed > renew * 200, f"renewed too often: {elapsed}"
    assert elapsed < (renew + rtt + 40) * 200 + 150 * 67, elapsed


def test_the_schedule_test_catches_renewals_an_interval_after_the_newest_send():
    """The rule before: the next renewal one interval after the newest confirmation's *send*.
    The simulation above finds the deadline passing before a confirmation's answer."""
    with pytest.raises(AssertionError, match="the deadline comes first|lost during a call"):
        simulate(200, newest_send_rule=True)

//! The lease rules: the timing settings of a handle ([`Timing`]), the calls that confirmed a
//! lease and which of them it is trusted from ([`Confirmations`]), and the clock of one held
//! lease ([`LeaseClock`]).
//!
//! A lease is trusted until `trusted confirmation + lease − margin`
//! ([`LeaseClock::deadline`]): the margin covers the difference between this process's
//! clock and Redis's, and the trusted confirmation is one that a failover to a replica
//! lagging by less than one renewal interval cannot have lost (see [`Confirmations`]; the
//! last confirmation may be missing from such a replica, and so may every other one answered
//! less than a renewal interval before the last was sent). Every "could the lease have
//! ended?" question in the engine is answered here.

use std::time::Duration;

use super::time::Instant;

/// The shortest lease a semaphore handle, an acquisition or [`Permit::set_lease`] accepts:
/// 250 ms. A lease is renewed at least three times per length, and trusted only from the
/// renewal before the last (the failover rule, docs/PROTOCOL.md): what is left for round
/// trips, timer and scheduling delays is about a quarter of it, of which a shorter lease
/// keeps a few milliseconds, and its permits are then lost (`Unreachable`) to an ordinary
/// delay.
///
/// [`Permit::set_lease`]: crate::Permit::set_lease
pub const MIN_LEASE: Duration = Duration::from_millis(250);

/// Safety margin taken off a lease before trusting it: a tenth, at most 1 s. The holder
/// trusts a lease confirmed at `t` until `t + lease − margin` (`deadline_after`).
pub fn margin(lease: Duration) -> Duration {
    (lease / 10).min(Duration::from_secs(1))
}

/// The moment a lease of length `lease`, confirmed by a call sent at `confirmed`, could have
/// run out in Redis: lease − safety margin later.
pub(crate) fn deadline_after(confirmed: Instant, lease: Duration) -> Instant {
    confirmed + lease - margin(lease)
}

/// Why `lease`, below [`MIN_LEASE`], is refused.
pub(crate) fn min_lease_message(lease: Duration) -> String {
    format!(
        "lease {lease:?} is shorter than the minimum of {MIN_LEASE:?} (redsem::MIN_LEASE): a \
         lease renewed every third of it (or more often) leaves a shorter one too little time for round trips \
         and scheduling delays, and its permits would be lost to an ordinary delay"
    )
}

/// Timing settings of a semaphore handle (validated by the builder).
#[derive(Clone, Debug)]
pub(crate) struct Timing {
    /// The handle's lease: of its waiters, and of its holders unless an acquisition asked
    /// for another (each holder's [`LeaseClock`] keeps its own).
    pub(crate) lease: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) fallback_poll: Duration,
}

impl Timing {
    /// The settings for `lease`, renewed every `renew_every`, with waiters polled every
    /// `fallback_poll`.
    pub(crate) fn new(lease: Duration, renew_every: Duration, fallback_poll: Duration) -> Timing {
        Timing {
            lease,
            renew_every,
            fallback_poll,
        }
    }

    /// Safety margin taken off the handle's lease before trusting it.
    #[cfg(test)]
    pub(crate) fn margin(&self) -> Duration {
        margin(self.lease)
    }

    /// The moment a lease of the handle's length, last confirmed by a call sent at
    /// `confirmed`, could have run out in Redis: lease − safety margin later.
    #[cfg(test)]
    pub(crate) fn deadline(&self, confirmed: Instant) -> Instant {
        deadline_after(confirmed, self.lease)
    }

    /// Whether `lease` may be a holder's lease on this handle: the handle renews every
    /// `renew_every`, which must be at most a third of it (see [`renewal_due`]).
    ///
    /// [`renewal_due`]: Self::renewal_due
    pub(crate) fn check_holder_lease(&self, lease: Duration) -> Result<(), String> {
        if lease < MIN_LEASE {
            return Err(min_lease_message(lease));
        }
        if lease < self.renew_every * 3 {
            return Err(format!(
                "lease {lease:?} is shorter than three renewal intervals of this semaphore handle \
                 (it renews every {:?}): ask for a longer lease, or open the handle with a shorter \
                 renew_every",
                self.renew_every
            ));
        }
        Ok(())
    }

    /// When the lease held in `lease` is due for renewal: one renewal interval after the
    /// answer to its anchor confirmation (see [`Confirmations`]), the first moment a renewal
    /// makes that confirmation trusted. The deadline then counts from it; the next renewal
    /// comes one interval (+ a round trip) after it, so `2 × (renewal + round trip) + margin
    /// < lease` leaves room for the round trips, the grid and retries (lease ≥ 3 renewals).
    pub(crate) fn renewal_due(&self, lease: &LeaseClock) -> Instant {
        lease.anchor_answered() + self.renew_every
    }

    /// When the waiters' session, confirmed by `waiters`, must be renewed at the latest. A
    /// waiter granted now becomes a holder with these confirmations (its lease continues the
    /// session's), and its first renewal that counts (its next anchor) can be sent one
    /// interval after the anchor's answer; so each anchor must come soon enough after the one
    /// before that the next can still be made before the deadline that one sets: at most
    /// `lease − margin − 1¼ intervals` after it (1.45 intervals for a lease of three). The
    /// waiters' checks and the holders' renewals usually make it in time (and the session
    /// rides along with them); after a call made for another reason (not an anchor: less than
    /// an interval after it) delayed the next check, this is when the session is renewed for
    /// itself (never before the earliest moment a renewal counts). Without it the anchors
    /// drifted up to two intervals apart, and a waiter granted then was a holder whose
    /// deadline came before its first renewal could.
    pub(crate) fn waiters_renewal_due(&self, waiters: &Confirmations) -> Instant {
        let earliest = waiters.anchor_answered() + self.renew_every;
        let room = (self.lease - margin(self.lease)).saturating_sub(self.renew_every * 5 / 4);
        earliest.max(waiters.anchor_sent() + room)
    }

    /// How often the waiters are checked: every fallback interval, and at least every renewal
    /// interval (waiters hold a lease too; a fallback poll longer than the lease would let
    /// Redis reap them).
    pub(crate) fn waiter_check(&self) -> Duration {
        self.fallback_poll.min(self.renew_every)
    }
}

/// The calls that confirmed a lease (its grant, a waiter's registration, then renewals):
/// the one the lease is trusted from, and the anchor of the renewal rhythm.
///
/// The trust rule. A failover may promote a replica that lags its master by less than one
/// renewal interval `L` (the documented bound): the replica has every write the master
/// made until `L` before it died. A confirmation answered at `r` is on any such replica
/// once a later confirmation was *sent* at or after `r + L`: that one was answered either by
/// a master alive at its send time (so a failover that could still take effect killed it
/// later, and its replica has everything up to `r`), or by a promoted replica, which then
/// held the lease and renewed it. Counting from "the confirmation before the last" is not
/// enough: two confirmations less than `L` apart (a renewal and a heartbeat beat for another
/// reason, or renewals rounded to a grid) may both be missing from the replica.
///
/// The anchor: the first confirmation, then each one sent at least `L` after the anchor's
/// answer, which makes that anchor trusted and becomes the next anchor. The lease is
/// trusted from the send time of the newest anchor made trusted so (the first confirmation
/// until then: a grant a failover lost is a lost grant, which the next renewal reports).
/// The next renewal is due `L` after the anchor's answer, the earliest moment it makes the
/// anchor trusted. Confirmations in between (the heartbeat beating for waiters or expiries)
/// neither delay nor hasten it, and are not trusted themselves (keeping them would cost
/// memory for a deadline a few milliseconds later at best).
///
/// What it costs: 40 bytes per holder, and one for all the waiters of a handle (`table.rs`).
#[derive(Clone, Debug)]
pub(crate) struct Confirmations {
    /// The lag a replica may have: one renewal interval.
    lag: Duration,
    /// Send time of the confirmation the lease is trusted from.
    trusted_from: Instant,
    /// The anchor of the renewal rhythm: (sent, answered).
    anchor: (Instant, Instant),
}

impl Confirmations {
    /// A first confirmation, by a call sent at `sent` and answered at `answered`, of a lease
    /// renewed every `lag` (the replicas' lag it must survive).
    pub(crate) fn new(sent: Instant, answered: Instant, lag: Duration) -> Confirmations {
        Confirmations {
            lag,
            trusted_from: sent,
            anchor: (sent, answered.max(sent)),
        }
    }

    /// Records a confirmation by a call sent at `sent` and answered at `answered` (an older
    /// call answering late changes nothing).
    pub(crate) fn confirm(&mut self, sent: Instant, answered: Instant) {
        if sent >= self.anchor.1 + self.lag {
            // the anchor is on every replica a failover may promote; this is the next one
            self.trusted_from = self.anchor.0;
            self.anchor = (sent, answered.max(sent));
        }
    }

    /// Send time of the confirmation the lease is trusted from.
    pub(crate) fn trusted_from(&self) -> Instant {
        self.trusted_from
    }

    /// When the anchor confirmation was answered: the next renewal is due one interval
    /// later.
    pub(crate) fn anchor_answered(&self) -> Instant {
        self.anchor.1
    }

    /// When the anchor confirmation was sent.
    pub(crate) fn anchor_sent(&self) -> Instant {
        self.anchor.0
    }
}

/// The clock of one held lease: the calls that confirmed it and its length, which together
/// say until when it is trusted ([`deadline`](Self::deadline)). Kept in the handle's state
/// ([`HandleState`](super::HandleState)), under its one lock.
#[derive(Clone, Debug)]
pub(crate) struct LeaseClock {
    confirmations: Confirmations,
    /// The lease's length in Redis for confirmations sent at or after `since`.
    len: Duration,
    /// For confirmations sent before `since`: the shorter of this and `len` (a change of
    /// length reaches Redis at some moment this process does not know).
    earlier: Duration,
    since: Instant,
}

impl LeaseClock {
    /// A lease of length `len`, renewed every `lag`, first confirmed by a call sent at `sent`
    /// and answered at `answered` (a grant in reply to an acquisition).
    pub(crate) fn new(
        sent: Instant,
        answered: Instant,
        len: Duration,
        lag: Duration,
    ) -> LeaseClock {
        LeaseClock::confirmed(Confirmations::new(sent, answered, lag), len)
    }

    /// A lease of length `len` with the confirmations so far (a granted waiter's: its
    /// session's, which the grant keeps).
    pub(crate) fn confirmed(confirmations: Confirmations, len: Duration) -> LeaseClock {
        let since = confirmations.trusted_from();
        LeaseClock {
            confirmations,
            len,
            earlier: len,
            since,
        }
    }

    /// The length of the lease confirmed at the trusted confirmation, as far as this process
    /// can tell.
    fn trusted_len(&self) -> Duration {
        if self.confirmations.trusted_from() >= self.since {
            self.len
        } else {
            self.len.min(self.earlier)
        }
    }

    /// The moment the lease could have run out in Redis: the trusted confirmation + its
    /// length − safety margin.
    pub(crate) fn deadline(&self) -> Instant {
        deadline_after(self.confirmations.trusted_from(), self.trusted_len())
    }

    /// Whether the lease could have run out in Redis by `now`.
    pub(crate) fn may_have_ended(&self, now: Instant) -> bool {
        self.deadline() <= now
    }

    /// The length of the lease in Redis for confirmations sent from now on.
    pub(crate) fn len(&self) -> Duration {
        self.len
    }

    /// The lease's length becomes `len` for every confirmation sent at or after `since`
    /// (those before count with the shorter of the old and new lengths).
    pub(crate) fn set_len(&mut self, len: Duration, since: Instant) {
        self.earlier = self.earlier.min(self.len);
        self.len = len;
        self.since = since;
    }

    /// The lease may already be shorter than it was (a change sent, not confirmed): counts
    /// every confirmation, past and future, with at most `len`.
    pub(crate) fn cap_len(&mut self, len: Duration) {
        self.earlier = self.earlier.min(len);
        self.len = self.len.min(len);
    }

    /// Records a confirmation by a call sent at `sent` and answered at `answered` (see
    /// [`Confirmations::confirm`]).
    pub(crate) fn renewed(&mut self, sent: Instant, answered: Instant) {
        self.confirmations.confirm(sent, answered);
    }

    /// When the anchor confirmation was answered: the next renewal is due one renewal
    /// interval later ([`Timing::renewal_due`]).
    pub(crate) fn anchor_answered(&self) -> Instant {
        self.confirmations.anchor_answered()
    }

    /// Send time of the confirmation the deadline counts from: the newest one that a
    /// failover to a replica lagging by less than one renewal interval cannot have lost
    /// (see [`Confirmations`]).
    #[cfg(test)]
    pub(crate) fn trusted_from(&self) -> Instant {
        self.confirmations.trusted_from()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_lease_may_have_ended_from_lease_minus_margin_after_its_confirmation() {
        let timing = Timing::new(
            Duration::from_secs(3),
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        assert_eq!(timing.margin(), Duration::from_millis(300), "a tenth");
        let confirmed = Instant::now();
        assert_eq!(
            timing.deadline(confirmed),
            confirmed + Duration::from_millis(2700)
        );
        tokio::time::advance(Duration::from_millis(2699)).await;
        assert!(timing.deadline(confirmed) > Instant::now());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            (timing.deadline(confirmed) <= Instant::now()),
            "at the deadline"
        );
        // a later confirmation moves it
        assert!(timing.deadline(confirmed + Duration::from_secs(1)) > Instant::now());
    }

    #[tokio::test(start_paused = true)]
    async fn the_margin_is_a_tenth_of_the_lease_and_at_most_one_second() {
        let long = Timing::new(
            Duration::from_secs(60),
            Duration::from_secs(20),
            Duration::from_secs(1),
        );
        assert_eq!(long.margin(), Duration::from_secs(1));
        let confirmed = Instant::now();
        tokio::time::advance(Duration::from_secs(58)).await;
        assert!(long.deadline(confirmed) > Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!((long.deadline(confirmed) <= Instant::now()));
    }

    #[test]
    fn waiters_are_checked_at_least_every_renewal_interval() {
        let t = |fallback| {
            Timing::new(Duration::from_secs(9), Duration::from_secs(3), fallback).waiter_check()
        };
        assert_eq!(t(Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(t(Duration::from_secs(30)), Duration::from_secs(3));
    }

    const SECOND: Duration = Duration::from_secs(1);

    /// A lease of length `len` renewed every second, granted by a call sent and answered at
    /// `at`.
    fn lease_at(at: Instant, len: Duration) -> LeaseClock {
        LeaseClock::confirmed(Confirmations::new(at, at, SECOND), len)
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_never_moves_the_confirmation_back() {
        let t0 = Instant::now();
        let s = |n: u32| t0 + SECOND * n;
        let mut lease = lease_at(t0, Duration::from_secs(3));
        lease.renewed(s(2), s(2));
        assert_eq!(lease.trusted_from(), t0, "the grant");
        let half = s(2) + SECOND / 2;
        lease.renewed(half, half);
        assert_eq!(
            lease.trusted_from(),
            t0,
            "not an interval after the anchor's answer"
        );
        lease.renewed(s(3), s(3));
        assert_eq!(lease.trusted_from(), s(2));
        // an older call answering late changes nothing
        lease.renewed(half, s(4));
        assert_eq!(lease.trusted_from(), s(2));
        assert_eq!(lease.anchor_answered(), s(3));
    }

    /// A failover to a replica that lags by less than one renewal interval may have lost
    /// every confirmation answered less than an interval before the newest was sent: the
    /// deadline counts from an anchor that a confirmation sent an interval after its answer
    /// made trusted, and the next renewal is due an interval after the answer to the anchor.
    #[tokio::test(start_paused = true)]
    async fn the_deadline_counts_from_a_confirmation_one_renewal_interval_older_than_a_later_one() {
        let timing = Timing::new(Duration::from_secs(3), SECOND, SECOND);
        let ms = |n: u64| Instant::now() + Duration::from_millis(n);
        let t0 = Instant::now();
        let mut lease = LeaseClock::confirmed(Confirmations::new(t0, ms(10), SECOND), timing.lease);
        assert_eq!(
            lease.trusted_from(),
            t0,
            "the grant, until a later one is trusted"
        );
        assert_eq!(
            timing.renewal_due(&lease),
            ms(1010),
            "an interval after its answer"
        );
        lease.renewed(ms(1010), ms(1020));
        assert_eq!(lease.trusted_from(), t0);
        lease.renewed(ms(2020), ms(2030));
        assert_eq!(
            lease.trusted_from(),
            ms(1010),
            "sent after its answer + an interval"
        );
        assert_eq!(lease.deadline(), ms(1010 + 2700));
        // the heartbeat beats 80 ms later (for its waiters): both confirmations may be
        // missing from a replica lagging 900 ms, so the trusted one stays where it was, and
        // the renewal is still due an interval after the anchor's answer
        lease.renewed(ms(2100), ms(2110));
        assert_eq!(lease.trusted_from(), ms(1010));
        assert_eq!(timing.renewal_due(&lease), ms(3030));
        lease.renewed(ms(3030), ms(3040));
        assert_eq!(lease.trusted_from(), ms(2020), "the anchor");
        assert_eq!(timing.renewal_due(&lease), ms(4040));
        // each renewal comes before the deadline, and moves it on (renewal ≤ lease / 3)
        assert!(timing.renewal_due(&lease) < lease.deadline());
        lease.renewed(ms(4040), ms(4050));
        assert_eq!(lease.deadline(), ms(3030 + 2700));
        assert!(timing.renewal_due(&lease) < lease.deadline());
    }

    /// A longer lease counts only from a confirmation sent after the change: a replica (or a
    /// Redis that never received the change) may still hold the old length for the earlier
    /// confirmations.
    #[tokio::test(start_paused = true)]
    async fn a_longer_lease_counts_once_a_confirmation_after_the_change_is_trusted() {
        let t0 = Instant::now();
        let mut lease = lease_at(t0, Duration::from_secs(3));
        assert_eq!(lease.deadline(), t0 + Duration::from_millis(2700));
        let changed = t0 + SECOND;
        lease.set_len(Duration::from_secs(30), changed);
        lease.renewed(changed, changed);
        assert_eq!(lease.len(), Duration::from_secs(30));
        assert_eq!(
            lease.deadline(),
            t0 + Duration::from_millis(2700),
            "trusted from the grant, under the old length"
        );
        lease.renewed(t0 + SECOND * 2, t0 + SECOND * 2);
        assert_eq!(
            lease.deadline(),
            changed + Duration::from_secs(29),
            "trusted from the change, under the new length (margin 1 s)"
        );
    }

    /// A shorter lease counts at once, for past confirmations too: the change may land in
    /// Redis before any reply says so.
    #[tokio::test(start_paused = true)]
    async fn a_shorter_lease_counts_at_once() {
        let t0 = Instant::now();
        let mut lease = lease_at(t0, Duration::from_secs(30));
        lease.cap_len(Duration::from_secs(3));
        assert_eq!(lease.deadline(), t0 + Duration::from_millis(2700));
        lease.set_len(Duration::from_secs(3), t0 + SECOND);
        lease.renewed(t0 + SECOND, t0 + SECOND);
        lease.renewed(t0 + SECOND * 2, t0 + SECOND * 2);
        assert_eq!(
            lease.deadline(),
            t0 + Duration::from_millis(3700),
            "trusted from the change, under the new length"
        );
        assert!(!lease.may_have_ended(Instant::now()));
        tokio::time::advance(Duration::from_millis(3700)).await;
        assert!(lease.may_have_ended(Instant::now()));
    }

    #[test]
    fn a_holder_lease_spans_at_least_three_renewal_intervals() {
        let timing = Timing::new(
            Duration::from_secs(9),
            Duration::from_secs(3),
            Duration::from_secs(1),
        );
        assert!(timing.check_holder_lease(Duration::from_secs(9)).is_ok());
        assert!(timing.check_holder_lease(Duration::from_secs(60)).is_ok());
        let e = timing
            .check_holder_lease(Duration::from_millis(8999))
            .unwrap_err();
        assert!(e.contains("renew_every"), "{e}");
        // nor shorter than MIN_LEASE, whatever the renewals
        let fast = Timing::new(MIN_LEASE, Duration::from_millis(10), Duration::from_secs(1));
        assert!(fast.check_holder_lease(MIN_LEASE).is_ok());
        let e = fast
            .check_holder_lease(MIN_LEASE - Duration::from_millis(1))
            .unwrap_err();
        assert!(e.contains("MIN_LEASE"), "{e}");
    }
}

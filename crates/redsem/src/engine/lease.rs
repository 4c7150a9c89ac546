//! Lease state: the timing settings of a handle ([`Timing`]) and the bookkeeping of one
//! held lease ([`LeaseState`]), shared by a permit and the heartbeat.
//!
//! A lease is trusted until `previous confirmed renewal + lease − margin`
//! ([`LeaseState::deadline`]): the margin covers the difference
//! between this process's clock and Redis's, and counting from the renewal *before* the last
//! one covers a failover to a replica that missed the last renewal (its copy of the lease
//! ends up to one renewal interval earlier than the master's). Every "could the lease have
//! ended?" question in the engine is answered here.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::LostReason;
use crate::scripts::Grant;

/// Safety margin taken off a lease before trusting it: a tenth, at most 1 s.
pub(crate) fn margin(lease: Duration) -> Duration {
    (lease / 10).min(Duration::from_secs(1))
}

/// The moment a lease of length `lease`, confirmed by a call sent at `confirmed`, could have
/// run out in Redis: lease − safety margin later.
pub(crate) fn deadline_after(confirmed: Instant, lease: Duration) -> Instant {
    confirmed + lease - margin(lease)
}

/// Timing settings of a semaphore handle (validated by the builder).
#[derive(Clone, Debug)]
pub(crate) struct Timing {
    /// The handle's lease: of its waiters, and of its holders unless an acquisition asked
    /// for another ([`LeaseState`] keeps each holder's own).
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

    /// When the lease held in `lease` is due for renewal: one renewal interval after its last
    /// confirmation, and at once when that confirmation came more than a renewal interval
    /// after the one before (a renewal that succeeded after failures). The deadline counts
    /// from the confirmation before the last, so it must be recent again before the
    /// deadline: `2 × renewal + margin < lease` leaves room for it and its retries.
    pub(crate) fn renewal_due(&self, lease: &LeaseState) -> Instant {
        (lease.renewed_at() + self.renew_every).min(lease.trusted_from() + self.renew_every * 2)
    }

    /// Whether a lease of the handle's length last confirmed by a call sent at `confirmed`
    /// could have run out in Redis by now.
    #[cfg(test)]
    pub(crate) fn may_have_ended(&self, confirmed: Instant) -> bool {
        self.deadline(confirmed) <= Instant::now()
    }

    /// How often the waiters are checked: every fallback interval, and at least every renewal
    /// interval (waiters hold a lease too; a fallback poll longer than the lease would let
    /// Redis reap them).
    pub(crate) fn waiter_check(&self) -> Duration {
        self.fallback_poll.min(self.renew_every)
    }
}

/// The confirmations of a lease and its length.
#[derive(Clone, Copy)]
struct Renewals {
    /// Send time of the confirmation before the last (the grant, until the second).
    trusted_from: Instant,
    /// Send time of the last call that confirmed the lease (or of the grant's delivery).
    renewed_at: Instant,
    /// The lease's length in Redis for confirmations sent at or after `since`.
    len: Duration,
    /// For confirmations sent before `since`: the shorter of this and `len` (a change of
    /// length reaches Redis at some moment this process does not know).
    earlier: Duration,
    since: Instant,
}

impl Renewals {
    /// The length of the lease confirmed at `trusted_from`, as far as this process can tell.
    fn trusted_len(&self) -> Duration {
        if self.trusted_from >= self.since {
            self.len
        } else {
            self.len.min(self.earlier)
        }
    }

    fn deadline(&self) -> Instant {
        deadline_after(self.trusted_from, self.trusted_len())
    }
}

/// Lease bookkeeping shared by a permit and the heartbeat.
pub(crate) struct LeaseState {
    lost_tx: watch::Sender<Option<LostReason>>,
    token: CancellationToken,
    renewed: Mutex<Renewals>,
    /// Ticket, slots and fences of the permit: for the heartbeat's events, and to tell this
    /// grant from a later one under the same id.
    granted: OnceLock<Grant>,
}

impl LeaseState {
    /// A lease of length `len` confirmed by a call sent at `now`.
    pub(crate) fn new(now: Instant, len: Duration) -> LeaseState {
        LeaseState::confirmed(now, now, len)
    }

    /// A lease of length `len` whose last two confirmations were sent at `trusted_from` and
    /// `renewed_at` (a granted waiter's: the deadline counts from the one before the last,
    /// as for a holder).
    pub(crate) fn confirmed(
        trusted_from: Instant,
        renewed_at: Instant,
        len: Duration,
    ) -> LeaseState {
        LeaseState {
            lost_tx: watch::Sender::new(None),
            token: CancellationToken::new(),
            renewed: Mutex::new(Renewals {
                trusted_from: trusted_from.min(renewed_at),
                renewed_at,
                len,
                earlier: len,
                since: trusted_from.min(renewed_at),
            }),
            granted: OnceLock::new(),
        }
    }

    /// The moment the lease could have run out in Redis: the confirmation before the last +
    /// its length − safety margin.
    pub(crate) fn deadline(&self) -> Instant {
        self.renewed.lock().unwrap().deadline()
    }

    /// Whether the lease could have run out in Redis by now (lost or not).
    pub(crate) fn may_have_ended(&self) -> bool {
        self.deadline() <= Instant::now()
    }

    /// The length of the lease in Redis for confirmations sent from now on.
    pub(crate) fn len(&self) -> Duration {
        self.renewed.lock().unwrap().len
    }

    /// The lease's length becomes `len` for every confirmation sent at or after `since`
    /// (those before count with the shorter of the old and new lengths).
    pub(crate) fn set_len(&self, len: Duration, since: Instant) {
        let mut r = self.renewed.lock().unwrap();
        r.earlier = r.earlier.min(r.len);
        r.len = len;
        r.since = since;
    }

    /// The lease may already be shorter than it was (a change sent, not confirmed): counts
    /// every confirmation, past and future, with at most `len`.
    pub(crate) fn cap_len(&self, len: Duration) {
        let mut r = self.renewed.lock().unwrap();
        r.earlier = r.earlier.min(len);
        r.len = r.len.min(len);
    }

    /// Ticket, slots and fences of the permit that holds this lease, once known.
    pub(crate) fn granted(&self) -> Option<&Grant> {
        self.granted.get()
    }

    /// Records the grant of the permit that holds this lease.
    pub(crate) fn set_granted(&self, grant: Grant) {
        let _ = self.granted.set(grant);
    }

    /// Whether Redis's answer `held` is this permit's grant. It is not when the entry was
    /// granted again under the same id: Redis lost the first grant (a failover to a replica
    /// that missed it, a restore) while the entry waited there, and granted it afresh, with
    /// other fences and maybe other slots. The permit is then lost: its slots and fences are
    /// not what Redis holds for it.
    pub(crate) fn is_same_grant(&self, held: &Grant) -> bool {
        self.granted.get().is_none_or(|mine| mine == held)
    }

    /// Records a confirmation by a call sent at `sent` (an older call answering late is
    /// ignored).
    pub(crate) fn renewed(&self, sent: Instant) {
        let mut r = self.renewed.lock().unwrap();
        if sent > r.renewed_at {
            r.trusted_from = r.renewed_at;
            r.renewed_at = sent;
        }
    }

    /// Send time of the last confirmed renewal: the next renewal is due one renewal
    /// interval after it.
    pub(crate) fn renewed_at(&self) -> Instant {
        self.renewed.lock().unwrap().renewed_at
    }

    /// Send time of the confirmed renewal before the last one (the grant, until the second
    /// renewal): what the lease's deadline counts from. A failover may promote a replica
    /// that never received the last renewal, but it has the one before, as long as
    /// replication lags less than one renewal interval.
    pub(crate) fn trusted_from(&self) -> Instant {
        self.renewed.lock().unwrap().trusted_from
    }

    /// Marks the lease lost (first reason wins) and cancels the permit's token.
    pub(crate) fn lose(&self, reason: LostReason) {
        self.lost_tx.send_if_modified(|v| {
            if v.is_none() {
                *v = Some(reason);
                true
            } else {
                false
            }
        });
        self.token.cancel();
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        *self.lost_tx.borrow()
    }

    /// Follows the loss of the lease (`None` until it is lost).
    pub(crate) fn lost_receiver(&self) -> watch::Receiver<Option<LostReason>> {
        self.lost_tx.subscribe()
    }

    /// The token cancelled when the lease is lost.
    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
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
        assert!(!timing.may_have_ended(confirmed));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(timing.may_have_ended(confirmed), "at the deadline");
        // a later confirmation moves it
        assert!(!timing.may_have_ended(confirmed + Duration::from_secs(1)));
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
        assert!(!long.may_have_ended(confirmed));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(long.may_have_ended(confirmed));
    }

    #[test]
    fn waiters_are_checked_at_least_every_renewal_interval() {
        let t = |fallback| {
            Timing::new(Duration::from_secs(9), Duration::from_secs(3), fallback).waiter_check()
        };
        assert_eq!(t(Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(t(Duration::from_secs(30)), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_never_moves_the_confirmation_back() {
        let t0 = Instant::now();
        let lease = LeaseState::new(t0, Duration::from_secs(3));
        lease.renewed(t0 + Duration::from_secs(2));
        lease.renewed(t0 + Duration::from_secs(1)); // an older call answering late
        assert_eq!(lease.renewed_at(), t0 + Duration::from_secs(2));
        assert_eq!(lease.trusted_from(), t0, "the confirmation before the last");
        lease.lose(LostReason::Unreachable);
        lease.lose(LostReason::NotHolder);
        assert_eq!(
            lease.lost_reason(),
            Some(LostReason::Unreachable),
            "first wins"
        );
        assert!(lease.token().is_cancelled());
    }

    /// A failover to a replica that missed the last renewal leaves a lease that ends one
    /// renewal interval before the master's would have: the deadline counts from the
    /// renewal before the last, so it comes before that earlier end.
    #[tokio::test(start_paused = true)]
    async fn the_deadline_counts_from_the_renewal_before_the_last() {
        let timing = Timing::new(
            Duration::from_secs(3),
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        let t0 = Instant::now();
        let lease = LeaseState::new(t0, Duration::from_secs(3));
        assert_eq!(lease.trusted_from(), t0, "the grant, until two renewals");
        lease.renewed(t0 + Duration::from_secs(1));
        assert_eq!(lease.trusted_from(), t0);
        lease.renewed(t0 + Duration::from_secs(2));
        assert_eq!(lease.trusted_from(), t0 + Duration::from_secs(1));
        assert_eq!(lease.renewed_at(), t0 + Duration::from_secs(2));
        // the replica's copy ends at 1 s + lease = 4 s; the deadline is a margin before it
        assert_eq!(
            timing.deadline(lease.trusted_from()),
            t0 + Duration::from_millis(3700)
        );
        // and the next renewal is due well before it (renewal ≤ lease / 3)
        assert!(lease.renewed_at() + timing.renew_every < timing.deadline(lease.trusted_from()));
    }

    /// A longer lease counts only from a confirmation sent after the change: a replica (or a
    /// Redis that never received the change) may still hold the old length for the earlier
    /// confirmations.
    #[tokio::test(start_paused = true)]
    async fn a_longer_lease_counts_once_a_confirmation_after_the_change_is_trusted() {
        let t0 = Instant::now();
        let lease = LeaseState::new(t0, Duration::from_secs(3));
        assert_eq!(lease.deadline(), t0 + Duration::from_millis(2700));
        let changed = t0 + Duration::from_secs(1);
        lease.set_len(Duration::from_secs(30), changed);
        lease.renewed(changed);
        assert_eq!(lease.len(), Duration::from_secs(30));
        assert_eq!(
            lease.deadline(),
            t0 + Duration::from_millis(2700),
            "trusted from the grant, under the old length"
        );
        lease.renewed(t0 + Duration::from_secs(2));
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
        let lease = LeaseState::new(t0, Duration::from_secs(30));
        lease.cap_len(Duration::from_secs(3));
        assert_eq!(lease.deadline(), t0 + Duration::from_millis(2700));
        lease.set_len(Duration::from_secs(3), t0 + Duration::from_secs(1));
        lease.renewed(t0 + Duration::from_secs(1));
        lease.renewed(t0 + Duration::from_secs(2));
        assert_eq!(
            lease.deadline(),
            t0 + Duration::from_millis(3700),
            "trusted from the change, under the new length"
        );
        assert!(!lease.may_have_ended());
        tokio::time::advance(Duration::from_millis(3700)).await;
        assert!(lease.may_have_ended());
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
    }
}

//! When a handle's heartbeat runs next ([`Schedule`]), and the client-wide [`Grid`] its
//! renewal wake-ups are rounded up to. Pure: every time is an argument.
//!
//! The heartbeat wakes at the earliest of (see [`HandleState::next_wakeup`](super::HandleState::next_wakeup)):
//! - the renewal time of the holders (the answer to their anchor confirmation + renewal
//!   interval: see [`Confirmations`](super::lease::Confirmations)), on the grid;
//! - the check of the waiters (last check + the shorter of the fallback and renewal
//!   intervals: the waiters' session must be renewed too), on the grid;
//! - the moment a lease in Redis is due to expire (as reported by the last script, plus
//!   [`REAP_SLACK`]): a crashed holder's slot is then reclaimed by this call and granted to
//!   the head of the queue, so crash recovery does not wait for the fallback poll;
//! - the local deadline of a holder (the trusted confirmation + lease − safety margin): if
//!   no renewal has been confirmed by then, the permit is lost.
//!
//! After a failed renewal, everything but the holders' deadlines waits for the retry time,
//! which backs off ([`RETRY`], doubling, at most [`RETRY_MAX`] or one renewal interval): a
//! Redis that refuses connections is not called in a loop.

use std::time::Duration;

use super::lease::Timing;
use super::time::Instant;
use crate::backoff::Backoff;

/// Delay before retrying a failed heartbeat; it doubles with every further failure, up to
/// [`RETRY_MAX`] (and never beyond one renewal interval).
pub(crate) const RETRY: Duration = Duration::from_millis(200);

/// Longest delay between two tries of a failing heartbeat.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(2);

/// How late after a lease's expiry (as Redis reported it) the heartbeat looks, so that the
/// lease has expired by Redis's clock too.
pub(crate) const REAP_SLACK: Duration = Duration::from_millis(2);

/// The longest step of the [`Grid`].
pub(crate) const GRID_STEP: Duration = Duration::from_millis(50);

/// The client-wide grid that heartbeats round their renewal wake-ups up to: multiples of
/// [`GRID_STEP`] after the client's epoch (an eighth of the renewal interval when that is
/// shorter). Handles whose renewals fall due in the same step, at whatever phase, then wake
/// together and share one call. Up, not down: a renewal must not leave before one renewal
/// interval after the answer to the one it is to make trusted (see
/// [`Confirmations`](super::lease::Confirmations)); its cost is at most one step of lease per
/// renewal (a renewal every 3,333 ms comes every 3,350 ms, 0.5 % of the lease's length
/// later), which the lease's slack for retries absorbs. Only renewal times move: a wake-up
/// at a lease expiry in Redis (to reap it) or at a holder's deadline stays where it is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grid {
    epoch: Instant,
}

impl Grid {
    /// The grid whose lines are the multiples of the step after `epoch`.
    pub(crate) fn new(epoch: Instant) -> Grid {
        Grid { epoch }
    }

    /// `at` rounded up to the grid, for renewals every `interval`: to a multiple of
    /// [`GRID_STEP`] (of `interval` / 8 when that is shorter, so that a renewal comes at most
    /// an eighth of its interval late) after the epoch.
    pub(crate) fn ceil(&self, at: Instant, interval: Duration) -> Instant {
        let step = GRID_STEP.min(interval / 8).as_nanos();
        if step == 0 || at <= self.epoch {
            return at;
        }
        let since = (at - self.epoch).as_nanos();
        let up = (step - since % step) % step;
        at + Duration::from_nanos(up as u64)
    }
}

/// When the heartbeat runs next: the times it keeps besides the leases themselves, and what
/// the last renewal said about the queue (which waiters to doubt).
pub(crate) struct Schedule {
    /// The client's grid, which renewal times are rounded up to.
    pub(super) grid: Grid,
    /// Check everything at once (set by a reconnect).
    pub(super) force: bool,
    /// After failed heartbeats: when to try again.
    pub(super) retry: Option<Instant>,
    /// The delays between tries of a failing heartbeat.
    backoff: Backoff,
    /// When a lease in Redis is due to expire (plus [`REAP_SLACK`]).
    pub(super) next_check: Option<Instant>,
    /// Last time the waiters were checked.
    pub(super) waiters_checked_at: Instant,
    /// Check every local waiter in Redis at the next heartbeat (a reconnect, a session
    /// that had lost its lease, a failed check).
    pub(super) check_all: bool,
    /// The place of the head of the queue at the last renewal: a waiter with a lower place
    /// was granted or removed meanwhile, and is checked (infinity: nobody was waiting).
    pub(super) doubt_below: f64,
    /// The highest ticket granted in each priority class at the last renewal: a waiter of
    /// that class with a ticket at or below it was granted or removed meanwhile, and is
    /// checked (a higher class queued ahead of it hides that from the head).
    pub(super) served: Vec<u64>,
    /// The highest ticket issued at the last renewal: a waiter with a ticket above it was
    /// queued before the semaphore's configuration was lost and re-created without it, and is
    /// checked (`served` and the head, counted anew from there, miss it until new tickets
    /// pass its own).
    pub(super) issued: Option<u64>,
}

impl Schedule {
    /// A schedule on `grid` for a handle with `timing`, with the waiters' check interval
    /// starting at `now`.
    pub(crate) fn new(grid: Grid, timing: &Timing, now: Instant) -> Schedule {
        Schedule {
            grid,
            force: false,
            retry: None,
            backoff: Backoff::new(RETRY, RETRY_MAX.min(timing.renew_every)),
            next_check: None,
            waiters_checked_at: now,
            check_all: false,
            doubt_below: f64::NEG_INFINITY,
            served: Vec::new(),
            issued: None,
        }
    }

    /// A script reported at `now` that a lease in Redis expires in `ms`: look then (the
    /// earliest wins).
    pub(crate) fn lease_expires_in(&mut self, ms: u64, now: Instant) {
        let at = now + Duration::from_millis(ms) + REAP_SLACK;
        self.next_check = Some(self.next_check.map_or(at, |t| t.min(at)));
    }

    /// A renewal call succeeded at `now`; the nearest expiry it reported is `next_expiry_ms`.
    pub(crate) fn succeeded(&mut self, now: Instant, next_expiry_ms: Option<u64>) {
        self.retry = None;
        self.backoff.reset();
        self.waiters_checked_at = now;
        self.next_check = next_expiry_ms.map(|ms| now + Duration::from_millis(ms) + REAP_SLACK);
    }

    /// A renewal call failed at `now`: try again after [`RETRY`], doubling with every
    /// further failure up to [`RETRY_MAX`] or one renewal interval, whichever is shorter.
    pub(crate) fn failed(&mut self, now: Instant) {
        self.retry = Some(now + self.backoff.next_delay());
    }

    /// Check every waiter and holder now (after a reconnect).
    pub(crate) fn recheck_now(&mut self) {
        self.force = true;
        self.check_all = true;
    }

    /// Whether a beat was forced since the last call (and no longer).
    pub(crate) fn take_force(&mut self) -> bool {
        std::mem::take(&mut self.force)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn wake_ups_round_up_to_the_grid() {
        let t0 = Instant::now();
        let grid = Grid::new(t0);
        let ms = Duration::from_millis;
        let second = Duration::from_secs(1);
        // any phase within a step lands on the step's end; a line stays where it is
        for phase in [1, 17, 49] {
            assert_eq!(grid.ceil(t0 + ms(3000 + phase), second), t0 + ms(3050));
        }
        assert_eq!(grid.ceil(t0 + ms(3050), second), t0 + ms(3050));
        // so handles renewing every 3,333 ms at random phases meet on the same lines, and
        // one on the grid stays on it, 3,350 ms apart
        let at = grid.ceil(t0 + ms(3333), ms(3333));
        assert_eq!(at, t0 + ms(3350));
        assert_eq!(grid.ceil(at + ms(3333), ms(3333)), t0 + ms(6700));
        // short intervals: a step of an eighth of the interval, never more late than that
        assert_eq!(grid.ceil(t0 + ms(1017), ms(80)), t0 + ms(1020));
        // never before the epoch
        tokio::time::advance(ms(10)).await;
        let later = Grid::new(Instant::now());
        assert_eq!(later.ceil(t0, second), t0);
    }
}

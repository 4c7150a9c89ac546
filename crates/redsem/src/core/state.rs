//! [`HandleState`]: everything one semaphore handle knows about its entries, as one value.
//!
//! The engine keeps it behind the handle's one lock and changes it only through these
//! methods. The waiters are resolved exactly once (see [`HandleState::resolve`]); whatever is
//! resolved after its acquire was dropped is released, so nothing leaks.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::lease::{Confirmations, LeaseClock, Timing};
use super::schedule::{Grid, Schedule};
use super::time::Instant;
use crate::protocol::Grant;
use crate::protocol::ids::session_id;

/// How a waiter is resolved.
pub(crate) enum Outcome {
    /// Granted. Boxed: every waiter's channel has room for one outcome, and few are grants
    /// at once. The lease of the new holder is in the state's holders.
    Granted(Box<Grant>),
    /// The request can never be satisfied (the limit shrank below it): it asks again, and
    /// Redis answers with the current limit.
    Rejected,
    /// An operator removed the waiter from the queue (a forced release).
    Removed,
    /// The ticket vanished from Redis (expired while this process was paused, or data loss).
    Lost,
    /// The handle was closed ([`Semaphore::close`](crate::Semaphore::close)).
    Closed,
    /// Redis refused a renewal for lack of permission: what it refused, in redsem's words.
    Refused(String),
}

/// Where a waiter is queued in Redis.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Queued {
    pub(crate) ticket: u64,
    pub(crate) priority: u8,
}

impl Queued {
    /// Its place in the queue ([`queue_place`](crate::protocol::queue_place)).
    pub(crate) fn place(self) -> f64 {
        crate::protocol::queue_place(self.ticket, self.priority)
    }
}

/// One pending acquire: how the engine resolves it (`W`, e.g. a channel), and its place once
/// Redis confirmed it.
struct Waiter<W> {
    resolver: W,
    /// The ticket Redis confirmed (the acquire call returned "queued"), with its priority
    /// class. Until then it is never checked: a check that overtook the acquire would find
    /// it missing.
    queued: Option<Queued>,
}

/// One holder: its lease clock, its grant once known, and what the engine tells when it is
/// lost (`H`, e.g. a signal the permit watches).
pub(crate) struct Holder<H> {
    pub(crate) clock: LeaseClock,
    /// Ticket, slots and fences: to tell this grant from a later one under the same id.
    pub(crate) grant: Option<Grant>,
    pub(crate) signal: H,
}

/// What [`HandleState::resolve`] found.
pub(crate) enum Resolved<W> {
    /// The waiter was pending: resolve it through its resolver. When granted, it is now a
    /// holder (its lease continues the waiters' session).
    Pending(W),
    /// Nobody waits for it (resolved before, or cancelled): `release` says whether a grant
    /// must be given back (no holder has it either).
    Gone { release: bool },
}

/// The state of one semaphore handle: waiters, holders, the sessions in use, the
/// confirmations of the waiters' session and the heartbeat's schedule. `W` resolves a
/// waiter, `H` signals a holder's loss (the engine's types; plain values in tests).
pub(crate) struct HandleState<W, H> {
    timing: Timing,
    /// Keyed by the waiter's id, shared with its pending acquire (one allocation).
    waiters: HashMap<Arc<str>, Waiter<W>>,
    holders: HashMap<String, Holder<H>>,
    /// The lease lengths (ms) in use, each with how many use it: one session each in Redis,
    /// renewed while in use. The waiters' lease (the handle's) is always in use; another is
    /// in use while an acquisition that asked for it is pending, or a permit may be in its
    /// session. A session no longer in use is not renewed: it expires in Redis (with any
    /// entry whose release did not reach Redis), so that a handle whose acquisitions ask for
    /// many lease lengths does not renew them all for ever.
    leases: BTreeMap<u64, usize>,
    /// The lease lengths (ms) that went out of use, and when: their sessions may still be in
    /// Redis until one lease after that, and a closing handle ends them too.
    unused: BTreeMap<u64, Instant>,
    /// The lease lengths each permit uses (until the permit is gone, lost or not).
    permit_leases: HashMap<String, Vec<u64>>,
    /// The calls that confirmed the waiters' session (the lease of every waiter: entries live
    /// as long as their session) since the first of the current waiters registered. A grant
    /// keeps that lease, so a granted waiter's lease clock starts with these. One for all
    /// waiters: a waiter registered later counts from older confirmations, which only
    /// brings its deadline earlier.
    waiter_session: Option<Confirmations>,
    pub(crate) schedule: Schedule,
}

impl<W, H> HandleState<W, H> {
    /// The state of a handle with `timing`, its renewals on `grid`, created at `now`.
    pub(crate) fn new(timing: Timing, grid: Grid, now: Instant) -> Self {
        let mut leases = BTreeMap::new();
        // always in use (never released)
        leases.insert(timing.lease.as_millis() as u64, 1);
        HandleState {
            waiters: HashMap::new(),
            holders: HashMap::new(),
            leases,
            unused: BTreeMap::new(),
            permit_leases: HashMap::new(),
            waiter_session: None,
            schedule: Schedule::new(grid, &timing, now),
            timing,
        }
    }

    pub(crate) fn timing(&self) -> &Timing {
        &self.timing
    }

    // ----- waiters

    /// Registers the waiter `id` at `now`; the first of the current waiters starts the
    /// waiters' session's confirmations and the waiters' check interval.
    pub(crate) fn add_waiter(&mut self, id: Arc<str>, resolver: W, now: Instant) {
        if self.waiters.is_empty() {
            self.waiter_session = Some(Confirmations::new(now, now, self.timing.renew_every));
            self.schedule.waiters_checked_at = now;
        }
        let queued = None;
        self.waiters.insert(id, Waiter { resolver, queued });
    }

    /// Redis confirmed the ticket of waiter `id`: it may be checked from now on.
    pub(crate) fn waiter_queued(&mut self, id: &str, queued: Queued) {
        if let Some(w) = self.waiters.get_mut(id) {
            w.queued = Some(queued);
        }
    }

    /// Removes the waiter `id` (its acquire gave up); `None` if it was resolved before.
    pub(crate) fn remove_waiter(&mut self, id: &str) -> Option<W> {
        self.waiters.remove(id).map(|w| w.resolver)
    }

    pub(crate) fn has_waiters(&self) -> bool {
        !self.waiters.is_empty()
    }

    /// The ids of every waiter.
    pub(crate) fn waiter_ids(&self) -> Vec<Arc<str>> {
        self.waiters.keys().cloned().collect()
    }

    /// Removes every waiter (the handle closes): their resolvers.
    pub(crate) fn take_waiters(&mut self) -> Vec<W> {
        self.waiters.drain().map(|(_, w)| w.resolver).collect()
    }

    /// Records a confirmed renewal of the waiters' session, sent at `sent` and answered at
    /// `answered`.
    pub(crate) fn waiters_renewed(&mut self, sent: Instant, answered: Instant) {
        if let Some(c) = &mut self.waiter_session {
            c.confirm(sent, answered);
        }
    }

    /// Resolves the pending acquire `id`, if it is still pending (the first resolution
    /// wins). A grant makes it a holder whose lease continues the waiters' session, with the
    /// waiters' lease length, signalled through `signal()`.
    pub(crate) fn resolve(
        &mut self,
        id: &str,
        granted: bool,
        signal: impl FnOnce() -> H,
    ) -> Resolved<W> {
        let Some(waiter) = self.waiters.remove(id) else {
            let release = granted && !self.holders.contains_key(id);
            return Resolved::Gone { release };
        };
        if granted {
            let confirmations = self
                .waiter_session
                .clone()
                .expect("a registered waiter started the waiters' session");
            let clock = LeaseClock::confirmed(confirmations, self.timing.lease);
            self.insert_holder(id.to_owned(), clock, signal());
        }
        Resolved::Pending(waiter.resolver)
    }

    /// The doubt rule: the waiters (with confirmed tickets) that a check in Redis must look
    /// at, except those in `checked`. All of them after a reconnect, a failed check or when
    /// their session had lost its lease (the "all" flag, taken here); else those whose place
    /// is below the head of the queue at the last renewal, or whose ticket is at or below
    /// the highest granted in their priority class: they were granted or removed while their
    /// notification was lost; or whose ticket is above the highest issued: the semaphore was
    /// lost and re-created without them.
    pub(crate) fn doubted_waiters(&mut self, checked: &HashSet<Arc<str>>) -> Vec<Arc<str>> {
        let all = std::mem::take(&mut self.schedule.check_all);
        let s = &self.schedule;
        self.waiters
            .iter()
            .filter_map(|(id, w)| w.queued.map(|q| (id, q)))
            .filter(|(id, q)| {
                let served = s.served.get(usize::from(q.priority)).copied();
                let unissued = s.issued.is_some_and(|i| q.ticket > i);
                (all || q.place() < s.doubt_below
                    || served.is_some_and(|t| q.ticket <= t)
                    || unissued)
                    && !checked.contains(*id)
            })
            .map(|(id, _)| id.clone())
            .collect()
    }

    // ----- holders

    /// Adds a holder (a try-mode grant, an adoption; a granted waiter through
    /// [`resolve`](Self::resolve)).
    pub(crate) fn insert_holder(&mut self, id: String, clock: LeaseClock, signal: H) {
        let grant = None;
        self.holders.insert(
            id,
            Holder {
                clock,
                grant,
                signal,
            },
        );
    }

    pub(crate) fn holder(&self, id: &str) -> Option<&Holder<H>> {
        self.holders.get(id)
    }

    pub(crate) fn holder_mut(&mut self, id: &str) -> Option<&mut Holder<H>> {
        self.holders.get_mut(id)
    }

    /// Removes the holder `id` (released, lost or handed off); `None` if it was not one.
    pub(crate) fn remove_holder(&mut self, id: &str) -> Option<Holder<H>> {
        self.holders.remove(id)
    }

    /// Removes every holder (the client shuts down): their ids and entries.
    pub(crate) fn take_holders(&mut self) -> Vec<(String, Holder<H>)> {
        self.holders.drain().collect()
    }

    /// `(holders, waiters)`.
    pub(crate) fn counts(&self) -> (usize, usize) {
        (self.holders.len(), self.waiters.len())
    }

    /// The ids of every holder.
    pub(crate) fn holder_ids(&self) -> Vec<String> {
        self.holders.keys().cloned().collect()
    }

    /// The holders whose lease could have run out by `now` without a confirmed renewal.
    pub(crate) fn holders_past_deadline(&self, now: Instant) -> Vec<String> {
        self.holders
            .iter()
            .filter(|(_, h)| h.clock.may_have_ended(now))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The earliest deadline of a holder, if any.
    pub(crate) fn earliest_deadline(&self) -> Option<Instant> {
        self.holders.values().map(|h| h.clock.deadline()).min()
    }

    // ----- sessions

    /// An entry is about to use a lease of `ms`: its session is renewed from now on, until
    /// as many [`unuse_lease`](Self::unuse_lease) calls.
    pub(crate) fn use_lease(&mut self, ms: u64) {
        *self.leases.entry(ms).or_insert(0) += 1;
        self.unused.remove(&ms);
    }

    /// One use of the lease length `ms` ended at `now`.
    pub(crate) fn unuse_lease(&mut self, ms: u64, now: Instant) {
        if let Some(n) = self.leases.get_mut(&ms) {
            *n -= 1;
            if *n == 0 {
                self.leases.remove(&ms);
                // (those unused for longer than their lease have expired in Redis)
                self.unused
                    .retain(|&ms, at| now.duration_since(*at) < Duration::from_millis(ms));
                self.unused.insert(ms, now);
            }
        }
    }

    /// The permit `id` uses the lease length `ms` (once per length) until
    /// [`permit_gone`](Self::permit_gone).
    pub(crate) fn permit_uses_lease(&mut self, id: &str, ms: u64) {
        let uses = self.permit_leases.entry(id.to_owned()).or_default();
        if !uses.contains(&ms) {
            uses.push(ms);
            self.use_lease(ms);
        }
    }

    /// The permit `id` is gone at `now`: the lease lengths it used are no longer in use by it.
    pub(crate) fn permit_gone(&mut self, id: &str, now: Instant) {
        for ms in self.permit_leases.remove(id).unwrap_or_default() {
            self.unuse_lease(ms, now);
        }
    }

    /// The sessions of the handle `channel_id`, with their leases in ms: `(id, lease)`.
    pub(crate) fn sessions(&self, channel_id: &str) -> Vec<(String, u64)> {
        self.leases
            .keys()
            .map(|&ms| (session_id(channel_id, ms), ms))
            .collect()
    }

    /// Every session that may still be in Redis: those in use and those that went out of
    /// use (a closing handle ends them all).
    pub(crate) fn sessions_to_end(&self, channel_id: &str) -> Vec<String> {
        self.leases
            .keys()
            .chain(self.unused.keys())
            .map(|&ms| session_id(channel_id, ms))
            .collect()
    }

    // ----- schedule

    /// When the heartbeat must run next, or `None` when the handle has nothing to look after.
    pub(crate) fn next_wakeup(&self) -> Option<Instant> {
        let (s, timing) = (&self.schedule, &self.timing);
        let mut at: Option<Instant> = None;
        let mut earliest = |t: Instant| at = Some(at.map_or(t, |a| a.min(t)));
        if self.holders.is_empty() && self.waiters.is_empty() {
            return None;
        }
        if let Some(retry_at) = s.retry {
            // Failing: every renewal or check is overdue, and runs at the retry time. Only a
            // holder's deadline (when it is declared lost) may come first.
            earliest(retry_at);
            for h in self.holders.values() {
                earliest(h.clock.deadline());
            }
            return at;
        }
        // renewals (and the waiters' checks) on the client's grid, so that the handles whose
        // renewals fall due in one step share a call; expiries and deadlines where they are
        let on_grid = |at: Instant| s.grid.ceil(at, timing.waiter_check());
        for h in self.holders.values() {
            earliest(on_grid(timing.renewal_due(&h.clock)));
            earliest(h.clock.deadline());
        }
        if !self.waiters.is_empty() {
            earliest(on_grid(s.waiters_checked_at + timing.waiter_check()));
            if let Some(c) = &self.waiter_session {
                earliest(on_grid(timing.waiters_renewal_due(c)));
            }
            if let Some(c) = s.next_check {
                earliest(c);
            }
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::schedule::{REAP_SLACK, RETRY};

    const LEASE: Duration = Duration::from_secs(9);
    const RENEW: Duration = Duration::from_secs(3);

    /// A handle's state in tests: no resolvers, no signals.
    pub(crate) type Plain = HandleState<(), ()>;

    fn timing(fallback: Duration) -> Timing {
        Timing::new(LEASE, RENEW, fallback)
    }

    fn state(fallback: Duration) -> Plain {
        HandleState::new(timing(fallback), Grid::new(Instant::now()), Instant::now())
    }

    /// A holder "h" of the handle's lease length granted by a call sent and answered at `at`.
    fn with_holder(mut st: Plain, at: Instant) -> Plain {
        let clock = LeaseClock::new(at, at, LEASE, RENEW);
        st.insert_holder("h".into(), clock, ());
        st
    }

    fn add_waiter(st: &mut Plain, id: &str) {
        st.add_waiter(id.into(), (), Instant::now());
    }

    fn deadline(st: &Plain) -> Instant {
        st.holder("h").unwrap().clock.deadline()
    }

    /// The waiters share one chain of confirmations: the session's renewals since the first
    /// of the current waiters registered. A later waiter counts from it (older: only an
    /// earlier deadline); once nobody waits, the next first waiter starts a fresh one, so
    /// that its grant is not counted from renewals made before it (or from none).
    #[tokio::test(start_paused = true)]
    async fn waiters_share_the_sessions_confirmations_from_the_first_registration() {
        let t0 = Instant::now();
        let mut st = state(RENEW);
        st.waiters_renewed(t0, t0); // nobody waits: nothing to confirm
        assert!(st.waiter_session.is_none());
        add_waiter(&mut st, "a");
        let s = |n: u32| t0 + RENEW * n;
        st.waiters_renewed(s(1), s(1));
        st.waiters_renewed(s(2), s(2));
        tokio::time::advance(RENEW * 2).await;
        add_waiter(&mut st, "b");
        let trusted = |st: &Plain| st.waiter_session.as_ref().unwrap().trusted_from();
        assert_eq!(trusted(&st), s(1), "b counts from the chain a started");
        // a grant continues that lease
        assert!(matches!(
            st.resolve("b", true, || ()),
            Resolved::Pending(())
        ));
        assert_eq!(st.holder("b").unwrap().clock.trusted_from(), s(1));
        assert!(matches!(
            st.resolve("b", true, || ()),
            Resolved::Gone { release: false }
        ));
        assert!(st.remove_waiter("a").is_some());
        tokio::time::advance(RENEW * 10).await;
        add_waiter(&mut st, "c");
        assert_eq!(
            trusted(&st),
            Instant::now(),
            "a fresh chain for a first waiter"
        );
        // a grant for an entry nobody waits for, and no holder has, is given back
        assert!(matches!(
            st.resolve("x", true, || ()),
            Resolved::Gone { release: true }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_to_look_after_means_no_wakeup() {
        assert_eq!(state(RENEW).next_wakeup(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_is_renewed_one_renewal_interval_after_its_last_renewal() {
        let t0 = Instant::now();
        let mut st = state(RENEW);
        tokio::time::advance(Duration::from_secs(1)).await;
        st = with_holder(st, t0);
        // the renewal comes before the deadline (renewal ≤ lease / 3)
        assert_eq!(st.next_wakeup(), Some(t0 + RENEW));
        let h = st.holder_mut("h").unwrap();
        h.clock.renewed(t0 + RENEW, t0 + RENEW);
        assert_eq!(st.next_wakeup(), Some(t0 + RENEW * 2));
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_checked_every_fallback_or_renewal_interval_whichever_is_shorter() {
        let t0 = Instant::now();
        let short = Duration::from_secs(1);
        let mut st = state(short);
        add_waiter(&mut st, "w");
        assert_eq!(st.next_wakeup(), Some(t0 + short));
        let mut st = state(Duration::from_secs(60));
        add_waiter(&mut st, "w");
        assert_eq!(st.next_wakeup(), Some(t0 + RENEW));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reported_lease_expiry_wakes_waiters_just_after_it() {
        let t0 = Instant::now();
        let mut st = with_holder(state(RENEW), t0);
        st.schedule.lease_expires_in(500, t0);
        st.schedule.lease_expires_in(800, t0); // the earliest wins
        // holders alone do not care: nobody waits for the slot
        assert_eq!(st.next_wakeup(), Some(t0 + RENEW));
        add_waiter(&mut st, "w");
        let at = t0 + Duration::from_millis(500) + REAP_SLACK;
        assert_eq!(st.next_wakeup(), Some(at));
        // a successful renewal replaces it with the expiry it reports
        tokio::time::advance(Duration::from_millis(100)).await;
        let now = Instant::now();
        st.schedule.succeeded(now, None);
        assert_eq!(st.next_wakeup(), Some(t0 + RENEW));
        st.schedule.succeeded(now, Some(50));
        let at = now + Duration::from_millis(50) + REAP_SLACK;
        assert_eq!(st.next_wakeup(), Some(at));
    }

    /// Renewals due at any phase wake on the client's grid (the line at or above), so that
    /// handles whose renewals fall due in the same step share a call; a wake-up at a lease
    /// expiry in Redis, and a holder's deadline, stay where they are.
    #[tokio::test(start_paused = true)]
    async fn renewals_wake_on_the_grid_and_expiries_where_they_are() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let fresh = || state(Duration::from_secs(60));
        assert_eq!(with_holder(fresh(), t0).next_wakeup(), Some(t0 + RENEW));
        for phase in [1, 17, 49] {
            let st = with_holder(fresh(), t0 + ms(phase));
            assert_eq!(st.next_wakeup(), Some(t0 + RENEW + ms(50)));
        }
        let mut st = with_holder(fresh(), t0 + ms(17));
        add_waiter(&mut st, "w");
        st.schedule.waiters_checked_at = t0 + ms(17);
        assert_eq!(st.next_wakeup(), Some(t0 + RENEW + ms(50)));
        st.schedule.lease_expires_in(1013, t0);
        let at = t0 + ms(1013) + REAP_SLACK;
        assert_eq!(st.next_wakeup(), Some(at), "not moved to the grid");
        let timing = timing(Duration::from_secs(60));
        assert_eq!(deadline(&st), timing.deadline(t0 + ms(17)), "off the grid");
    }

    /// The waiters' session is renewed for itself when calls made for other reasons (not
    /// anchors) keep pushing the waiters' check on: before its anchors drift so far apart
    /// that a waiter granted then would be a holder whose deadline comes before its first
    /// renewal can.
    #[tokio::test(start_paused = true)]
    async fn the_waiters_session_is_renewed_before_a_grant_from_it_would_be_lost() {
        let t0 = Instant::now();
        let mut st = state(Duration::from_secs(60));
        add_waiter(&mut st, "w"); // the session's first confirmation (and anchor): t0
        // a call for another reason, less than an interval after the anchor: not one
        let other = t0 + RENEW * 9 / 10;
        st.waiters_renewed(other, other);
        st.schedule.succeeded(other, None);
        // the check would come at other + RENEW (1.9 intervals); the session is renewed at
        // 9 s − 0.9 s margin − 3.75 s = 4.35 s after the anchor instead (1.45 intervals)
        let due = t0 + Duration::from_millis(4350);
        assert_eq!(st.next_wakeup(), Some(due));
        st.waiters_renewed(due, due);
        st.schedule.succeeded(due, None);
        // a waiter granted now is renewed (one interval after the anchor) before its deadline
        let granted = LeaseClock::confirmed(st.waiter_session.clone().unwrap(), LEASE);
        assert!(due + RENEW < granted.deadline());
    }

    /// A renewal that fails at once (Redis refusing connections) must not be retried in a
    /// tight loop: the renewal it retries is overdue, yet the next try waits for the retry
    /// time, which backs off, and a holder is still declared lost at its deadline.
    #[tokio::test(start_paused = true)]
    async fn failed_renewals_back_off_instead_of_retrying_at_once() {
        let t0 = Instant::now();
        let mut st = with_holder(state(Duration::from_secs(1)), t0);
        add_waiter(&mut st, "w");
        st.schedule.lease_expires_in(10, t0);
        tokio::time::advance(RENEW).await; // the renewal is due, and fails
        let mut delays = Vec::new();
        loop {
            let now = Instant::now();
            st.on_renewal_failed(now);
            let next = st.next_wakeup().unwrap();
            assert!(next > now, "retried at once");
            if next == deadline(&st) {
                assert!(st.holders_past_deadline(next).contains(&"h".to_owned()));
                break; // then the holder is lost
            }
            delays.push(next - now);
            tokio::time::advance(next - now).await;
        }
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [200, 400, 800, 1600, 2000]);
        // once a renewal succeeds, the schedule is the usual one again
        let now = Instant::now();
        st.remove_holder("h");
        st = with_holder(st, now);
        st.waiters_renewed(now, now); // (the call renewed the waiters' session too)
        st.schedule.succeeded(now, None);
        assert_eq!(st.next_wakeup(), Some(now + Duration::from_secs(1)));
        st.on_renewal_failed(now);
        assert_eq!(
            st.next_wakeup(),
            Some(now + RETRY),
            "the backoff starts over"
        );
    }

    /// After renewals failed for a while and one succeeded, the deadline counts from the
    /// anchor before the failures (the late one cannot be trusted before an interval after
    /// its answer): the next renewal is due then, and moves the deadline on.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_that_succeeds_after_failures_is_trusted_one_interval_later() {
        let t0 = Instant::now();
        let margin = timing(RENEW).margin();
        let mut st = with_holder(state(Duration::from_secs(60)), t0);
        let renewed = |st: &mut Plain, at: Instant| {
            st.holder_mut("h").unwrap().clock.renewed(at, at);
        };
        renewed(&mut st, t0 + RENEW);
        assert_eq!(st.next_wakeup(), Some(t0 + RENEW * 2));
        // the renewal due at 2 × RENEW failed, retries too; one sent at 2.5 × RENEW succeeds
        let late = t0 + RENEW * 5 / 2;
        tokio::time::advance(late - t0).await;
        renewed(&mut st, late);
        assert_eq!(deadline(&st), t0 + RENEW + LEASE - margin);
        assert_eq!(st.next_wakeup(), Some(late + RENEW));
        assert!(late + RENEW < deadline(&st));
        // once it succeeds, the late one is trusted
        let next = late + RENEW;
        tokio::time::advance(next - late).await;
        renewed(&mut st, next);
        assert_eq!(st.next_wakeup(), Some(next + RENEW));
        assert_eq!(deadline(&st), late + LEASE - margin);
    }

    /// Renewals come one interval after the answer to the one before, so that each makes
    /// the one before trusted (one sent an interval after the *send* of the one before would
    /// not: a failover to a replica lagging almost an interval may have lost both); the
    /// heartbeat's other beats (for waiters, expiries) confirm the holder too, and neither
    /// delay nor hasten its renewals. With a lease of three renewal intervals, a round trip
    /// of 20 ms and the grid, the deadline never comes before the next confirmation.
    #[tokio::test(start_paused = true)]
    async fn renewals_keep_the_deadline_ahead_whatever_else_the_heartbeat_does() {
        let ms = Duration::from_millis;
        let (renew, rtt) = (ms(300), ms(20));
        let timing = Timing::new(renew * 3, renew, renew);
        let t0 = Instant::now();
        let mut st: Plain = HandleState::new(timing.clone(), Grid::new(t0), t0);
        let clock = LeaseClock::new(t0, t0 + rtt, timing.lease, renew);
        st.insert_holder("h".into(), clock, ());
        add_waiter(&mut st, "w");
        let mut beats = 0;
        let mut beat = |st: &mut Plain, sent: Instant| {
            let now = Instant::now();
            assert!(
                !st.holders_past_deadline(now).contains(&"h".to_owned()),
                "lost during a call at beat {beats}"
            );
            st.holder_mut("h").unwrap().clock.renewed(sent, now);
            st.waiters_renewed(sent, now);
            st.schedule.succeeded(now, None);
            beats += 1;
        };
        for i in 0..200 {
            let next = st.next_wakeup().unwrap();
            assert!(next < deadline(&st), "the deadline comes first");
            tokio::time::advance(next.saturating_duration_since(Instant::now())).await;
            let sent = Instant::now();
            tokio::time::advance(rtt).await;
            beat(&mut st, sent);
            if i % 3 == 0 {
                // a beat for another reason (a lease expiring in Redis, a reconnect)
                tokio::time::advance(ms(130)).await;
                let sent = Instant::now();
                tokio::time::advance(rtt).await;
                beat(&mut st, sent);
            }
        }
        // one renewal per interval (+ round trip + grid), besides the other beats
        let elapsed = Instant::now() - t0;
        assert!(elapsed > renew * 200, "renewed too often: {elapsed:?}");
        assert!(
            elapsed < (renew + rtt + ms(40)) * 200 + ms(150 * 67),
            "{elapsed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_backoff_never_exceeds_one_renewal_interval() {
        let short = Timing::new(
            Duration::from_millis(600),
            Duration::from_millis(300),
            Duration::from_secs(1),
        );
        let now = Instant::now();
        let mut st: Plain = HandleState::new(short, Grid::new(now), now);
        add_waiter(&mut st, "w");
        for _ in 0..5 {
            st.on_renewal_failed(Instant::now());
        }
        let at = Instant::now() + Duration::from_millis(300);
        assert_eq!(st.next_wakeup(), Some(at));
    }

    /// A session goes out of use with its last use; a closing handle still ends it while it
    /// may be in Redis (for one lease), and a permit's uses end with the permit.
    #[tokio::test(start_paused = true)]
    async fn sessions_live_while_an_entry_may_use_them() {
        let mut st = state(RENEW);
        let ids = |v: Vec<(String, u64)>| v.into_iter().map(|(s, _)| s).collect::<Vec<_>>();
        assert_eq!(ids(st.sessions("c.1")), ["c.1~9000"]);
        st.use_lease(20_000);
        st.permit_uses_lease("p", 20_000);
        st.permit_uses_lease("p", 20_000); // once per length
        st.unuse_lease(20_000, Instant::now());
        assert_eq!(ids(st.sessions("c.1")), ["c.1~9000", "c.1~20000"]);
        st.permit_gone("p", Instant::now());
        assert_eq!(ids(st.sessions("c.1")), ["c.1~9000"]);
        assert_eq!(st.sessions_to_end("c.1"), ["c.1~9000", "c.1~20000"]);
        // a length unused for longer than itself has expired in Redis
        tokio::time::advance(Duration::from_secs(21)).await;
        st.use_lease(30_000);
        st.unuse_lease(30_000, Instant::now());
        assert_eq!(st.sessions_to_end("c.1"), ["c.1~9000", "c.1~30000"]);
    }

    /// The doubt rule: confirmed waiters below the head, or at or below the highest ticket
    /// granted in their class, are checked; all of them once after "check all".
    #[tokio::test(start_paused = true)]
    async fn waiters_are_doubted_below_the_head_or_served_in_their_class() {
        let mut st = state(RENEW);
        for (id, ticket, priority) in [("a", 5, 0), ("b", 9, 0), ("c", 3, 1), ("u", 1, 0)] {
            add_waiter(&mut st, id);
            if id != "u" {
                st.waiter_queued(id, Queued { ticket, priority });
            }
        }
        let sorted = |mut v: Vec<Arc<str>>| {
            v.sort();
            v.into_iter().map(|s| s.to_string()).collect::<Vec<_>>()
        };
        let none = HashSet::new();
        st.schedule.doubt_below = 6.0;
        st.schedule.served = vec![0, 3];
        assert_eq!(
            sorted(st.doubted_waiters(&none)),
            ["a", "c"],
            "unconfirmed u never"
        );
        st.schedule.doubt_below = f64::NEG_INFINITY;
        st.schedule.served = vec![];
        assert!(st.doubted_waiters(&none).is_empty());
        st.check_all_next();
        let checked: HashSet<Arc<str>> = [Arc::from("b")].into();
        assert_eq!(sorted(st.doubted_waiters(&checked)), ["a", "c"]);
        assert!(st.doubted_waiters(&none).is_empty(), "the flag was taken");
    }
}

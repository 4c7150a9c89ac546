//! The heartbeat: one task per semaphore handle that renews the handle's sessions (the
//! leases of all its holders and waiters) and checks its holders in one renewal (its part of
//! a call shared with the client's other handles, see below), checks the
//! waiters it has reason to doubt (see [`in_doubt`]; one more call per 512 of them), which
//! finds grants whose notification was lost, and declares permits lost in time. Its [`Schedule`] is its own: the rest of the
//! engine only tells it what happened ([`Heartbeat::lease_expires_in`],
//! [`Heartbeat::first_waiter`], [`Heartbeat::recheck_now`]).
//!
//! It wakes at the earliest of:
//! - the renewal time of the holders (the answer to their anchor confirmation + renewal
//!   interval: see [`Confirmations`](super::lease::Confirmations));
//! - the check of the waiters (last check + the shorter of the fallback and renewal
//!   intervals: the waiters' session must be renewed too);
//! - the moment a lease in Redis is due to expire (as reported by the last script, plus
//!   [`REAP_SLACK`]): a crashed holder's slot is then reclaimed by this call and granted to
//!   the head of the queue, so crash recovery does not wait for the fallback poll;
//! - the local deadline of a holder (the trusted confirmation + lease − safety margin; see
//!   `lease.rs`): if no renewal has been confirmed by then, the permit is lost;
//! - a poke (new waiter or holder, reconnect of the subscriber).
//!
//! After a failed renewal, everything but the holders' deadlines waits for the retry time,
//! which backs off (200 ms, doubling, at most 2 s or one renewal interval): a Redis that
//! refuses connections is not called in a loop.
//!
//! A renewal never re-creates an entry: an entry that expired is reported gone and its permit
//! is lost.
//!
//! What it costs: the renewal is handed to the client's [`Renewer`], which sends the
//! renewals of all the client's handles that wait for one Redis node as one call (per hash
//! slot on a cluster; at most 256 semaphores per call). The renewal wake-ups (the holders'
//! renewal, the waiters' check) are rounded up to the client's [`Grid`] (50 ms steps), so
//! that handles whose renewals fall due at random phases wake together: per renewal
//! interval and node, at most one round of calls per grid step in which a renewal falls
//! due (at most interval / 50 ms rounds, e.g. 20 per second of fallback interval), each one
//! call or two (a request leaves at once; those made while it is in flight leave together
//! next), whatever the number of semaphores, holders and waiters. The price: a renewal comes
//! up to one step (at most an eighth of the interval) late. Synced mode renews on its own (`renew + WAIT` on one connection).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::lease::{LeaseState, Timing};
use super::remote::Remote;
use super::renewer::{Grid, Renewer};
use super::table::{Entries, Outcome, Table};
use crate::error::{CallError, LostReason};
use crate::protocol::{self, Conn, EntryState, RemovedBy, Session};

/// Delay before retrying a failed heartbeat; it doubles with every further failure, up to
/// [`RETRY_MAX`] (and never beyond one renewal interval).
const RETRY: Duration = Duration::from_millis(200);

/// Longest delay between two tries of a failing heartbeat.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// How late after a lease's expiry (as Redis reported it) the heartbeat looks, so that the
/// lease has expired by Redis's clock too.
const REAP_SLACK: Duration = Duration::from_millis(2);

/// Most waiters checked by one call. Every holder goes in the first call; thousands of
/// waiters in doubt (after a reconnect) are spread over several calls, so that no call (its
/// arguments and its reply, held in memory at once) grows with the number of waiters.
const WAITERS_PER_CALL: usize = 512;

/// When the heartbeat runs next: the times it keeps besides the leases themselves.
pub(crate) struct Schedule {
    /// The client's grid, which renewal times are rounded up to.
    grid: Grid,
    /// Check everything at once (set by a reconnect).
    force: bool,
    /// After failed heartbeats: when to try again, and the delay that led there (doubled
    /// by the next failure).
    retry: Option<(Instant, Duration)>,
    /// When a lease in Redis is due to expire (plus [`REAP_SLACK`]).
    next_check: Option<Instant>,
    /// Last time the waiters were checked.
    waiters_checked_at: Instant,
    /// Check every local waiter in Redis at the next heartbeat (a reconnect, a session
    /// that had lost its lease, a failed check).
    check_all: bool,
    /// The place of the head of the queue at the last renewal: a waiter with a lower place
    /// was granted or removed meanwhile, and is checked (infinity: nobody was waiting).
    doubt_below: f64,
    /// The highest ticket granted in each priority class at the last renewal: a waiter of
    /// that class with a ticket at or below it was granted or removed meanwhile, and is
    /// checked (a higher class queued ahead of it hides that from the head).
    served: Vec<u64>,
}

impl Schedule {
    fn new(grid: Grid) -> Schedule {
        Schedule {
            grid,
            force: false,
            retry: None,
            next_check: None,
            waiters_checked_at: Instant::now(),
            check_all: false,
            doubt_below: f64::NEG_INFINITY,
            served: Vec::new(),
        }
    }

    /// A script reported that a lease in Redis expires in `ms`: look then (the earliest wins).
    fn lease_expires_in(&mut self, ms: u64) {
        let at = Instant::now() + Duration::from_millis(ms) + REAP_SLACK;
        self.next_check = Some(self.next_check.map_or(at, |t| t.min(at)));
    }

    /// A renewal call succeeded at `now`; the nearest expiry it reported is `next_expiry_ms`.
    fn succeeded(&mut self, now: Instant, next_expiry_ms: Option<u64>) {
        self.retry = None;
        self.waiters_checked_at = now;
        self.next_check = next_expiry_ms.map(|ms| now + Duration::from_millis(ms) + REAP_SLACK);
    }

    /// A renewal call failed at `now`: try again after [`RETRY`], doubling with every
    /// further failure up to [`RETRY_MAX`] or one renewal interval, whichever is shorter.
    fn failed(&mut self, now: Instant, timing: &Timing) {
        let longest = RETRY_MAX.min(timing.renew_every);
        let delay = match self.retry {
            Some((_, last)) => last * 2,
            None => RETRY,
        }
        .min(longest);
        self.retry = Some((now + delay, delay));
    }

    /// When the heartbeat must run next given the table `st`, or `None` when the handle has
    /// nothing to look after.
    fn next_wakeup(&self, st: &Entries, timing: &Timing) -> Option<Instant> {
        let mut at: Option<Instant> = None;
        let mut earliest = |t: Instant| at = Some(at.map_or(t, |a| a.min(t)));
        if st.holders.is_empty() && !st.has_waiters() {
            return None;
        }
        if let Some((retry_at, _)) = self.retry {
            // Failing: every renewal or check is overdue, and runs at the retry time. Only a
            // holder's deadline (when it is declared lost) may come first.
            earliest(retry_at);
            for lease in st.holders.values() {
                earliest(lease.deadline());
            }
            return at;
        }
        // renewals (and the waiters' checks) on the client's grid, so that the handles whose
        // renewals fall due in one step share a call; expiries and deadlines where they are
        let on_grid = |at: Instant| self.grid.ceil(at, timing.waiter_check());
        for lease in st.holders.values() {
            earliest(on_grid(timing.renewal_due(lease)));
            earliest(lease.deadline());
        }
        if st.has_waiters() {
            earliest(on_grid(self.waiters_checked_at + timing.waiter_check()));
            if let Some(c) = self.next_check {
                earliest(c);
            }
        }
        at
    }
}

/// The heartbeat of one handle: its schedule and what a renewal needs.
pub(crate) struct Heartbeat {
    schedule: Mutex<Schedule>,
    table: Arc<Table>,
    remote: Arc<Remote>,
    timing: Timing,
    /// Sends the renewals, in calls shared with the client's other handles.
    renewer: Renewer,
    /// Synced mode's connection (its renewals are `renew + WAIT` on one connection).
    conn: Conn,
    response_timeout: Duration,
    /// Synced mode: renewals count once this many replicas acknowledged them (`WAIT`).
    synced: Option<(u32, Duration)>,
    /// Cancelled when the handle is gone.
    stop: CancellationToken,
}

impl Heartbeat {
    /// The heartbeat of a handle, not started yet. Its renewals go through `renewer` (in
    /// synced mode, straight on `conn`).
    pub(crate) fn new(
        table: Arc<Table>,
        remote: Arc<Remote>,
        timing: Timing,
        (renewer, conn): (Renewer, Conn),
        response_timeout: Duration,
        synced: Option<(u32, Duration)>,
    ) -> Arc<Heartbeat> {
        Arc::new(Heartbeat {
            schedule: Mutex::new(Schedule::new(renewer.grid())),
            table,
            remote,
            timing,
            renewer,
            conn,
            response_timeout,
            synced,
            stop: CancellationToken::new(),
        })
    }

    /// Starts the task; it runs until [`stop`](Self::stop) or until `self` is dropped.
    pub(crate) fn start(self: &Arc<Self>) {
        let (poke, stop) = (self.table.poke.clone(), self.stop.clone());
        tokio::spawn(run(Arc::downgrade(self), poke, stop));
    }

    /// Stops the task (the handle is gone).
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    /// Check every waiter and holder now (after a reconnect).
    pub(crate) fn recheck_now(&self) {
        {
            let mut schedule = self.schedule.lock().unwrap();
            schedule.force = true;
            schedule.check_all = true;
        }
        self.table.poke.notify_one();
    }

    /// A script reported the time to the nearest lease expiry in Redis, if any: look then.
    pub(crate) fn lease_expires_in(&self, ms: Option<u64>) {
        if let Some(ms) = ms {
            self.schedule.lock().unwrap().lease_expires_in(ms);
        }
        self.table.poke.notify_one();
    }

    /// The first waiter is being registered (call it under the table's lock, before the
    /// insertion): the waiters' check interval starts now.
    pub(crate) fn first_waiter(&self) {
        self.schedule.lock().unwrap().waiters_checked_at = Instant::now();
    }

    /// Declares the holder `id` lost (a call other than a renewal found it gone).
    pub(crate) fn lose_holder(&self, id: &str, lease: &LeaseState, reason: LostReason) {
        lose(self, id, lease, reason);
    }

    /// The holder `id` reached its maximum hold time: it is lost
    /// ([`LostReason::MaxHold`]) and, unless it was lost or released before, detached in
    /// Redis (in the background): its entry leaves the handle's session for one nobody
    /// renews, and expires with the lease it has. Not released: the program may still be
    /// stopping its work, and the permit's drop releases it.
    pub(crate) fn max_hold_reached(&self, id: &str, lease: &LeaseState) {
        if declare_lost(self, id, lease, LostReason::MaxHold) {
            self.table.detach_in_background(id.to_owned());
        }
    }

    fn next_wakeup(&self) -> Option<Instant> {
        let st = self.table.lock();
        self.schedule.lock().unwrap().next_wakeup(&st, &self.timing)
    }

    fn name(&self) -> &str {
        self.remote.name()
    }
}

async fn run(weak: Weak<Heartbeat>, poke: Arc<Notify>, stop: CancellationToken) {
    loop {
        let wake = match weak.upgrade() {
            Some(hb) => hb.next_wakeup(),
            None => return,
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = poke.notified() => {}
            _ = sleep_until_opt(wake) => {}
        }
        let Some(hb) = weak.upgrade() else { return };
        let forced = std::mem::take(&mut hb.schedule.lock().unwrap().force);
        let due = forced || hb.next_wakeup().is_some_and(|t| t <= Instant::now());
        if due {
            beat(&hb).await;
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A local holder: its id and lease.
type Holder = (String, Arc<LeaseState>);

/// One renewal of every session of the handle and check of every local holder: one call.
/// Waiters are not checked one by one unless the renewal gives reason to doubt them (see
/// [`in_doubt`]): then one more call per [`WAITERS_PER_CALL`] of them.
async fn beat(hb: &Heartbeat) {
    let (holders, waiting) = {
        let st = hb.table.lock();
        (st.holders(), st.has_waiters())
    };
    if holders.is_empty() && !waiting {
        return;
    }
    let sessions = hb.table.sessions();
    let sessions: Vec<Session<'_>> = sessions.iter().map(|(s, ms)| (s.as_str(), *ms)).collect();
    let mut checked: HashSet<Arc<str>> = HashSet::new();
    let doubted = in_doubt(hb, &checked);
    let first_chunk = &doubted[..doubted.len().min(WAITERS_PER_CALL)];
    let first = renew_call(hb, &sessions, &holders, first_chunk).await;
    let mut poked = first.poked;
    let mut ok = first.ok;
    checked.extend(first_chunk.iter().cloned());
    // The reply may have put waiters in doubt (a head of the queue above their tickets, a
    // session without a lease, the rest of a long list): check them now.
    while ok {
        let doubted = in_doubt(hb, &checked);
        if doubted.is_empty() {
            break;
        }
        let chunk = &doubted[..doubted.len().min(WAITERS_PER_CALL)];
        let call = renew_call(hb, &[], &[], chunk).await;
        poked |= call.poked;
        ok = call.ok;
        checked.extend(chunk.iter().cloned());
    }
    if !ok {
        // retried as a whole later
        hb.schedule.lock().unwrap().check_all = true;
    }
    // Holders whose lease could have expired without a confirmed renewal are lost (those
    // granted during the call included).
    let current: Vec<Holder> = hb.table.lock().holders();
    for (id, lease) in &current {
        if lease.deadline() <= Instant::now() {
            lose(hb, id, lease, LostReason::Unreachable);
        }
    }
    if poked {
        // the pokes consumed above were meant for the loop as well
        hb.table.poke.notify_one();
    }
}

/// The local waiters (with confirmed tickets) that a check in Redis must look at, except
/// those in `checked`: all of them after a reconnect or when their session had lost its
/// lease, else those whose place is below the head of the queue or whose ticket is at or
/// below the highest granted in their priority class (granted or removed while their
/// notification was lost). Takes the "all" flag.
fn in_doubt(hb: &Heartbeat, checked: &HashSet<Arc<str>>) -> Vec<Arc<str>> {
    let waiters = hb.table.lock().queued_waiters();
    let mut schedule = hb.schedule.lock().unwrap();
    let all = std::mem::take(&mut schedule.check_all);
    waiters
        .into_iter()
        .filter(|(id, q)| {
            let served = schedule.served.get(usize::from(q.priority)).copied();
            (all || q.place() < schedule.doubt_below || served.is_some_and(|s| q.ticket <= s))
                && !checked.contains(id)
        })
        .map(|(id, _)| id)
        .collect()
}

/// What one renewal call did.
struct Call {
    /// Redis answered.
    ok: bool,
    /// The heartbeat was poked meanwhile (the poke was consumed here).
    poked: bool,
}

/// One renewal call for `sessions`, checking `holders` and `waiters`: confirms the leases,
/// delivers grants and losses, and schedules the next check.
async fn renew_call(
    hb: &Heartbeat,
    sessions: &[Session<'_>],
    holders: &[Holder],
    waiters: &[Arc<str>],
) -> Call {
    let sent = Instant::now();
    // Never wait for an answer past the moment a holder's lease could have expired: every
    // local holder's, not only those renewed by this call.
    let holders_limit = |limit: Instant| {
        let st = hb.table.lock();
        st.holders.values().fold(limit, |limit, lease| {
            limit.min(lease.deadline().max(sent + Duration::from_millis(1)))
        })
    };
    let mut limit = holders_limit(sent + hb.response_timeout);
    let ids: Vec<&str> = holders
        .iter()
        .map(|(id, _)| id.as_str())
        .chain(waiters.iter().map(|id| &**id))
        .collect();
    let span = tracing::debug_span!(
        "redsem.renew",
        semaphore = %hb.name(),
        sessions = sessions.len(),
        holders = holders.len(),
        waiters = waiters.len(),
    );
    let renew = async {
        match hb.synced {
            None => hb
                .renewer
                .renew(&hb.remote, sessions, &ids)
                .await
                .map(|renewal| (renewal, true)),
            Some((replicas, timeout)) => {
                let target = hb.remote.target();
                let mut conn = hb.conn.clone();
                protocol::renew_and_wait(&mut conn, &target, sessions, &ids, replicas, timeout)
                    .await
                    .map(|(renewal, acked)| {
                        if acked < replicas {
                            tracing::warn!(semaphore = %hb.name(), acked, wanted = replicas,
                                "synced mode: too few replicas acknowledged the renewal; it does not count");
                        }
                        (renewal, acked >= replicas)
                    })
            }
        }
    }
    .instrument(span.clone());
    tokio::pin!(renew);
    // A grant notified while this call is in flight adds a holder whose lease (the waiter's)
    // may end before the answer comes: a poke lowers the limit to its deadline too.
    let mut poked = false;
    let reply = loop {
        tokio::select! {
            r = &mut renew => break Ok(r),
            _ = tokio::time::sleep_until(limit) => break Err(()),
            _ = hb.table.poke.notified() => {
                poked = true;
                limit = holders_limit(limit);
            }
        }
    };
    let now = Instant::now();
    if !sessions.is_empty() {
        crate::metrics::renewal(hb.name(), matches!(reply, Ok(Ok((_, true)))));
    }
    match reply {
        Ok(Ok((renewal, replicated))) => {
            if let Some((free, limit)) = renewal.seen {
                hb.remote.set_free(free);
                hb.remote.set_limit(limit);
            }
            tracing::debug!(parent: &span, replicated, "renewed");
            // the waiters' session (the handle's lease) kept its lease: they are renewed
            let wait_ms = hb.timing.lease.as_millis() as u64;
            let waiters_kept = sessions
                .iter()
                .zip(&renewal.had_lease)
                .any(|((_, ms), &had)| *ms == wait_ms && had);
            {
                let mut schedule = hb.schedule.lock().unwrap();
                if replicated {
                    schedule.succeeded(now, renewal.next_expiry);
                } else {
                    // retried like a failed call; the holders' deadlines stay where they were
                    schedule.failed(now, &hb.timing);
                }
                schedule.doubt_below = renewal.head.map_or(f64::INFINITY, |h| h as f64);
                schedule.served = renewal.served;
                if !sessions.is_empty() && !waiters_kept {
                    // the waiters' session had expired: they may have been reaped
                    schedule.check_all = true;
                }
            }
            if replicated && waiters_kept {
                hb.table.lock().waiters_renewed(sent, now);
            }
            // Removed by someone else: holders are lost; a waiter an operator removed fails,
            // a rejected one asks again (Redis answers with the current limit), and one
            // removed for a reason not given queues again. First: a waiter checked below
            // finds its entry gone too, which alone would queue it again.
            for (id, by) in &renewal.removed {
                let holder = hb.table.lock().holders.get(id.as_str()).cloned();
                match holder {
                    Some(lease) => lose(hb, id, &lease, LostReason::NotHolder),
                    None => hb.table.deliver(
                        id,
                        match by {
                            RemovedBy::Operator => Outcome::Removed,
                            RemovedBy::Rejected => Outcome::Rejected,
                            RemovedBy::Unknown => Outcome::Lost,
                        },
                    ),
                }
            }
            let (h_states, w_states) = renewal.states.split_at(holders.len());
            let gone = if renewal.deleted {
                LostReason::Deleted
            } else {
                LostReason::NotHolder
            };
            for ((id, lease), state) in holders.iter().zip(h_states) {
                match state {
                    // granted again under the same id after Redis lost this grant
                    EntryState::Held(g) if !lease.is_same_grant(g) => {
                        lose(hb, id, lease, LostReason::NotHolder);
                    }
                    EntryState::Held(_) if replicated => lease.renewed(sent, now),
                    EntryState::Held(_) => {}
                    EntryState::Gone | EntryState::Waiting => lose(hb, id, lease, gone),
                    EntryState::Moved => lose(hb, id, lease, LostReason::HandedOff),
                }
            }
            for (id, state) in waiters.iter().zip(w_states) {
                match state {
                    EntryState::Held(grant) => hb
                        .table
                        .deliver(id, Outcome::Granted(Box::new(grant.clone()))),
                    EntryState::Gone | EntryState::Moved => hb.table.deliver(id, Outcome::Lost),
                    EntryState::Waiting => {}
                }
            }
            Call {
                ok: replicated,
                poked,
            }
        }
        Ok(Err(CallError::Denied(detail))) => {
            // no renewal can succeed: give up the permits now, and fail the waiters with the
            // refusal (retried later all the same: the rule may be fixed meanwhile)
            tracing::error!(semaphore = %hb.name(), error = %detail, "Redis refused the renewal");
            hb.schedule.lock().unwrap().failed(now, &hb.timing);
            let holders: Vec<Holder> = hb.table.lock().holders();
            for (id, lease) in holders {
                lose(hb, &id, &lease, LostReason::Refused);
            }
            let waiters: Vec<Arc<str>> = hb.table.lock().waiters.keys().cloned().collect();
            for id in waiters {
                hb.table.deliver(&id, Outcome::Refused(detail.clone()));
            }
            Call { ok: false, poked }
        }
        Ok(Err(e)) => {
            tracing::warn!(semaphore = %hb.name(), error = %e, "heartbeat failed; retrying");
            hb.schedule.lock().unwrap().failed(now, &hb.timing);
            Call { ok: false, poked }
        }
        Err(_) => {
            tracing::warn!(semaphore = %hb.name(), "heartbeat timed out; retrying");
            hb.schedule.lock().unwrap().failed(now, &hb.timing);
            Call { ok: false, poked }
        }
    }
}

/// Declares the holder `id` lost for `reason` and removes whatever is left of its entry in
/// Redis (in the background).
fn lose(hb: &Heartbeat, id: &str, lease: &LeaseState, reason: LostReason) {
    // Whatever is left of the entry in Redis is removed (idempotent); not an entry another
    // handle adopted, which is that handle's now.
    if declare_lost(hb, id, lease, reason) && reason != LostReason::HandedOff {
        hb.table.release_in_background(id.to_owned());
    }
}

/// Declares the holder `id` lost for `reason` locally (the heartbeat stops checking it, the
/// permit learns it): false if it was no longer a holder (released or lost meanwhile).
fn declare_lost(hb: &Heartbeat, id: &str, lease: &LeaseState, reason: LostReason) -> bool {
    let was_holder = hb.table.lock().holders.remove(id).is_some();
    if !was_holder {
        return false; // released or lost meanwhile
    }
    let (ticket, slots) = lease
        .granted()
        .map(|g| (g.ticket, g.slots.clone()))
        .unwrap_or_default();
    tracing::warn!(semaphore = %hb.name(), holder = id, ticket, ?slots, %reason, "lease lost");
    crate::metrics::lease_lost(hb.name(), reason);
    lease.lose(reason);
    true
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;
    use crate::engine::lease::Confirmations;
    use crate::engine::table::Waiter;

    const LEASE: Duration = Duration::from_secs(9);
    const RENEW: Duration = Duration::from_secs(3);

    fn timing(fallback: Duration) -> Timing {
        Timing::new(LEASE, RENEW, fallback)
    }

    /// A lease of the handle's length granted by a call sent and answered at `at`.
    fn lease_at(at: Instant) -> Arc<LeaseState> {
        Arc::new(LeaseState::confirmed(
            Confirmations::new(at, at, RENEW),
            LEASE,
        ))
    }

    fn with_holder(renewed_at: Instant) -> Entries {
        let mut st = Entries::default();
        st.holders.insert("h".into(), lease_at(renewed_at));
        st
    }

    fn add_waiter(st: &mut Entries) {
        let (tx, _rx) = oneshot::channel();
        st.add_waiter("w".into(), Waiter::new(tx, "test"), RENEW);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_to_look_after_means_no_wakeup() {
        let schedule = Schedule::new(Grid::new(Instant::now()));
        assert_eq!(
            schedule.next_wakeup(&Entries::default(), &timing(RENEW)),
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_is_renewed_one_renewal_interval_after_its_last_renewal() {
        let schedule = Schedule::new(Grid::new(Instant::now()));
        let t0 = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        let st = with_holder(t0);
        // the renewal comes before the deadline (renewal ≤ lease / 3)
        assert_eq!(schedule.next_wakeup(&st, &timing(RENEW)), Some(t0 + RENEW));
        st.holders["h"].renewed(t0 + RENEW, t0 + RENEW);
        assert_eq!(
            schedule.next_wakeup(&st, &timing(RENEW)),
            Some(t0 + RENEW * 2)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_checked_every_fallback_or_renewal_interval_whichever_is_shorter() {
        let t0 = Instant::now();
        let schedule = Schedule::new(Grid::new(Instant::now()));
        let mut st = Entries::default();
        add_waiter(&mut st);
        let short = Duration::from_secs(1);
        assert_eq!(schedule.next_wakeup(&st, &timing(short)), Some(t0 + short));
        let long = Duration::from_secs(60);
        assert_eq!(schedule.next_wakeup(&st, &timing(long)), Some(t0 + RENEW));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reported_lease_expiry_wakes_waiters_just_after_it() {
        let t0 = Instant::now();
        let mut schedule = Schedule::new(Grid::new(Instant::now()));
        schedule.lease_expires_in(500);
        schedule.lease_expires_in(800); // the earliest wins
        let mut st = with_holder(t0);
        // holders alone do not care: nobody waits for the slot
        assert_eq!(schedule.next_wakeup(&st, &timing(RENEW)), Some(t0 + RENEW));
        add_waiter(&mut st);
        let at = t0 + Duration::from_millis(500) + REAP_SLACK;
        assert_eq!(schedule.next_wakeup(&st, &timing(RENEW)), Some(at));
        // a successful renewal replaces it with the expiry it reports
        tokio::time::advance(Duration::from_millis(100)).await;
        let now = Instant::now();
        schedule.succeeded(now, None);
        assert_eq!(schedule.next_wakeup(&st, &timing(RENEW)), Some(t0 + RENEW));
        schedule.succeeded(now, Some(50));
        assert_eq!(
            schedule.next_wakeup(&st, &timing(RENEW)),
            Some(now + Duration::from_millis(50) + REAP_SLACK)
        );
    }

    /// Renewals due at any phase wake on the client's grid (the line at or above), so that
    /// handles whose renewals fall due in the same step share a call; a wake-up at a lease
    /// expiry in Redis, and a holder's deadline, stay where they are.
    #[tokio::test(start_paused = true)]
    async fn renewals_wake_on_the_grid_and_expiries_where_they_are() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut schedule = Schedule::new(Grid::new(t0));
        let timing = timing(Duration::from_secs(60));
        assert_eq!(
            schedule.next_wakeup(&with_holder(t0), &timing),
            Some(t0 + RENEW)
        );
        for phase in [1, 17, 49] {
            let st = with_holder(t0 + ms(phase));
            assert_eq!(
                schedule.next_wakeup(&st, &timing),
                Some(t0 + RENEW + ms(50))
            );
        }
        let mut st = with_holder(t0 + ms(17));
        schedule.waiters_checked_at = t0 + ms(17);
        add_waiter(&mut st);
        assert_eq!(
            schedule.next_wakeup(&st, &timing),
            Some(t0 + RENEW + ms(50))
        );
        schedule.lease_expires_in(1013);
        assert_eq!(
            schedule.next_wakeup(&st, &timing),
            Some(t0 + ms(1013) + REAP_SLACK),
            "not moved to the grid"
        );
        let lease = &st.holders["h"];
        assert_eq!(
            lease.deadline(),
            timing.deadline(t0 + ms(17)),
            "off the grid"
        );
    }

    /// A renewal that fails at once (Redis refusing connections) must not be retried in a
    /// tight loop: the renewal it retries is overdue, yet the next try waits for the retry
    /// time, which backs off, and a holder is still declared lost at its deadline.
    #[tokio::test(start_paused = true)]
    async fn failed_renewals_back_off_instead_of_retrying_at_once() {
        let t0 = Instant::now();
        let timing = timing(Duration::from_secs(1));
        let mut schedule = Schedule::new(Grid::new(Instant::now()));
        let mut st = with_holder(t0);
        add_waiter(&mut st);
        schedule.lease_expires_in(10);
        tokio::time::advance(RENEW).await; // the renewal is due, and fails
        let mut delays = Vec::new();
        loop {
            let now = Instant::now();
            schedule.failed(now, &timing);
            let next = schedule.next_wakeup(&st, &timing).unwrap();
            assert!(next > now, "retried at once");
            if next == timing.deadline(t0) {
                break; // then the holder is lost
            }
            delays.push(next - now);
            tokio::time::advance(next - now).await;
        }
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [200, 400, 800, 1600, 2000]);
        // once a renewal succeeds, the schedule is the usual one again
        let now = Instant::now();
        st.holders.clear();
        st.holders.insert("h".into(), lease_at(now));
        schedule.succeeded(now, None);
        assert_eq!(
            schedule.next_wakeup(&st, &timing),
            Some(now + Duration::from_secs(1))
        );
        schedule.failed(now, &timing);
        assert_eq!(
            schedule.next_wakeup(&st, &timing),
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
        let timing = timing(Duration::from_secs(60));
        let schedule = Schedule::new(Grid::new(Instant::now()));
        let st = with_holder(t0);
        let lease = st.holders["h"].clone();
        lease.renewed(t0 + RENEW, t0 + RENEW);
        assert_eq!(schedule.next_wakeup(&st, &timing), Some(t0 + RENEW * 2));
        // the renewal due at 2 × RENEW failed, retries too; one sent at 2.5 × RENEW succeeds
        let late = t0 + RENEW * 5 / 2;
        tokio::time::advance(late - t0).await;
        lease.renewed(late, late);
        assert_eq!(lease.deadline(), t0 + RENEW + LEASE - timing.margin());
        assert_eq!(schedule.next_wakeup(&st, &timing), Some(late + RENEW));
        assert!(late + RENEW < lease.deadline());
        // once it succeeds, the late one is trusted
        let next = late + RENEW;
        tokio::time::advance(next - late).await;
        lease.renewed(next, next);
        assert_eq!(schedule.next_wakeup(&st, &timing), Some(next + RENEW));
        assert_eq!(lease.deadline(), late + LEASE - timing.margin());
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
        let mut schedule = Schedule::new(Grid::new(t0));
        let mut st = Entries::default();
        let lease = Arc::new(LeaseState::confirmed(
            Confirmations::new(t0, t0 + rtt, renew),
            timing.lease,
        ));
        st.holders.insert("h".into(), lease.clone());
        add_waiter(&mut st);
        let mut beats = 0;
        let mut beat = |st: &mut Entries, schedule: &mut Schedule, sent: Instant| {
            assert!(
                !lease.may_have_ended(),
                "lost during a call at beat {beats}"
            );
            lease.renewed(sent, Instant::now());
            st.waiters_renewed(sent, Instant::now());
            schedule.succeeded(Instant::now(), None);
            beats += 1;
        };
        for i in 0..200 {
            let next = schedule.next_wakeup(&st, &timing).unwrap();
            assert!(next < lease.deadline(), "the deadline comes first");
            tokio::time::advance(next.saturating_duration_since(Instant::now())).await;
            let sent = Instant::now();
            tokio::time::advance(rtt).await;
            beat(&mut st, &mut schedule, sent);
            if i % 3 == 0 {
                // a beat for another reason (a lease expiring in Redis, a reconnect)
                tokio::time::advance(ms(130)).await;
                let sent = Instant::now();
                tokio::time::advance(rtt).await;
                beat(&mut st, &mut schedule, sent);
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
        let mut schedule = Schedule::new(Grid::new(Instant::now()));
        let mut st = Entries::default();
        add_waiter(&mut st);
        for _ in 0..5 {
            schedule.failed(Instant::now(), &short);
        }
        assert_eq!(
            schedule.next_wakeup(&st, &short),
            Some(Instant::now() + Duration::from_millis(300))
        );
    }
}

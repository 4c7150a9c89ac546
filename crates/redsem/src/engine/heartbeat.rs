//! The heartbeat: one task per semaphore handle that renews the handle's sessions (the
//! leases of all its holders and waiters) and checks its holders in one renewal (its part of
//! a call shared with the client's other handles, see below), checks the
//! waiters it has reason to doubt (the core's doubt rule,
//! [`HandleState::doubted_waiters`](crate::core::HandleState::doubted_waiters); one more
//! call per 512 of them), which finds grants whose notification was lost, and declares
//! permits lost in time. When it runs, and what a renewal's answer means, are the core's
//! decisions ([`HandleState::next_wakeup`](crate::core::HandleState::next_wakeup),
//! [`HandleState::on_renewal`](crate::core::HandleState::on_renewal)); this file sends the
//! calls and carries out the effects.
//!
//! It wakes at the earliest of the times listed in `core/schedule.rs`, or when poked (a new
//! waiter or holder, a reconnect of the subscriber).
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
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::remote::Remote;
use super::renewer::Renewer;
use super::table::Table;
use crate::codes::Code;
use crate::core::RenewalCall;
use crate::error::CallError;
use crate::protocol::{self, Conn, Renewal, Session};

/// Most waiters checked by one call. Every holder goes in the first call; thousands of
/// waiters in doubt (after a reconnect) are spread over several calls, so that no call (its
/// arguments and its reply, held in memory at once) grows with the number of waiters.
const WAITERS_PER_CALL: usize = 512;

/// The heartbeat of one handle: what a renewal needs.
pub(crate) struct Heartbeat {
    table: Arc<Table>,
    remote: Arc<Remote>,
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
        (renewer, conn): (Renewer, Conn),
        response_timeout: Duration,
        synced: Option<(u32, Duration)>,
    ) -> Arc<Heartbeat> {
        Arc::new(Heartbeat {
            table,
            remote,
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
        self.table.lock().schedule.recheck_now();
        self.table.poke.notify_one();
    }

    /// A script reported the time to the nearest lease expiry in Redis, if any: look then.
    pub(crate) fn lease_expires_in(&self, ms: Option<u64>) {
        if let Some(ms) = ms {
            self.table
                .lock()
                .schedule
                .lease_expires_in(ms, Instant::now());
        }
        self.table.poke.notify_one();
    }

    fn name(&self) -> &str {
        self.remote.name()
    }
}

async fn run(weak: Weak<Heartbeat>, poke: Arc<Notify>, stop: CancellationToken) {
    loop {
        let wake = match weak.upgrade() {
            Some(hb) => hb.table.lock().next_wakeup(),
            None => return,
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = poke.notified() => {}
            _ = sleep_until_opt(wake) => {}
        }
        let Some(hb) = weak.upgrade() else { return };
        let due = {
            let mut st = hb.table.lock();
            let forced = st.schedule.take_force();
            forced || st.next_wakeup().is_some_and(|t| t <= Instant::now())
        };
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

/// One renewal of every session of the handle and check of every local holder: one call.
/// Waiters are not checked one by one unless the renewal gives reason to doubt them: then
/// one more call per [`WAITERS_PER_CALL`] of them.
async fn beat(hb: &Heartbeat) {
    let (holders, waiting) = {
        let st = hb.table.lock();
        (st.holder_ids(), st.has_waiters())
    };
    if holders.is_empty() && !waiting {
        return;
    }
    let sessions = hb.table.sessions();
    let mut checked: HashSet<Arc<str>> = HashSet::new();
    let mut first = true;
    let mut call = Renewed {
        ok: true,
        poked: false,
    };
    // The reply may have put waiters in doubt (a head of the queue above their tickets, a
    // session without a lease, the rest of a long list): check them in further calls.
    while call.ok {
        let doubted = hb.table.lock().doubted_waiters(&checked);
        if doubted.is_empty() && !first {
            break;
        }
        let chunk = &doubted[..doubted.len().min(WAITERS_PER_CALL)];
        let this = if std::mem::take(&mut first) {
            renew_call(hb, &sessions, &holders, chunk).await
        } else {
            renew_call(hb, &[], &[], chunk).await
        };
        call = Renewed {
            ok: this.ok,
            poked: call.poked | this.poked,
        };
        checked.extend(chunk.iter().cloned());
    }
    if !call.ok {
        // retried as a whole later
        hb.table.lock().check_all_next();
    }
    // Holders whose lease could have expired without a confirmed renewal are lost (those
    // granted during the call included).
    let expired = hb.table.lock().holders_past_deadline(Instant::now());
    for id in expired {
        hb.table.lose(&id, crate::error::LostReason::Unreachable);
    }
    if call.poked {
        // the pokes consumed above were meant for the loop as well
        hb.table.poke.notify_one();
    }
}

/// What one renewal call did.
struct Renewed {
    /// Redis answered.
    ok: bool,
    /// The heartbeat was poked meanwhile (the poke was consumed here).
    poked: bool,
}

/// One renewal call for `sessions`, checking `holders` and `waiters`: the core applies its
/// answer ([`HandleState::on_renewal`](crate::core::HandleState::on_renewal)), and the
/// effects are carried out.
async fn renew_call(
    hb: &Heartbeat,
    sessions: &[(String, u64)],
    holders: &[String],
    waiters: &[Arc<str>],
) -> Renewed {
    let sent = Instant::now();
    let span = tracing::debug_span!(
        "redsem.renew",
        semaphore = %hb.name(),
        sessions = sessions.len(),
        holders = holders.len(),
        waiters = waiters.len(),
    );
    let (reply, poked) = send_renewal(hb, sessions, holders, waiters, sent)
        .instrument(span.clone())
        .await;
    let now = Instant::now();
    if !sessions.is_empty() {
        crate::metrics::renewal(hb.name(), matches!(reply, Ok(Ok((_, true)))));
    }
    let ok = match reply {
        Ok(Ok((renewal, replicated))) => {
            let (free, limit) = renewal.seen;
            hb.remote.set_free(free);
            hb.remote.set_limit(limit);
            tracing::debug!(parent: &span, replicated, "renewed");
            let lease_ms: Vec<u64> = sessions.iter().map(|(_, ms)| *ms).collect();
            let call = RenewalCall {
                sent,
                answered: now,
                sessions: &lease_ms,
                holders,
                waiters,
                replicated,
            };
            let effects = hb.table.lock().on_renewal(&call, renewal);
            hb.table.apply(effects);
            replicated
        }
        Ok(Err(CallError::Denied(detail))) => {
            tracing::error!(semaphore = %hb.name(), error = %detail, "Redis refused the renewal");
            let effects = hb.table.lock().on_renewal_refused(now, &detail);
            hb.table.apply(effects);
            false
        }
        Ok(Err(CallError::Redis(e))) if overwritten(&e) => {
            tracing::error!(semaphore = %hb.name(), error = %e,
                "a key of the semaphore was overwritten by another program's data; its permits are lost");
            let effects = hb.table.lock().on_renewal_overwritten(now);
            hb.table.apply(effects);
            false
        }
        Ok(Err(e)) => {
            tracing::warn!(semaphore = %hb.name(), error = %e, "heartbeat failed; retrying");
            hb.table.lock().on_renewal_failed(now);
            false
        }
        Err(()) => {
            tracing::warn!(semaphore = %hb.name(), "heartbeat timed out; retrying");
            hb.table.lock().on_renewal_failed(now);
            false
        }
    };
    Renewed { ok, poked }
}

/// Whether a renewal's failure says that a key of the semaphore holds another program's data
/// ([`Code`] decides): a value of another type, a foreign hash at the configuration key, or a
/// record redsem cannot read. No renewal can succeed until an operator removes it.
fn overwritten(e: &redis::RedisError) -> bool {
    matches!(Code::of(e), Code::WrongType | Code::Foreign | Code::Corrupt)
}

/// A renewal's answer (with whether it counts), or `Err` when none came in time.
type Answer = Result<Result<(Renewal, bool), CallError>, ()>;

/// Sends one renewal and waits for its answer, never past the moment a holder's lease could
/// have expired: every local holder's, not only those renewed by this call. A grant
/// notified while it is in flight adds a holder whose lease (the waiter's) may end before
/// the answer comes: a poke lowers the limit to its deadline too. Also returns whether the
/// heartbeat was poked meanwhile.
async fn send_renewal(
    hb: &Heartbeat,
    sessions: &[(String, u64)],
    holders: &[String],
    waiters: &[Arc<str>],
    sent: Instant,
) -> (Answer, bool) {
    let holders_limit = |limit: Instant| {
        let earliest = hb.table.lock().earliest_deadline();
        earliest.map_or(limit, |d| limit.min(d.max(sent + Duration::from_millis(1))))
    };
    let mut limit = holders_limit(sent + hb.response_timeout);
    let sessions: Vec<Session<'_>> = sessions.iter().map(|(s, ms)| (s.as_str(), *ms)).collect();
    let ids: Vec<&str> = holders
        .iter()
        .map(String::as_str)
        .chain(waiters.iter().map(|id| &**id))
        .collect();
    let renew = renew(hb, &sessions, &ids);
    tokio::pin!(renew);
    let mut poked = false;
    loop {
        tokio::select! {
            r = &mut renew => return (Ok(r), poked),
            _ = tokio::time::sleep_until(limit) => return (Err(()), poked),
            _ = hb.table.poke.notified() => {
                poked = true;
                limit = holders_limit(limit);
            }
        }
    }
}

/// The renewal itself: through the client's renewer, or in synced mode `renew + WAIT` on the
/// handle's connection (it counts once enough replicas acknowledged it).
async fn renew(
    hb: &Heartbeat,
    sessions: &[Session<'_>],
    ids: &[&str],
) -> Result<(Renewal, bool), CallError> {
    let Some((replicas, timeout)) = hb.synced else {
        let renewal = hb.renewer.renew(&hb.remote, sessions, ids).await?;
        return Ok((renewal, true));
    };
    let target = hb.remote.target();
    let mut conn = hb.conn.clone();
    let (renewal, acked) =
        protocol::renew_and_wait(&mut conn, &target, sessions, ids, replicas, timeout).await?;
    if acked < replicas {
        tracing::warn!(semaphore = %hb.name(), acked, wanted = replicas,
            "synced mode: too few replicas acknowledged the renewal; it does not count");
    }
    Ok((renewal, acked >= replicas))
}

//! The heartbeat: one task per semaphore handle that renews every local lease in one batched
//! call (one more per 512 waiters beyond the first 512), finds grants whose notification was
//! lost, and declares permits lost in time.
//!
//! It wakes at the earliest of:
//! - the renewal time of the holders (last renewal + renewal interval);
//! - the fallback poll of the waiters (last check + fallback interval);
//! - the moment a lease in Redis is due to expire (as reported by the last script): a crashed
//!   holder's slot is then reclaimed by this call and granted to the head of the queue, so
//!   crash recovery does not wait for the fallback poll;
//! - the local deadline of a holder (last confirmed renewal + lease − safety margin): if no
//!   renewal has been confirmed by then, the permit is lost;
//! - a poke (new waiter, reconnect of the subscriber).
//!
//! A renewal never re-creates an entry: an entry that expired is reported gone and its permit
//! is lost.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::error::LostReason;
use crate::permit::LeaseState;
use crate::scripts::{self, EntryState};
use crate::semaphore::{Delivery, SemShared};

/// Delay before retrying a failed heartbeat.
const RETRY: Duration = Duration::from_millis(200);

pub(crate) fn spawn(shared: &Arc<SemShared>) {
    let weak = Arc::downgrade(shared);
    let poke = shared.poke.clone();
    let stop = shared.stop.clone();
    tokio::spawn(async move {
        loop {
            let wake = match weak.upgrade() {
                Some(sh) => next_wakeup(&sh),
                None => return,
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = poke.notified() => {}
                _ = sleep_until_opt(wake) => {}
            }
            let Some(sh) = weak.upgrade() else { return };
            let due = {
                let mut st = sh.state.lock().unwrap();
                std::mem::take(&mut st.force)
            } || next_wakeup(&sh).is_some_and(|t| t <= Instant::now());
            if due {
                beat(&sh).await;
            }
        }
    });
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn deadline(sh: &SemShared, lease: &LeaseState) -> Instant {
    lease.renewed_at() + sh.settings.lease - sh.settings.margin
}

/// When the heartbeat must run next, or `None` when this handle has nothing to look after.
fn next_wakeup(sh: &SemShared) -> Option<Instant> {
    let st = sh.state.lock().unwrap();
    let mut at: Option<Instant> = None;
    let mut earliest = |t: Instant| at = Some(at.map_or(t, |a| a.min(t)));
    if st.holders.is_empty() && !st.has_waiters() {
        return None;
    }
    if let Some(r) = st.retry_at {
        earliest(r);
    }
    for lease in st.holders.values() {
        earliest(lease.renewed_at() + sh.settings.renew_every);
        earliest(deadline(sh, lease));
    }
    if st.has_waiters() {
        // Waiters hold a lease too: renew it at least every renewal interval (a fallback
        // poll longer than the lease would otherwise let Redis reap them, and they would lose
        // their place in the queue).
        earliest(st.waiters_checked_at + sh.settings.fallback_poll.min(sh.settings.renew_every));
        if let Some(c) = st.next_check {
            earliest(c);
        }
    }
    at
}

/// A local holder: its id and lease.
type Holder = (String, Arc<LeaseState>);

/// Most waiters renewed by one call. Every holder goes in the first call; thousands of
/// waiters are spread over several calls, so that no call (its arguments and its reply,
/// held in memory at once) grows with the number of waiters.
const WAITERS_PER_CALL: usize = 512;

/// One renewal and check of every local holder and waiter: one call, or one per
/// [`WAITERS_PER_CALL`] waiters.
async fn beat(sh: &Arc<SemShared>) {
    let (holders, waiters): (Vec<Holder>, Vec<Arc<str>>) = {
        let st = sh.state.lock().unwrap();
        (
            st.holders
                .iter()
                .map(|(id, l)| (id.clone(), l.clone()))
                .collect(),
            st.waiter_ids(),
        )
    };
    if holders.is_empty() && waiters.is_empty() {
        return;
    }
    let mut chunks = waiters.chunks(WAITERS_PER_CALL);
    let first = renew_call(sh, &holders, chunks.next().unwrap_or_default()).await;
    let mut poked = first.poked;
    if first.ok {
        for chunk in chunks {
            let call = renew_call(sh, &[], chunk).await;
            poked |= call.poked;
            if !call.ok {
                break; // retried as a whole later
            }
        }
    }
    // Holders whose lease could have expired without a confirmed renewal are lost (those
    // granted during the call included).
    let current: Vec<Holder> = {
        let st = sh.state.lock().unwrap();
        st.holders
            .iter()
            .map(|(id, l)| (id.clone(), l.clone()))
            .collect()
    };
    for (id, lease) in &current {
        if deadline(sh, lease) <= Instant::now() {
            lose(sh, id, lease, LostReason::Unreachable);
        }
    }
    if poked {
        // the pokes consumed above were meant for the loop as well
        sh.poke.notify_one();
    }
}

/// What one renewal call did.
struct Call {
    /// Redis answered.
    ok: bool,
    /// The heartbeat was poked meanwhile (the poke was consumed here).
    poked: bool,
}

/// One renewal call for `holders` and `waiters`: confirms their leases, delivers grants and
/// losses, and schedules the next check.
async fn renew_call(sh: &Arc<SemShared>, holders: &[Holder], waiters: &[Arc<str>]) -> Call {
    let sent = Instant::now();
    // Never wait for an answer past the moment a holder's lease could have expired: every
    // local holder's, not only those renewed by this call.
    let holders_limit = |limit: Instant| {
        let st = sh.state.lock().unwrap();
        st.holders.values().fold(limit, |limit, lease| {
            limit.min(deadline(sh, lease).max(sent + Duration::from_millis(1)))
        })
    };
    let mut limit = holders_limit(sent + sh.client.response_timeout);
    let ids: Vec<&str> = holders
        .iter()
        .map(|(id, _)| id.as_str())
        .chain(waiters.iter().map(|id| &**id))
        .collect();
    let mut conn = sh.client.conn.clone();
    let span = tracing::debug_span!(
        "redsem.renew",
        semaphore = %sh.name(),
        holders = holders.len(),
        waiters = waiters.len(),
    );
    let target = sh.core.target();
    let renew = scripts::renew(&mut conn, &target, &ids).instrument(span.clone());
    tokio::pin!(renew);
    // A grant notified while this call is in flight adds a holder whose lease (the waiter's)
    // may end before the answer comes: a poke lowers the limit to its deadline too.
    let mut poked = false;
    let reply = loop {
        tokio::select! {
            r = &mut renew => break Ok(r),
            _ = tokio::time::sleep_until(limit) => break Err(()),
            _ = sh.poke.notified() => {
                poked = true;
                limit = holders_limit(limit);
            }
        }
    };
    let now = Instant::now();
    crate::metrics::renewal(sh.name(), matches!(reply, Ok(Ok(_))));
    match reply {
        Ok(Ok((next_expiry, states))) => {
            tracing::debug!(parent: &span, "renewed");
            {
                let mut st = sh.state.lock().unwrap();
                st.retry_at = None;
                st.waiters_checked_at = now;
                st.next_check = next_expiry.map(|ms| now + Duration::from_millis(ms + 2));
            }
            let (h_states, w_states) = states.split_at(holders.len());
            for ((id, lease), state) in holders.iter().zip(h_states) {
                match state {
                    EntryState::Held(_) => lease.renewed(sent),
                    EntryState::Gone | EntryState::Waiting => {
                        lose(sh, id, lease, LostReason::NotHolder);
                    }
                }
            }
            for (id, state) in waiters.iter().zip(w_states) {
                match state {
                    EntryState::Held(grant) => sh.deliver(id, Delivery::Granted(grant.clone())),
                    EntryState::Gone => sh.deliver(id, Delivery::Lost),
                    EntryState::Waiting => sh.state.lock().unwrap().waiter_renewed(id, sent),
                }
            }
            Call { ok: true, poked }
        }
        Ok(Err(e)) => {
            tracing::warn!(semaphore = %sh.name(), error = %e, "heartbeat failed; retrying");
            sh.state.lock().unwrap().retry_at = Some(now + RETRY);
            Call { ok: false, poked }
        }
        Err(_) => {
            tracing::warn!(semaphore = %sh.name(), "heartbeat timed out; retrying");
            sh.state.lock().unwrap().retry_at = Some(now + RETRY);
            Call { ok: false, poked }
        }
    }
}

fn lose(sh: &SemShared, id: &str, lease: &LeaseState, reason: LostReason) {
    let was_holder = sh.state.lock().unwrap().holders.remove(id).is_some();
    if !was_holder {
        return; // released meanwhile
    }
    let (ticket, slots) = lease.granted().cloned().unwrap_or_default();
    tracing::warn!(semaphore = %sh.name(), holder = id, ticket, ?slots, %reason, "lease lost");
    crate::metrics::lease_lost(sh.name(), reason);
    lease.lose(reason);
    // Whatever is left of the entry in Redis is removed (idempotent).
    sh.release_in_background(id.to_owned());
}

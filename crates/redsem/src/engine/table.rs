//! The waiter/holder table of one semaphore handle: who in this process waits for or holds
//! permits through it, and how a waiter is resolved ([`Table::deliver`]).
//!
//! A waiter is resolved exactly once, by whichever comes first: the reply of its own acquire
//! call, a notification, the heartbeat, or closing the handle. Whatever is resolved after
//! its acquire was dropped is released in the background, so nothing leaks.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::lease::{Confirmations, LeaseState};
use super::releaser::Releaser;
use super::remote::Remote;
use crate::protocol::Grant;

/// How a waiter is resolved.
pub(crate) enum Outcome {
    /// Granted. Boxed: every waiter's channel has room for one outcome, and few are grants
    /// at once. The lease of the new holder is in the table's holders.
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

/// One pending acquire.
pub(crate) struct Waiter {
    tx: oneshot::Sender<Outcome>,
    /// The ticket Redis confirmed (the acquire call returned "queued"), with its priority
    /// class. Until then the heartbeat never checks it: a check that overtook the acquire
    /// would find it missing.
    queued: Option<Queued>,
    /// Counts this waiter in `redsem_client_waiters` while it lives (feature `metrics`).
    _gauge: crate::metrics::WaiterGauge,
}

impl Waiter {
    /// A waiter of the semaphore `name`, resolved through `tx`.
    pub(crate) fn new(tx: oneshot::Sender<Outcome>, name: &str) -> Waiter {
        Waiter {
            tx,
            queued: None,
            _gauge: crate::metrics::WaiterGauge::new(name),
        }
    }
}

/// The waiters and holders, behind the table's lock.
#[derive(Default)]
pub(crate) struct Entries {
    /// Keyed by the waiter's id, shared with its pending acquire (one allocation).
    pub(crate) waiters: HashMap<Arc<str>, Waiter>,
    pub(crate) holders: HashMap<String, Arc<LeaseState>>,
    /// The lease lengths (ms) in use, each with how many use it: one session each in Redis,
    /// renewed while in use. The waiters' lease (the handle's) is always in use; another is
    /// in use while an acquisition that asked for it is pending, or a permit may be in its
    /// session ([`LeaseUse`]). A session no longer in use is not renewed: it expires in Redis
    /// (with any entry whose release did not reach Redis), so that a handle whose
    /// acquisitions ask for many lease lengths does not renew them all for ever.
    pub(crate) leases: BTreeMap<u64, usize>,
    /// The lease lengths (ms) that went out of use, and when: their sessions may still be in
    /// Redis until one lease after that, and a closing handle ends them too.
    pub(crate) unused: BTreeMap<u64, Instant>,
    /// The calls that confirmed the waiters' session (the lease of every waiter: entries live
    /// as long as their session) since the first of the current waiters registered. A grant
    /// keeps that lease, so a granted waiter's lease clock starts with these. One for all
    /// waiters: a waiter registered later counts from older confirmations, which only
    /// brings its deadline earlier.
    waiter_session: Option<Confirmations>,
}

impl Entries {
    /// The waiters whose ticket Redis confirmed (only those can be checked), with where they
    /// are queued.
    pub(crate) fn queued_waiters(&self) -> Vec<(Arc<str>, Queued)> {
        self.waiters
            .iter()
            .filter_map(|(id, w)| w.queued.map(|q| (id.clone(), q)))
            .collect()
    }

    /// Registers the waiter `id`, now; the first of the current waiters starts the waiters'
    /// session's confirmations ([`waiters_renewed`](Self::waiters_renewed)), renewed every
    /// `renew_every`.
    pub(crate) fn add_waiter(&mut self, id: Arc<str>, waiter: Waiter, renew_every: Duration) {
        if self.waiters.is_empty() {
            let now = Instant::now();
            self.waiter_session = Some(Confirmations::new(now, now, renew_every));
        }
        self.waiters.insert(id, waiter);
    }

    /// Records a confirmed renewal of the waiters' session, sent at `sent` and answered at
    /// `answered`.
    pub(crate) fn waiters_renewed(&mut self, sent: Instant, answered: Instant) {
        if let Some(c) = &mut self.waiter_session {
            c.confirm(sent, answered);
        }
    }

    /// Redis confirmed the ticket of waiter `id`: the heartbeat may check it from now on.
    pub(crate) fn waiter_queued(&mut self, id: &str, queued: Queued) {
        if let Some(w) = self.waiters.get_mut(id) {
            w.queued = Some(queued);
        }
    }

    pub(crate) fn has_waiters(&self) -> bool {
        !self.waiters.is_empty()
    }

    /// Every holder and its lease.
    pub(crate) fn holders(&self) -> Vec<(String, Arc<LeaseState>)> {
        self.holders
            .iter()
            .map(|(id, l)| (id.clone(), l.clone()))
            .collect()
    }
}

/// One use of a lease length by an entry of the handle (a pending acquisition that asked for
/// it, or a permit that may be in its session): its session is renewed while a use lives.
pub(crate) struct LeaseUse {
    table: Arc<Table>,
    ms: u64,
}

impl LeaseUse {
    /// The lease length used, in ms.
    pub(crate) fn ms(&self) -> u64 {
        self.ms
    }
}

impl Drop for LeaseUse {
    fn drop(&mut self) {
        let mut st = self.table.lock();
        if let Some(n) = st.leases.get_mut(&self.ms) {
            *n -= 1;
            if *n == 0 {
                st.leases.remove(&self.ms);
                let now = Instant::now();
                // (those unused for longer than their lease have expired in Redis)
                st.unused
                    .retain(|&ms, at| now.duration_since(*at) < Duration::from_millis(ms));
                st.unused.insert(self.ms, now);
            }
        }
    }
}

/// The table of one handle, and what resolving an entry needs: the releaser (for what
/// nobody waits for any more) and the heartbeat's wake-up (its schedule changes).
pub(crate) struct Table {
    entries: Mutex<Entries>,
    remote: Arc<Remote>,
    /// The handle's channel id, which starts the ids of its sessions.
    channel_id: String,
    releaser: Releaser,
    /// The waiters' lease (the handle's): a granted waiter keeps it until renewed as a holder.
    wait_lease: Duration,
    /// Wakes the heartbeat to recompute its schedule.
    pub(crate) poke: Arc<Notify>,
}

impl Table {
    pub(crate) fn new(
        remote: Arc<Remote>,
        releaser: Releaser,
        wait_lease: Duration,
        channel_id: String,
    ) -> Table {
        let mut entries = Entries::default();
        // always in use (never released)
        entries.leases.insert(wait_lease.as_millis() as u64, 1);
        Table {
            entries: Mutex::new(entries),
            remote,
            channel_id,
            releaser,
            wait_lease,
            poke: Arc::new(Notify::new()),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries.lock().unwrap()
    }

    /// An entry of this handle is about to use a lease of `len`: its session is renewed
    /// from now on, as long as the returned [`LeaseUse`] (or another for the same length)
    /// lives.
    pub(crate) fn use_lease(self: &Arc<Self>, len: Duration) -> LeaseUse {
        let ms = len.as_millis() as u64;
        let mut st = self.lock();
        *st.leases.entry(ms).or_insert(0) += 1;
        st.unused.remove(&ms);
        drop(st);
        LeaseUse {
            table: self.clone(),
            ms,
        }
    }

    /// The sessions of this handle, with their leases in ms: `(id, lease)`.
    pub(crate) fn sessions(&self) -> Vec<(String, u64)> {
        self.lock()
            .leases
            .keys()
            .map(|&ms| (crate::protocol::ids::session_id(&self.channel_id, ms), ms))
            .collect()
    }

    /// Ends this handle's sessions in Redis in the background (each only if no entry is left
    /// in it), those in use and those that went out of use less than their lease ago: the
    /// handle is gone.
    pub(crate) fn end_sessions(&self) {
        let unused: Vec<u64> = self.lock().unused.keys().copied().collect();
        let sessions = self
            .sessions()
            .into_iter()
            .map(|(sid, _)| sid)
            .chain(
                unused
                    .into_iter()
                    .map(|ms| crate::protocol::ids::session_id(&self.channel_id, ms)),
            )
            .collect();
        self.releaser.send(super::releaser::Job::EndSessions {
            remote: self.remote.clone(),
            sessions,
        });
    }

    /// Detaches the holder `id` in Redis in the background: it leaves this handle's session
    /// and expires with the lease it has.
    pub(crate) fn detach_in_background(&self, id: String) {
        self.releaser.send(super::releaser::Job::Detach {
            remote: self.remote.clone(),
            id,
        });
    }

    /// Removes `id` from Redis in the background (idempotent).
    pub(crate) fn release_in_background(&self, id: String) {
        self.releaser.release(&self.remote, id);
    }

    /// A permit's holder is done with it (released, dropped or lost).
    pub(crate) fn forget_holder(&self, id: &str) {
        self.lock().holders.remove(id);
    }

    /// Resolves the pending acquire `id`, if it is still pending. The first resolution wins;
    /// a grant nobody waits for any more is released.
    pub(crate) fn deliver(&self, id: &str, what: Outcome) {
        let mut st = self.lock();
        let Some(waiter) = st.waiters.remove(id) else {
            let orphan_grant = matches!(what, Outcome::Granted(_)) && !st.holders.contains_key(id);
            drop(st);
            if orphan_grant {
                self.release_in_background(id.to_owned());
            }
            return;
        };
        if let Outcome::Granted(_) = what {
            let confirmations = st
                .waiter_session
                .clone()
                .expect("a registered waiter started the waiters' session");
            let lease = Arc::new(LeaseState::confirmed(confirmations, self.wait_lease));
            st.holders.insert(id.to_owned(), lease);
        }
        // no longer waiting: out of the gauge before its acquire can see the outcome
        let Waiter { tx, _gauge, .. } = waiter;
        _gauge.done();
        if let Err(Outcome::Granted(_)) = tx.send(what) {
            st.holders.remove(id);
            drop(st);
            self.release_in_background(id.to_owned());
            return;
        }
        drop(st);
        // the heartbeat's schedule changed (a new holder to renew, one waiter fewer)
        self.poke.notify_one();
    }

    /// Resolves every waiter with [`Outcome::Closed`].
    pub(crate) fn close_waiters(&self) {
        let waiters = std::mem::take(&mut self.lock().waiters);
        for (_, Waiter { tx, _gauge, .. }) in waiters {
            _gauge.done();
            let _ = tx.send(Outcome::Closed);
        }
        self.poke.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RENEW: Duration = Duration::from_secs(1);

    fn register(st: &mut Entries, id: &str) {
        let (tx, _rx) = oneshot::channel();
        st.add_waiter(id.into(), Waiter::new(tx, "test"), RENEW);
    }

    /// The waiters share one chain of confirmations: the session's renewals since the first
    /// of the current waiters registered. A later waiter counts from it (older: only an
    /// earlier deadline); once nobody waits, the next first waiter starts a fresh one, so
    /// that its grant is not counted from renewals made before it (or from none).
    #[tokio::test(start_paused = true)]
    async fn waiters_share_the_sessions_confirmations_from_the_first_registration() {
        let t0 = Instant::now();
        let mut st = Entries::default();
        st.waiters_renewed(t0, t0); // nobody waits: nothing to confirm
        assert!(st.waiter_session.is_none());
        register(&mut st, "a");
        let s = |n: u32| t0 + RENEW * n;
        st.waiters_renewed(s(1), s(1));
        st.waiters_renewed(s(2), s(2));
        tokio::time::advance(RENEW * 2).await;
        register(&mut st, "b");
        let trusted = |st: &Entries| st.waiter_session.as_ref().unwrap().trusted_from();
        assert_eq!(trusted(&st), s(1), "b counts from the chain a started");
        st.waiters.clear();
        tokio::time::advance(RENEW * 10).await;
        register(&mut st, "c");
        assert_eq!(
            trusted(&st),
            Instant::now(),
            "a fresh chain for a first waiter"
        );
    }
}

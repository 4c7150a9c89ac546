//! The acquire path: one acquisition from the call to the grant, as a state machine.
//!
//! 1. checks that cost nothing (`n`, closed, limit), then the local cap;
//! 2. [`Pending::new`] registers the waiter in the table *before* the request is sent (a
//!    grant may be notified before the script's reply arrives);
//! 3. the request goes through the batching task ([`batch`](super::batch)) to
//!    `acquire.lua`: granted, queued, no capacity (try), or too many;
//! 4. a queued waiter waits for its [`Outcome`]: delivered by a notification (the notifier),
//!    the heartbeat's fallback poll, or [`Handle::close`]; one rejected after a shrink asks
//!    again (to learn the current limit), one an operator removed fails;
//! 5. a grant that arrives after the waiter's lease could have ended is given back and the
//!    request queued again; otherwise it becomes a [`Held`] entry (wrapped into a `Permit`
//!    by the public layer), confirmed on replicas first in synced mode.
//!
//! Cancel safety: dropping the future at any `.await` drops the armed [`Pending`], which
//! removes the waiter locally and the entry from Redis in the background.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument;

use super::batch::{self, Custom};
use super::handle::Handle;
use super::held::Held;
use super::lease::{LeaseState, deadline_after};
use super::table::{Outcome, Queued, Waiter};
use crate::error::{BackendError, Error, NoPermitsReason};
use crate::protocol::AcquireReply;

/// What one acquisition asks for (validated by the public layer).
pub(crate) struct Ask {
    pub(crate) n: u32,
    pub(crate) try_only: bool,
    /// Give up after this long (counted from the first poll).
    pub(crate) timeout: Option<Duration>,
    /// A holder lease, label or maximum hold time other than the handle's: rare, so shared
    /// and on the heap (a plain acquisition's future stays small).
    pub(crate) custom: Option<Arc<Custom>>,
}

impl Handle {
    /// A fresh entry id ([`ids::new_entry_id`](crate::protocol::ids::new_entry_id)).
    fn new_id(&self) -> String {
        crate::protocol::ids::new_entry_id(&self.channel_id)
    }

    /// One acquisition, traced (span `redsem.acquire`) and measured (feature `metrics`); in
    /// synced mode, the grant is confirmed on enough replicas.
    ///
    /// Built from combinators rather than `async fn` layers: each layer would store its own
    /// copy of the arguments (and of the result) in the future, and a waiting task carries
    /// that future as long as it waits. The synced-mode step is boxed for the same reason.
    pub(crate) fn acquire(
        self: &Arc<Self>,
        ask: Ask,
    ) -> impl Future<Output = Result<Held, Error>> + Send + '_ {
        let (n, try_only) = (ask.n, ask.try_only);
        use futures_util::FutureExt as _;
        use futures_util::future::{Either, ready};
        let span = tracing::debug_span!(
            "redsem.acquire",
            semaphore = %self.name(),
            permits = n,
            mode = if try_only { "try" } else { "wait" },
            holder = tracing::field::Empty,
            ticket = tracing::field::Empty,
            slots = tracing::field::Empty,
        );
        let started = Instant::now();
        self.acquire_untraced(ask)
            .then(move |result| match result {
                Ok(permit) if self.ctx.synced.is_some() => {
                    Either::Left(Box::pin(self.confirm_synced(permit)))
                }
                other => Either::Right(ready(other)),
            })
            .map(move |result| {
                self.record_acquire(&result, started);
                result
            })
            .instrument(span)
    }

    /// Records the outcome of an acquisition in its span and metrics.
    fn record_acquire(&self, result: &Result<Held, Error>, started: Instant) {
        let waited = started.elapsed();
        match result {
            Ok(permit) => {
                let span = tracing::Span::current();
                span.record("ticket", permit.grant().ticket);
                span.record("slots", tracing::field::debug(&permit.grant().slots));
                tracing::debug!(waited_ms = waited.as_millis() as u64, "granted");
                crate::metrics::acquired(self.name(), waited);
            }
            Err(e) => {
                tracing::debug!(error = %e, waited_ms = waited.as_millis() as u64, "acquire failed");
                crate::metrics::acquire_failed(self.name(), e);
            }
        }
    }

    async fn acquire_untraced(self: &Arc<Self>, ask: Ask) -> Result<Held, Error> {
        let Ask {
            n,
            try_only,
            timeout,
            custom,
        } = ask;
        if n == 0 {
            return Err(Error::InvalidArgument(
                "cannot acquire 0 permits: ask for at least one".into(),
            ));
        }
        if self.closed.is_cancelled() {
            return Err(Error::closed(self.name()));
        }
        // Only a request no limit can satisfy fails here. Otherwise Redis checks `n` against
        // the stored limit, which another process may have raised since this handle last
        // saw it (the reply of a refused request carries the current limit).
        if n > crate::protocol::keys::MAX_LIMIT {
            return Err(Error::TooManyPermits {
                name: self.name().to_owned(),
                requested: n,
                limit: self.limit(),
            });
        }
        // Only an acquire with a deadline carries a timer, and on the heap: a waiting acquire
        // future stays small (one per waiting task; see the benchmark's `memory` scenario).
        let mut deadline = timeout.map(|timeout| Deadline {
            sleep: Box::pin(tokio::time::sleep(timeout)),
            timeout,
        });
        let holder_lease = custom
            .as_ref()
            .and_then(|c| c.lease)
            .unwrap_or(self.timing.lease);
        let priority = custom.as_ref().map_or(0, |c| c.priority);
        // its session is renewed from now on, and by the permit once granted
        let lease_use =
            (holder_lease != self.timing.lease).then(|| self.table.use_lease(holder_lease));
        let local = match &self.local_cap {
            None => None,
            Some((cap, _)) if n > *cap => {
                return Err(Error::InvalidArgument(format!(
                    "requested {n} permits, more than this process's local cap of {cap}"
                )));
            }
            Some((_, sem)) if try_only => Some(
                sem.clone()
                    .try_acquire_many_owned(n)
                    .map_err(|_| Error::no_permits(self.name(), NoPermitsReason::LocalCap))?,
            ),
            // boxed: its state is not carried by every acquire future
            Some((_, sem)) => Some(Box::pin(self.local_permit(sem, n, deadline.as_mut())).await?),
        };
        loop {
            let mut pending = Pending::new(self, try_only)?;
            tracing::Span::current().record("holder", &*pending.id);
            // Scoped, and the call boxed like the local cap: only the wait below lives as
            // long as the queue.
            {
                // before the request can reach Redis: the lease of a try-mode grant starts later
                let sent = Instant::now();
                let reply = Box::pin(self.send_request(
                    &pending.id,
                    n,
                    try_only,
                    custom.clone(),
                    deadline.as_mut(),
                ))
                .await?;
                match reply {
                    AcquireReply::Granted(grant) if try_only => {
                        if deadline_after(sent, holder_lease) <= Instant::now() {
                            // the reply came too late to trust the grant: give it back
                            let id = pending.disarm();
                            self.table.release_in_background(id);
                            return Err(Error::Unreachable(BackendError::timed_out(format!(
                                "the grant of semaphore {:?} came back after its lease could have ended",
                                self.name()
                            ))));
                        }
                        let lease =
                            Arc::new(LeaseState::new(sent, holder_lease, self.timing.renew_every));
                        self.table
                            .lock()
                            .holders
                            .insert(pending.id.to_string(), lease.clone());
                        self.table.poke.notify_one();
                        let id = pending.disarm();
                        return Ok(
                            Held::new(self.clone(), id, n, *grant, lease, local, lease_use)
                                .with_max_hold(custom.as_ref().and_then(|c| c.max_hold)),
                        );
                    }
                    AcquireReply::Granted(grant) => {
                        self.table.deliver(&pending.id, Outcome::Granted(grant))
                    }
                    AcquireReply::Queued {
                        ticket,
                        next_expiry_ms,
                    } => {
                        tracing::Span::current().record("ticket", ticket);
                        tracing::debug!(ticket, "waiting in the queue");
                        self.table
                            .lock()
                            .waiter_queued(&pending.id, Queued { ticket, priority });
                        self.heartbeat.lease_expires_in(next_expiry_ms)
                    }
                    AcquireReply::NoCapacity { queued_first } => {
                        pending.disarm();
                        let reason = if queued_first {
                            NoPermitsReason::QueuedFirst
                        } else {
                            NoPermitsReason::NoneFree
                        };
                        return Err(Error::no_permits(self.name(), reason));
                    }
                    AcquireReply::TooMany { limit } => {
                        pending.disarm();
                        self.remote.set_limit(limit);
                        return Err(Error::TooManyPermits {
                            name: self.name().to_owned(),
                            requested: n,
                            limit,
                        });
                    }
                }
            }
            let rx = pending
                .rx
                .as_mut()
                .expect("a waiting acquire has a receiver");
            // Closing the handle resolves the receiver (Outcome::Closed): no need to watch
            // the token here.
            let outcome = tokio::select! {
                o = rx => o,
                e = timed_out(deadline.as_mut(), self.name()) => return Err(e),
            };
            match outcome {
                Ok(Outcome::Granted(grant)) => {
                    let id = pending.disarm();
                    // The lease the table created for the new holder: gone if the heartbeat
                    // declared it lost meanwhile.
                    let lease = self.table.lock().holders.get(&id).cloned();
                    // A grant keeps the waiter's lease; the holder's own length counts from
                    // the first renewal sent after the grant (the table made the lease with
                    // the waiter's length; renewals since then may have used either).
                    if let Some(lease) = &lease {
                        lease.set_len(holder_lease, Instant::now());
                    }
                    // One that arrives after that lease could have run out (its notification
                    // or reply held up) may no longer be ours in Redis: give it back and
                    // queue again, at the back.
                    let lease = match lease {
                        Some(lease) if !lease.is_lost() && !lease.may_have_ended() => lease,
                        _ => {
                            tracing::info!(semaphore = %self.name(), "grant arrived too late to be trusted; queueing again");
                            self.table.forget_holder(&id);
                            self.table.release_in_background(id);
                            continue;
                        }
                    };
                    return Ok(
                        Held::new(self.clone(), id, n, *grant, lease, local, lease_use)
                            .with_max_hold(custom.as_ref().and_then(|c| c.max_hold)),
                    );
                }
                // The limit shrank below the request, and Redis removed it: ask again, and
                // Redis answers with the limit as it is now (or queues it at the back, if
                // the limit grew back meanwhile).
                Ok(Outcome::Rejected) => {
                    tracing::info!(semaphore = %self.name(), "rejected after a shrink of the limit; asking again");
                    pending.disarm();
                    continue;
                }
                // An operator removed it from the queue (its entry is gone in Redis).
                Ok(Outcome::Removed) => {
                    pending.disarm();
                    return Err(Error::RemovedFromQueue {
                        name: self.name().to_owned(),
                    });
                }
                // armed: dropping `pending` removes the entry from Redis
                Ok(Outcome::Closed) => return Err(Error::closed(self.name())),
                Ok(Outcome::Refused(detail)) => return Err(Error::NoPermission(detail)),
                // The ticket vanished (paused past its lease, or Redis lost its data):
                // queue again, at the back.
                Ok(Outcome::Lost) | Err(_) => {
                    tracing::info!(semaphore = %self.name(), "ticket lost while waiting; queueing again");
                    pending.disarm();
                    continue;
                }
            }
        }
    }

    /// Waits for `n` permits of this process's local cap.
    async fn local_permit(
        &self,
        sem: &Arc<tokio::sync::Semaphore>,
        n: u32,
        deadline: Option<&mut Deadline>,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, Error> {
        tokio::select! {
            p = sem.clone().acquire_many_owned(n) => p.map_err(|_| Error::closed(self.name())),
            _ = self.closed.cancelled() => Err(Error::closed(self.name())),
            e = timed_out(deadline, self.name()) => Err(e),
        }
    }

    /// Hands one request to the batching task and waits for its reply. After
    /// [`close`](Self::close), the batching task answers a request it has not sent yet with
    /// `Closed` (one already sent returns with its call): watching the token here too would
    /// make every request's future larger.
    async fn send_request(
        &self,
        id: &Arc<str>,
        n: u32,
        try_only: bool,
        custom: Option<Arc<Custom>>,
        deadline: Option<&mut Deadline>,
    ) -> Result<AcquireReply, Error> {
        let (tx, rx) = oneshot::channel();
        let request = batch::Request {
            id: id.clone(),
            n,
            try_only,
            custom,
            reply: tx,
        };
        if self.batch.send(request).is_err() {
            return Err(Error::closed(self.name()));
        }
        tokio::select! {
            r = rx => match r {
                Ok(r) => r.map_err(|e| Error::from_call(e, self.name())),
                Err(_) => Err(Error::closed(self.name())),
            },
            e = timed_out(deadline, self.name()) => Err(e),
        }
    }
}

/// The deadline of an acquire with a timeout: its timer (on the heap) and the timeout it
/// reports.
struct Deadline {
    sleep: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

/// Resolves with [`Error::Timeout`] (for the semaphore `name`) once `deadline` has passed;
/// never without one.
async fn timed_out(deadline: Option<&mut Deadline>, name: &str) -> Error {
    match deadline {
        Some(d) => {
            d.sleep.as_mut().await;
            Error::Timeout {
                name: name.to_owned(),
                timeout: d.timeout,
            }
        }
        None => std::future::pending().await,
    }
}

/// A pending acquire: registered as a local waiter before the script is sent (a grant may
/// be notified before the script's reply arrives). If dropped while armed (cancelled, timed
/// out, failed), it removes the waiter locally and the entry from Redis in the background,
/// and releases a grant that arrived meanwhile.
struct Pending<'a> {
    shared: &'a Arc<Handle>,
    id: Arc<str>,
    rx: Option<oneshot::Receiver<Outcome>>,
    armed: bool,
}

impl<'a> Pending<'a> {
    /// Registers the waiter (not for a try). `Err(Closed)` if the handle is closed: checked
    /// under the lock that [`Handle::close`] takes to wake the waiters, so none is missed.
    fn new(shared: &'a Arc<Handle>, try_only: bool) -> Result<Pending<'a>, Error> {
        let id: Arc<str> = shared.new_id().into();
        let rx = if try_only {
            None
        } else {
            let (tx, rx) = oneshot::channel();
            let mut st = shared.table.lock();
            if shared.closed.is_cancelled() {
                return Err(Error::closed(shared.name()));
            }
            if st.waiters.is_empty() {
                shared.heartbeat.first_waiter();
            }
            st.add_waiter(
                id.clone(),
                Waiter::new(tx, shared.name()),
                shared.timing.renew_every,
            );
            drop(st);
            shared.table.poke.notify_one();
            Some(rx)
        };
        Ok(Pending {
            shared,
            id,
            rx,
            armed: true,
        })
    }

    fn disarm(&mut self) -> String {
        self.armed = false;
        self.id.to_string()
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        {
            let mut st = self.shared.table.lock();
            if st.waiters.remove(&self.id).is_none() {
                // resolved meanwhile: a grant sits in the channel, nobody will take it
                if let Some(Ok(Outcome::Granted(..))) = self.rx.as_mut().map(|rx| rx.try_recv()) {
                    st.holders.remove(&*self.id);
                }
            }
        }
        // The script may have run even if its reply was lost: remove whatever exists.
        self.shared.table.release_in_background(self.id.to_string());
    }
}

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
use super::signal::LossSignal;
use super::table::{LeaseUse, Resolver};
use crate::core::{LeaseClock, Outcome, Queued, deadline_after};
use crate::error::{BackendError, Error, NoPermitsReason};
use crate::protocol::{AcquireReply, Grant};

/// What one acquisition asks for (validated by the public layer).
pub(crate) struct Ask {
    pub(crate) n: u32,
    pub(crate) try_only: bool,
    /// Give up after this long (counted from the first poll).
    pub(crate) timeout: Option<Duration>,
    /// Asked with a zero timeout: try-only, and its refusal is a timeout (the public layer
    /// turns it into one).
    pub(crate) zero_timeout: bool,
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
        self.acquire_untraced(Acquisition::new(ask, self.timing.lease))
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

    /// One acquisition. Its state lives in `acq`, captured by the future and used in place:
    /// an `async fn` would store its argument twice (as given, and moved into the body), and
    /// a local moved out of it or a value kept across the wait would be stored beside it (a
    /// waiting task carries this future as long as it waits; the test `future_size` keeps
    /// it small).
    #[allow(clippy::manual_async_fn)] // (the point: see above)
    fn acquire_untraced(
        self: &Arc<Self>,
        mut acq: Acquisition,
    ) -> impl Future<Output = Result<Held, Error>> + Send + '_ {
        async move {
            self.check_ask(acq.granted.n)?;
            acq.start_timer();
            // its session is renewed from now on, and by the permit once granted
            acq.granted.lease_use = (acq.granted.holder_lease != self.timing.lease)
                .then(|| self.table.use_lease(acq.granted.holder_lease));
            acq.granted.local = self
                .take_local_cap(acq.granted.n, acq.try_only, acq.deadline.as_mut())
                .await?;
            loop {
                let mut pending = Pending::new(self, acq.try_only)?;
                tracing::Span::current().record("holder", &*pending.id);
                // Boxed like the local cap: only the wait below lives as long as the queue.
                // (a `match` on the reply itself, no local: nothing of it is kept across the
                // waits below)
                let busy = match Box::pin(self.request(
                    &mut pending,
                    &mut acq.granted,
                    acq.deadline.as_mut(),
                ))
                .await
                {
                    Ok(Some(done)) => return done,
                    Ok(None) => false,
                    // the server cannot serve now (a failover, a slot in migration)
                    Err(e) if !acq.try_only && acq.busy.again(&e, acq.deadline.is_some()) => {
                        tracing::info!(semaphore = %self.name(), error = %e, "Redis cannot serve now; asking again");
                        true
                    }
                    Err(e) => return Err(e),
                };
                if busy {
                    // asked again after a pause, with a new entry (`pending`'s drop removes
                    // this one)
                    drop(pending);
                    Box::pin(self.pause_busy(&mut acq)).await?;
                    continue;
                }
                let rx = pending
                    .rx
                    .as_mut()
                    .expect("a waiting acquire has a receiver");
                // Closing the handle resolves the receiver (Outcome::Closed): no need to
                // watch the token here.
                let outcome = tokio::select! {
                    o = rx => o,
                    () = expiry(acq.deadline.as_mut()) => return Err(self.timeout_error(acq.timeout)),
                };
                if let Some(done) = self.on_outcome(&mut pending, outcome, &mut acq.granted) {
                    return done;
                }
            }
        }
    }

    /// Waits before asking again a server that could not serve ([`Busy`]); `Err(Timeout)`
    /// if the acquisition's timeout passes first.
    async fn pause_busy(&self, acq: &mut Acquisition) -> Result<(), Error> {
        let pause = tokio::time::sleep(acq.busy.next_delay());
        tokio::select! {
            () = pause => Ok(()),
            () = expiry(acq.deadline.as_mut()) => Err(self.timeout_error(acq.timeout)),
        }
    }

    /// [`Error::Timeout`] for an acquisition whose `timeout` passed.
    fn timeout_error(&self, timeout: Option<Duration>) -> Error {
        Error::Timeout {
            name: self.name().to_owned(),
            timeout: timeout.unwrap_or_default(),
        }
    }

    /// The checks that cost nothing: `n`, the closed flag, a request no limit can satisfy.
    fn check_ask(&self, n: u32) -> Result<(), Error> {
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
        Ok(())
    }

    /// Takes `n` permits of this process's local cap, if the handle has one.
    async fn take_local_cap(
        &self,
        n: u32,
        try_only: bool,
        deadline: Option<&mut Deadline>,
    ) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, Error> {
        Ok(match &self.local_cap {
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
            Some((_, sem)) => Some(Box::pin(self.local_permit(sem, n, deadline)).await?),
        })
    }

    /// Sends the request of `pending` and acts on the script's reply: `Some` when the
    /// acquisition is over (granted at once, refused), `None` when it waits in the queue.
    async fn request(
        self: &Arc<Self>,
        pending: &mut Pending<'_>,
        granted: &mut Granted,
        deadline: Option<&mut Deadline>,
    ) -> Result<Option<Result<Held, Error>>, Error> {
        let n = granted.n;
        let try_only = pending.rx.is_none();
        // before the request can reach Redis: the lease of a try-mode grant starts later
        let sent = Instant::now();
        let custom = granted.custom.clone();
        let reply = self
            .send_request(&pending.id, n, try_only, custom, deadline)
            .await?;
        Ok(match reply {
            AcquireReply::Granted(grant) if try_only => {
                Some(self.granted_at_once(pending, *grant, sent, granted))
            }
            AcquireReply::Granted(grant) => {
                self.table.deliver(&pending.id, Outcome::Granted(grant));
                None
            }
            AcquireReply::Queued {
                ticket,
                next_expiry_ms,
            } => {
                tracing::Span::current().record("ticket", ticket);
                tracing::debug!(ticket, "waiting in the queue");
                let priority = granted.custom.as_ref().map_or(0, |c| c.priority);
                let queued = Queued { ticket, priority };
                self.table.lock().waiter_queued(&pending.id, queued);
                self.heartbeat.lease_expires_in(next_expiry_ms);
                None
            }
            AcquireReply::NoCapacity { queued_first } => {
                pending.disarm();
                let reason = if queued_first {
                    NoPermitsReason::QueuedFirst
                } else {
                    NoPermitsReason::NoneFree
                };
                Some(Err(Error::no_permits(self.name(), reason)))
            }
            AcquireReply::TooMany { limit } => {
                pending.disarm();
                self.remote.set_limit(limit);
                Some(Err(Error::TooManyPermits {
                    name: self.name().to_owned(),
                    requested: n,
                    limit,
                }))
            }
        })
    }

    /// A try-mode request granted in the reply to a call sent at `sent`: the permit, unless
    /// the reply came too late to trust the grant (then it is given back).
    fn granted_at_once(
        self: &Arc<Self>,
        pending: &mut Pending<'_>,
        grant: Grant,
        sent: Instant,
        granted: &mut Granted,
    ) -> Result<Held, Error> {
        let now = Instant::now();
        if deadline_after(sent, granted.holder_lease) <= now {
            // the reply came too late to trust the grant: give it back
            let id = pending.disarm();
            self.table.release_in_background(id);
            return Err(Error::Unreachable(BackendError::timed_out(format!(
                "the grant of semaphore {:?} came back after its lease could have ended",
                self.name()
            ))));
        }
        let clock = LeaseClock::new(sent, now, granted.holder_lease, self.timing.renew_every);
        let signal = Arc::new(LossSignal::new());
        let id = pending.disarm();
        self.table
            .lock()
            .insert_holder(id.clone(), clock, signal.clone());
        self.table.poke.notify_one();
        Ok(granted.held(self, id, grant, signal))
    }

    /// A queued request was resolved with `outcome`: `Some` when the acquisition is over,
    /// `None` when it asks again.
    fn on_outcome(
        self: &Arc<Self>,
        pending: &mut Pending<'_>,
        outcome: Result<Outcome, oneshot::error::RecvError>,
        granted: &mut Granted,
    ) -> Option<Result<Held, Error>> {
        let done = match outcome {
            Ok(Outcome::Granted(grant)) => {
                let id = pending.disarm();
                let signal = self.trusted_grant(&id, granted.holder_lease)?;
                Ok(granted.held(self, id, *grant, signal))
            }
            // The limit shrank below the request, and Redis removed it: ask again, and
            // Redis answers with the limit as it is now (or queues it at the back, if
            // the limit grew back meanwhile).
            Ok(Outcome::Rejected) => {
                tracing::info!(semaphore = %self.name(), "rejected after a shrink of the limit; asking again");
                pending.disarm();
                return None;
            }
            // An operator removed it from the queue (its entry is gone in Redis).
            Ok(Outcome::Removed) => {
                pending.disarm();
                Err(Error::RemovedFromQueue {
                    name: self.name().to_owned(),
                })
            }
            // armed: dropping `pending` removes the entry from Redis
            Ok(Outcome::Closed) => Err(Error::closed(self.name())),
            Ok(Outcome::Refused(detail)) => Err(Error::NoPermission(detail)),
            // The ticket vanished (paused past its lease, or Redis lost its data):
            // queue again, at the back.
            Ok(Outcome::Lost) | Err(_) => {
                tracing::info!(semaphore = %self.name(), "ticket lost while waiting; queueing again");
                pending.disarm();
                return None;
            }
        };
        Some(done)
    }

    /// The holder `id` the state made of a granted waiter, if its grant can be trusted: its
    /// loss signal. A grant keeps the waiter's lease; the holder's own length counts from
    /// the first renewal sent after the grant (the state made the lease with the waiter's
    /// length; renewals since then may have used either). One that arrives after that lease
    /// could have run out (its notification or reply held up) may no longer be ours in
    /// Redis, nor one the heartbeat declared lost meanwhile: it is given back (`None`), and
    /// the request queues again, at the back.
    fn trusted_grant(&self, id: &str, holder_lease: Duration) -> Option<Arc<LossSignal>> {
        let now = Instant::now();
        let signal = self.table.lock().holder_mut(id).and_then(|h| {
            h.clock.set_len(holder_lease, now);
            let trusted = !h.signal.is_lost() && !h.clock.may_have_ended(now);
            trusted.then(|| h.signal.clone())
        });
        if signal.is_none() {
            tracing::info!(semaphore = %self.name(), "grant arrived too late to be trusted; queueing again");
            self.table.forget_holder(id);
            self.table.release_in_background(id.to_owned());
        }
        signal
    }

    /// Waits for `n` permits of this process's local cap.
    async fn local_permit(
        &self,
        sem: &Arc<tokio::sync::Semaphore>,
        n: u32,
        deadline: Option<&mut Deadline>,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, Error> {
        let timeout = deadline.as_ref().map(|d| d.timeout);
        tokio::select! {
            p = sem.clone().acquire_many_owned(n) => p.map_err(|_| Error::closed(self.name())),
            _ = self.closed.cancelled() => Err(Error::closed(self.name())),
            () = expiry(deadline) => Err(self.timeout_error(timeout)),
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
        let timeout = deadline.as_ref().map(|d| d.timeout);
        tokio::select! {
            r = rx => match r {
                Ok(r) => r.map_err(|e| Error::from_call(e, self.name())),
                Err(_) => Err(Error::closed(self.name())),
            },
            () = expiry(deadline) => Err(self.timeout_error(timeout)),
        }
    }
}

/// How long an acquisition without a timeout asks again while the server cannot serve
/// ([`Busy`]): about what a failover takes.
const BUSY_FOR: Duration = Duration::from_secs(15);

/// An acquisition's answers of a server that cannot serve now (a reply `TRYAGAIN`,
/// `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`, `BUSY`, `READONLY`: a failover, a slot in
/// migration, a restart), which it asks again after, with backoff: until its timeout, or for
/// [`BUSY_FOR`] without one (then the error is returned). A connection the server dropped
/// (a restart: the first call after it finds the old connection closed, while the server
/// is back) is asked again once, on the connection made anew (the request is idempotent per
/// id). A server that does not answer, a refused connection, or a second drop fails at once
/// as before (`Unreachable`: the caller decides), and so does a `try_acquire` (one round
/// trip).
#[derive(Default)]
struct Busy {
    /// The first such answer, and how many there were.
    since: Option<Instant>,
    answers: u32,
    /// A dropped connection was asked again already.
    dropped: bool,
}

impl Busy {
    /// Whether to ask again after `e` (`timed`: the acquisition has a timeout).
    fn again(&mut self, e: &Error, timed: bool) -> bool {
        // a reply of the server (with a code), classed as "cannot serve now"
        let busy = matches!(e, Error::Unreachable(b) if b.code().is_some());
        let dropped = matches!(e, Error::Unreachable(b)
            if b.code().is_none() && b.is_connection() && !b.is_timeout() && !b.is_refusal());
        if dropped && !std::mem::replace(&mut self.dropped, true) {
            self.answers += 1;
            return true;
        }
        if !busy {
            return false;
        }
        self.answers += 1;
        let since = *self.since.get_or_insert_with(Instant::now);
        timed || since.elapsed() < BUSY_FOR
    }

    /// The pause before asking again: 50 ms, doubling up to 1 s.
    fn next_delay(&self) -> Duration {
        Duration::from_millis(50 << self.answers.saturating_sub(1).min(4))
            .min(Duration::from_secs(1))
    }
}

/// One acquisition's state, owned by its future: the request and what it holds, the mode,
/// and the timer of a timeout (made at the first poll).
struct Acquisition {
    granted: Granted,
    /// The server's answers that it cannot serve now ([`Busy`]).
    busy: Busy,
    try_only: bool,
    timeout: Option<Duration>,
    deadline: Option<Deadline>,
}

impl Acquisition {
    /// The state of `ask` before its first poll (`lease`: the handle's holder lease).
    fn new(ask: Ask, lease: Duration) -> Acquisition {
        let holder_lease = ask.custom.as_ref().and_then(|c| c.lease).unwrap_or(lease);
        Acquisition {
            granted: Granted {
                n: ask.n,
                holder_lease,
                custom: ask.custom,
                local: None,
                lease_use: None,
            },
            busy: Busy::default(),
            try_only: ask.try_only,
            timeout: ask.timeout,
            deadline: None,
        }
    }

    /// Starts the timer of a timeout (at the first poll). Only an acquire with a timeout
    /// carries one, and on the heap.
    fn start_timer(&mut self) {
        self.deadline = self.timeout.map(|timeout| Deadline {
            sleep: Box::pin(tokio::time::sleep(timeout)),
            timeout,
        });
    }
}

/// What a grant turns into a permit: the request, and what it holds while it waits (the
/// local cap's permits, the use of its lease length).
struct Granted {
    n: u32,
    holder_lease: Duration,
    custom: Option<Arc<Custom>>,
    local: Option<tokio::sync::OwnedSemaphorePermit>,
    lease_use: Option<LeaseUse>,
}

impl Granted {
    /// The permit of the holder `id` with `grant` (once: what it holds moves into it).
    fn held(
        &mut self,
        handle: &Arc<Handle>,
        id: String,
        grant: Grant,
        signal: Arc<LossSignal>,
    ) -> Held {
        let (local, lease_use) = (self.local.take(), self.lease_use.take());
        let max_hold = self.custom.as_ref().and_then(|c| c.max_hold);
        Held::new(handle.clone(), id, self.n, grant, signal, local, lease_use)
            .with_max_hold(max_hold)
    }
}

/// The deadline of an acquire with a timeout: its timer (on the heap) and the timeout it
/// reports.
struct Deadline {
    sleep: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

/// Resolves once `deadline` has passed; never without one. A plain future over the timer
/// rather than an `async fn` that builds the error: it is part of every waiting future.
fn expiry(deadline: Option<&mut Deadline>) -> impl Future<Output = ()> + Send + '_ {
    use futures_util::future::Either;
    match deadline {
        Some(d) => Either::Left(d.sleep.as_mut()),
        None => Either::Right(std::future::pending()),
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
            st.add_waiter(id.clone(), Resolver::new(tx, shared.name()), Instant::now());
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
            if st.remove_waiter(&self.id).is_none() {
                // resolved meanwhile: a grant sits in the channel, nobody will take it
                if let Some(Ok(Outcome::Granted(..))) = self.rx.as_mut().map(|rx| rx.try_recv()) {
                    st.remove_holder(&self.id);
                }
            }
        }
        // The script may have run even if its reply was lost: remove whatever exists.
        self.shared.table.release_in_background(self.id.to_string());
    }
}

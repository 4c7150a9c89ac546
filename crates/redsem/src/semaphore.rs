//! [`Semaphore`]: a fair distributed semaphore; [`SemaphoreBuilder`] opens one.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::batch;
use crate::client::{Client, ClientInner};
use crate::driver::Msg;
use crate::error::{BackendError, Error};
use crate::heartbeat;
use crate::keys::Keys;
use crate::permit::{LeaseState, Permit};
use crate::scripts::{self, AcquireReply, Grant, Notice, Target};
use crate::stats::Stats;

/// Largest accepted limit. The slot numbers `0..limit` are materialised in Redis.
pub const MAX_LIMIT: u32 = 100_000;

/// The immutable part of a semaphore handle that background work needs (no reference back
/// to the client, so a pending release never keeps a client alive).
pub(crate) struct Core {
    pub(crate) keys: Keys,
    /// Last limit seen in Redis; used to re-create the configuration after a data loss.
    pub(crate) limit: AtomicU32,
    pub(crate) publish: &'static str,
}

impl Core {
    pub(crate) fn target(&self) -> Target<'_> {
        Target {
            keys: &self.keys,
            limit: self.limit.load(Ordering::Relaxed),
            publish: self.publish,
        }
    }
}

/// Timing and identity settings of a semaphore handle (validated by the builder).
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) lease: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) fallback_poll: Duration,
    pub(crate) margin: Duration,
    pub(crate) label: String,
}

/// Opens a [`Semaphore`]; made by [`Client::semaphore`].
#[derive(Debug)]
#[must_use = "a SemaphoreBuilder does nothing until .open().await"]
pub struct SemaphoreBuilder {
    client: Client,
    name: String,
    limit: u32,
    lease: Duration,
    renew_every: Option<Duration>,
    fallback_poll: Duration,
    local_cap: Option<u32>,
    label: Option<String>,
}

impl SemaphoreBuilder {
    pub(crate) fn new(client: Client, name: String, limit: u32) -> SemaphoreBuilder {
        SemaphoreBuilder {
            client,
            name,
            limit,
            lease: Duration::from_secs(10),
            renew_every: None,
            fallback_poll: Duration::from_secs(1),
            local_cap: None,
            label: None,
        }
    }

    /// Lease of each holder and waiter (default 10 s). A crashed holder's slot is free again
    /// at most one lease after its last renewal; a crashed waiter leaves the queue as fast.
    /// Live holders and waiters are renewed in the background, so the lease does not bound
    /// how long work may hold a permit.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often the leases of this process are renewed (default a third of the lease). Must
    /// be at most half the lease, so a failed renewal is retried before the lease runs out.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// Longest time a waiter relies on notifications alone (default 1 s): while this process
    /// has waiters, one batched call per interval also looks for grants whose notification
    /// was lost. It costs one script call per interval per process, whatever the number of
    /// waiters.
    pub fn fallback_poll(mut self, every: Duration) -> Self {
        self.fallback_poll = every;
        self
    }

    /// Caps the permits this process may have queued or held at once (an in-process
    /// semaphore in front of the distributed one), so one replica cannot flood the queue.
    pub fn local_cap(mut self, permits: u32) -> Self {
        self.local_cap = Some(permits);
        self
    }

    /// A label shown in [`Semaphore::stats`] for this process's holders and waiters
    /// (default `host:pid`). At most 200 bytes.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    fn validate(&self) -> Result<Settings, Error> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.limit == 0 {
            return bad("limit is 0: a semaphore needs at least one permit".into());
        }
        if self.limit > MAX_LIMIT {
            return bad(format!(
                "limit {} exceeds the maximum of {MAX_LIMIT}",
                self.limit
            ));
        }
        if self.lease < Duration::from_millis(20) {
            return bad(format!(
                "lease {:?} is shorter than the minimum of 20ms",
                self.lease
            ));
        }
        let renew_every = self.renew_every.unwrap_or(self.lease / 3);
        if renew_every.is_zero() || renew_every > self.lease / 2 {
            return bad(format!(
                "renewal interval {renew_every:?} must be greater than zero and at most half the lease ({:?}): \
                 lengthen the lease or renew more often",
                self.lease
            ));
        }
        if self.fallback_poll < Duration::from_millis(1) {
            return bad("fallback poll interval must be at least 1ms".into());
        }
        if self.local_cap == Some(0) {
            return bad("local cap is 0: it must allow at least one permit".into());
        }
        let label = match &self.label {
            Some(l) => l.clone(),
            None => default_label(),
        };
        if label.len() > 200 {
            return bad(format!(
                "label is {} bytes long; the maximum is 200",
                label.len()
            ));
        }
        Ok(Settings {
            lease: self.lease,
            renew_every,
            fallback_poll: self.fallback_poll,
            margin: (self.lease / 10).min(Duration::from_secs(1)),
            label,
        })
    }

    /// Subscribes to this handle's notification channel, creates the semaphore in Redis if it
    /// does not exist, and checks that the stored limit is the one asked for.
    ///
    /// Cost: two round trips (SUBSCRIBE, one script), once per handle.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad name, limit (0 or above [`MAX_LIMIT`]), lease,
    /// renewal interval, local cap or label, before anything is sent;
    /// [`Error::LimitConflict`] when the semaphore exists with another limit;
    /// [`Error::WrongType`] when one of its keys holds a foreign value; connection and
    /// permission errors as they come.
    pub async fn open(self) -> Result<Semaphore, Error> {
        let settings = self.validate()?;
        let inner = self.client.inner.clone();
        let keys = Keys::new(&inner.prefix, &self.name)?;
        let channel_suffix = inner.channel_suffix();
        let channel = keys.channel(&channel_suffix);
        let core = Arc::new(Core {
            keys,
            limit: AtomicU32::new(self.limit),
            publish: inner.publish,
        });
        let closed = CancellationToken::new();
        let batch = batch::spawn(
            core.clone(),
            closed.clone(),
            inner.conn.clone(),
            inner.driver.clone(),
            batch::Fixed {
                lease_ms: settings.lease.as_millis() as u64,
                wait_lease_ms: settings.lease.as_millis() as u64,
                channel_suffix: channel_suffix.clone(),
                label: settings.label.clone(),
            },
        );
        let shared = Arc::new(SemShared {
            client: inner.clone(),
            batch,
            core,
            settings,
            channel_suffix,
            channel: channel.clone(),
            state: Mutex::new(Local::default()),
            poke: Arc::new(Notify::new()),
            closed,
            stop: CancellationToken::new(),
            local_cap: self
                .local_cap
                .map(|n| (n, Arc::new(tokio::sync::Semaphore::new(n as usize)))),
        });
        // From here on, dropping `shared` unsubscribes (see Drop).
        inner
            .notifier
            .subscribe(&channel, Arc::downgrade(&shared), &self.name)
            .await?;
        let mut conn = inner.conn.clone();
        let (stored, created) = scripts::open(&mut conn, &shared.core.target())
            .await
            .map_err(|e| Error::from_redis(e, &self.name))?;
        if stored != self.limit {
            return Err(Error::LimitConflict {
                name: self.name,
                requested: self.limit,
                stored,
            });
        }
        tracing::debug!(semaphore = %self.name, limit = stored, created, "opened");
        heartbeat::spawn(&shared);
        Ok(Semaphore { shared })
    }
}

fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    format!("{}:{}", host.trim(), std::process::id())
}

/// What a pending acquire is told by whoever resolves it first (its own reply, the
/// notifier, or the heartbeat).
pub(crate) enum Outcome {
    /// Boxed: every waiter's channel has room for one outcome, and few are grants at once.
    Granted(Box<Grant>, Arc<LeaseState>),
    /// The request can never be satisfied (the limit shrank below it).
    Rejected,
    /// The ticket vanished from Redis (expired while this process was paused, or data loss).
    Lost,
    /// The handle was closed ([`Semaphore::close`]).
    Closed,
}

/// How an entry is resolved (see [`SemShared::deliver`]).
pub(crate) enum Delivery {
    Granted(Grant),
    Rejected,
    Lost,
}

struct Waiter {
    tx: oneshot::Sender<Outcome>,
    /// Send time of the last call that confirmed this waiter's lease (its enqueue or a
    /// renewal). A grant keeps that lease, so the holder's lease clock starts here.
    renewed_at: Instant,
    /// Redis confirmed the ticket (the acquire call returned "queued"). Until then the
    /// heartbeat leaves it out: a renewal that overtook the acquire would find it missing.
    queued: bool,
    /// Counts this waiter in `redsem_local_waiters` while it lives (feature `metrics`).
    _gauge: crate::metrics::WaiterGauge,
}

/// This process's view of one semaphore handle: its waiters and holders.
pub(crate) struct Local {
    /// Keyed by the waiter's id, shared with its pending acquire (one allocation).
    waiters: HashMap<Arc<str>, Waiter>,
    pub(crate) holders: HashMap<String, Arc<LeaseState>>,
    /// When the heartbeat should look again because a lease in Redis is due to expire.
    pub(crate) next_check: Option<Instant>,
    /// Last time the waiters were checked (for the fallback poll).
    pub(crate) waiters_checked_at: Instant,
    /// Retry time after a failed heartbeat.
    pub(crate) retry_at: Option<Instant>,
    /// Set by a reconnect: check everything at once.
    pub(crate) force: bool,
}

impl Default for Local {
    fn default() -> Self {
        Local {
            waiters: HashMap::new(),
            holders: HashMap::new(),
            next_check: None,
            waiters_checked_at: Instant::now(),
            retry_at: None,
            force: false,
        }
    }
}

impl Local {
    /// The waiters whose ticket Redis confirmed (only those can be renewed).
    pub(crate) fn waiter_ids(&self) -> Vec<Arc<str>> {
        self.waiters
            .iter()
            .filter(|(_, w)| w.queued)
            .map(|(id, _)| id.clone())
            .collect()
    }
    /// Records a confirmed renewal of a waiter's lease, sent at `sent`.
    pub(crate) fn waiter_renewed(&mut self, id: &str, sent: Instant) {
        if let Some(w) = self.waiters.get_mut(id) {
            w.renewed_at = w.renewed_at.max(sent);
        }
    }
    pub(crate) fn has_waiters(&self) -> bool {
        !self.waiters.is_empty()
    }
}

pub(crate) struct SemShared {
    pub(crate) client: Arc<ClientInner>,
    /// Acquisitions go through the batching task (see batch.rs).
    batch: tokio::sync::mpsc::UnboundedSender<batch::Request>,
    pub(crate) core: Arc<Core>,
    pub(crate) settings: Settings,
    pub(crate) channel_suffix: String,
    channel: String,
    pub(crate) state: Mutex<Local>,
    /// Wakes the heartbeat to recompute its schedule.
    pub(crate) poke: Arc<Notify>,
    closed: CancellationToken,
    /// Cancelled when the last handle is gone: stops the heartbeat.
    pub(crate) stop: CancellationToken,
    local_cap: Option<(u32, Arc<tokio::sync::Semaphore>)>,
}

impl Drop for SemShared {
    fn drop(&mut self) {
        self.stop.cancel();
        self.client.driver.send(Msg::Unsubscribe {
            channel: self.channel.clone(),
        });
    }
}

impl SemShared {
    pub(crate) fn name(&self) -> &str {
        &self.core.keys.name
    }

    pub(crate) fn limit(&self) -> u32 {
        self.core.limit.load(Ordering::Relaxed)
    }

    /// Removes `id` from Redis in the background (idempotent).
    pub(crate) fn release_in_background(&self, id: String) {
        self.client.driver.send(Msg::Release {
            core: self.core.clone(),
            id,
        });
    }

    /// Resolves the pending acquire `id`, if it is still pending. The first resolution wins;
    /// a grant nobody waits for any more is released.
    pub(crate) fn deliver(&self, id: &str, what: Delivery) {
        let mut st = self.state.lock().unwrap();
        let Some(waiter) = st.waiters.remove(id) else {
            let orphan_grant = matches!(what, Delivery::Granted(_)) && !st.holders.contains_key(id);
            drop(st);
            if orphan_grant {
                self.release_in_background(id.to_owned());
            }
            return;
        };
        let outcome = match what {
            Delivery::Granted(grant) => {
                let lease = Arc::new(LeaseState::new(waiter.renewed_at));
                st.holders.insert(id.to_owned(), lease.clone());
                Outcome::Granted(Box::new(grant), lease)
            }
            Delivery::Rejected => Outcome::Rejected,
            Delivery::Lost => Outcome::Lost,
        };
        if let Err(Outcome::Granted(..)) = waiter.tx.send(outcome) {
            st.holders.remove(id);
            drop(st);
            self.release_in_background(id.to_owned());
            return;
        }
        drop(st);
        // the heartbeat's schedule changed (a new holder to renew, one waiter fewer)
        self.poke.notify_one();
    }

    /// Handles a message from this handle's channel.
    pub(crate) fn on_notices(&self, payload: &str) {
        for notice in scripts::parse_notices(payload) {
            match notice {
                Notice::Granted { id, grant } => self.deliver(&id, Delivery::Granted(grant)),
                Notice::Rejected { id } => self.deliver(&id, Delivery::Rejected),
            }
        }
    }

    /// Whether a lease last confirmed by a call sent at `confirmed` could have run out in
    /// Redis by now (the heartbeat's deadline: lease − safety margin).
    pub(crate) fn lease_may_have_ended(&self, confirmed: Instant) -> bool {
        confirmed + self.settings.lease - self.settings.margin <= Instant::now()
    }

    /// Asks the heartbeat to check every waiter and holder now (after a reconnect).
    pub(crate) fn recheck_now(&self) {
        self.state.lock().unwrap().force = true;
        self.poke.notify_one();
    }

    /// Closes the handle: wakes every pending acquire with [`Outcome::Closed`] (they remove
    /// their entries from Redis as they return). An acquire that registers later sees the
    /// token cancelled under the same lock.
    fn close(&self) {
        self.closed.cancel();
        let waiters = std::mem::take(&mut self.state.lock().unwrap().waiters);
        for (_, w) in waiters {
            let _ = w.tx.send(Outcome::Closed);
        }
        self.poke.notify_one();
    }

    /// A permit's holder is done with it (released, dropped or lost).
    pub(crate) fn forget_holder(&self, id: &str) {
        self.state.lock().unwrap().holders.remove(id);
    }

    fn schedule_check(&self, after_ms: Option<u64>) {
        if let Some(ms) = after_ms {
            // a few ms late, so that the lease has expired by Redis's clock too
            let at = Instant::now() + Duration::from_millis(ms + 2);
            let mut st = self.state.lock().unwrap();
            st.next_check = Some(st.next_check.map_or(at, |t| t.min(at)));
        }
        self.poke.notify_one();
    }

    fn new_id(&self) -> String {
        let r = uuid::Uuid::new_v4().simple().to_string();
        format!("{}-{}", self.channel_suffix, &r[..12])
    }

    /// One acquisition, traced (span `redsem.acquire`) and measured (feature `metrics`); in
    /// synced mode, the grant is confirmed on enough replicas.
    ///
    /// Built from combinators rather than `async fn` layers: each layer would store its own
    /// copy of the arguments (and of the result) in the future, and a waiting task carries
    /// that future as long as it waits. The synced-mode step is boxed for the same reason.
    fn acquire_inner(
        self: &Arc<Self>,
        n: u32,
        try_only: bool,
        deadline: Option<(Instant, Duration)>,
    ) -> impl Future<Output = Result<Permit, Error>> + Send + '_ {
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
        self.acquire_untraced(n, try_only, deadline)
            .then(move |result| match result {
                Ok(permit) if self.client.synced.is_some() => {
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
    fn record_acquire(&self, result: &Result<Permit, Error>, started: Instant) {
        let waited = started.elapsed();
        match result {
            Ok(permit) => {
                let span = tracing::Span::current();
                span.record("ticket", permit.ticket());
                span.record("slots", tracing::field::debug(permit.slots()));
                tracing::debug!(waited_ms = waited.as_millis() as u64, "granted");
                crate::metrics::acquired(self.name(), waited);
            }
            Err(e) => {
                tracing::debug!(error = %e, waited_ms = waited.as_millis() as u64, "acquire failed");
                crate::metrics::acquire_failed(self.name(), e);
            }
        }
    }

    async fn acquire_untraced(
        self: &Arc<Self>,
        n: u32,
        try_only: bool,
        deadline: Option<(Instant, Duration)>,
    ) -> Result<Permit, Error> {
        if n == 0 {
            return Err(Error::InvalidArgument(
                "cannot acquire 0 permits: ask for at least one".into(),
            ));
        }
        if self.closed.is_cancelled() {
            return Err(Error::Closed);
        }
        let limit = self.limit();
        if n > limit {
            return Err(Error::TooManyPermits {
                requested: n,
                limit,
            });
        }
        // Only an acquire with a deadline carries a timer, and on the heap: a waiting acquire
        // future stays small (one per waiting task; see the benchmark's `memory` scenario).
        let mut deadline = deadline.map(|(at, timeout)| Deadline {
            sleep: Box::pin(tokio::time::sleep_until(at)),
            timeout,
        });
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
                    .map_err(|_| Error::NoPermits)?,
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
                let reply =
                    Box::pin(self.send_request(&pending.id, n, try_only, deadline.as_mut()))
                        .await?;
                match reply {
                    AcquireReply::Granted(grant) if try_only => {
                        if self.lease_may_have_ended(sent) {
                            // the reply came too late to trust the grant: give it back
                            let id = pending.disarm();
                            self.release_in_background(id);
                            return Err(Error::Unreachable(BackendError::timed_out(format!(
                                "the grant of semaphore {:?} came back after its lease could have ended",
                                self.name()
                            ))));
                        }
                        let lease = Arc::new(LeaseState::new(sent));
                        self.state
                            .lock()
                            .unwrap()
                            .holders
                            .insert(pending.id.to_string(), lease.clone());
                        self.poke.notify_one();
                        let id = pending.disarm();
                        return Ok(Permit::new(self.clone(), id, n, *grant, lease, local));
                    }
                    AcquireReply::Granted(grant) => {
                        self.deliver(&pending.id, Delivery::Granted(*grant))
                    }
                    AcquireReply::Queued {
                        ticket,
                        next_expiry_ms,
                    } => {
                        tracing::Span::current().record("ticket", ticket);
                        tracing::debug!(ticket, "waiting in the queue");
                        if let Some(w) = self.state.lock().unwrap().waiters.get_mut(&pending.id) {
                            w.queued = true;
                        }
                        self.schedule_check(next_expiry_ms)
                    }
                    AcquireReply::NoCapacity => {
                        pending.disarm();
                        return Err(Error::NoPermits);
                    }
                    AcquireReply::TooMany { limit } => {
                        pending.disarm();
                        self.core.limit.store(limit, Ordering::Relaxed);
                        return Err(Error::TooManyPermits {
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
                e = timed_out(deadline.as_mut()) => return Err(e),
            };
            match outcome {
                Ok(Outcome::Granted(grant, lease)) => {
                    let id = pending.disarm();
                    // A grant keeps the waiter's lease. One that arrives after that lease
                    // could have run out (its notification or reply held up) may no longer be
                    // ours in Redis: give it back and queue again, at the back.
                    if lease.is_lost() || self.lease_may_have_ended(lease.renewed_at()) {
                        tracing::info!(semaphore = %self.name(), "grant arrived too late to be trusted; queueing again");
                        self.forget_holder(&id);
                        self.release_in_background(id);
                        continue;
                    }
                    return Ok(Permit::new(self.clone(), id, n, *grant, lease, local));
                }
                Ok(Outcome::Rejected) => {
                    pending.disarm();
                    return Err(Error::TooManyPermits {
                        requested: n,
                        limit: self.limit(),
                    });
                }
                // armed: dropping `pending` removes the entry from Redis
                Ok(Outcome::Closed) => return Err(Error::Closed),
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
            p = sem.clone().acquire_many_owned(n) => p.map_err(|_| Error::Closed),
            _ = self.closed.cancelled() => Err(Error::Closed),
            e = timed_out(deadline) => Err(e),
        }
    }

    /// Hands one request to the batching task and waits for its reply. After [`close`](Self::close), the batching task answers a request it
    /// has not sent yet with `Closed` (one already sent returns with its call): watching the
    /// token here too would make every request's future larger.
    async fn send_request(
        &self,
        id: &Arc<str>,
        n: u32,
        try_only: bool,
        deadline: Option<&mut Deadline>,
    ) -> Result<AcquireReply, Error> {
        let (tx, rx) = oneshot::channel();
        let request = batch::Request {
            id: id.clone(),
            n,
            try_only,
            reply: tx,
        };
        if self.batch.send(request).is_err() {
            return Err(Error::Closed);
        }
        tokio::select! {
            r = rx => match r {
                Ok(r) => r.map_err(|e| Error::from_redis(e, self.name())),
                Err(_) => Err(Error::Closed),
            },
            e = timed_out(deadline) => Err(e),
        }
    }
}

/// The deadline of an acquire with a timeout: its timer (on the heap) and the timeout it
/// reports.
struct Deadline {
    sleep: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

/// Resolves with [`Error::Timeout`] once `deadline` has passed; never without one.
async fn timed_out(deadline: Option<&mut Deadline>) -> Error {
    match deadline {
        Some(d) => {
            d.sleep.as_mut().await;
            Error::Timeout(d.timeout)
        }
        None => std::future::pending().await,
    }
}

/// A pending acquire: registered as a local waiter before the script is sent (a grant may
/// be notified before the script's reply arrives). If dropped while armed (cancelled, timed
/// out, failed), it removes the waiter locally and the entry from Redis in the background,
/// and releases a grant that arrived meanwhile.
struct Pending<'a> {
    shared: &'a Arc<SemShared>,
    id: Arc<str>,
    rx: Option<oneshot::Receiver<Outcome>>,
    armed: bool,
}

impl<'a> Pending<'a> {
    /// Registers the waiter (not for a try). `Err(Closed)` if the handle is closed: checked
    /// under the lock that [`SemShared::close`] takes to wake the waiters, so none is missed.
    fn new(shared: &'a Arc<SemShared>, try_only: bool) -> Result<Pending<'a>, Error> {
        let id: Arc<str> = shared.new_id().into();
        let rx = if try_only {
            None
        } else {
            let (tx, rx) = oneshot::channel();
            let mut st = shared.state.lock().unwrap();
            if shared.closed.is_cancelled() {
                return Err(Error::Closed);
            }
            if st.waiters.is_empty() {
                st.waiters_checked_at = Instant::now();
            }
            st.waiters.insert(
                id.clone(),
                Waiter {
                    tx,
                    renewed_at: Instant::now(),
                    queued: false,
                    _gauge: crate::metrics::WaiterGauge::new(shared.name()),
                },
            );
            drop(st);
            shared.poke.notify_one();
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
            let mut st = self.shared.state.lock().unwrap();
            if st.waiters.remove(&self.id).is_none() {
                // resolved meanwhile: a grant sits in the channel, nobody will take it
                if let Some(Ok(Outcome::Granted(..))) = self.rx.as_mut().map(|rx| rx.try_recv()) {
                    st.holders.remove(&*self.id);
                }
            }
        }
        // The script may have run even if its reply was lost: remove whatever exists.
        self.shared.release_in_background(self.id.to_string());
    }
}

/// A fair (FIFO), crash-safe counting semaphore whose permits are shared by every process
/// that opens it under the same name on the same Redis.
///
/// Modelled on [`tokio::sync::Semaphore`]'s owned permits: [`acquire`](Self::acquire) waits
/// in FIFO order and returns a [`Permit`] that releases on drop. Differences that follow
/// from being distributed:
///
/// - every acquire and release is a round trip to Redis, and even
///   [`try_acquire`](Self::try_acquire) is `async`;
/// - a permit holds a *lease* renewed in the background; if renewal fails it is *lost*, and
///   [`Permit::run`] cancels the guarded work;
/// - each permit carries slot numbers in `0..limit` and a fencing token per slot.
///
/// # Fairness
/// Permits are granted strictly in ticket order. An [`acquire_many`](Self::acquire_many) at
/// the head of the queue blocks smaller requests behind it until enough permits are free:
/// no request starves, at the cost of idle permits while a large request waits.
///
/// # Cost
/// At most one script call per acquisition (granted at once, or queued and later notified
/// with no further round trip; acquisitions made while a call is in flight share the next
/// one) and one per release, whatever the number of waiters. Per process and
/// semaphore handle, one batched renewal call every renewal interval while it holds permits,
/// and every fallback interval while it has waiters.
///
/// Cloning is cheap; clones share waiters, holders, heartbeat and channel.
#[derive(Clone)]
pub struct Semaphore {
    pub(crate) shared: Arc<SemShared>,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name())
            .field("limit", &self.limit())
            .finish_non_exhaustive()
    }
}

impl Semaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.shared.name()
    }

    /// The limit as last seen in Redis (at open, resize, stats or a rejected request). Use
    /// [`stats`](Self::stats) for the current value.
    pub fn limit(&self) -> u32 {
        self.shared.limit()
    }

    /// Waits for one permit, in FIFO order.
    ///
    /// # Cancel safety
    /// Dropping the future gives up its place in the queue: the ticket is removed in the
    /// background (or expires with its lease), and a grant that arrived meanwhile is
    /// released. Nothing leaks.
    ///
    /// # Errors
    /// [`Error::Closed`] after [`close`](Self::close); connection and permission errors as
    /// they come. A ticket lost while waiting (this process paused past the lease, Redis
    /// restarted) is queued again, at the back, without an error.
    pub async fn acquire(&self) -> Result<Permit, Error> {
        self.shared.acquire_inner(1, false, None).await
    }

    /// Waits for `n` permits at once, in FIFO order (see [Fairness](Self#fairness)).
    ///
    /// # Cancel safety
    /// As for [`acquire`](Self::acquire).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `n == 0`; [`Error::TooManyPermits`] when `n` exceeds
    /// the limit (checked before queueing, and again if the limit shrinks below `n` while
    /// waiting); otherwise as [`acquire`](Self::acquire).
    pub async fn acquire_many(&self, n: u32) -> Result<Permit, Error> {
        self.shared.acquire_inner(n, false, None).await
    }

    /// [`acquire`](Self::acquire) that gives up after `timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`] when no permit was granted in time (its place in the queue is
    /// given up); otherwise as [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Permit, Error> {
        self.acquire_many_timeout(1, timeout).await
    }

    /// [`acquire_many`](Self::acquire_many) that gives up after `timeout`.
    ///
    /// # Errors
    /// As [`acquire_timeout`](Self::acquire_timeout) and [`acquire_many`](Self::acquire_many).
    pub async fn acquire_many_timeout(&self, n: u32, timeout: Duration) -> Result<Permit, Error> {
        let deadline = Instant::now() + timeout;
        self.shared
            .acquire_inner(n, false, Some((deadline, timeout)))
            .await
    }

    /// Takes one permit only if one is free now and nobody is queued (FIFO: a free permit
    /// belongs to the head of the queue). One round trip; never queues.
    ///
    /// # Errors
    /// [`Error::NoPermits`] when it would have to wait; otherwise as
    /// [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Permit, Error> {
        self.shared.acquire_inner(1, true, None).await
    }

    /// Takes `n` permits only if they are free now and nobody is queued.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire) and [`acquire_many`](Self::acquire_many).
    pub async fn try_acquire_many(&self, n: u32) -> Result<Permit, Error> {
        self.shared.acquire_inner(n, true, None).await
    }

    /// Acquires one permit, runs `work` under it and releases it; if the permit is lost
    /// first, `work` is dropped (cancelled at its next `.await`) and
    /// [`Error::LeaseLost`] returned. See [`Permit::run`].
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), and [`Error::LeaseLost`].
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        self.acquire().await?.run(work).await
    }

    /// A consistent snapshot of the semaphore in Redis: limit, permits in use, every holder
    /// and waiter. One round trip; its size grows with holders and waiters.
    ///
    /// # Errors
    /// Connection and permission errors.
    pub async fn stats(&self) -> Result<Stats, Error> {
        let mut conn = self.shared.client.conn.clone();
        let raw = scripts::stats(&mut conn, &self.shared.core.target())
            .await
            .map_err(|e| Error::from_redis(e, self.name()))?;
        self.shared.core.limit.store(raw.limit, Ordering::Relaxed);
        let stats = Stats::from_raw(self.name(), raw)?;
        crate::metrics::expiries_seen(self.name(), stats.expired_total);
        Ok(stats)
    }

    /// Changes the limit for every replica, live. Growing admits waiters at once; shrinking
    /// lets holders finish and admits nobody until the permits in use are below the new
    /// limit (queued requests larger than the new limit fail with
    /// [`Error::TooManyPermits`]). Returns the previous limit.
    ///
    /// Processes that open the semaphore later must pass the new limit.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 or a limit above [`MAX_LIMIT`]; connection errors.
    pub async fn resize(&self, new_limit: u32) -> Result<u32, Error> {
        if new_limit == 0 || new_limit > MAX_LIMIT {
            return Err(Error::InvalidArgument(format!(
                "limit must be between 1 and {MAX_LIMIT}, not {new_limit}"
            )));
        }
        let mut conn = self.shared.client.conn.clone();
        let old = scripts::resize(&mut conn, &self.shared.core.target(), new_limit)
            .await
            .map_err(|e| Error::from_redis(e, self.name()))?;
        self.shared.core.limit.store(new_limit, Ordering::Relaxed);
        Ok(old)
    }

    /// An operator's release of another holder's permit (or of a queued ticket) by its
    /// holder id, as shown by [`stats`](Self::stats). The fences of its slots advance at
    /// once, so a protected resource rejects the evicted holder's further writes; its next
    /// renewal finds the permit gone. Returns whether the entry existed.
    ///
    /// # Errors
    /// Connection and permission errors.
    pub async fn force_release(&self, holder_id: &str) -> Result<bool, Error> {
        let mut conn = self.shared.client.conn.clone();
        let n = scripts::release(&mut conn, &self.shared.core.target(), &[holder_id], true)
            .await
            .map_err(|e| Error::from_redis(e, self.name()))?;
        Ok(n > 0)
    }

    /// Closes this handle and its clones in this process, like
    /// [`tokio::sync::Semaphore::close`]: pending and future acquires fail with
    /// [`Error::Closed`] (one whose script call is in flight, once that call returns) and
    /// their entries are removed from Redis in the background. Held permits stay valid until
    /// dropped. Other processes are not affected.
    pub fn close(&self) {
        self.shared.close();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.is_cancelled()
    }

    /// Permits this process holds or waits for through this handle, without I/O:
    /// `(holders, waiters)` entries.
    pub fn local_counts(&self) -> (usize, usize) {
        let st = self.shared.state.lock().unwrap();
        (st.holders.len(), st.waiters.len())
    }
}

//! [`Semaphore`]: a fair distributed semaphore, a thin public handle over the engine's
//! per-handle state. [`SemaphoreBuilder`](crate::SemaphoreBuilder) opens one.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::admin::{ForceReleased, Resized};
use crate::engine::Handle;
use crate::error::Error;
use crate::handoff::HandoffToken;
use crate::options::AcquireOptions;
use crate::permit::Permit;
use crate::protocol;
use crate::stats::Stats;

pub use crate::protocol::keys::MAX_LIMIT;

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
/// no request starves, at the cost of idle permits while a large request waits. An
/// acquisition may carry a priority class ([`AcquireOptions::priority`]): higher classes are
/// served first, FIFO within a class, and a request is overtaken by at most 1000 later ones
/// per class above its own, so none starves either.
///
/// # Cost
/// At most one script call per acquisition (granted at once, or queued and later notified
/// with no further round trip; acquisitions made while a call is in flight share the next
/// one) and at most one per release (releases made while one is in flight share the next),
/// whatever the number of waiters. Per open semaphore handle, one
/// renewal every renewal interval while it holds permits, and every fallback or renewal
/// interval, whichever is shorter, while it has waiters: it renews the handle's session and
/// checks its holders, and costs Redis the same whatever the number of waiters (waiters are
/// checked one by one only when a lost notification is suspected). The renewals of all the
/// handles of a client that fall due together share one script call per Redis node.
///
/// Cloning is cheap; clones share waiters, holders, heartbeat and channel.
#[derive(Clone)]
pub struct Semaphore {
    pub(crate) handle: Arc<Handle>,
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
        self.handle.name()
    }

    /// The limit as last seen in Redis (at open, resize, stats, a renewal or a rejected
    /// request). Use [`stats`](Self::stats) for the current value.
    pub fn limit(&self) -> u32 {
        self.handle.limit()
    }

    /// Permits free, as last seen in Redis: a snapshot, like
    /// [`tokio::sync::Semaphore::available_permits`], but of a semaphore shared with other
    /// processes, so it may be stale by the time it is read. Synchronous, no I/O.
    ///
    /// Updated by every reply that carries it: opening the handle, each acquisition call,
    /// each renewal (every renewal interval while this handle holds or waits), and
    /// [`stats`](Self::stats), which reads it fresh. Free permits may still be taken by
    /// requests queued first (FIFO); use [`try_acquire`](Self::try_acquire) to take one.
    pub fn available_permits(&self) -> u32 {
        self.handle.remote.free()
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
    /// they come ([`Error::Unreachable`] at once when Redis does not answer). A server that
    /// answers that it cannot serve now (`TRYAGAIN` while a slot migrates, `CLUSTERDOWN` or
    /// `READONLY` during a failover, `LOADING` after a restart) is asked again with backoff
    /// (50 ms doubling to 1 s): until the acquisition's timeout, or for 15 s without one,
    /// after which its error is returned. A ticket lost while waiting (this process paused past the lease, Redis
    /// restarted) is queued again, at the back, without an error; one an operator removed
    /// from the queue ([`Client::force_release_existing`](crate::Client::force_release_existing))
    /// fails with [`Error::RemovedFromQueue`]; one larger than the limit after a shrink, with
    /// [`Error::TooManyPermits`] naming the current limit. In synced mode
    /// ([`ClientBuilder::synced_replicas`](crate::ClientBuilder::synced_replicas)), also
    /// [`Error::NotReplicated`] when too few replicas acknowledged the grant in time (the
    /// permit was released), and [`Error::LeaseLost`] when the grant was gone by the time it
    /// was confirmed.
    pub fn acquire(&self) -> impl Future<Output = Result<Permit, Error>> + Send + '_ {
        self.acquire_with(AcquireOptions::new())
    }

    /// Waits for `n` permits at once, in FIFO order (see [Fairness](Self#fairness)).
    ///
    /// # Cancel safety
    /// As for [`acquire`](Self::acquire).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `n == 0`; [`Error::TooManyPermits`] when `n` exceeds
    /// the limit stored in Redis (checked by the script before queueing, so a limit raised
    /// by another process counts at once; and again if the limit shrinks below `n` while
    /// waiting); otherwise as [`acquire`](Self::acquire).
    pub fn acquire_many(&self, n: u32) -> impl Future<Output = Result<Permit, Error>> + Send + '_ {
        self.acquire_with(AcquireOptions::new().permits(n))
    }

    /// [`acquire`](Self::acquire) that gives up after `timeout`.
    ///
    /// # Cancel safety
    /// As for [`acquire`](Self::acquire): dropping the future, or the timeout running out,
    /// gives up the place in the queue and releases a grant that arrived meanwhile (in the
    /// background). A grant that arrives as the timeout runs out is released, never leaked.
    ///
    /// # Errors
    /// [`Error::Timeout`] when no permit was granted in time (its place in the queue is
    /// given up; with a zero timeout, when none was free at once: see
    /// [`AcquireOptions::timeout`]); [`Error::InvalidArgument`] for a timeout above [`MAX_DURATION`](crate::MAX_DURATION) (use
    /// [`acquire`](Self::acquire) to wait without a limit); otherwise as
    /// [`acquire`](Self::acquire).
    pub fn acquire_timeout(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<Permit, Error>> + Send + '_ {
        self.acquire_with(AcquireOptions::new().timeout(timeout))
    }

    /// [`acquire_many`](Self::acquire_many) that gives up after `timeout`.
    ///
    /// # Cancel safety
    /// As for [`acquire_timeout`](Self::acquire_timeout).
    ///
    /// # Errors
    /// As [`acquire_timeout`](Self::acquire_timeout) and [`acquire_many`](Self::acquire_many).
    pub fn acquire_many_timeout(
        &self,
        n: u32,
        timeout: Duration,
    ) -> impl Future<Output = Result<Permit, Error>> + Send + '_ {
        self.acquire_with(AcquireOptions::new().permits(n).timeout(timeout))
    }

    /// Takes one permit only if one is free now and nobody is queued (FIFO: a free permit
    /// belongs to the head of the queue). One round trip; never queues.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes leaves nothing behind: a grant made by a call
    /// already sent is released in the background once its reply is in.
    ///
    /// # Errors
    /// [`Error::NoPermits`] when it would have to wait; otherwise as
    /// [`acquire`](Self::acquire).
    pub fn try_acquire(&self) -> impl Future<Output = Result<Permit, Error>> + Send + '_ {
        self.acquire_with(AcquireOptions::new().try_only(true))
    }

    /// Takes `n` permits only if they are free now and nobody is queued.
    ///
    /// # Cancel safety
    /// As for [`try_acquire`](Self::try_acquire).
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire) and [`acquire_many`](Self::acquire_many).
    pub fn try_acquire_many(
        &self,
        n: u32,
    ) -> impl Future<Output = Result<Permit, Error>> + Send + '_ {
        self.acquire_with(AcquireOptions::new().permits(n).try_only(true))
    }

    /// The general form of every `acquire` method: the permits, lease, label, timeout,
    /// maximum hold time and mode of [`options`](AcquireOptions). The other methods are
    /// shorthands for it.
    ///
    /// ```no_run
    /// # async fn f(sem: redsem::Semaphore) -> Result<(), redsem::Error> {
    /// use std::time::Duration;
    /// use redsem::AcquireOptions;
    ///
    /// let permit = sem
    ///     .acquire_with(
    ///         AcquireOptions::new()
    ///             .lease(Duration::from_secs(120))
    ///             .label("job 42")
    ///             .timeout(Duration::from_secs(10)),
    ///     )
    ///     .await?;
    /// # drop(permit); Ok(()) }
    /// ```
    ///
    /// # Cost
    /// As [`acquire`](Self::acquire): at most one script call, shared with the acquisitions
    /// made while a call is in flight. A lease or label of its own adds one small allocation.
    ///
    /// # Cancel safety
    /// As for [`acquire`](Self::acquire) (or [`try_acquire`](Self::try_acquire) in try-only
    /// mode).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`], before anything is sent, for 0 permits, a lease shorter
    /// than three renewal intervals of this handle or above [`MAX_DURATION`](crate::MAX_DURATION), a label over
    /// 200 bytes, a timeout above [`MAX_DURATION`](crate::MAX_DURATION), or a timeout with try-only; otherwise as
    /// [`acquire_many_timeout`](Self::acquire_many_timeout) or
    /// [`try_acquire_many`](Self::try_acquire_many).
    pub fn acquire_with(
        &self,
        options: AcquireOptions,
    ) -> impl Future<Output = Result<Permit, Error>> + Send + '_ {
        use futures_util::FutureExt as _;
        use futures_util::future::{Either, ready};
        match options.into_ask(&self.handle.timing) {
            // A combinator, not an `async fn`: a waiting task carries this future as long as
            // it waits, and an `async fn` layer would store its own copy of the arguments.
            Ok(ask) => {
                let zero = ask.zero_timeout;
                Either::Left(self.handle.acquire(ask).map(move |held| match held {
                    // a zero timeout ran out: the permits were not free at once
                    Err(Error::NoPermits { name, .. }) if zero => Err(Error::Timeout {
                        name,
                        timeout: Duration::ZERO,
                    }),
                    held => held.map(Permit::new),
                }))
            }
            Err(e) => Either::Right(ready(Err(e))),
        }
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

    /// A consistent snapshot of the semaphore in Redis: limit, permits in use, how many hold
    /// and wait, and the first [`STATS_LISTED`](crate::STATS_LISTED) holders and waiters.
    /// One round trip, of a bounded cost whatever the queue and the limit.
    ///
    /// # Errors
    /// Connection and permission errors.
    pub async fn stats(&self) -> Result<Stats, Error> {
        self.stats_listing(crate::stats::STATS_LISTED).await
    }

    /// [`stats`](Self::stats), listing at most `listed` holders and `listed` waiters instead
    /// of [`STATS_LISTED`](crate::STATS_LISTED); the counts are of all of them whatever
    /// `listed`. 0 lists nobody (then [`Stats::oldest_wait`] is `None`); 1 lists the head of
    /// the queue. For a frequent poll that needs the counts: Redis time grows with the
    /// entries listed (a few µs each), never with the queue or the limit.
    ///
    /// # Errors
    /// As [`stats`](Self::stats); [`Error::InvalidArgument`] for `listed` above
    /// [`MAX_LISTED`](crate::MAX_LISTED).
    pub async fn stats_listing(&self, listed: usize) -> Result<Stats, Error> {
        crate::stats::check_listed(listed)?;
        let mut conn = self.handle.ctx.conn_for(self.name())?;
        let reply = protocol::stats(&mut conn, &self.handle.remote.target(), listed)
            .await
            .map_err(|e| Error::from_call(e, self.name()))?;
        self.handle.remote.set_limit(reply.limit);
        self.handle
            .remote
            .set_free(reply.limit.saturating_sub(reply.in_use));
        let stats = Stats::from_reply(self.name(), reply);
        Ok(stats)
    }

    /// Changes the limit for every replica, live. Growing admits waiters at once; shrinking
    /// lets holders finish and admits nobody until the permits in use are below the new
    /// limit (queued requests larger than the new limit, anywhere in the queue, are removed
    /// at once, and their acquires fail with [`Error::TooManyPermits`] naming the new limit).
    /// Returns the previous limit and the requests it rejected.
    ///
    /// Processes that open the semaphore later must pass the new limit, unless they open it
    /// with a [`LimitPolicy`](crate::LimitPolicy) that adopts the stored one.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 or a limit above [`MAX_LIMIT`]; connection errors.
    pub async fn resize(&self, new_limit: u32) -> Result<Resized, Error> {
        crate::protocol::keys::check_limit(new_limit.into())?;
        let mut conn = self.handle.ctx.conn_for(self.name())?;
        let reply = protocol::resize(&mut conn, &self.handle.remote.target(), new_limit)
            .await
            .map_err(|e| Error::from_call(e, self.name()))?;
        self.handle.remote.set_limit(new_limit);
        Ok(Resized::from_reply(reply, new_limit))
    }

    /// Changes the limit by `delta` (positive or negative) for every replica, atomically:
    /// two concurrent changes both count, where two concurrent [`resize`](Self::resize)s
    /// would overwrite each other. Like tokio's `add_permits` (and `forget_permits` for a
    /// negative `delta`), but the change is to the stored limit, shared by every process.
    /// Growing admits waiters at once; shrinking lets holders finish first (as
    /// [`resize`](Self::resize)). Returns the previous and the new limit and the queued
    /// requests a shrink rejected, as [`resize`](Self::resize) does.
    ///
    /// # Cost
    /// One script call.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the new limit would be below 1 or above
    /// [`MAX_LIMIT`] (nothing is changed; the message gives the current limit);
    /// connection and permission errors.
    pub async fn add_permits(&self, delta: i64) -> Result<Resized, Error> {
        let mut conn = self.handle.ctx.conn_for(self.name())?;
        let reply =
            protocol::add_to_limit(&mut conn, &self.handle.remote.target(), delta, MAX_LIMIT)
                .await
                .map_err(|e| Error::from_call(e, self.name()))?;
        self.handle.remote.set_limit(reply.1.unwrap_or(reply.0));
        Resized::from_added(reply, self.name(), delta)
    }

    /// An operator's release of another holder's permit (or removal of a queued waiter) by
    /// its holder id, as shown by [`stats`](Self::stats). A holder's slots go to the queue at
    /// once; the evicted holder learns it at its next renewal (within one renewal interval),
    /// and the next grant of each slot carries a higher fence, so a protected resource
    /// rejects the evicted holder once the slot's next holder has used it (see
    /// [`crate::fencing`]). A removed waiter's acquire fails with
    /// [`Error::RemovedFromQueue`]. Returns whether the entry existed
    /// ([`Client::force_release_existing`](crate::Client::force_release_existing) says
    /// which it was).
    ///
    /// # Errors
    /// Connection and permission errors.
    pub async fn force_release(&self, holder_id: &str) -> Result<bool, Error> {
        let mut conn = self.handle.ctx.conn_for(self.name())?;
        let counts =
            protocol::force_release(&mut conn, &self.handle.remote.target(), false, holder_id)
                .await
                .map_err(|e| Error::from_call(e, self.name()))?;
        Ok(counts.is_some_and(|c| ForceReleased::from_counts(c).existed()))
    }

    /// Takes over a permit another process (or handle) exported with
    /// [`Permit::export`]: from now on this handle renews it, and the returned [`Permit`]
    /// holds the token's slots and fences, under its holder id, ticket and lease. Works
    /// across languages (the token is the same string in Rust, Python and Node.js).
    ///
    /// The permit is trusted from the moment this call was sent (as a fresh grant is): its
    /// local deadline is the send time + the token's lease − the safety margin, and it is
    /// renewed like any other permit of this handle. It does not wait in the queue: the
    /// slots are already held. It counts against this process's
    /// [`local_cap`](crate::SemaphoreBuilder::local_cap), if any (without waiting).
    ///
    /// Adopting a token twice (two processes, or twice here) moves the permit each time: the
    /// **last adopter holds it**. An earlier adopter learns it at its next renewal (within
    /// one renewal interval; [`Permit::lost`] resolves with [`LostReason::HandedOff`]) and
    /// must stop: until then both believe they hold it, with the same fences (an adoption
    /// does not change them), so nothing tells their requests apart. Hand each token to one
    /// adopter. An earlier adopter that releases the permit before its renewal told it of
    /// the second adoption releases the last adopter's permit.
    ///
    /// # Cost
    /// One script call (`lease.lua` in adopt mode); in synced mode, one more to confirm it
    /// on the replicas.
    ///
    /// # Cancel safety
    /// Dropping the future after the call was sent detaches the entry again in the
    /// background (it is then renewed by nobody, and expires within one lease unless adopted
    /// again): it is never left in a session of this handle without a permit.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a token of another semaphore, or a lease shorter than
    /// three renewal intervals of this handle; [`Error::HandoffGone`] when the permit is no
    /// longer in Redis (its lease ran out before it was adopted, it was released, or an
    /// operator removed it); [`Error::NoPermits`] when the local cap is used up;
    /// [`Error::Closed`]; connection and permission errors (then the entry is detached again,
    /// see above, and the token may be adopted again while its lease lasts).
    ///
    /// [`LostReason::HandedOff`]: crate::LostReason::HandedOff
    pub async fn adopt(&self, token: &HandoffToken) -> Result<Permit, Error> {
        self.check_token(token)?;
        let grant = crate::protocol::Grant {
            ticket: token.ticket(),
            slots: token.slots(),
            fences: token.fences().iter().map(|f| f.generation).collect(),
        };
        let held = self
            .handle
            .adopt(token.holder_id(), &grant, token.lease())
            .await?;
        Ok(Permit::new(held))
    }

    /// Releases the permit of a hand-off token by its holder id, without adopting it: the
    /// slots go to the queue at once. A normal release (not an operator's forced one):
    /// whoever holds it meanwhile (an adopter) learns it at its next renewal, as
    /// [`LostReason::NotHolder`](crate::LostReason::NotHolder). Idempotent; returns whether
    /// the permit was still in Redis.
    ///
    /// # Cost
    /// One script call (`release.lua`).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not release it; calling again is harmless.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a token of another semaphore; connection and
    /// permission errors.
    pub async fn release_handoff(&self, token: &HandoffToken) -> Result<bool, Error> {
        self.check_token(token)?;
        self.handle.release_by_id(token.holder_id()).await
    }

    /// [`Error::InvalidArgument`] unless `token` is of this semaphore.
    fn check_token(&self, token: &HandoffToken) -> Result<(), Error> {
        if token.semaphore() != self.name() {
            return Err(Error::InvalidArgument(format!(
                "the hand-off token is for semaphore {}, not {}: adopt or release it through a \
                 handle of its own semaphore",
                crate::error::display_name(token.semaphore()),
                crate::error::display_name(self.name())
            )));
        }
        Ok(())
    }

    /// Closes this handle and its clones in this process, like
    /// [`tokio::sync::Semaphore::close`]: pending and future acquires fail with
    /// [`Error::Closed`] (one whose script call is in flight, once that call returns) and
    /// their entries are removed from Redis in the background. Held permits stay valid until
    /// dropped. Other processes are not affected.
    pub fn close(&self) {
        self.handle.close();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Permits this process holds or waits for through this handle, without I/O:
    /// `(holders, waiters)` entries.
    pub fn local_counts(&self) -> (usize, usize) {
        self.handle.local_counts()
    }
}

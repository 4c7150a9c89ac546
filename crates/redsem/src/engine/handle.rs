//! [`Handle`]: the per-handle shared state behind a public `Semaphore` and its permits —
//! the semaphore in Redis, the waiter/holder table, the heartbeat, the batching tasks, the
//! notification channel — and how a handle is opened.
//!
//! The acquire path ([`acquire`](super::acquire)) and synced mode
//! ([`synced`](super::synced)) add methods to it from their own files.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::batch::{self, RequestSettings};
use super::combine::ReleaseCombiner;
use super::context::{Context, Member};
use super::heartbeat::Heartbeat;
use super::notifier::Listener;
use super::releaser::Job;
use super::remote::Remote;
use super::table::Table;
use crate::core::Outcome;
use crate::core::Timing;
use crate::error::{Error, LostReason};
use crate::protocol::keys::Keys;
use crate::protocol::{self, Notice};

/// The state one semaphore handle and its clones and permits share. Dropping the last
/// reference stops the heartbeat and unsubscribes the channel.
pub(crate) struct Handle {
    pub(crate) ctx: Arc<Context>,
    /// Acquisitions go through the batching task (see batch.rs).
    pub(super) batch: mpsc::UnboundedSender<batch::Request>,
    /// In-place releases, combined (see batch.rs).
    pub(super) releases: Arc<ReleaseCombiner<protocol::Conn>>,
    pub(crate) remote: Arc<Remote>,
    pub(crate) timing: Timing,
    /// This handle's channel id (it also starts the ids of its holders and waiters).
    pub(super) channel_id: String,
    channel: String,
    pub(crate) table: Arc<Table>,
    pub(super) heartbeat: Arc<Heartbeat>,
    pub(super) closed: CancellationToken,
    pub(super) local_cap: Option<(u32, Arc<tokio::sync::Semaphore>)>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.heartbeat.stop();
        self.table.end_sessions();
        self.ctx.releaser.send(Job::Unsubscribe {
            channel: self.channel.clone(),
        });
    }
}

impl Listener for Handle {
    fn on_message(&self, payload: &str) {
        for notice in protocol::parse_notices(payload) {
            match notice {
                Notice::Granted { id, grant } => {
                    self.table.deliver(&id, Outcome::Granted(Box::new(grant)))
                }
                Notice::Rejected { id } => self.table.deliver(&id, Outcome::Rejected),
                // (a holder an operator removed learns it at its next renewal)
                Notice::Removed { id } => self.table.deliver(&id, Outcome::Removed),
            }
        }
    }

    fn on_resubscribed(&self) {
        self.heartbeat.recheck_now();
    }
}

impl Member for Handle {
    fn shut_down(&self) {
        let (waiters, holders) = {
            let mut st = self.table.lock();
            (st.waiter_ids(), st.take_holders())
        };
        self.close();
        for (id, holder) in holders {
            tracing::info!(semaphore = %self.name(), holder = %id, "client shut down: permit released");
            crate::metrics::lease_lost(self.name(), LostReason::Shutdown);
            holder.signal.lose(LostReason::Shutdown);
            self.table.release_in_background(id);
        }
        // their pending acquires release them too, but maybe after the releaser stopped
        for id in waiters {
            self.table.release_in_background(id.to_string());
        }
        self.heartbeat.stop();
        self.table.end_sessions();
        self.ctx.releaser.send(Job::Unsubscribe {
            channel: self.channel.clone(),
        });
    }
}

/// What opening a handle needs (validated by the builder).
pub(crate) struct OpenSettings {
    pub(crate) name: String,
    pub(crate) limit: u32,
    pub(crate) timing: Timing,
    pub(crate) label: String,
    pub(crate) local_cap: Option<u32>,
    /// Open even when Redis's `maxmemory-policy` can evict the semaphore's keys.
    pub(crate) allow_evicting_policy: bool,
    /// Create the semaphore with `limit` when it does not exist (else
    /// [`Error::UnknownSemaphore`], and nothing is written).
    pub(crate) create: bool,
    /// What a stored limit other than `limit` does.
    pub(crate) on_other_limit: OtherLimit,
}

/// What opening a handle does when the stored limit is not the one asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OtherLimit {
    /// Fail with [`Error::LimitConflict`].
    Fail,
    /// Use the stored limit.
    Adopt,
}

impl Handle {
    /// Subscribes to the handle's channel, creates the semaphore in Redis if it does not
    /// exist (with `s.create`), checks the stored limit against the one asked for (or adopts
    /// it, with [`OtherLimit::Adopt`]), and starts the heartbeat.
    pub(crate) async fn open(ctx: Arc<Context>, s: OpenSettings) -> Result<Arc<Handle>, Error> {
        let keys = Keys::new(&ctx.prefix, &s.name)?;
        let handle = Self::build(&ctx, keys, &s);
        // From here on, dropping `handle` unsubscribes (see Drop).
        let member: std::sync::Weak<Handle> = Arc::downgrade(&handle);
        ctx.join(member, &s.name)?;
        handle.open_in_redis(&s).await?;
        handle.heartbeat.start();
        Ok(handle)
    }

    /// The handle and its tasks (batching; the heartbeat, not started yet).
    fn build(ctx: &Arc<Context>, keys: Keys, s: &OpenSettings) -> Arc<Handle> {
        let channel_id = ctx.new_channel_id();
        let channel = keys.channel(&channel_id);
        let remote = Arc::new(Remote::new(keys, s.limit, ctx.publish));
        let closed = CancellationToken::new();
        let lease_ms = s.timing.lease.as_millis() as u64;
        let batch = batch::spawn(
            remote.clone(),
            closed.clone(),
            ctx.conn.clone(),
            ctx.releaser.clone(),
            RequestSettings {
                lease_ms,
                wait_lease_ms: lease_ms,
                channel_id: channel_id.clone(),
                label: s.label.clone(),
            },
        );
        let releases = ReleaseCombiner::new(remote.clone(), ctx.conn.clone());
        let table = Arc::new(Table::new(
            remote.clone(),
            ctx.releaser.clone(),
            (s.timing.clone(), ctx.renewer.grid()),
            channel_id.clone(),
        ));
        let heartbeat = Heartbeat::new(
            table.clone(),
            remote.clone(),
            (ctx.renewer.clone(), ctx.conn.clone()),
            ctx.response_timeout,
            ctx.synced,
        );
        let local_cap = s
            .local_cap
            .map(|n| (n, Arc::new(tokio::sync::Semaphore::new(n as usize))));
        Arc::new(Handle {
            ctx: ctx.clone(),
            batch,
            releases,
            remote,
            timing: s.timing.clone(),
            channel_id,
            channel,
            table,
            heartbeat,
            closed,
            local_cap,
        })
    }

    /// Subscribes to the handle's channel and runs `open.lua` at once (one round trip's wait;
    /// both are done before the handle can acquire, and open.lua grants nothing to a handle
    /// that has no waiter): creates the semaphore if it does not exist (with `s.create`),
    /// refuses an `allkeys-*` maxmemory-policy before it writes anything (unless allowed) and a
    /// key with a TTL under a `volatile-*` one, and checks the stored limit against the one
    /// asked for (or adopts it, with [`OtherLimit::Adopt`]).
    async fn open_in_redis(self: &Arc<Self>, s: &OpenSettings) -> Result<(), Error> {
        let listener: std::sync::Weak<Handle> = Arc::downgrade(self);
        let mut conn = self.ctx.conn.clone();
        let target = self.remote.target();
        let (subscribed, opened) = tokio::join!(
            self.ctx
                .notifier
                .subscribe(&self.channel, listener, &s.name),
            protocol::open(&mut conn, &target, s.create, !s.allow_evicting_policy),
        );
        if let Ok(Some(o)) = &opened
            && o.refused
        {
            return Err(Error::EvictingPolicy {
                name: s.name.clone(),
                policy: o.policy.clone().unwrap_or_default(),
                detail: "it evicts any key under memory pressure".into(),
            });
        }
        subscribed?;
        let opened = opened.map_err(|e| Error::from_call(e, &s.name))?;
        let Some(opened) = opened else {
            return Err(Error::UnknownSemaphore {
                name: s.name.clone(),
                prefix: self.ctx.prefix.clone(),
            });
        };
        let (stored, created, with_ttl) = (opened.limit, opened.created, opened.with_ttl);
        self.remote.set_free(opened.free);
        let policy = opened.policy;
        if let (Some(p), Some(key)) = (policy.filter(|p| p.starts_with("volatile-")), with_ttl) {
            return Err(Error::EvictingPolicy {
                name: s.name.clone(),
                policy: p,
                detail: format!(
                    "the key {key} carries a TTL, which makes it evictable (redsem never sets one: remove it with PERSIST)"
                ),
            });
        }
        if stored != s.limit && s.on_other_limit == OtherLimit::Adopt {
            self.remote.set_limit(stored);
        } else if stored != s.limit {
            return Err(Error::LimitConflict {
                name: s.name.clone(),
                requested: s.limit,
                stored,
            });
        }
        tracing::debug!(semaphore = %s.name, limit = stored, created, "opened");
        Ok(())
    }

    pub(crate) fn name(&self) -> &str {
        self.remote.name()
    }

    /// The limit as last seen in Redis.
    pub(crate) fn limit(&self) -> u32 {
        self.remote.limit()
    }

    /// Closes the handle: wakes every pending acquire with [`Outcome::Closed`] (they remove
    /// their entries from Redis as they return). An acquire that registers later sees the
    /// token cancelled under the table's lock, which this takes after cancelling it.
    pub(crate) fn close(&self) {
        self.closed.cancel();
        self.table.close_waiters();
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// `(holders, waiters)` entries of this handle in this process.
    pub(crate) fn local_counts(&self) -> (usize, usize) {
        self.table.lock().counts()
    }
}

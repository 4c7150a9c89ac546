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
use super::context::{Context, Member};
use super::heartbeat::Heartbeat;
use super::lease::Timing;
use super::notifier::Listener;
use super::releaser::Job;
use super::remote::Remote;
use super::table::{Outcome, Table};
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
    pub(super) releases: Arc<batch::Releases<protocol::Conn>>,
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
            let waiters: Vec<String> = st.waiters.keys().map(|id| id.to_string()).collect();
            (waiters, std::mem::take(&mut st.holders))
        };
        self.close();
        for (id, lease) in holders {
            tracing::info!(semaphore = %self.name(), holder = %id, "client shut down: permit released");
            crate::metrics::lease_lost(self.name(), LostReason::Shutdown);
            lease.lose(LostReason::Shutdown);
            self.table.release_in_background(id);
        }
        // their pending acquires release them too, but maybe after the releaser stopped
        for id in waiters {
            self.table.release_in_background(id);
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
                label: s.label,
            },
        );
        let releases = batch::Releases::new(remote.clone(), ctx.conn.clone());
        let table = Arc::new(Table::new(
            remote.clone(),
            ctx.releaser.clone(),
            s.timing.lease,
            channel_id.clone(),
        ));
        let heartbeat = Heartbeat::new(
            table.clone(),
            remote.clone(),
            s.timing.clone(),
            (ctx.renewer.clone(), ctx.conn.clone()),
            ctx.response_timeout,
            ctx.synced,
        );
        let handle = Arc::new(Handle {
            ctx: ctx.clone(),
            batch,
            releases,
            remote,
            timing: s.timing,
            channel_id,
            channel: channel.clone(),
            table,
            heartbeat,
            closed,
            local_cap: s
                .local_cap
                .map(|n| (n, Arc::new(tokio::sync::Semaphore::new(n as usize)))),
        });
        // From here on, dropping `handle` unsubscribes (see Drop).
        let member: std::sync::Weak<Handle> = Arc::downgrade(&handle);
        ctx.join(member, &s.name)?;
        let listener: std::sync::Weak<Handle> = Arc::downgrade(&handle);
        // The subscription and open.lua at once: one round trip's wait. Both are done before
        // the handle can acquire, and open.lua grants nothing to a handle that has no waiter.
        // open.lua checks the maxmemory-policy before it writes anything.
        let mut conn = ctx.conn.clone();
        let target = handle.remote.target();
        let (subscribed, opened) = tokio::join!(
            ctx.notifier.subscribe(&channel, listener, &s.name),
            protocol::open(&mut conn, &target, s.create, !s.allow_evicting_policy),
        );
        if let Ok(Some(o)) = &opened
            && o.refused
        {
            return Err(Error::EvictingPolicy {
                name: s.name,
                policy: o.policy.clone().unwrap_or_default(),
                detail: "it evicts any key under memory pressure".into(),
            });
        }
        subscribed?;
        let opened = opened.map_err(|e| Error::from_call(e, &s.name))?;
        let Some(opened) = opened else {
            return Err(Error::UnknownSemaphore {
                name: s.name,
                prefix: ctx.prefix.clone(),
            });
        };
        let (stored, created, with_ttl) = (opened.limit, opened.created, opened.with_ttl);
        handle.remote.set_free(opened.free);
        let policy = opened.policy;
        if let (Some(p), Some(key)) = (policy.filter(|p| p.starts_with("volatile-")), with_ttl) {
            return Err(Error::EvictingPolicy {
                name: s.name,
                policy: p,
                detail: format!(
                    "the key {key} carries a TTL, which makes it evictable (redsem never sets one: remove it with PERSIST)"
                ),
            });
        }
        if stored != s.limit && s.on_other_limit == OtherLimit::Adopt {
            handle.remote.set_limit(stored);
        } else if stored != s.limit {
            return Err(Error::LimitConflict {
                name: s.name,
                requested: s.limit,
                stored,
            });
        }
        tracing::debug!(semaphore = %s.name, limit = stored, created, "opened");
        handle.heartbeat.start();
        Ok(handle)
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
        let st = self.table.lock();
        (st.holders.len(), st.waiters.len())
    }
}

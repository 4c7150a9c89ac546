//! [`Remote`]: one semaphore as background work addresses it in Redis, and [`Calls`]: the
//! script calls that background work makes on it.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::CallResult;
use crate::protocol::keys::Keys;
use crate::protocol::{self, AcquireArgs, AcquireReply, Conn, Removal, Target};

/// One semaphore in Redis as a handle and its background work address it: its keys, the
/// last limit seen (mutable: updated by resize, stats and rejections; used to re-create the
/// configuration after a data loss) and how grants are published. Holds no reference back to
/// the client, so a pending release never keeps a client alive.
pub(crate) struct Remote {
    pub(crate) keys: Keys,
    limit: AtomicU32,
    /// Permits free, as last seen in Redis.
    free: AtomicU32,
    publish: &'static str,
}

impl Remote {
    pub(crate) fn new(keys: Keys, limit: u32, publish: &'static str) -> Remote {
        Remote {
            keys,
            limit: AtomicU32::new(limit),
            free: AtomicU32::new(limit),
            publish,
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.keys.name
    }

    /// The limit as last seen in Redis.
    pub(crate) fn limit(&self) -> u32 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Records the limit seen in Redis.
    pub(crate) fn set_limit(&self, limit: u32) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Permits free, as last seen in Redis.
    pub(crate) fn free(&self) -> u32 {
        self.free.load(Ordering::Relaxed)
    }

    /// Records the free permits seen in Redis.
    pub(crate) fn set_free(&self, free: u32) {
        self.free.store(free, Ordering::Relaxed);
    }

    /// What a script call on this semaphore needs.
    pub(crate) fn target(&self) -> Target<'_> {
        Target {
            keys: &self.keys,
            limit: self.limit(),
            publish: self.publish,
        }
    }
}

/// The script calls that the batching task and the releaser make: on Redis through a
/// [`Conn`], or on a stand-in in the engine's unit tests, which then run without a server
/// (and in paused time).
pub(crate) trait Calls: Clone + Send + 'static {
    /// Runs a batch of acquisitions in one `acquire.lua` call ([`protocol::acquire`]).
    fn acquire(
        &mut self,
        remote: &Remote,
        batch: &[AcquireArgs<'_>],
    ) -> impl Future<Output = CallResult<Vec<AcquireReply>>> + Send;

    /// Removes holders or queued waiters, not forced, detaches holders, and ends the
    /// sessions that have no entry left ([`protocol::release`]).
    fn release(
        &mut self,
        remote: &Remote,
        removal: &Removal<'_>,
    ) -> impl Future<Output = CallResult<u64>> + Send;
}

impl Calls for Conn {
    async fn acquire(
        &mut self,
        remote: &Remote,
        batch: &[AcquireArgs<'_>],
    ) -> CallResult<Vec<AcquireReply>> {
        let (replies, free) = protocol::acquire(self, &remote.target(), batch).await?;
        if let Some(free) = free {
            remote.set_free(free);
        }
        Ok(replies)
    }

    async fn release(&mut self, remote: &Remote, removal: &Removal<'_>) -> CallResult<u64> {
        protocol::release(self, &remote.target(), removal, false).await
    }
}

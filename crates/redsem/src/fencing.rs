//! Fencing: how a protected resource rejects a holder whose lease has expired.
//!
//! A lease cannot stop a holder that was paused (GC, swap, SIGSTOP, a stopped VM) past its
//! lease from waking up and still believing it holds a slot, while another process was
//! granted the same slot. Where exceeding the limit would cause damage rather than load, the
//! resource itself must check the [`Fence`] that comes with every permit:
//!
//! 1. The holder sends `(slot, generation)` with every request it makes under the permit.
//! 2. The resource keeps, per slot, the highest generation it has seen, and rejects any
//!    request with a lower generation. Equal is accepted (the same holder again).
//!
//! Generations of a slot strictly increase in grant order, so once the new holder of a slot
//! has made one request, every request of the stale holder is refused.
//! Generations are derived from Redis's clock: `max(previous + 1, Redis TIME in µs)`. So they
//! also go up across a loss of the semaphore's data (`FLUSHALL`, a restart without
//! persistence, a failover to a replica that missed the last grants), as long as Redis's clock
//! has not gone back past the earlier grant — with NTP-synchronised hosts, a step back of more
//! than the time between the loss and the next grant. (One script call that makes `k` grants,
//! a batch or a pump after a resize, gives them `k` consecutive generations, so the last runs
//! up to `k - 1` µs ahead of Redis's clock: at most 0.1 s at the largest limit; see
//! docs/PROTOCOL.md, "Fencing tokens".) Under that assumption tokens are also unique per slot:
//! an equal token is the same grant writing again.
//!
//! [`Semaphore::force_release`](crate::Semaphore::force_release) does not fence at once: the
//! evicted holder learns of the eviction at its next renewal (within one renewal interval);
//! until then, a resource refuses it only once the slot's next holder, whose token is higher,
//! has used the resource.
//!
//! [`FencedStore`] does this for a resource that lives in Redis.

use crate::client::Client;
use crate::error::Error;
use crate::permit::Fence;
use crate::protocol;

/// Fencing-token checks and fenced writes for a resource stored in Redis.
///
/// The highest generation seen per slot is kept in a hash at `fence_key`. In Redis Cluster,
/// `fence_key` and the keys written must share a hash tag (e.g. `{orders}:fence` and
/// `{orders}:total`).
#[derive(Clone, Debug)]
pub struct FencedStore {
    client: Client,
    fence_key: String,
}

impl FencedStore {
    /// A store whose fence record is the hash at `fence_key`. No I/O.
    pub fn new(client: &Client, fence_key: impl Into<String>) -> FencedStore {
        FencedStore {
            client: client.clone(),
            fence_key: fence_key.into(),
        }
    }

    /// Atomically checks `fence` and records it: `Ok(true)` when the holder is current (its
    /// generation is the highest seen for its slot), `Ok(false)` when it is stale and must
    /// stop. One round trip.
    ///
    /// # Errors
    /// Connection and permission errors; [`Error::WrongType`] if `fence_key` is not a hash.
    pub async fn check(&self, fence: Fence) -> Result<bool, Error> {
        self.call(fence, None).await
    }

    /// Atomically checks `fence` and, only if the holder is current, `SET`s `key` to `value`.
    /// Returns whether the write happened. One round trip.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub async fn write(&self, fence: Fence, key: &str, value: &[u8]) -> Result<bool, Error> {
        self.call(fence, Some((key, value))).await
    }

    async fn call(&self, fence: Fence, write: Option<(&str, &[u8])>) -> Result<bool, Error> {
        // (not a semaphore's call: a Closed error names none)
        let mut conn = self.client.inner.conn_for("")?;
        protocol::fence(
            &mut conn,
            &self.fence_key,
            fence.slot,
            fence.generation,
            write,
        )
        .await
        .map_err(|e| Error::from_redis(e, &self.fence_key))
    }
}

//! Design 2 of the reference: a leased sorted set with polling acquirers.
//!
//! The reference describes it in prose only (section 1): "the member is a random token per
//! acquisition, the score is the lease's expiry time. Every attempt to acquire first removes
//! members whose expiry has passed. Take that time from the Redis server with TIME inside a
//! Lua script". Everything below is therefore a gap, filled exactly as the peers did
//! (GAPS.md, design 2; `seed_semaphores.py`, `LEASED_ACQUIRE`):
//!
//! - one Lua script ([`ACQUIRE_LUA`], `zset_poll_acquire.lua`, byte-identical to the peers'
//!   string): the reference's `NOW` prelude (server `TIME`), `ZREMRANGEBYSCORE key -inf now`,
//!   then `ZCARD < limit` -> `ZADD key now+ttl token`, return 1, else 0;
//! - a fresh random token per acquisition (`uuid4().hex`), poll every 20 ms;
//! - release is `ZREM key token`; key `sem:{name}:lease`.

use std::time::Duration;

use redis::Script;
use redis::aio::MultiplexedConnection;

use super::{AcquireError, Params};

/// The acquire script (see the module docs).
pub const ACQUIRE_LUA: &str = include_str!("zset_poll_acquire.lua");

/// Poll interval after an unsuccessful attempt.
pub const POLL: Duration = Duration::from_millis(20);

/// Leased sorted-set semaphore with polling acquirers.
pub struct LeasedSemaphore {
    con: MultiplexedConnection,
    key: String,
    limit: u32,
    ttl_ms: u64,
    acquire: Script,
}

impl LeasedSemaphore {
    /// Connects and loads the script (`SCRIPT LOAD`), so acquisitions are plain EVALSHAs.
    pub async fn open(p: &Params) -> anyhow::Result<Self> {
        let mut con = super::connect(&p.redis_url).await?;
        let acquire = Script::new(ACQUIRE_LUA);
        acquire.load_async(&mut con).await?;
        Ok(LeasedSemaphore {
            con,
            key: format!("sem:{}:lease", p.name),
            limit: p.limit,
            ttl_ms: p.lease_ms,
            acquire,
        })
    }

    /// Runs the script every 20 ms until it returns 1. Returns the token.
    pub async fn acquire(&self) -> Result<String, AcquireError> {
        let mut con = self.con.clone();
        let token = super::new_token();
        loop {
            let got: i64 = self
                .acquire
                .key(&self.key)
                .arg(self.limit)
                .arg(self.ttl_ms)
                .arg(&token)
                .invoke_async(&mut con)
                .await?;
            if got == 1 {
                return Ok(token);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// `ZREM key token`.
    pub async fn release(&self, token: &str) -> anyhow::Result<()> {
        let mut con = self.con.clone();
        let _: i64 = redis::cmd("ZREM")
            .arg(&self.key)
            .arg(token)
            .query_async(&mut con)
            .await?;
        Ok(())
    }
}

//! Design 3 of the reference: FIFO tickets with polling acquirers.
//!
//! `ENQUEUE` and `CHECK` are the reference's Lua, verbatim ([`ENQUEUE_LUA`] =
//! `fifo_enqueue.lua`, [`CHECK_LUA`] = `fifo_check.lua`, byte-identical to the peers'
//! strings, `NOW` prelude included). Keys `sem:{name}:queue` (ordered by ticket),
//! `sem:{name}:lease` (ordered by expiry), `sem:{name}:seq` (ticket counter).
//!
//! The reference measured this design ("a freed slot stayed empty until the next waiter's
//! 20 ms poll came round") but prints only the scripts, so, as the peers did (GAPS.md,
//! design 3): the acquire loop is the reference's design-4 `acquire()` with the pub/sub wait
//! replaced by a plain 20 ms sleep, and release is its design-4 `release()` without the
//! PUBLISH (`MULTI; ZREM queue token; ZREM lease token; EXEC`). On an error or an expired
//! entry inside acquire the token is released before the error is returned (the reference's
//! `except BaseException: await self.release(token); raise`); a *dropped* acquire future
//! cannot run async clean-up in Rust, but the worker never drops one (and a waiter that
//! vanishes drops out of the queue when its lease expires, which is what leases are for).

use std::time::Duration;

use redis::Script;
use redis::aio::MultiplexedConnection;

use super::{AcquireError, Params};

/// The reference's ENQUEUE script.
pub const ENQUEUE_LUA: &str = include_str!("fifo_enqueue.lua");
/// The reference's CHECK script.
pub const CHECK_LUA: &str = include_str!("fifo_check.lua");

/// Poll interval between CHECKs.
pub const POLL: Duration = Duration::from_millis(20);

/// Keys and scripts shared by both FIFO designs.
pub struct FifoCore {
    /// The connection all tasks of the process share.
    pub con: MultiplexedConnection,
    /// `[queue, lease, seq]`, as the reference's `self.keys`.
    pub keys: [String; 3],
    /// Maximum simultaneous holders.
    pub limit: u32,
    /// Lease in ms (`self.ttl_ms`).
    pub ttl_ms: u64,
    enqueue: Script,
    check: Script,
}

/// What CHECK answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckState {
    /// 1: among the `limit` lowest live tickets: holds a slot.
    Acquired,
    /// 0: still queued (lease extended).
    Waiting,
    /// -1: the entry expired while waiting.
    Expired,
}

impl FifoCore {
    /// Connects and loads both scripts.
    pub async fn open(p: &Params) -> anyhow::Result<Self> {
        let mut con = super::connect(&p.redis_url).await?;
        let enqueue = Script::new(ENQUEUE_LUA);
        let check = Script::new(CHECK_LUA);
        enqueue.load_async(&mut con).await?;
        check.load_async(&mut con).await?;
        Ok(FifoCore {
            con,
            keys: [
                format!("sem:{}:queue", p.name),
                format!("sem:{}:lease", p.name),
                format!("sem:{}:seq", p.name),
            ],
            limit: p.limit,
            ttl_ms: p.lease_ms,
            enqueue,
            check,
        })
    }

    /// `ENQUEUE(keys=self.keys, args=[ttl_ms, token])`.
    pub async fn enqueue(&self, token: &str) -> redis::RedisResult<()> {
        let mut con = self.con.clone();
        let _: redis::Value = self
            .enqueue
            .key(&self.keys[0])
            .key(&self.keys[1])
            .key(&self.keys[2])
            .arg(self.ttl_ms)
            .arg(token)
            .invoke_async(&mut con)
            .await?;
        Ok(())
    }

    /// `CHECK(keys=self.keys[:2], args=[limit, ttl_ms, token])`.
    pub async fn check(&self, token: &str) -> redis::RedisResult<CheckState> {
        let mut con = self.con.clone();
        let state: i64 = self
            .check
            .key(&self.keys[0])
            .key(&self.keys[1])
            .arg(self.limit)
            .arg(self.ttl_ms)
            .arg(token)
            .invoke_async(&mut con)
            .await?;
        Ok(match state {
            1 => CheckState::Acquired,
            -1 => CheckState::Expired,
            _ => CheckState::Waiting,
        })
    }

    /// `MULTI; ZREM queue token; ZREM lease token; [PUBLISH channel ""]; EXEC`.
    pub async fn release(&self, token: &str, publish: Option<&str>) -> anyhow::Result<()> {
        let mut con = self.con.clone();
        let mut p = redis::pipe();
        p.atomic()
            .zrem(&self.keys[0], token)
            .zrem(&self.keys[1], token);
        if let Some(channel) = publish {
            p.publish(channel, b"");
        }
        p.exec_async(&mut con).await?;
        Ok(())
    }
}

/// FIFO ticket semaphore whose waiters poll CHECK every 20 ms.
pub struct FifoPollingSemaphore {
    core: FifoCore,
}

impl FifoPollingSemaphore {
    /// Connects and loads the scripts.
    pub async fn open(p: &Params) -> anyhow::Result<Self> {
        Ok(FifoPollingSemaphore {
            core: FifoCore::open(p).await?,
        })
    }

    /// ENQUEUE, then CHECK every 20 ms until acquired. Returns the token.
    pub async fn acquire(&self) -> Result<String, AcquireError> {
        let token = super::new_token();
        self.core.enqueue(&token).await?;
        let outcome = async {
            loop {
                match self.core.check(&token).await? {
                    CheckState::Acquired => return Ok(()),
                    CheckState::Expired => return Err(AcquireError::LeaseExpired),
                    CheckState::Waiting => tokio::time::sleep(POLL).await,
                }
            }
        }
        .await;
        match outcome {
            Ok(()) => Ok(token),
            Err(e) => {
                // leave the queue on error (the reference's `except BaseException`)
                let _ = self.core.release(&token, None).await;
                Err(e)
            }
        }
    }

    /// `MULTI; ZREM queue; ZREM lease; EXEC`.
    pub async fn release(&self, token: &str) -> anyhow::Result<()> {
        self.core.release(token, None).await
    }
}

//! Design 1 of the reference: the INCR/DECR counter.
//!
//! Reference code (section 1), kept as written:
//!
//! ```python
//! while await r.incr("sem:count") > LIMIT:
//!     await r.decr("sem:count")
//!     await asyncio.sleep(0.02)
//! ```
//!
//! Gaps filled as the peers did (GAPS.md, design 1): the key is namespaced `sem:{name}:count`;
//! release is one `DECR` (the reference says "DECR when done" but prints no release code); no
//! lease, so `--lease-ms` is ignored and a crashed holder's slot is lost for good (that is the
//! point of the design).

use std::time::Duration;

use redis::aio::MultiplexedConnection;

use super::{AcquireError, Params};

/// The reference's poll interval after a failed INCR.
pub const POLL: Duration = Duration::from_millis(20);

/// INCR/DECR counter semaphore.
pub struct CounterSemaphore {
    con: MultiplexedConnection,
    key: String,
    limit: i64,
}

impl CounterSemaphore {
    /// Connects; nothing else to set up.
    pub async fn open(p: &Params) -> anyhow::Result<Self> {
        Ok(CounterSemaphore {
            con: super::connect(&p.redis_url).await?,
            key: format!("sem:{}:count", p.name),
            limit: i64::from(p.limit),
        })
    }

    /// `while INCR > LIMIT: DECR; sleep 20 ms`. Returns an empty token.
    pub async fn acquire(&self) -> Result<String, AcquireError> {
        let mut con = self.con.clone();
        loop {
            let n: i64 = redis::cmd("INCR")
                .arg(&self.key)
                .query_async(&mut con)
                .await?;
            if n <= self.limit {
                return Ok(String::new());
            }
            let _: i64 = redis::cmd("DECR")
                .arg(&self.key)
                .query_async(&mut con)
                .await?;
            tokio::time::sleep(POLL).await;
        }
    }

    /// One `DECR`.
    pub async fn release(&self, _token: &str) -> anyhow::Result<()> {
        let mut con = self.con.clone();
        let _: i64 = redis::cmd("DECR")
            .arg(&self.key)
            .query_async(&mut con)
            .await?;
        Ok(())
    }
}

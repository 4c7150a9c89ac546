//! Design 4 of the reference, its final one: FIFO tickets plus a release notification over
//! pub/sub (class `RedisSemaphore`, section 3, re-implemented line by line).
//!
//! - ENQUEUE/CHECK: the reference's Lua, shared with [`fifo_poll`](super::fifo_poll).
//! - One subscriber per process on `sem:{name}:released` feeds an [`Event`] with Python's
//!   `asyncio.Event` semantics that **all** local waiters share: every message wakes every
//!   waiter of the process, each of which re-runs CHECK (the thundering herd the peers
//!   measured is part of the design).
//! - acquire: ENQUEUE; loop { `changed.clear()`; CHECK; 1 -> acquired, -1 -> error;
//!   wait for `changed` at most `fallback_poll` = 250 ms (the reference's default) }; on
//!   error release and return the error.
//! - release: `MULTI; ZREM queue; ZREM lease; PUBLISH released ""; EXEC`.
//!
//! Gaps (as GAPS.md, design 4): the reference starts its listener lazily on the first acquire
//! and never stops it; here it is subscribed during set-up, before `start-at` (the contract
//! asks for set-up before the start), and stopped by [`NotifySemaphore::close`]. `renew()`
//! (reference section 4) is not needed: benchmark holds are far shorter than the lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::fifo_poll::{CheckState, FifoCore};
use super::{AcquireError, Params};

/// The reference's `fallback_poll` default.
pub const FALLBACK_POLL: Duration = Duration::from_millis(250);

/// Python's `asyncio.Event`: `set()` wakes every current waiter and stays set until
/// `clear()`; `wait()` returns at once while set.
#[derive(Default)]
pub struct Event {
    flag: AtomicBool,
    notify: Notify,
}

impl Event {
    /// Sets the flag and wakes all waiters.
    pub fn set(&self) {
        self.flag.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Clears the flag.
    pub fn clear(&self) {
        self.flag.store(false, Ordering::SeqCst);
    }

    /// Returns when the flag is set (at once if it already is).
    pub async fn wait(&self) {
        // register before looking at the flag, so a set() in between is not missed
        let notified = self.notify.notified();
        if self.flag.load(Ordering::SeqCst) {
            return;
        }
        notified.await;
    }
}

/// FIFO ticket semaphore with pub/sub release notification.
pub struct NotifySemaphore {
    core: FifoCore,
    channel: String,
    changed: Arc<Event>,
    listener: JoinHandle<()>,
}

impl NotifySemaphore {
    /// Connects, loads the scripts, subscribes and starts the listener task.
    pub async fn open(p: &Params) -> anyhow::Result<Self> {
        let core = FifoCore::open(p).await?;
        let channel = format!("sem:{}:released", p.name);
        let changed = Arc::new(Event::default());
        let mut pubsub = redis::Client::open(p.redis_url.as_str())?
            .get_async_pubsub()
            .await?;
        pubsub.subscribe(&channel).await?;
        let ev = changed.clone();
        let listener = tokio::spawn(async move {
            let mut messages = pubsub.into_on_message();
            while messages.next().await.is_some() {
                ev.set();
            }
            eprintln!("fifo-notify: pub/sub connection closed; waiters fall back to polling");
        });
        Ok(NotifySemaphore {
            core,
            channel,
            changed,
            listener,
        })
    }

    /// ENQUEUE, then CHECK on every notification or after 250 ms. Returns the token.
    pub async fn acquire(&self) -> Result<String, AcquireError> {
        let token = super::new_token();
        self.core.enqueue(&token).await?;
        let outcome = async {
            loop {
                self.changed.clear();
                match self.core.check(&token).await? {
                    CheckState::Acquired => return Ok(()),
                    CheckState::Expired => return Err(AcquireError::LeaseExpired),
                    CheckState::Waiting => {
                        // pub/sub is fire-and-forget: a timeout is just the fallback poll
                        let _ = tokio::time::timeout(FALLBACK_POLL, self.changed.wait()).await;
                    }
                }
            }
        }
        .await;
        match outcome {
            Ok(()) => Ok(token),
            Err(e) => {
                let _ = self.core.release(&token, Some(&self.channel)).await;
                Err(e)
            }
        }
    }

    /// `MULTI; ZREM queue; ZREM lease; PUBLISH released ""; EXEC`.
    pub async fn release(&self, token: &str) -> anyhow::Result<()> {
        self.core.release(token, Some(&self.channel)).await
    }

    /// Stops the listener.
    pub fn close(self) {
        self.listener.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn event_wakes_every_waiter_and_stays_set() {
        let ev = Arc::new(Event::default());
        let mut waiters = Vec::new();
        for _ in 0..3 {
            let ev = ev.clone();
            waiters.push(tokio::spawn(async move { ev.wait().await }));
        }
        tokio::task::yield_now().await;
        ev.set();
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(1), w)
                .await
                .unwrap()
                .unwrap();
        }
        // still set: returns at once
        tokio::time::timeout(Duration::from_millis(10), ev.wait())
            .await
            .unwrap();
        ev.clear();
        assert!(
            tokio::time::timeout(Duration::from_millis(20), ev.wait())
                .await
                .is_err()
        );
    }
}

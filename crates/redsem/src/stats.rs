//! [`Stats`]: a snapshot of one semaphore as stored in Redis.

use std::time::Duration;

use serde::Serialize;

use crate::permit::Fence;
use crate::protocol::StatsReply;

/// At most this many holders and this many waiters are listed in a [`Stats`] taken by
/// [`Semaphore::stats`](crate::Semaphore::stats) or [`Client::inspect`](crate::Client::inspect)
/// (the counts, [`Stats::holder_count`] and [`Stats::waiter_count`], are of all of them), so
/// that taking a snapshot costs Redis the same whatever the length of the queue and the limit.
/// `stats_listing` and `inspect_listing` take another bound (0: the counts alone).
pub const STATS_LISTED: usize = 100;

/// The most entries of each kind a snapshot may list (`stats_listing`, `inspect_listing`):
/// more is refused with [`Error::InvalidArgument`](crate::Error::InvalidArgument) (a snapshot
/// is one script call, whose cost and reply grow with what it lists).
pub const MAX_LISTED: usize = 1000;

/// [`MAX_LISTED`], checked.
pub(crate) fn check_listed(listed: usize) -> Result<(), crate::Error> {
    if listed > MAX_LISTED {
        return Err(crate::Error::InvalidArgument(format!(
            "cannot list {listed} entries of a semaphore at once: at most {MAX_LISTED} (the \
             counts are of all of them whatever is listed)"
        )));
    }
    Ok(())
}

/// A consistent snapshot of one semaphore, taken by one read-only script run: it writes
/// nothing (a user allowed only to read the keys may take it), and leaves out the entries
/// whose lease has passed in Redis (those the next script will reap), so every holder listed
/// has a valid lease.
///
/// Its cost is bounded: it counts every holder and waiter, and lists at most
/// [`STATS_LISTED`] of each (the first waiters of the queue), or the number asked of
/// [`Semaphore::stats_listing`](crate::Semaphore::stats_listing).
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// The semaphore's name.
    pub name: String,
    /// The limit stored in Redis.
    pub limit: u32,
    /// Permits held now.
    pub in_use: u32,
    /// Permits free now (`limit − in_use`, 0 while over a shrunk limit).
    pub available: u32,
    /// Holders, oldest acquisition first: all of them, or [`STATS_LISTED`] (or the number
    /// asked) of them when there are more ([`holder_count`](Self::holder_count) counts them
    /// all).
    pub holders: Vec<HolderInfo>,
    /// Waiters, in queue (FIFO) order: the first [`STATS_LISTED`] (or the number asked) of
    /// the queue ([`waiter_count`](Self::waiter_count) counts them all).
    pub waiters: Vec<WaiterInfo>,
    /// How many entries hold permits (each may hold several: see
    /// [`in_use`](Self::in_use)), listed or not.
    pub holder_count: usize,
    /// How many requests are queued, listed or not.
    pub waiter_count: usize,
    /// Grants made since the semaphore was created.
    pub grants_total: u64,
    /// Entries (holders and waiters) removed because their lease expired, since creation.
    pub expired_total: u64,
    /// Times the scripts found the semaphore's keys inconsistent (a key evicted, deleted or
    /// restored apart from the others) and repaired them from what survived. Non-zero means
    /// Redis lost some of the semaphore's data: check `maxmemory-policy` and persistence.
    /// Every script call checks the keys for a loss in O(1).
    pub repairs_total: u64,
    /// Redis server time of the snapshot, in milliseconds since the Unix epoch.
    pub server_time_ms: u64,
}

impl Stats {
    /// The longest wait among the waiters the snapshot listed (the first of the queue), if
    /// anyone waits and one was listed. Without priority classes the head of the queue
    /// waited longest of all; with them, a waiter of a lower class that higher ones overtook
    /// may wait longer than the head: this finds it when it is among those listed (so a
    /// listing of one, as `redsem list`'s, reports the head's wait).
    pub fn oldest_wait(&self) -> Option<Duration> {
        self.waiters.iter().map(|w| w.waited).max()
    }
}

/// One holder in [`Stats`].
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct HolderInfo {
    /// Holder id (see [`Permit::holder_id`](crate::Permit::holder_id)).
    pub id: String,
    /// The label of the process that holds it.
    pub label: String,
    /// Permits held.
    pub permits: u32,
    /// Slots and their fencing tokens.
    pub fences: Vec<Fence>,
    /// Time since the grant.
    #[serde(with = "millis")]
    pub held: Duration,
    /// Time until its lease expires unless renewed.
    #[serde(with = "millis")]
    pub lease_left: Duration,
}

/// One waiter in [`Stats`].
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct WaiterInfo {
    /// Waiter id (it becomes the holder id when granted).
    pub id: String,
    /// The label of the process that waits.
    pub label: String,
    /// Permits requested.
    pub permits: u32,
    /// Position in the queue, 0 = next to be granted.
    pub position: usize,
    /// Ticket number (FIFO order across all processes, within a priority class).
    pub ticket: u64,
    /// Its priority class ([`AcquireOptions::priority`](crate::AcquireOptions::priority); 0
    /// by default).
    pub priority: u8,
    /// Time since it joined the queue.
    #[serde(with = "millis")]
    pub waited: Duration,
    /// Time until its lease expires unless renewed (a crashed waiter leaves the queue then).
    #[serde(with = "millis")]
    pub lease_left: Duration,
}

mod millis {
    use serde::Serializer;
    use std::time::Duration;
    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
}

impl Stats {
    /// The public snapshot of the reply of `stats.lua` (parsed in `protocol`).
    pub(crate) fn from_reply(name: &str, reply: StatsReply) -> Stats {
        let now = reply.now_ms;
        let ms = |t: u64| Duration::from_millis(t);
        let mut holders: Vec<HolderInfo> = reply
            .holders
            .into_iter()
            .map(|e| HolderInfo {
                fences: e
                    .slots
                    .iter()
                    .zip(&e.fences)
                    .map(|(&slot, &generation)| Fence { slot, generation })
                    .collect(),
                held: ms(now.saturating_sub(e.granted_at.unwrap_or(now))),
                lease_left: ms(e.expires_at.unwrap_or(now).saturating_sub(now)),
                id: e.id,
                label: e.label,
                permits: e.permits,
            })
            .collect();
        holders.sort_by_key(|h| std::cmp::Reverse(h.held));
        let waiters: Vec<WaiterInfo> = reply
            .waiters
            .into_iter()
            .enumerate()
            .map(|(position, e)| WaiterInfo {
                waited: ms(now.saturating_sub(e.queued_at)),
                lease_left: ms(e.expires_at.unwrap_or(now).saturating_sub(now)),
                ticket: e.ticket,
                priority: e.priority,
                id: e.id,
                label: e.label,
                permits: e.permits,
                position,
            })
            .collect();
        Stats {
            holder_count: (reply.holder_count as usize).max(holders.len()),
            waiter_count: (reply.waiter_count as usize).max(waiters.len()),
            name: name.to_owned(),
            limit: reply.limit,
            in_use: reply.in_use,
            available: reply.limit.saturating_sub(reply.in_use),
            holders,
            waiters,
            grants_total: reply.grants,
            expired_total: reply.expired,
            repairs_total: reply.repairs,
            server_time_ms: reply.now_ms,
        }
    }
}

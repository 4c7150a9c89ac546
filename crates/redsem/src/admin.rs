//! Operator functions of [`Client`]: address an *existing* semaphore by name, without
//! knowing its limit and without opening it (no subscription, no heartbeat).
//!
//! These are what a command-line tool, a dashboard or an exporter needs: list the semaphores
//! under a prefix, read one's [`Stats`], resize it, force-release a holder. None of them
//! ever creates a semaphore: each runs the same script as its [`Semaphore`] counterpart,
//! behind a guard that returns nothing when the semaphore's configuration key does not exist
//! (checked atomically, inside the script), which is reported as
//! [`Error::UnknownSemaphore`]. After [`Client::shutdown`] each fails with
//! [`Error::Closed`] and sends nothing.
//!
//! [`Semaphore`]: crate::Semaphore

use std::collections::BTreeSet;

use crate::client::Client;
use crate::error::{CallResult, Error};
use crate::protocol;
use crate::protocol::keys::Keys;
use crate::protocol::keys::MAX_LIMIT;
use crate::stats::Stats;

impl Client {
    /// The names of every semaphore under this client's key prefix, sorted.
    ///
    /// Found with `SCAN MATCH <prefix>:{*}:cfg` (the configuration key every semaphore has;
    /// on a cluster, on every master), so it costs one round trip per `SCAN` page and walks
    /// the whole keyspace of the database: meant for operators and exporters, not for a hot
    /// path. Nothing is created.
    ///
    /// # Errors
    /// Connection and permission errors.
    pub async fn list_semaphores(&self) -> Result<Vec<String>, Error> {
        let prefix = &self.inner.prefix;
        let pattern = format!("{}:{{*}}:cfg", glob_escape(prefix));
        let head = format!("{prefix}:{{");
        let mut conn = self.inner.conn_for("")?;
        let mut names = BTreeSet::new();
        // on a cluster, every master is scanned
        let keys = conn
            .scan_match(&pattern)
            .await
            .map_err(Error::from_server)?;
        for key in keys {
            let name = key
                .strip_prefix(&head)
                .and_then(|rest| rest.strip_suffix("}:cfg"));
            // a prefix with '*' in it could match foreign keys: keep exact matches only
            if let Some(name) = name.filter(|n| !n.contains(['{', '}'])) {
                names.insert(name.to_owned());
            }
        }
        Ok(names.into_iter().collect())
    }

    /// Loads redsem's Redis Functions library (on a cluster, on every master) and returns its
    /// name, `redsem_<hash of its text>`: for the user that installs it where the
    /// applications' user may not (`FUNCTION LOAD`; the CLI's `load-library`; the rules are in
    /// docs/security.md). Idempotent; a library of another redsem version stays (each client
    /// calls its own). Not needed otherwise: a client whose call finds the library missing
    /// loads it itself, or runs the scripts where it may not (see
    /// [`ClientBuilder::scripts_only`](crate::ClientBuilder::scripts_only)). One round trip
    /// per master.
    ///
    /// # Errors
    /// [`Error::NoPermission`] when the user may not run `FUNCTION LOAD`; [`Error::Backend`]
    /// when the server has no Functions (Redis before 7.0) or refuses the library;
    /// connection errors.
    pub async fn load_library(&self) -> Result<String, Error> {
        let mut conn = self.inner.conn_for("")?;
        protocol::install_library(&mut conn)
            .await
            .map_err(|e| Error::from_call(e, "(the Functions library)"))
    }

    /// A consistent snapshot of the existing semaphore `name`, as
    /// [`Semaphore::stats`](crate::Semaphore::stats) returns it, without knowing its limit.
    /// Never creates the semaphore. One round trip.
    ///
    /// # Errors
    /// [`Error::UnknownSemaphore`] when it does not exist under this client's prefix;
    /// [`Error::InvalidArgument`] for a bad name; [`Error::WrongType`] when one of its keys
    /// holds a foreign value; connection and permission errors.
    pub async fn inspect(&self, name: &str) -> Result<Stats, Error> {
        self.inspect_listing(name, crate::stats::STATS_LISTED).await
    }

    /// [`inspect`](Self::inspect), listing at most `listed` holders and `listed` waiters
    /// instead of [`STATS_LISTED`](crate::STATS_LISTED): the counts are of all of them
    /// whatever `listed`. 0 lists nobody (then [`Stats::oldest_wait`] is `None`); 1 lists the
    /// head of the queue (what [`Stats::oldest_wait`] needs).
    ///
    /// Cost: one read-only round trip; Redis time grows with the entries listed (each is
    /// read and sent: a few µs), never with the length of the queue or the limit. Counting
    /// alone (0 or 1) costs about what inspecting an empty semaphore does (1.2–1.8x behind
    /// 1,000 to 10,000 waiters in the bench's `admin` scenario); listing 100 waiters, 8x.
    ///
    /// # Errors
    /// As [`inspect`](Self::inspect); [`Error::InvalidArgument`] for `listed` above
    /// [`MAX_LISTED`](crate::MAX_LISTED).
    pub async fn inspect_listing(&self, name: &str, listed: usize) -> Result<Stats, Error> {
        crate::stats::check_listed(listed)?;
        let keys = Keys::new(&self.inner.prefix, name)?;
        let mut conn = self.inner.conn_for(name)?;
        let publish = self.inner.publish;
        let reply = protocol::stats_existing(&mut conn, &keys, publish, listed).await;
        Ok(Stats::from_reply(name, self.existing(&keys, reply)?))
    }

    /// Changes the limit of the existing semaphore `name` for every replica, live, like
    /// [`Semaphore::resize`](crate::Semaphore::resize), without knowing its current limit.
    /// Returns the previous limit and the queued requests it rejected (larger than the new
    /// limit). Never creates the semaphore.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 or a limit above [`MAX_LIMIT`];
    /// [`Error::UnknownSemaphore`] when it does not exist; otherwise as
    /// [`inspect`](Self::inspect).
    pub async fn resize_existing(&self, name: &str, new_limit: u32) -> Result<Resized, Error> {
        crate::protocol::keys::check_limit(new_limit.into())?;
        let keys = Keys::new(&self.inner.prefix, name)?;
        let mut conn = self.inner.conn_for(name)?;
        let publish = self.inner.publish;
        let reply = protocol::resize_existing(&mut conn, &keys, publish, new_limit).await;
        Ok(Resized::from_reply(self.existing(&keys, reply)?, new_limit))
    }

    /// Changes the limit of the existing semaphore `name` by `delta` (positive or negative)
    /// for every replica, atomically, like [`Semaphore::add_permits`](crate::Semaphore::add_permits),
    /// without knowing its current limit: two concurrent changes both count. Returns the
    /// previous and the new limit and, when it shrank, the queued requests it rejected
    /// (larger than the new limit). Never creates the semaphore.
    ///
    /// # Cost
    /// One script call.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the new limit would be below 1 or above
    /// [`MAX_LIMIT`] (nothing is changed; the message gives the current limit);
    /// [`Error::UnknownSemaphore`] when it does not exist; otherwise as
    /// [`inspect`](Self::inspect).
    pub async fn add_permits_existing(&self, name: &str, delta: i64) -> Result<Resized, Error> {
        let keys = Keys::new(&self.inner.prefix, name)?;
        let mut conn = self.inner.conn_for(name)?;
        let publish = self.inner.publish;
        let reply =
            protocol::add_to_limit_existing(&mut conn, &keys, publish, delta, MAX_LIMIT).await;
        Resized::from_added(self.existing(&keys, reply)?, name, delta)
    }

    /// An operator's release of a holder, or removal of a queued waiter, of the existing
    /// semaphore `name` by its id (as [`inspect`](Self::inspect) lists them), like
    /// [`Semaphore::force_release`](crate::Semaphore::force_release): a holder's slots go to
    /// the queue at once, the holder learns it at its next renewal and the slots' next
    /// holders carry higher fences; a waiter leaves the queue, and its acquire fails with
    /// [`Error::RemovedFromQueue`] (told at once, or at its next renewal if the message is
    /// lost). Returns which it was. Never creates the semaphore. One script call.
    ///
    /// # Errors
    /// [`Error::UnknownSemaphore`] when the semaphore does not exist; otherwise as
    /// [`inspect`](Self::inspect).
    pub async fn force_release_existing(
        &self,
        name: &str,
        holder_id: &str,
    ) -> Result<ForceReleased, Error> {
        let keys = Keys::new(&self.inner.prefix, name)?;
        let mut conn = self.inner.conn_for(name)?;
        let publish = self.inner.publish;
        let reply = protocol::force_release_existing(&mut conn, &keys, publish, holder_id).await;
        Ok(ForceReleased::from_counts(self.existing(&keys, reply)?))
    }

    /// Deletes the semaphore `name`: every key of it in Redis (configuration, queue, leases,
    /// records, slot map, free slots, fences). Refused with [`Error::InUse`] while anyone
    /// holds or waits (expired entries do not count), unless `force`.
    ///
    /// A forced delete evicts like [`Semaphore::force_release`](crate::Semaphore::force_release):
    /// holders learn it at their next renewal (within one renewal interval) and their
    /// permits are lost with [`LostReason::Deleted`](crate::LostReason::Deleted); waiters
    /// are queued again. When it evicted entries, it leaves a tombstone (the `own` key, with
    /// a TTL of the longest lease left plus 10 s) so that their renewals and releases do not
    /// re-create the semaphore; a deliberate use (an acquisition, opening a handle) still
    /// does, with its own limit: stop those processes, or close their handles, to remove it
    /// for good. Fences never go back across
    /// a delete and a re-create: a new grant's generation is at least Redis's clock in
    /// microseconds (see [`crate::fencing`]).
    ///
    /// Use it to drop a semaphore nobody uses any more, or to re-create one under a new
    /// protocol version. Returns how many entries (holders and waiters) were evicted: 0
    /// unless forced.
    ///
    /// A forced delete removes a semaphore whose keys are inconsistent too, but never another
    /// program's data: when a key under the semaphore's names holds a type redsem does not
    /// keep there, or its configuration key a hash that is not a redsem configuration, it
    /// fails with [`Error::NotASemaphore`] and deletes nothing (see
    /// [`purge_keys`](Self::purge_keys)).
    ///
    /// # Cost
    /// One script call, O(entries).
    ///
    /// # Errors
    /// [`Error::InUse`] as above; [`Error::UnknownSemaphore`] when it does not exist;
    /// [`Error::NotASemaphore`] as above (or, without `force`, [`Error::WrongType`]);
    /// [`Error::InvalidArgument`] for a bad name; connection and permission errors.
    pub async fn delete_semaphore(&self, name: &str, force: bool) -> Result<u32, Error> {
        let mode = if force {
            protocol::DeleteMode::Force
        } else {
            protocol::DeleteMode::IfUnused
        };
        self.delete_with(name, mode).await
    }

    /// **Deletes every key a semaphore named `name` would use, whatever it holds, another
    /// program's data included** — what [`delete_semaphore`](Self::delete_semaphore) with
    /// `force` refuses to do ([`Error::NotASemaphore`]). Holders and waiters are evicted as
    /// by a forced delete. Only for an operator who has checked that the data may go (CLI:
    /// `redsem delete NAME --force --delete-foreign-data`). Returns how many redsem entries
    /// were evicted (as far as the keys could be read as such).
    ///
    /// # Errors
    /// [`Error::UnknownSemaphore`] when its configuration key does not exist;
    /// [`Error::InvalidArgument`] for a bad name; connection and permission errors.
    pub async fn purge_keys(&self, name: &str) -> Result<u32, Error> {
        self.delete_with(name, protocol::DeleteMode::Purge).await
    }

    async fn delete_with(&self, name: &str, mode: protocol::DeleteMode) -> Result<u32, Error> {
        let force = !matches!(mode, protocol::DeleteMode::IfUnused);
        let keys = Keys::new(&self.inner.prefix, name)?;
        let mut conn = self.inner.conn_for(name)?;
        let publish = self.inner.publish;
        let reply = protocol::delete_existing(&mut conn, &keys, publish, mode).await;
        let d = self.existing(&keys, reply)?;
        if !d.deleted {
            return Err(Error::InUse {
                name: name.to_owned(),
                holders: d.holders,
                waiters: d.waiters,
            });
        }
        tracing::info!(
            semaphore = name,
            force,
            evicted_holders = d.holders,
            evicted_waiters = d.waiters,
            "semaphore deleted"
        );
        Ok(d.holders + d.waiters)
    }

    /// Waits until the background task has performed every release handed to it before this
    /// call: those of dropped [`Permit`](crate::Permit)s and of cancelled or timed-out
    /// acquires (each retried a few times if Redis fails; the entries otherwise expire with
    /// their leases).
    ///
    /// Call it before a short-lived process exits, so that a ticket it gave up leaves the
    /// queue at once instead of when its lease expires. Bound it with a timeout if Redis may
    /// be unreachable.
    pub async fn flush_releases(&self) {
        self.inner.releaser.flush().await;
    }

    /// The reply of an operator script on the semaphore `keys`; `None` means that it does
    /// not exist.
    fn existing<T>(&self, keys: &Keys, reply: CallResult<Option<T>>) -> Result<T, Error> {
        match reply.map_err(|e| Error::from_call(e, &keys.name))? {
            Some(v) => Ok(v),
            None => Err(Error::UnknownSemaphore {
                name: keys.name.clone(),
                prefix: self.inner.prefix.clone(),
            }),
        }
    }
}

/// What a change of the limit did ([`Semaphore::resize`](crate::Semaphore::resize),
/// [`Client::resize_existing`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Resized {
    /// The limit before the change.
    pub previous: u32,
    /// The limit now.
    pub limit: u32,
    /// The queued requests the change rejected, in queue order: each asked for more permits
    /// than the new limit, so it could never be granted. Their acquires fail with
    /// [`Error::TooManyPermits`], which names the new limit. Empty unless the limit shrank.
    pub rejected: Vec<RejectedWaiter>,
}

impl Resized {
    pub(crate) fn from_reply(reply: protocol::ResizeReply, new_limit: u32) -> Resized {
        let (previous, limit, rejected) = reply;
        Resized {
            previous,
            limit: limit.unwrap_or(new_limit),
            rejected: rejected
                .into_iter()
                .map(|(id, permits, label)| RejectedWaiter { id, permits, label })
                .collect(),
        }
    }

    /// The reply of a relative change (`add`) by `delta`; an error when it was refused
    /// (nothing changed).
    pub(crate) fn from_added(
        reply: protocol::ResizeReply,
        name: &str,
        delta: i64,
    ) -> Result<Resized, Error> {
        let (old, new, _) = &reply;
        let Some(new) = *new else {
            return Err(Error::InvalidArgument(format!(
                "semaphore {}: its limit is {old}; adding {delta} would take it outside 1..={MAX_LIMIT}",
                crate::error::display_name(name)
            )));
        };
        Ok(Resized::from_reply(reply, new))
    }
}

/// A queued request that a shrink of the limit rejected (see [`Resized::rejected`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RejectedWaiter {
    /// Its id, as [`Stats::waiters`](crate::Stats::waiters) showed it.
    pub id: String,
    /// The permits it asked for.
    pub permits: u32,
    /// Its label (host:pid by default).
    pub label: String,
}

/// What an operator's forced release found ([`Client::force_release_existing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ForceReleased {
    /// A holder: its permits were released (it learns it at its next renewal).
    Holder,
    /// A queued waiter: it was removed from the queue (its acquire fails with
    /// [`Error::RemovedFromQueue`]).
    Waiter,
    /// No entry with that id (it finished, expired, or never existed): nothing changed.
    NotFound,
}

impl ForceReleased {
    /// `(holders, waiters)` removed by the script.
    pub(crate) fn from_counts((holders, waiters): (u64, u64)) -> ForceReleased {
        if waiters > 0 {
            ForceReleased::Waiter
        } else if holders > 0 {
            ForceReleased::Holder
        } else {
            ForceReleased::NotFound
        }
    }

    /// Whether an entry existed (and was removed).
    pub fn existed(self) -> bool {
        self != ForceReleased::NotFound
    }
}

/// Escapes the glob metacharacters of `SCAN MATCH` patterns.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn glob_metacharacters_are_escaped() {
        assert_eq!(super::glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(super::glob_escape("redsem"), "redsem");
    }
}

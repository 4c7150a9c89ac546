//! Operator functions of [`Client`]: address an *existing* semaphore by name, without
//! knowing its limit and without opening it (no subscription, no heartbeat).
//!
//! These are what a command-line tool, a dashboard or an exporter needs: list the semaphores
//! under a prefix, read one's [`Stats`], resize it, force-release a holder. None of them
//! ever creates a semaphore: each runs the same script as its [`Semaphore`] counterpart,
//! behind a guard that returns nothing when the semaphore's configuration key does not exist
//! (checked atomically, inside the script), which is reported as
//! [`Error::UnknownSemaphore`].
//!
//! [`Semaphore`]: crate::Semaphore

use std::collections::BTreeSet;

use crate::client::Client;
use crate::error::{CallResult, Error};
use crate::keys::Keys;
use crate::scripts;
use crate::semaphore::MAX_LIMIT;
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
        let mut conn = self.inner.conn.clone();
        let mut names = BTreeSet::new();
        // on a cluster, every master is scanned
        let keys = conn
            .scan_match(&pattern)
            .await
            .map_err(|e| Error::from_redis(e, ""))?;
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

    /// A consistent snapshot of the existing semaphore `name`, as
    /// [`Semaphore::stats`](crate::Semaphore::stats) returns it, without knowing its limit.
    /// Never creates the semaphore. One round trip.
    ///
    /// # Errors
    /// [`Error::UnknownSemaphore`] when it does not exist under this client's prefix;
    /// [`Error::InvalidArgument`] for a bad name; [`Error::WrongType`] when one of its keys
    /// holds a foreign value; connection and permission errors.
    pub async fn inspect(&self, name: &str) -> Result<Stats, Error> {
        let keys = Keys::new(&self.inner.prefix, name)?;
        let mut conn = self.inner.conn.clone();
        let publish = self.inner.publish;
        let reply = scripts::stats_existing(&mut conn, &keys, publish).await;
        Ok(Stats::from_reply(name, self.existing(&keys, reply)?))
    }

    /// Changes the limit of the existing semaphore `name` for every replica, live, like
    /// [`Semaphore::resize`](crate::Semaphore::resize), without knowing its current limit.
    /// Returns the previous limit. Never creates the semaphore.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 or a limit above [`MAX_LIMIT`];
    /// [`Error::UnknownSemaphore`] when it does not exist; otherwise as
    /// [`inspect`](Self::inspect).
    pub async fn resize_existing(&self, name: &str, new_limit: u32) -> Result<u32, Error> {
        crate::keys::check_limit(new_limit.into())?;
        let keys = Keys::new(&self.inner.prefix, name)?;
        let mut conn = self.inner.conn.clone();
        let publish = self.inner.publish;
        let reply = scripts::resize_existing(&mut conn, &keys, publish, new_limit).await;
        self.existing(&keys, reply)
    }

    /// Changes the limit of the existing semaphore `name` by `delta` (positive or negative)
    /// for every replica, atomically, like [`Semaphore::add_permits`](crate::Semaphore::add_permits),
    /// without knowing its current limit: two concurrent changes both count. Returns the new
    /// limit (the previous one is the new one − `delta`). Never creates the semaphore.
    ///
    /// # Cost
    /// One script call.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the new limit would be below 1 or above
    /// [`MAX_LIMIT`] (nothing is changed; the message gives the current limit);
    /// [`Error::UnknownSemaphore`] when it does not exist; otherwise as
    /// [`inspect`](Self::inspect).
    pub async fn add_permits_existing(&self, name: &str, delta: i64) -> Result<u32, Error> {
        let keys = Keys::new(&self.inner.prefix, name)?;
        let mut conn = self.inner.conn.clone();
        let publish = self.inner.publish;
        let reply =
            scripts::add_to_limit_existing(&mut conn, &keys, publish, delta, MAX_LIMIT).await;
        let (old, new) = self.existing(&keys, reply)?;
        new.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "semaphore {name:?}: its limit is {old}; adding {delta} would take it outside 1..={MAX_LIMIT}"
            ))
        })
    }

    /// An operator's release of a holder (or queued waiter) of the existing semaphore `name`
    /// by its id, like [`Semaphore::force_release`](crate::Semaphore::force_release) (the
    /// holder learns it at its next renewal; the slots' next holders carry higher fences).
    /// Returns whether the entry existed. Never creates the semaphore.
    ///
    /// # Errors
    /// [`Error::UnknownSemaphore`] when the semaphore does not exist; otherwise as
    /// [`inspect`](Self::inspect).
    pub async fn force_release_existing(&self, name: &str, holder_id: &str) -> Result<bool, Error> {
        let keys = Keys::new(&self.inner.prefix, name)?;
        let mut conn = self.inner.conn.clone();
        let publish = self.inner.publish;
        let reply = scripts::force_release_existing(&mut conn, &keys, publish, holder_id).await;
        Ok(self.existing(&keys, reply)? > 0)
    }

    /// Deletes the semaphore `name`: every key of it in Redis (configuration, queue, leases,
    /// records, slot map, free slots, fences). Refused with [`Error::InUse`] while anyone
    /// holds or waits (expired entries do not count), unless `force`.
    ///
    /// A forced delete evicts like [`Semaphore::force_release`](crate::Semaphore::force_release):
    /// holders learn it at their next renewal (within one renewal interval) and their
    /// permits are lost; waiters are queued again. A handle still open on it (in any process)
    /// re-creates it, with its own limit, at its next call, as after a data loss: stop those
    /// processes, or close their handles, to remove it for good. Fences never go back across
    /// a delete and a re-create: a new grant's generation is at least Redis's clock in
    /// microseconds (see [`crate::fencing`]).
    ///
    /// Use it to drop a semaphore nobody uses any more, or to re-create one under a new
    /// protocol version. Returns how many entries (holders and waiters) were evicted: 0
    /// unless forced.
    ///
    /// # Cost
    /// One script call, O(entries + limit).
    ///
    /// # Errors
    /// [`Error::InUse`] as above; [`Error::UnknownSemaphore`] when it does not exist;
    /// [`Error::InvalidArgument`] for a bad name; connection and permission errors.
    pub async fn delete_semaphore(&self, name: &str, force: bool) -> Result<u32, Error> {
        let keys = Keys::new(&self.inner.prefix, name)?;
        let mut conn = self.inner.conn.clone();
        let publish = self.inner.publish;
        let reply = scripts::delete_existing(&mut conn, &keys, publish, force).await;
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

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
use std::sync::LazyLock;

use redis::Value;

use crate::client::Client;
use crate::error::Error;
use crate::keys::Keys;
use crate::scripts::{Lua, RawStats};
use crate::semaphore::MAX_LIMIT;
use crate::stats::Stats;

/// Prepended to a script body: a missing configuration means "no such semaphore" (nil reply),
/// where the plain scripts would create it.
const GUARD: &str = "if redis.call('EXISTS', K_CFG) == 0 then return false end";

static STATS: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("inspect", GUARD, include_str!("scripts/stats.lua")));
static RESIZE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("resize", GUARD, include_str!("scripts/resize.lua")));
static RELEASE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("force-release", GUARD, include_str!("scripts/release.lua")));

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
        let v = self.invoke_guarded(&STATS, &keys, &[]).await?;
        let items = match &v {
            Value::Array(items) if items.len() >= 7 => items,
            _ => return Err(unexpected(name, &v)),
        };
        let int = |i: usize| as_int(&items[i]).ok_or_else(|| unexpected(name, &v));
        let text = |i: usize| as_text(&items[i]).ok_or_else(|| unexpected(name, &v));
        let raw = RawStats {
            now_ms: int(0)? as u64,
            limit: int(1)? as u32,
            in_use: int(2)? as u32,
            grants: int(3)? as u64,
            expired: int(4)? as u64,
            holders_json: text(5)?,
            waiters_json: text(6)?,
        };
        Stats::from_raw(name, raw)
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
        if new_limit == 0 || new_limit > MAX_LIMIT {
            return Err(Error::InvalidArgument(format!(
                "limit must be between 1 and {MAX_LIMIT}, not {new_limit}"
            )));
        }
        let keys = Keys::new(&self.inner.prefix, name)?;
        let v = self
            .invoke_guarded(&RESIZE, &keys, &[new_limit.to_string()])
            .await?;
        as_int(&v)
            .map(|old| old as u32)
            .ok_or_else(|| unexpected(name, &v))
    }

    /// An operator's release of a holder (or queued waiter) of the existing semaphore `name`
    /// by its id, like [`Semaphore::force_release`](crate::Semaphore::force_release): the
    /// fences of its slots advance at once. Returns whether the entry existed. Never creates
    /// the semaphore.
    ///
    /// # Errors
    /// [`Error::UnknownSemaphore`] when the semaphore does not exist; otherwise as
    /// [`inspect`](Self::inspect).
    pub async fn force_release_existing(&self, name: &str, holder_id: &str) -> Result<bool, Error> {
        let keys = Keys::new(&self.inner.prefix, name)?;
        let v = self
            .invoke_guarded(&RELEASE, &keys, &["1".to_owned(), holder_id.to_owned()])
            .await?;
        as_int(&v)
            .map(|n| n > 0)
            .ok_or_else(|| unexpected(name, &v))
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
        self.inner.driver.flush().await;
    }

    /// Runs a guarded script on an existing semaphore; a nil reply means it does not exist.
    async fn invoke_guarded(
        &self,
        script: &Lua,
        keys: &Keys,
        args: &[String],
    ) -> Result<Value, Error> {
        let mut conn = self.inner.conn.clone();
        // common header (see prelude.lua); the limit is never used: the guard returns first
        // when the configuration is missing
        let v = script
            .run(&mut conn, keys, 1, self.inner.publish, |inv| {
                for a in args {
                    inv.arg(a);
                }
            })
            .await
            .map_err(|e| Error::from_redis(e, &keys.name))?;
        if matches!(v, Value::Nil) {
            return Err(Error::UnknownSemaphore {
                name: keys.name.clone(),
                prefix: self.inner.prefix.clone(),
            });
        }
        Ok(v)
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

fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

fn as_text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn unexpected(name: &str, v: &Value) -> Error {
    Error::InvalidArgument(format!(
        "semaphore {name:?}: unexpected reply from a redsem script ({v:?}); is another redsem protocol version using these keys?"
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn glob_metacharacters_are_escaped() {
        assert_eq!(super::glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(super::glob_escape("redsem"), "redsem");
    }
}

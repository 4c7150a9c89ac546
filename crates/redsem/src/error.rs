//! The crate's error type.

use std::fmt;

use crate::codes::{Code, script_detail};
use std::time::Duration;

/// Why a held permit's slot is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// A renewal reached Redis and found the entry missing: the lease expired before it could
    /// be renewed (this process was paused or too slow), an operator force-released it, or
    /// Redis lost its data. Another process may hold the slot now.
    NotHolder,
    /// Renewals failed (Redis unreachable or too slow) until the lease could have expired on
    /// the server. The slot may or may not still be held; it must be treated as lost. Told a
    /// safety margin before the lease could end in Redis, so that the work stops in time: the
    /// entry is detached there, not released (nobody renews it, and nobody else is granted
    /// its slots before that lease ends); dropping the permit releases it.
    Unreachable,
    /// The client was shut down ([`Client::shutdown`](crate::Client::shutdown)) while the
    /// permit was held: its entry was released.
    Shutdown,
    /// Redis refused the renewal for lack of permission (an ACL rule without a command the
    /// renewal script needs; see the warning logged and the crate's `guide`, "Security"):
    /// no renewal can succeed, so the permit is given up at once. Pending acquisitions of the
    /// handle fail with [`Error::NoPermission`].
    Refused,
    /// The semaphore was deleted while the permit was held (an operator's forced delete,
    /// [`Client::delete_semaphore`](crate::Client::delete_semaphore) with `force`, or
    /// `redsem delete --force`): the renewal found it gone, and did not re-create it.
    Deleted,
    /// Another semaphore handle adopted the entry
    /// ([`Semaphore::adopt`](crate::Semaphore::adopt) with a
    /// [`HandoffToken`](crate::HandoffToken) of it, e.g. the same token adopted twice): the
    /// last adopter holds it now, and this handle's renewals no longer keep it alive.
    HandedOff,
    /// The permit reached the maximum hold time its acquisition asked for
    /// ([`AcquireOptions::max_hold`](crate::AcquireOptions::max_hold)), counted from when this
    /// process learned of the grant. Its renewals stopped: the entry was detached in Redis
    /// and keeps the lease it had then, so its slots are free within one lease even if the
    /// program keeps the permit; dropping or releasing the permit frees them at once. Until
    /// that lease ends nobody else holds the slots, but the work must stop: it ran out of
    /// the time it was given.
    MaxHold,
    /// A key of the semaphore was overwritten while the permit was held: it now holds data
    /// redsem cannot read as its own (a value of another type, `WRONGTYPE`; another
    /// program's hash at the configuration key; an unreadable record), so the renewal failed
    /// and no renewal can succeed. The semaphore's record of its holders can no longer be
    /// trusted (an operator who deletes the foreign keys starts a fresh semaphore, whose
    /// permits are all free), so the permit is given up at once rather than when its lease
    /// runs out. Acquisitions fail with [`Error::WrongType`] or [`Error::NotASemaphore`]
    /// until the foreign keys are removed (`redsem delete --force --delete-foreign-data`,
    /// which removes what is left of the entry too); releasing such a permit sends nothing
    /// (Redis would refuse it the same way) and succeeds.
    Overwritten,
}

/// Why a `try_acquire` found no permits ([`Error::NoPermits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NoPermitsReason {
    /// Fewer permits are free than requested.
    NoneFree,
    /// Enough permits are free, but other requests are queued and FIFO order grants them
    /// first.
    QueuedFirst,
    /// This process's local cap
    /// ([`SemaphoreBuilder::local_cap`](crate::SemaphoreBuilder::local_cap)) is used up;
    /// Redis was not asked.
    LocalCap,
}

impl fmt::Display for NoPermitsReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NoPermitsReason::NoneFree => "fewer permits are free than requested",
            NoPermitsReason::QueuedFirst => {
                "permits are free, but other requests are queued first (FIFO)"
            }
            NoPermitsReason::LocalCap => "this process's local cap is used up",
        })
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::NotHolder => "the renewal found the lease gone (expired or removed)",
            LostReason::Unreachable => {
                "renewals failed until the lease could have expired (Redis unreachable or slow)"
            }
            LostReason::Shutdown => "the client was shut down (Client::shutdown) while it was held",
            LostReason::Refused => "Redis refused the renewal for lack of permission (ACL)",
            LostReason::Deleted => "the semaphore was deleted (a forced delete) while it was held",
            LostReason::HandedOff => {
                "another handle adopted it (Semaphore::adopt of its hand-off token): the last adopter holds it"
            }
            LostReason::MaxHold => {
                "the maximum hold time of the acquisition was reached (its renewals stopped)"
            }
            LostReason::Overwritten => {
                "a key of the semaphore was overwritten by another program's data (the renewal found it)"
            }
        })
    }
}

/// Everything that can go wrong, each variant saying what to do about it.
///
/// The variants that describe bad input ([`InvalidArgument`](Error::InvalidArgument),
/// [`TooManyPermits`](Error::TooManyPermits), [`LimitConflict`](Error::LimitConflict)) are
/// returned before anything is queued. No error leaves a slot, a queue entry or a task behind:
/// what was written is removed in the background, or expires with its lease.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument or a configuration value is out of range. The message says which and why.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The semaphore exists in Redis with another limit. All replicas must agree on one
    /// limit: open it with the stored limit, or change it for everyone with
    /// [`Semaphore::resize`](crate::Semaphore::resize).
    #[error(
        "semaphore {n} already exists with limit {stored}, not {requested}: open it with limit {stored}, or resize it", n = display_name(.name))]
    #[non_exhaustive]
    LimitConflict {
        /// The semaphore's name.
        name: String,
        /// The limit this process asked for.
        requested: u32,
        /// The limit stored in Redis, shared by every replica.
        stored: u32,
    },

    /// More permits were requested at once than the semaphore's limit: such a request could
    /// never be granted.
    #[error("semaphore {n}: requested {requested} permits at once, but the limit is {limit}", n = display_name(.name))]
    #[non_exhaustive]
    TooManyPermits {
        /// The semaphore's name.
        name: String,
        /// Permits requested.
        requested: u32,
        /// The semaphore's limit at the time of the request.
        limit: u32,
    },

    /// `try_acquire`: the permits cannot be taken right now; [`NoPermitsReason`] says why.
    #[error("semaphore {n}: no permits right now: {reason}", n = display_name(.name))]
    #[non_exhaustive]
    NoPermits {
        /// The semaphore's name.
        name: String,
        /// Why: none free, or free but others are queued first (FIFO), or this process's
        /// local cap is used up.
        reason: NoPermitsReason,
    },

    /// The acquire did not succeed within its timeout; its place in the queue was given up.
    #[error("semaphore {n}: timed out after {timeout:?} waiting for permits", n = display_name(.name))]
    #[non_exhaustive]
    Timeout {
        /// The semaphore's name.
        name: String,
        /// The timeout that ran out.
        timeout: Duration,
    },

    /// The permit's slot was lost while the work ran (see [`LostReason`]).
    #[error("semaphore {n}: the slot was lost: {reason}", n = display_name(.name))]
    #[non_exhaustive]
    LeaseLost {
        /// The semaphore's name.
        name: String,
        /// Why it was lost.
        reason: LostReason,
    },

    /// An operator removed this waiter from the queue
    /// ([`Client::force_release_existing`](crate::Client::force_release_existing),
    /// [`Semaphore::force_release`](crate::Semaphore::force_release), CLI `redsem release`)
    /// before it was granted: the acquisition was cancelled on purpose. Nothing is left in
    /// Redis. Do not simply retry: ask whoever removed it, or acquire again if the work must
    /// still run.
    #[error(
        "semaphore {n}: an operator removed this request from the queue (a forced release) before it was granted; it was not retried", n = display_name(.name)
    )]
    #[non_exhaustive]
    RemovedFromQueue {
        /// The semaphore's name.
        name: String,
    },

    /// [`Semaphore::adopt`](crate::Semaphore::adopt): the entry of the
    /// [`HandoffToken`](crate::HandoffToken) is no longer in Redis. Its lease ran out before
    /// it was adopted (an exported permit is renewed by nobody until it is adopted: adopt
    /// it within one lease, or acquire with a longer lease), or it was released
    /// ([`Semaphore::release_handoff`](crate::Semaphore::release_handoff), an operator's
    /// forced release) or deleted. Nothing was changed; acquire a new permit if the work must
    /// still run.
    #[error(
        "semaphore {n}: the handed-off holder {holder_id} is gone from Redis (its lease ran out before it was adopted, or it was released): acquire a new permit", n = display_name(.name))]
    #[non_exhaustive]
    HandoffGone {
        /// The semaphore's name.
        name: String,
        /// The holder id the token names.
        holder_id: String,
    },

    /// The semaphore handle was closed with [`Semaphore::close`](crate::Semaphore::close),
    /// or its client shut down with [`Client::shutdown`](crate::Client::shutdown) (then
    /// every call of the client fails so too: the operator calls and
    /// [`Client::ping`](crate::Client::ping) as well). Connect a new client to go on.
    #[error("{}", closed_message(.name))]
    #[non_exhaustive]
    Closed {
        /// The semaphore's name (empty for a call about no semaphore, such as
        /// [`Client::ping`](crate::Client::ping)).
        name: String,
    },

    /// The semaphore does not exist under the client's key prefix (returned by the
    /// operator functions of [`Client`](crate::Client), such as
    /// [`inspect`](crate::Client::inspect), which never create one). Check the name and the
    /// key prefix.
    #[error(
        "no semaphore named {n} under key prefix {prefix:?} (check the name and the key prefix)", n = display_name(.name))]
    #[non_exhaustive]
    UnknownSemaphore {
        /// The semaphore's name.
        name: String,
        /// The key prefix that was searched.
        prefix: String,
    },

    /// [`Client::delete_semaphore`](crate::Client::delete_semaphore) without `force`: the
    /// semaphore has live holders or waiters. Wait until they are done, or delete with
    /// `force` (CLI: `--force`) to evict them.
    #[error(
        "semaphore {n} is in use ({holders} holder(s), {waiters} waiter(s)): wait until they are done, or delete with force (`--force`, `force: true`) to evict them", n = display_name(.name))]
    #[non_exhaustive]
    InUse {
        /// The semaphore's name.
        name: String,
        /// Live holders (acquisitions, not permits).
        holders: u32,
        /// Queued waiters.
        waiters: u32,
    },

    /// A key of the semaphore holds a value of another type: another program uses the same
    /// key names. Pick another name or key prefix, or delete the foreign keys.
    #[error(
        "a key of semaphore {n} holds another type of value ({detail}): use another name or key prefix", n = display_name(.name))]
    #[non_exhaustive]
    WrongType {
        /// The semaphore's name.
        name: String,
        /// What Redis said.
        detail: String,
    },

    /// The semaphore's configuration key (`<prefix>:{<name>}:cfg`), or another of its keys,
    /// holds another program's data: a hash that is not a redsem configuration (a `limit`
    /// that is not a positive integer, or neither `limit` nor `ver`), or a value of a type
    /// redsem does not keep there. Nothing was read as a semaphore, adopted or deleted. Use
    /// another name or key prefix; if the data may go, delete it with
    /// [`Client::purge_keys`](crate::Client::purge_keys) (CLI:
    /// `redsem delete NAME --force --delete-foreign-data`).
    #[error("semaphore {n}: not a redsem semaphore: {detail}; use another name or key prefix", n = display_name(.name))]
    #[non_exhaustive]
    NotASemaphore {
        /// The semaphore's name.
        name: String,
        /// Which key, and what it holds.
        detail: String,
    },

    /// The semaphore was created under another, incompatible version of the redsem protocol
    /// (a newer client, or another implementation; see `docs/PROTOCOL.md`), or Redis
    /// answered with a reply or a stored entry redsem cannot read. Nothing was changed. Use
    /// a client that speaks that version, or recreate the semaphore
    /// ([`Client::delete_semaphore`](crate::Client::delete_semaphore)).
    #[error("semaphore {n}: {detail}", n = display_name(.name))]
    #[non_exhaustive]
    ProtocolMismatch {
        /// The semaphore's name.
        name: String,
        /// What the script said: the semaphore's version and this client's.
        detail: String,
    },

    /// The semaphore's keys contradict each other in a way the scripts cannot repair (after
    /// keys were evicted, deleted or restored separately): two holder records claim one
    /// slot, or the free slots do not match the holders even after a repair. Nothing was
    /// granted. Inspect the named keys; if nobody relies on the semaphore's state, delete its
    /// keys (`redsem delete --force`, or `DEL` of the keys under `<prefix>:{<name>}:`) and
    /// reopen it. Losses that can be repaired (one key, or a record and its lease) are
    /// repaired silently and counted in [`Stats::repairs_total`](crate::Stats::repairs_total).
    #[error("semaphore {n}: its keys are inconsistent and could not be repaired: {detail}", n = display_name(.name))]
    #[non_exhaustive]
    Corrupt {
        /// The semaphore's name.
        name: String,
        /// What the script found, naming the key.
        detail: String,
    },

    /// The server's `maxmemory-policy` may evict the semaphore's keys (`allkeys-*`, or
    /// `volatile-*` while one of its keys carries a TTL). An evicted key would break the
    /// guarantees (the scripts repair what they can, but the holders of a lost record are
    /// only told at their next renewal). Use a Redis with `maxmemory-policy noeviction` (or a
    /// `volatile-*` policy and no TTL on the semaphore's keys) for semaphores, or accept the
    /// risk with [`SemaphoreBuilder::allow_evicting_policy`](crate::SemaphoreBuilder::allow_evicting_policy)
    /// (CLI: `--allow-evicting-policy`).
    #[error(
        "semaphore {n}: Redis's maxmemory-policy is {policy} and {detail}: set maxmemory-policy to noeviction, or open with allow_evicting_policy(true) / --allow-evicting-policy to accept the risk", n = display_name(.name))]
    #[non_exhaustive]
    EvictingPolicy {
        /// The semaphore's name.
        name: String,
        /// The server's `maxmemory-policy`, as `INFO memory` reports it.
        policy: String,
        /// Why it can evict the semaphore's keys.
        detail: String,
    },

    /// The Redis user may not run a command or touch a key or channel that redsem needs.
    /// Grant the rule documented in the README's Security section.
    #[error(
        "Redis refused a command for lack of permission ({0}): grant the ACL rule from the README's Security section"
    )]
    NoPermission(String),

    /// Authentication failed: the server needs a password the URL does not give (NOAUTH),
    /// or the user name or password is wrong (WRONGPASS). The message says which, and how
    /// to put them in the URL.
    #[error("Redis authentication failed: {0}")]
    Auth(String),

    /// Synced mode ([`ClientBuilder::synced_replicas`](crate::ClientBuilder::synced_replicas)):
    /// fewer replicas than required acknowledged the grant in time, so the permit was
    /// released. A replica is down or lagging; the call can be retried.
    #[error(
        "semaphore {n}: {acked} of the {wanted} required replicas acknowledged the grant within {timeout:?}; the permit was released (synced mode)", n = display_name(.name))]
    #[non_exhaustive]
    NotReplicated {
        /// The semaphore's name.
        name: String,
        /// Replicas that acknowledged the grant in time.
        acked: u32,
        /// Replicas required.
        wanted: u32,
        /// How long the grant waited for them.
        timeout: Duration,
    },

    /// Redis could not be reached, or did not answer in time. Check that the server runs and
    /// that the URL is right; calls can be retried.
    #[error("Redis is unreachable or did not answer in time: {0}")]
    Unreachable(BackendError),

    /// Any other error reported by Redis or the client.
    #[error("Redis error: {0}")]
    Backend(BackendError),
}

impl Error {
    /// True for errors that may go away by themselves (Redis unreachable or slow): retrying
    /// the same call later can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Unreachable(_)
                | Error::Timeout { .. }
                | Error::NoPermits { .. }
                | Error::NotReplicated { .. }
        )
    }

    /// Names a failed call after the semaphore `name` it was made for.
    pub(crate) fn from_call(err: CallError, name: &str) -> Error {
        match err {
            CallError::Denied(detail) => Error::NoPermission(detail),
            CallError::Redis(e) => Error::from_redis(e, name),
            CallError::Unreadable(text) => Error::ProtocolMismatch {
                name: name.to_owned(),
                detail: format!("a reply or stored entry could not be read: {text}"),
            },
        }
    }

    pub(crate) fn closed(name: &str) -> Error {
        Error::Closed {
            name: name.to_owned(),
        }
    }

    /// [`Error::LeaseLost`], for the language bindings (clients/python, clients/node), whose
    /// `Permit.run` runs work of the host language and reports the loss with this error.
    #[doc(hidden)]
    pub fn lease_lost_for_binding(name: &str, reason: LostReason) -> Error {
        Error::lease_lost(name, reason)
    }

    pub(crate) fn lease_lost(name: &str, reason: LostReason) -> Error {
        Error::LeaseLost {
            name: name.to_owned(),
            reason,
        }
    }

    pub(crate) fn no_permits(name: &str, reason: NoPermitsReason) -> Error {
        Error::NoPermits {
            name: name.to_owned(),
            reason,
        }
    }

    /// The name of the semaphore this error is about, when it is about one.
    pub fn semaphore(&self) -> Option<&str> {
        match self {
            Error::LimitConflict { name, .. }
            | Error::TooManyPermits { name, .. }
            | Error::NoPermits { name, .. }
            | Error::Timeout { name, .. }
            | Error::LeaseLost { name, .. }
            | Error::Closed { name }
            | Error::RemovedFromQueue { name }
            | Error::HandoffGone { name, .. }
            | Error::UnknownSemaphore { name, .. }
            | Error::InUse { name, .. }
            | Error::WrongType { name, .. }
            | Error::NotASemaphore { name, .. }
            | Error::ProtocolMismatch { name, .. }
            | Error::Corrupt { name, .. }
            | Error::EvictingPolicy { name, .. }
            | Error::NotReplicated { name, .. } => Some(name.as_str()),
            _ => None,
        }
        // (`Closed` from a call about no semaphore, e.g. `Client::ping`, has no name)
        .filter(|name| !name.is_empty())
    }

    /// `err`, from a call about the semaphore `name`, as redsem's error ([`Code`] decides).
    pub(crate) fn from_redis(err: redis::RedisError, name: &str) -> Error {
        let named = |f: fn(String, String) -> Error| f(name.to_owned(), script_detail(&err));
        match Code::of(&err) {
            Code::WrongType => named(|name, detail| Error::WrongType { name, detail }),
            Code::Protocol => named(|name, detail| Error::ProtocolMismatch { name, detail }),
            Code::Foreign => named(|name, detail| Error::NotASemaphore { name, detail }),
            Code::Corrupt => named(|name, detail| Error::Corrupt { name, detail }),
            _ => Error::from_server(err),
        }
    }

    /// `err`, from a call about no semaphore in particular (connecting, probing, listing),
    /// as redsem's error ([`Code`] decides).
    pub(crate) fn from_server(err: redis::RedisError) -> Error {
        let text = err.to_string();
        match Code::of(&err) {
            Code::Unavailable => Error::Unreachable(BackendError(err)),
            Code::NoPermission => Error::NoPermission(text),
            Code::NoAuth => Error::Auth(format!(
                "the server needs a password: put it in the URL as \
                 redis://user:password@host:port/ (redis://:password@host:port/ for the default \
                 user) [{text}]"
            )),
            Code::WrongPass => Error::Auth(format!(
                "the user name or password in the URL is wrong, or the user is disabled [{text}]"
            )),
            _ => Error::Backend(BackendError(err)),
        }
    }
}

/// How one Redis call made by redsem failed, before it is named after its semaphore (see
/// [`Error::from_call`]). Cloneable: one failed batched call answers every request in it.
#[derive(Clone, Debug)]
pub(crate) enum CallError {
    /// What Redis, or the Redis client, said.
    Redis(redis::RedisError),
    /// Redis refused a command, key or channel for lack of permission; the text says, in
    /// redsem's words, what the user may not do (built by the code that knows what it asked).
    Denied(String),
    /// A reply redsem cannot read (another protocol version wrote the keys?); the text
    /// says what.
    Unreadable(String),
}

/// The result of one Redis call made by redsem.
pub(crate) type CallResult<T> = Result<T, CallError>;

impl From<redis::RedisError> for CallError {
    fn from(e: redis::RedisError) -> CallError {
        CallError::Redis(e)
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Redis(e) => fmt::Display::fmt(e, f),
            CallError::Denied(detail) => write!(f, "permission denied: {detail}"),
            CallError::Unreadable(text) => f.write_str(text),
        }
    }
}

/// An error from Redis or the Redis client, kept opaque so that the client library can be
/// upgraded without breaking this crate's API. Its `Display` says what Redis said.
pub struct BackendError(redis::RedisError);

impl BackendError {
    pub(crate) fn timed_out(what: String) -> BackendError {
        BackendError(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            what,
        )))
    }
    /// A refused connection, in redsem's words (`what`: where, and what to check).
    pub(crate) fn refused(what: String) -> BackendError {
        BackendError(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            what,
        )))
    }
    /// True when the call did not get an answer in time.
    pub fn is_timeout(&self) -> bool {
        self.0.is_timeout()
    }
    /// True when the connection failed, was refused or dropped.
    pub fn is_connection(&self) -> bool {
        self.0.is_io_error() || self.0.is_connection_dropped() || self.0.is_connection_refusal()
    }
    /// The error code Redis replied with (`ERR`, `READONLY`, ...), if the server replied.
    pub fn code(&self) -> Option<&str> {
        self.0.code()
    }
    /// True when the server's reply was not RESP (the server is not Redis?).
    pub(crate) fn is_parse_error(&self) -> bool {
        matches!(self.0.kind(), redis::ErrorKind::Parse)
    }
    /// True when the connection was refused (nothing listens there).
    pub(crate) fn is_refusal(&self) -> bool {
        self.0.is_connection_refusal()
    }
}

impl fmt::Debug for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for BackendError {}

/// Longest part of a name that messages show ([`display_name`]), in characters.
const SHOWN_NAME_CHARS: usize = 60;

/// [`Error::Closed`]'s message.
fn closed_message(name: &str) -> String {
    if name.is_empty() {
        "the client was shut down (its shutdown or close): connect a new one".to_owned()
    } else {
        format!(
            "semaphore {} was closed (its handle's close, or its client's shutdown): open it \
             again on a live client",
            display_name(name)
        )
    }
}

/// A semaphore name as messages show it: quoted and escaped as by `{:?}`, cut after 60
/// characters with `…` (names may be 200 bytes long; a message names the semaphore, it
/// need not spell all of it).
pub fn display_name(name: &str) -> String {
    match name.char_indices().nth(SHOWN_NAME_CHARS) {
        None => format!("{name:?}"),
        Some((cut, _)) => {
            let quoted = format!("{:?}", &name[..cut]);
            format!("{}…\"", &quoted[..quoted.len() - 1])
        }
    }
}

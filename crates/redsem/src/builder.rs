//! [`SemaphoreBuilder`]: the settings of a semaphore handle, validated, and opening it.

use std::time::Duration;

use crate::client::Client;
use crate::engine::{Handle, OpenSettings, OtherLimit, Timing};
use crate::error::Error;
use crate::options::check_duration;
use crate::semaphore::Semaphore;

/// Opens a [`Semaphore`]; made by [`Client::semaphore`].
#[derive(Debug)]
#[must_use = "a SemaphoreBuilder does nothing until .open().await"]
pub struct SemaphoreBuilder {
    client: Client,
    name: String,
    limit: u32,
    lease: Duration,
    renew_every: Option<Duration>,
    fallback_poll: Duration,
    local_cap: Option<u32>,
    label: Option<String>,
    allow_evicting_policy: bool,
    on_limit: LimitPolicy,
}

/// What [`SemaphoreBuilder::open`] does when the semaphore exists in Redis with another limit
/// than the code's, or does not exist; set with [`SemaphoreBuilder::limit_policy`].
///
/// The stored limit is one for every replica. Which policy fits depends on who owns it:
///
/// - the code owns it ([`Resize`](Self::Resize)): a deploy that changes the limit changes it
///   for everyone as the first new replica opens;
/// - an operator owns it (`redsem limit`, [`Semaphore::resize`]) and the code's value only
///   seeds it ([`CreateOrAdopt`](Self::CreateOrAdopt)): replicas of every version open
///   whatever the stored limit is;
/// - someone else creates it ([`Adopt`](Self::Adopt));
/// - every replica must agree, and a disagreement is a bug to stop on
///   ([`Require`](Self::Require), the default).
///
/// # Rolling deploys
/// During a rolling deploy that changes the limit from 10 to 20, old replicas (limit 10) and
/// new ones (20) open the semaphore side by side. With `Require`, the new replicas fail with
/// [`Error::LimitConflict`] until someone runs `redsem limit NAME 20`, and after that the old
/// ones would. With `CreateOrAdopt` in both versions, every replica opens and uses the stored
/// limit; the operator changes it once (`redsem limit NAME 20`) when the deploy is done, and
/// every handle learns the new limit at its next renewal. With `Resize` in the new version,
/// the first new replica to open sets the limit to 20 for everyone (old replicas with
/// `CreateOrAdopt` follow it; old replicas with `Require` fail to open from then on, which is
/// why the old version should already adopt). Whatever the policy, a handle always grants
/// against the stored limit, never its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LimitPolicy {
    /// Create the semaphore with the code's limit if it does not exist; if it exists with
    /// another limit, fail with [`Error::LimitConflict`] (nothing is written). The default.
    #[default]
    Require,
    /// Use the stored limit, whatever it is; if the semaphore does not exist, fail with
    /// [`Error::UnknownSemaphore`] and write nothing (the code's limit is not used).
    Adopt,
    /// Create the semaphore with the code's limit if it does not exist; otherwise use the
    /// stored limit. Decided in the one script call `open` makes, so concurrent openers
    /// never fail, and all of them end up with the same limit.
    CreateOrAdopt,
    /// Create the semaphore with the code's limit if it does not exist; otherwise set the
    /// stored limit to the code's, for every replica, as [`Semaphore::resize`] does (a
    /// shrink rejects the queued requests above the new limit). Costs one more script call
    /// when the limits differ. Concurrent openers with different limits leave the last one's.
    Resize,
}

impl Client {
    /// Starts opening the semaphore `name` whose limit is `limit` permits shared by every
    /// replica. Nothing is sent to Redis until [`SemaphoreBuilder::open`].
    pub fn semaphore(&self, name: impl Into<String>, limit: u32) -> SemaphoreBuilder {
        SemaphoreBuilder::new(self.clone(), name.into(), limit)
    }
}

impl SemaphoreBuilder {
    fn new(client: Client, name: String, limit: u32) -> SemaphoreBuilder {
        SemaphoreBuilder {
            client,
            name,
            limit,
            lease: Duration::from_secs(10),
            renew_every: None,
            fallback_poll: Duration::from_secs(1),
            local_cap: None,
            label: None,
            allow_evicting_policy: false,
            on_limit: LimitPolicy::Require,
        }
    }

    /// What [`open`](Self::open) does when the semaphore exists with another limit, or does
    /// not exist (default [`LimitPolicy::Require`]: create it with this limit, fail on
    /// another). See [`LimitPolicy`] for the choices and the rolling-deploy recipe.
    pub fn limit_policy(mut self, policy: LimitPolicy) -> Self {
        self.on_limit = policy;
        self
    }

    /// Opens the semaphore even when Redis's `maxmemory-policy` can evict its keys
    /// (default `false`: [`open`](Self::open) refuses with [`Error::EvictingPolicy`]).
    ///
    /// `open` reads the policy from `INFO memory` (one round trip; the ACL rule of
    /// docs/security.md allows `INFO`, not `CONFIG GET`). An evicted key never makes the
    /// scripts grant beyond the limit — they repair the keys from what survives — but a
    /// holder whose record was evicted is only told at its next renewal, and an evicted
    /// limit is re-created from the opener's. Allow it only for a Redis whose memory never
    /// runs out, or where that risk is acceptable.
    pub fn allow_evicting_policy(mut self, allow: bool) -> Self {
        self.allow_evicting_policy = allow;
        self
    }

    /// Lease of each holder and waiter (default 10 s, at least [`MIN_LEASE`](crate::MIN_LEASE)).
    /// A crashed holder's slot is free again
    /// at most one lease after its last renewal; a crashed waiter leaves the queue as fast.
    /// Live holders and waiters are renewed in the background, so the lease does not bound
    /// how long work may hold a permit.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often the leases of this process are renewed (default a third of the lease). Must
    /// be at most a third of the lease: a permit trusts its lease only from a renewal that a
    /// failover could not have lost (one answered at least an interval before a later one
    /// was sent), so the renewals after it, with their retries, must fit in what is left of
    /// the lease (the client rules: the `core` module, see docs/ARCHITECTURE.md).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// Longest time a waiter relies on notifications alone (default 1 s): while this handle
    /// has waiters, one call per interval renews their session and learns the head of the
    /// queue, which reveals grants whose notification was lost (those waiters are then
    /// checked one by one). It runs every fallback interval or every renewal interval,
    /// whichever is shorter, and costs one renewal per such interval per handle, whatever
    /// the number of waiters (the client's handles share the calls).
    pub fn fallback_poll(mut self, every: Duration) -> Self {
        self.fallback_poll = every;
        self
    }

    /// Caps the permits this process may have queued or held at once (an in-process
    /// semaphore in front of the distributed one), so one replica cannot flood the queue.
    pub fn local_cap(mut self, permits: u32) -> Self {
        self.local_cap = Some(permits);
        self
    }

    /// A label shown in [`Semaphore::stats`] for this process's holders and waiters
    /// (default `host:pid`). At most 200 bytes, without control characters (newlines, tabs,
    /// escapes); [`open`](Self::open) refuses others with [`Error::InvalidArgument`].
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    fn validate(self) -> Result<(Client, OpenSettings, LimitPolicy), Error> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        crate::protocol::keys::check_limit(self.limit.into())?;
        check_duration("lease", self.lease)?;
        check_duration("fallback poll interval", self.fallback_poll)?;
        if self.lease < crate::MIN_LEASE {
            return bad(crate::core::min_lease_message(self.lease));
        }
        let renew_every = self.renew_every.unwrap_or(self.lease / 3);
        if renew_every.is_zero() || renew_every > self.lease / 3 {
            return bad(format!(
                "renewal interval {renew_every:?} must be greater than zero and at most a third of the lease ({:?}): \
                 lengthen the lease or renew more often",
                self.lease
            ));
        }
        if self.fallback_poll < Duration::from_millis(1) {
            return bad("fallback poll interval must be at least 1ms".into());
        }
        if self.local_cap == Some(0) {
            return bad("local cap is 0: it must allow at least one permit".into());
        }
        let label = match &self.label {
            Some(l) => l.clone(),
            None => default_label(),
        };
        crate::options::check_label(&label)?;
        Ok((
            self.client,
            OpenSettings {
                name: self.name,
                limit: self.limit,
                timing: Timing::new(self.lease, renew_every, self.fallback_poll),
                label,
                local_cap: self.local_cap,
                allow_evicting_policy: self.allow_evicting_policy,
                create: self.on_limit != LimitPolicy::Adopt,
                on_other_limit: match self.on_limit {
                    LimitPolicy::Require => OtherLimit::Fail,
                    _ => OtherLimit::Adopt,
                },
            },
            self.on_limit,
        ))
    }

    /// Subscribes to this handle's notification channel, creates the semaphore in Redis if it
    /// does not exist, and checks that the stored limit is the one asked for (or adopts or
    /// changes it: see [`limit_policy`](Self::limit_policy)).
    ///
    /// Cost: three round trips (`INFO memory`, SUBSCRIBE, one script), once per handle; two
    /// with [`allow_evicting_policy`](Self::allow_evicting_policy); one more with
    /// [`LimitPolicy::Resize`] when the stored limit differs.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad name, limit (0 or above [`MAX_LIMIT`](crate::MAX_LIMIT)), lease,
    /// renewal or poll interval (a lease or interval above
    /// [`MAX_DURATION`](crate::MAX_DURATION) included), local cap or label, before anything
    /// is sent;
    /// [`Error::EvictingPolicy`] when Redis's `maxmemory-policy` can evict the semaphore's
    /// keys (see [`allow_evicting_policy`](Self::allow_evicting_policy));
    /// [`Error::LimitConflict`] when the semaphore exists with another limit (with
    /// [`LimitPolicy::Require`]); [`Error::UnknownSemaphore`] when it does not exist (with
    /// [`LimitPolicy::Adopt`]);
    /// [`Error::WrongType`] when one of its keys holds a foreign value; connection and
    /// permission errors as they come.
    pub async fn open(self) -> Result<Semaphore, Error> {
        let (client, settings, policy) = self.validate()?;
        let limit = settings.limit;
        let semaphore = Semaphore {
            handle: Handle::open(client.inner, settings).await?,
        };
        if policy == LimitPolicy::Resize && semaphore.limit() != limit {
            semaphore.resize(limit).await?;
        }
        Ok(semaphore)
    }
}

fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    format!("{}:{}", host.trim(), std::process::id())
}

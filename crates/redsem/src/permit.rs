//! [`Permit`]: a held share of a semaphore, its slots, fences and lease.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::engine::Held;
use crate::error::{Error, LostReason};

/// A slot and its fencing token: the generation of that slot, incremented in Redis every time
/// the slot is granted.
///
/// A protected resource that must never be used by more than `limit` holders at once (even
/// when a paused holder wakes up after its lease expired) keeps, per slot, the highest
/// generation it has seen, and rejects any request carrying a lower one. See
/// [`fencing`](crate::fencing) for a helper when the resource lives in Redis.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Fence {
    /// Slot number, in `0..limit`; unique among live holders.
    pub slot: u32,
    /// Generation of the slot: strictly increasing across the holders of this slot.
    pub generation: u64,
}

impl fmt::Display for Fence {
    /// `slot:generation`, e.g. `3:17`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.slot, self.generation)
    }
}

/// A held permit (one or more permits of one acquisition). Releases on drop.
///
/// While it lives, its lease is renewed in the background. If a renewal finds the entry gone,
/// or renewals fail until the lease could have expired, or the acquisition's maximum hold
/// time ([`AcquireOptions::max_hold`](crate::AcquireOptions::max_hold)) is reached, the
/// permit is *lost*: [`lost`] resolves, [`cancellation_token`] is cancelled, and [`run`]
/// stops the work it guards.
///
/// Dropping it does no I/O: the release is handed to the client's background task (one
/// round trip, batched with other releases). [`release`](Permit::release) does it in place
/// and reports errors.
///
/// [`lost`]: Permit::lost
/// [`cancellation_token`]: Permit::cancellation_token
/// [`run`]: Permit::run
#[must_use = "dropping a Permit releases it at once"]
pub struct Permit {
    /// The entry in Redis: renewed while it lives, released when dropped.
    held: Held,
    fences: Vec<Fence>,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("semaphore", &self.held.name())
            .field("holder_id", &self.held.id())
            .field("fences", &self.fences)
            .field("lost", &self.held.signal().lost_reason())
            .finish()
    }
}

impl Permit {
    pub(crate) fn new(held: Held) -> Permit {
        let grant = held.grant();
        let fences = grant
            .slots
            .iter()
            .zip(&grant.fences)
            .map(|(&slot, &generation)| Fence { slot, generation })
            .collect();
        Permit { held, fences }
    }

    /// The entry and its fences (for [`export`](Self::export), in `handoff.rs`).
    pub(crate) fn into_parts(self) -> (Held, Vec<Fence>) {
        (self.held, self.fences)
    }

    /// The name of the semaphore this permit belongs to.
    pub fn semaphore(&self) -> &str {
        self.held.name()
    }

    /// Why the lease is lost, once [`is_lost`](Self::is_lost) is true: the heartbeat's
    /// reason; [`LostReason::MaxHold`] when the maximum hold time
    /// ([`AcquireOptions::max_hold`](crate::AcquireOptions::max_hold)) has passed; or
    /// [`LostReason::Unreachable`] when only the local deadline has passed (no renewal was
    /// confirmed in time). `None` while it is not lost. Cheap, no I/O.
    pub fn lost_reason(&self) -> Option<LostReason> {
        match self.held.signal().lost_reason() {
            Some(reason) => Some(reason),
            None if self.held.past_max_hold() => Some(LostReason::MaxHold),
            None if self.held.is_lost() => Some(LostReason::Unreachable),
            None => None,
        }
    }

    /// The holder id in Redis (as listed by [`Semaphore::stats`](crate::Semaphore::stats)).
    pub fn holder_id(&self) -> &str {
        self.held.id()
    }

    /// The ticket this permit was granted under. Tickets are numbered in arrival order
    /// across all processes, and granted in that order (FIFO).
    pub fn ticket(&self) -> u64 {
        self.held.grant().ticket
    }

    /// How many permits this holds.
    pub fn num_permits(&self) -> u32 {
        self.held.permits()
    }

    /// The slot numbers held, in `0..limit`, one per permit, ascending. No other live holder
    /// has them: use them to pick a device of a pool, a connection, a port.
    pub fn slots(&self) -> Vec<u32> {
        self.fences.iter().map(|f| f.slot).collect()
    }

    /// The fencing token of each slot held (same order as [`slots`](Self::slots)).
    pub fn fences(&self) -> &[Fence] {
        &self.fences
    }

    /// Whether the lease is lost, or could have run out in Redis: true once the heartbeat
    /// declared it lost, once the maximum hold time has passed, and also once the local
    /// deadline (the trusted renewal + lease −
    /// safety margin; the trusted renewal is one a failover cannot have lost, about one
    /// renewal interval older than the last) has passed, even if the heartbeat has not run
    /// since (a runtime busy with blocking work starves it). Cheap, no I/O.
    ///
    /// In the second case [`lost`](Self::lost) resolves, and the
    /// [`cancellation_token`](Self::cancellation_token) is cancelled, as soon as the
    /// heartbeat runs again; `is_lost` does not wait for that.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Time left before the lease could run out in Redis if no further renewal succeeded: the
    /// local deadline that [`is_lost`](Self::is_lost) checks, counted from the trusted
    /// renewal (about one renewal interval older than the last: so about lease − margin − one
    /// interval right after a renewal, and one interval less just before the next). Zero
    /// once lost. Cheap, no I/O.
    ///
    /// The lease itself is renewed in the background: this is not the time left to work,
    /// only how long the permit stays trustworthy should Redis become unreachable now.
    pub fn lease_left(&self) -> Duration {
        self.held.lease_left()
    }

    /// The length of this permit's lease: what each renewal extends it by (the handle's,
    /// the acquisition's, or the last [`set_lease`](Self::set_lease)).
    pub fn lease(&self) -> Duration {
        self.held.lease_len()
    }

    /// Changes the length of this permit's lease, as Redisson's `updateLeaseTime`: Redis
    /// extends the entry by `lease` from now, and every later renewal by `lease` too. A
    /// longer lease keeps the slot for a job whose renewals may be held up (a long GC pause,
    /// a slow network), at the price of a longer wait for the slot after a crash; a shorter
    /// one frees the slot sooner after a crash.
    ///
    /// A shorter lease counts locally at once ([`lease_left`](Self::lease_left) and
    /// [`is_lost`](Self::is_lost) use it even before Redis confirms); a longer one only from
    /// the renewals after the change (until then the old length bounds the local deadline).
    ///
    /// # Cost
    /// One script call.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the new lease in Redis; the local deadline
    /// then keeps the shorter of the two lengths, so it is never later than Redis's.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the permit is already lost, or Redis no longer has it (the
    /// permit is then declared lost); [`Error::InvalidArgument`] for a lease shorter than
    /// three renewal intervals of the semaphore handle or above
    /// [`MAX_DURATION`](crate::MAX_DURATION); connection and permission errors (the lease
    /// keeps its old length, or the shorter one if the change may have landed).
    pub async fn set_lease(&mut self, lease: Duration) -> Result<(), Error> {
        crate::options::check_duration("lease", lease)?;
        self.held.set_lease(lease).await
    }

    /// A future that resolves with the reason once the lease is lost, and never resolves if
    /// it is not (including after release). `'static`, so it can be moved into a task.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut rx = self.held.signal().lost_receiver();
        async move {
            let reason = match rx.wait_for(Option::is_some).await {
                Ok(reason) => *reason,
                Err(_) => None,
            };
            match reason {
                Some(reason) => reason,
                None => std::future::pending().await,
            }
        }
    }

    /// A token cancelled when the lease is lost: hand child tokens to spawned sub-tasks so
    /// that they stop too.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.held.signal().token().clone()
    }

    /// Runs `work` while holding the permit, then releases it.
    ///
    /// If the lease is lost first, `work` is dropped — which cancels it at its next `.await`
    /// point (CPU-bound code between awaits is not pre-empted) — and
    /// [`Error::LeaseLost`] is returned. Loss is detected within one renewal interval of a
    /// renewal finding the entry gone, and before the lease could have expired on the server
    /// when Redis is unreachable.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] as above. A failed release is not reported (it is retried in the
    /// background and bounded by the lease).
    ///
    /// `work` runs inside the span `redsem.hold` (fields `semaphore`, `holder`, `ticket`,
    /// `slots`), so the events it emits carry them.
    pub async fn run<F: Future>(self, work: F) -> Result<F::Output, Error> {
        let lost = self.lost();
        let span = tracing::info_span!(
            "redsem.hold",
            semaphore = %self.held.name(),
            holder = %self.held.id(),
            ticket = self.ticket(),
            slots = ?self.slots(),
        );
        let result = tokio::select! {
            biased;
            reason = lost => Err(Error::lease_lost(self.held.name(), reason)),
            out = work.instrument(span) => Ok(out),
        };
        drop(self);
        result
    }

    /// Releases the permit now and waits for Redis to confirm it (one round trip; the
    /// releases of the same semaphore handle made while one is in flight share the next
    /// call). Dropping the permit does the same in the background.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes (a `select!`, a timeout) does not lose the
    /// release: it is handed to the background task, as if the permit had been dropped. The
    /// lease stops being renewed when the call starts, so at worst the slot frees when the
    /// lease expires.
    ///
    /// # Errors
    /// Connection errors; the release is then retried in the background, and the lease
    /// expires if Redis stays unreachable.
    pub async fn release(self) -> Result<(), Error> {
        self.held.release().await
    }

    /// Stops renewing and does not release: the slot frees when the lease expires. For a
    /// process that hands the slot's lifetime to something else; most code wants drop.
    pub fn detach(self) {
        self.held.detach();
    }
}

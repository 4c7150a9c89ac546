//! [`Permit`]: a held share of a semaphore, its slots, fences and lease.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::{Error, LostReason};
use crate::scripts::{self, Grant};
use crate::semaphore::SemShared;

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

/// Lease bookkeeping shared by a permit and the heartbeat.
pub(crate) struct LeaseState {
    lost_tx: watch::Sender<Option<LostReason>>,
    token: CancellationToken,
    /// Send time of the last call that confirmed the lease (or of the grant's delivery).
    renewed_at: Mutex<Instant>,
    /// Ticket and slots of the permit, for the events of the heartbeat.
    granted: OnceLock<(u64, Vec<u32>)>,
}

impl LeaseState {
    pub(crate) fn new(now: Instant) -> LeaseState {
        LeaseState {
            lost_tx: watch::Sender::new(None),
            token: CancellationToken::new(),
            renewed_at: Mutex::new(now),
            granted: OnceLock::new(),
        }
    }

    /// Ticket and slots of the permit that holds this lease, once known.
    pub(crate) fn granted(&self) -> Option<&(u64, Vec<u32>)> {
        self.granted.get()
    }

    pub(crate) fn renewed(&self, sent: Instant) {
        let mut r = self.renewed_at.lock().unwrap();
        if sent > *r {
            *r = sent;
        }
    }

    pub(crate) fn renewed_at(&self) -> Instant {
        *self.renewed_at.lock().unwrap()
    }

    /// Marks the lease lost (first reason wins) and cancels the permit's token.
    pub(crate) fn lose(&self, reason: LostReason) {
        self.lost_tx.send_if_modified(|v| {
            if v.is_none() {
                *v = Some(reason);
                true
            } else {
                false
            }
        });
        self.token.cancel();
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    fn lost_reason(&self) -> Option<LostReason> {
        *self.lost_tx.borrow()
    }
}

/// A held permit (one or more permits of one acquisition). Releases on drop.
///
/// While it lives, its lease is renewed in the background. If a renewal finds the entry gone,
/// or renewals fail until the lease could have expired, the permit is *lost*: [`lost`]
/// resolves, [`cancellation_token`] is cancelled, and [`run`] stops the work it guards.
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
    shared: Arc<SemShared>,
    id: String,
    n: u32,
    ticket: u64,
    fences: Vec<Fence>,
    lease: Arc<LeaseState>,
    _local: Option<OwnedSemaphorePermit>,
    released: bool,
    /// `redsem_local_holders` and `redsem_hold_seconds` (feature `metrics`).
    _hold: crate::metrics::HoldTimer,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("semaphore", &self.shared.name())
            .field("holder_id", &self.id)
            .field("fences", &self.fences)
            .field("lost", &self.lease.lost_reason())
            .finish()
    }
}

impl Permit {
    pub(crate) fn new(
        shared: Arc<SemShared>,
        id: String,
        n: u32,
        grant: Grant,
        lease: Arc<LeaseState>,
        local: Option<OwnedSemaphorePermit>,
    ) -> Permit {
        let fences = grant
            .slots
            .iter()
            .zip(&grant.fences)
            .map(|(&slot, &generation)| Fence { slot, generation })
            .collect();
        let _ = lease.granted.set((grant.ticket, grant.slots.clone()));
        let _hold = crate::metrics::HoldTimer::new(shared.name());
        Permit {
            _hold,
            shared,
            id,
            n,
            ticket: grant.ticket,
            fences,
            lease,
            _local: local,
            released: false,
        }
    }

    /// The holder id in Redis (as listed by [`Semaphore::stats`](crate::Semaphore::stats)).
    pub fn holder_id(&self) -> &str {
        &self.id
    }

    /// The ticket this permit was granted under. Tickets are numbered in arrival order
    /// across all processes, and granted in that order (FIFO).
    pub fn ticket(&self) -> u64 {
        self.ticket
    }

    /// How many permits this holds.
    pub fn num_permits(&self) -> u32 {
        self.n
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

    /// Whether the lease is known to be lost. Cheap, no I/O.
    pub fn is_lost(&self) -> bool {
        self.lease.lost_reason().is_some()
    }

    /// A future that resolves with the reason once the lease is lost, and never resolves if
    /// it is not (including after release). `'static`, so it can be moved into a task.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut rx = self.lease.lost_tx.subscribe();
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
        self.lease.token.clone()
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
            semaphore = %self.shared.name(),
            holder = %self.id,
            ticket = self.ticket,
            slots = ?self.slots(),
        );
        let result = tokio::select! {
            biased;
            reason = lost => Err(Error::LeaseLost(reason)),
            out = work.instrument(span) => Ok(out),
        };
        drop(self);
        result
    }

    /// Releases the permit now and waits for Redis to confirm it (one round trip). Dropping
    /// the permit does the same in the background.
    ///
    /// # Errors
    /// Connection errors; the release is then retried in the background, and the lease
    /// expires if Redis stays unreachable.
    pub async fn release(mut self) -> Result<(), Error> {
        self.released = true;
        self.shared.forget_holder(&self.id);
        let mut conn = self.shared.client.conn.clone();
        let target = self.shared.core.target();
        match scripts::release(&mut conn, &target, &[&self.id], false).await {
            Ok(_) => {
                tracing::debug!(semaphore = %self.shared.name(), holder = %self.id,
                    ticket = self.ticket, slots = ?self.slots(), "released");
                Ok(())
            }
            Err(e) => {
                self.shared
                    .release_in_background(std::mem::take(&mut self.id));
                Err(Error::from_redis(e, self.shared.name()))
            }
        }
    }

    /// Stops renewing and does not release: the slot frees when the lease expires. For a
    /// process that hands the slot's lifetime to something else; most code wants drop.
    pub fn detach(mut self) {
        tracing::debug!(semaphore = %self.shared.name(), holder = %self.id,
            ticket = self.ticket, "detached: the slot frees when its lease expires");
        self.released = true;
        self.shared.forget_holder(&self.id);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        tracing::debug!(semaphore = %self.shared.name(), holder = %self.id,
            ticket = self.ticket, slots = ?self.slots(), "released (in the background)");
        self.shared.forget_holder(&self.id);
        self.shared
            .release_in_background(std::mem::take(&mut self.id));
    }
}

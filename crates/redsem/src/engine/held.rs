//! [`Held`]: one granted entry as the engine hands it to the public layer, which wraps it in
//! a [`Permit`](crate::Permit). It owns the entry in Redis: released on drop (in the
//! background), by [`release`](Held::release) in place, or left to expire by
//! [`detach`](Held::detach).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::handle::Handle;
use super::signal::LossSignal;
use super::table::LeaseUse;
use crate::error::{Error, LostReason};
use crate::protocol::{self, EntryState, Grant};

/// A granted entry of one acquisition, renewed by the heartbeat while it lives.
pub(crate) struct Held {
    handle: Arc<Handle>,
    id: String,
    n: u32,
    grant: Grant,
    /// Tells the permit it was lost (its lease clock is in the handle's state).
    signal: Arc<LossSignal>,
    /// The lease length last set (ms): what [`lease_len`](Held::lease_len) reports once the
    /// holder left the handle's state (lost).
    lease_ms: AtomicU64,
    _local: Option<OwnedSemaphorePermit>,
    released: bool,
    /// The maximum hold time's timer, if the acquisition asked for one.
    /// (Boxed: only a permit that asked for one pays for its size.)
    max_hold: Option<Box<MaxHoldTimer>>,
    /// `redsem_client_holders` and `redsem_client_hold_seconds` (feature `metrics`).
    _hold: crate::metrics::HoldTimer,
}

/// The timer of a maximum hold time: a task that, at `at`, declares the permit lost
/// ([`LostReason::MaxHold`]) and detaches its entry in Redis
/// ([`Table::max_hold_reached`](super::table::Table::max_hold_reached)). Ended
/// when the permit goes (released, detached, dropped).
struct MaxHoldTimer {
    at: Instant,
    task: tokio::task::AbortHandle,
}

impl Drop for MaxHoldTimer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Held {
    pub(crate) fn new(
        handle: Arc<Handle>,
        id: String,
        n: u32,
        grant: Grant,
        signal: Arc<LossSignal>,
        local: Option<OwnedSemaphorePermit>,
        lease_use: Option<LeaseUse>,
    ) -> Held {
        // The lease lengths other than the handle's whose sessions this permit may be in
        // (asked for by its acquisition, or by `set_lease`) are renewed while it lives.
        let lease_ms = {
            let mut st = handle.table.lock();
            if let Some(u) = &lease_use {
                st.permit_uses_lease(&id, u.ms());
            }
            let holder = st.holder_mut(&id);
            holder.map_or(0, |h| {
                h.grant = Some(grant.clone());
                h.clock.len().as_millis() as u64
            })
        };
        drop(lease_use);
        let _hold = crate::metrics::HoldTimer::new(handle.name());
        Held {
            _hold,
            handle,
            id,
            n,
            grant,
            signal,
            lease_ms: AtomicU64::new(lease_ms),
            _local: local,
            released: false,
            max_hold: None,
        }
    }

    /// Limits the hold to `max_hold` from now (nothing for `None`): then the permit is lost
    /// with [`LostReason::MaxHold`] and its entry detached in Redis, so that Redis stops
    /// renewing it; dropping the permit still releases it at once. Costs one timer task,
    /// aborted when the permit goes, and at the deadline one call of the releaser.
    pub(crate) fn with_max_hold(mut self, max_hold: Option<Duration>) -> Held {
        let Some(max_hold) = max_hold else {
            return self;
        };
        let at = Instant::now() + max_hold;
        let handle = Arc::downgrade(&self.handle);
        let id = self.id.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            if let Some(handle) = handle.upgrade() {
                tracing::info!(semaphore = %handle.name(), holder = %id, ?max_hold,
                    "maximum hold time reached: the permit is lost, its entry detached");
                handle.table.max_hold_reached(&id);
            }
        });
        self.max_hold = Some(Box::new(MaxHoldTimer {
            at,
            task: task.abort_handle(),
        }));
        self
    }

    /// Whether the maximum hold time has passed (whether or not its timer has run since).
    pub(crate) fn past_max_hold(&self) -> bool {
        self.max_hold
            .as_ref()
            .is_some_and(|m| Instant::now() >= m.at)
    }

    /// The semaphore's name.
    pub(crate) fn name(&self) -> &str {
        self.handle.name()
    }

    /// The holder id in Redis.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// How many permits this holds.
    pub(crate) fn permits(&self) -> u32 {
        self.n
    }

    /// Ticket, slots and fencing generations.
    pub(crate) fn grant(&self) -> &Grant {
        &self.grant
    }

    /// How the permit learns that it was lost.
    pub(crate) fn signal(&self) -> &LossSignal {
        &self.signal
    }

    /// The deadline of its lease as the handle's state keeps it (`None` once it left the
    /// state: lost, or being released).
    fn deadline(&self) -> Option<Instant> {
        let st = self.handle.table.lock();
        st.holder(&self.id).map(|h| h.clock.deadline())
    }

    /// Lost, or past the local deadline of its confirmed renewals or its maximum hold time
    /// (whether or not the heartbeat or the timer has run since).
    pub(crate) fn is_lost(&self) -> bool {
        self.signal.is_lost()
            || self.deadline().is_none_or(|d| d <= Instant::now())
            || self.past_max_hold()
    }

    /// Time left until the lease could have run out in Redis (zero once lost): the deadline
    /// the heartbeat keeps, counted from the trusted confirmation (see `core/lease.rs`).
    pub(crate) fn lease_left(&self) -> Duration {
        if self.signal.is_lost() {
            return Duration::ZERO;
        }
        self.deadline().map_or(Duration::ZERO, |d| {
            d.saturating_duration_since(Instant::now())
        })
    }

    /// The length of the lease in Redis for renewals from now on (as the handle's state
    /// keeps it; the last one set once the holder left the state).
    pub(crate) fn lease_len(&self) -> Duration {
        let st = self.handle.table.lock();
        st.holder(&self.id).map_or_else(
            || Duration::from_millis(self.lease_ms.load(Ordering::Relaxed)),
            |h| h.clock.len(),
        )
    }

    /// Changes the lease to `len` (one round trip; validated by the caller): Redis extends
    /// the entry by `len` from now, and every later renewal by `len` too.
    ///
    /// Locally, a shorter lease counts at once (the change may land before its reply comes);
    /// a longer one only from the renewals sent after the change was confirmed (a replica, or
    /// a failed call, may leave the old length in place).
    pub(crate) async fn set_lease(&self, len: Duration) -> Result<(), Error> {
        if let Some(reason) = self.signal.lost_reason() {
            return Err(Error::lease_lost(self.name(), reason));
        }
        self.handle
            .timing
            .check_holder_lease(len)
            .map_err(Error::InvalidArgument)?;
        let old = self.lease_len();
        {
            let mut st = self.handle.table.lock();
            if len != self.handle.timing.lease {
                st.permit_uses_lease(&self.id, len.as_millis() as u64);
            }
            if let Some(h) = st.holder_mut(&self.id) {
                h.clock.cap_len(len);
            }
        }
        self.handle.table.poke.notify_one(); // the deadline may have moved closer
        let sent = Instant::now();
        let mut conn = self.handle.ctx.conn.clone();
        let target = self.handle.remote.target();
        let owner = protocol::Owner::Is(&self.handle.channel_id);
        match protocol::set_lease(&mut conn, &target, &self.id, len.as_millis() as u64, owner).await
        {
            Ok(EntryState::Held(g)) if g == self.grant => {
                if let Some(h) = self.handle.table.lock().holder_mut(&self.id) {
                    h.clock.set_len(len, sent);
                }
                self.lease_ms
                    .store(len.as_millis() as u64, Ordering::Relaxed);
                tracing::debug!(semaphore = %self.name(), holder = %self.id, ?old, new = ?len, "lease changed");
                Ok(())
            }
            Ok(state) => {
                let reason = match state {
                    EntryState::Moved => LostReason::HandedOff,
                    _ => LostReason::NotHolder,
                };
                self.handle.table.lose(&self.id, reason);
                Err(Error::lease_lost(self.name(), reason))
            }
            Err(e) => Err(Error::from_call(e, self.handle.name())),
        }
    }

    /// Releases the entry now and waits for Redis to confirm it (one round trip, shared
    /// with the releases of the same handle made meanwhile: see `combine::ReleaseCombiner`); on
    /// error, the release is retried in the background.
    ///
    /// Cancel safe: the entry counts as released only once Redis confirmed it. Until then,
    /// dropping this future (or an error) leaves `released` unset, and [`Drop`] hands the
    /// release to the background releaser. The heartbeat stops renewing at once: the entry
    /// is going either way.
    pub(crate) async fn release(mut self) -> Result<(), Error> {
        self.handle.table.forget_holder(&self.id);
        if self.not_ours_to_release() {
            self.released = true; // another handle's now, or another program's: not released
            return Ok(());
        }
        let Some(result) = self.handle.releases.release(self.id.clone()).await else {
            // never sent (the runtime is shutting down): `Drop` tries the releaser
            return Err(Error::closed(self.handle.name()));
        };
        match result {
            Ok(()) => {
                self.released = true;
                self.handle.table.released(&self.id);
                tracing::debug!(semaphore = %self.name(), holder = %self.id,
                    ticket = self.grant.ticket, slots = ?self.grant.slots, "released");
                Ok(())
            }
            // `released` unset: dropping `self` retries in the background
            Err(e) => Err(Error::from_call(e, self.handle.name())),
        }
    }

    /// Exports the entry for a hand-off (one round trip): stops renewing it and detaches it
    /// in Redis now, so that it leaves this handle's session for one of its own that nobody
    /// renews, with the lease it has, until another handle adopts it
    /// ([`Handle::adopt`](super::Handle::adopt)). Awaited, not in the background: a detach
    /// that landed after an adoption would take the entry from its adopter.
    ///
    /// On error, or if this future is dropped, no token was handed out: [`Drop`] releases
    /// the entry in the background (after a detach that landed, that frees the slot sooner).
    pub(crate) async fn export(mut self) -> Result<(), Error> {
        if self.is_lost() {
            let reason = self.signal.lost_reason().unwrap_or(LostReason::Unreachable);
            return Err(Error::lease_lost(self.name(), reason));
        }
        self.handle.table.forget_holder(&self.id);
        let mut conn = self.handle.ctx.conn.clone();
        let target = self.handle.remote.target();
        let ids = [self.id.as_str()];
        let detach = protocol::Removal {
            detach: &ids,
            ..protocol::Removal::default()
        };
        match protocol::release(&mut conn, &target, &detach, false).await {
            Ok(_) => {
                tracing::debug!(semaphore = %self.name(), holder = %self.id,
                    ticket = self.grant.ticket, "exported for a hand-off: detached");
                self.released = true;
                Ok(())
            }
            Err(e) => Err(Error::from_call(e, self.handle.name())),
        }
    }

    /// Lost in a way that leaves nothing to release or detach from here: another handle
    /// adopted the entry (it is that handle's now), or its keys were overwritten by another
    /// program's data (a release would be refused with the same error; removing that data,
    /// `purge_keys`, removes the entry with it).
    fn not_ours_to_release(&self) -> bool {
        matches!(
            self.signal.lost_reason(),
            Some(LostReason::HandedOff | LostReason::Overwritten)
        )
    }

    /// Stops renewing and does not release: the entry leaves the handle's session (in the
    /// background: one call, batched with releases) for one nobody renews, and expires with
    /// the lease it has then.
    pub(crate) fn detach(mut self) {
        if self.not_ours_to_release() {
            return; // another handle's now, or another program's
        }
        tracing::debug!(semaphore = %self.name(), holder = %self.id,
            ticket = self.grant.ticket, "detached: the slot frees when its lease expires");
        self.released = true;
        self.handle.table.forget_holder(&self.id);
        self.handle.table.detach_in_background(self.id.clone());
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.released && !self.not_ours_to_release() {
            tracing::debug!(semaphore = %self.handle.name(), holder = %self.id,
                ticket = self.grant.ticket, slots = ?self.grant.slots, "released (in the background)");
            self.handle.table.forget_holder(&self.id);
            self.handle.table.release_in_background(self.id.clone());
        }
        // the sessions of the lease lengths it used are no longer kept for it
        let mut st = self.handle.table.lock();
        st.permit_gone(&self.id, Instant::now());
    }
}

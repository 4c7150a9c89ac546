//! Hand-off by id: a holder exported by one handle ([`Held::export`]) is adopted by another,
//! possibly in another process ([`Handle::adopt`]), or released by id
//! ([`Handle::release_by_id`]).
//!
//! Adoption is one `lease.lua` call in adopt mode: the entry moves from whatever session it
//! is in (the exporter's detached one, or a previous adopter's) to this handle's session for
//! the token's lease, whose lease becomes at least now + that lease. The adopter trusts it
//! from the call's send time, as a fresh grant's reply ([`LeaseState::new`]). A previous
//! owner's renewals find the entry in none of its sessions (`renew.lua`'s `-3`) and lose it
//! with [`LostReason::HandedOff`](crate::LostReason::HandedOff).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::handle::Handle;
use super::held::Held;
use super::signal::LossSignal;
use crate::core::{LeaseClock, deadline_after};
use crate::error::{BackendError, Error, NoPermitsReason};
use crate::protocol::{self, EntryState, Grant, Owner, Removal};

impl Handle {
    /// Adopts the holder `id`, granted `grant`, with a lease of `len` (one round trip): it
    /// moves to this handle's session for `len`, and this handle renews it from then on.
    ///
    /// Errors: [`Error::HandoffGone`] when the entry is gone or not that grant any more;
    /// [`Error::InvalidArgument`] for a lease this handle cannot renew in time; a full local
    /// cap; connection errors. On an error after the call was sent, and if this future is
    /// dropped meanwhile, the entry is detached in the background (it expires within one
    /// lease unless adopted again): an adoption that landed is never left renewed by a
    /// session nobody knows it is in.
    pub(crate) async fn adopt(
        self: &Arc<Self>,
        id: &str,
        grant: &Grant,
        len: Duration,
    ) -> Result<Held, Error> {
        let n = grant.slots.len() as u32;
        let local = self.check_adoptable(id, n, len)?;
        // its session is renewed from now on, and by the permit once adopted
        let lease_use = (len != self.timing.lease).then(|| self.table.use_lease(len));
        let mut guard = Unadopted {
            handle: self,
            id: Some(id.to_owned()),
        };
        let sent = Instant::now();
        let mut conn = self.ctx.conn.clone();
        let target = self.remote.target();
        let owner = Owner::Adopt(&self.channel_id);
        let state = protocol::set_lease(&mut conn, &target, id, len.as_millis() as u64, owner)
            .await
            .map_err(|e| Error::from_call(e, self.name()))?;
        match state {
            EntryState::Held(g) if g == *grant => {}
            // gone (nothing to detach), or granted afresh under this id (not the token's)
            state => {
                if !matches!(state, EntryState::Held(_)) {
                    guard.id = None;
                }
                return Err(Error::HandoffGone {
                    name: self.name().to_owned(),
                    holder_id: id.to_owned(),
                });
            }
        }
        if deadline_after(sent, len) <= Instant::now() {
            // the reply came too late to trust the lease: the guard detaches it again
            return Err(Error::Unreachable(BackendError::timed_out(format!(
                "the adoption of holder {id} of semaphore {:?} came back after its lease could have ended",
                self.name()
            ))));
        }
        let id = guard.id.take().expect("armed until adopted");
        let clock = LeaseClock::new(sent, Instant::now(), len, self.timing.renew_every);
        let signal = Arc::new(LossSignal::new());
        self.table
            .lock()
            .insert_holder(id.clone(), clock, signal.clone());
        self.table.poke.notify_one();
        let held = Held::new(self.clone(), id, n, grant.clone(), signal, local, lease_use);
        tracing::debug!(semaphore = %self.name(), holder = %held.id(), ticket = grant.ticket,
            "adopted a handed-off permit");
        if self.ctx.synced.is_some() {
            return self.confirm_synced(held).await;
        }
        Ok(held)
    }

    /// The checks before an adoption of `id` (`n` permits, lease `len`) is sent, and this
    /// process's local cap for it (taken without waiting).
    fn check_adoptable(
        &self,
        id: &str,
        n: u32,
        len: Duration,
    ) -> Result<Option<OwnedSemaphorePermit>, Error> {
        if self.closed.is_cancelled() {
            return Err(Error::closed(self.name()));
        }
        if self.table.lock().holder(id).is_some() {
            // two permits of one entry in one handle would release each other's
            return Err(Error::InvalidArgument(format!(
                "this handle of semaphore {:?} already holds {id} (adopted before): use that permit",
                self.name()
            )));
        }
        self.timing
            .check_holder_lease(len)
            .map_err(Error::InvalidArgument)?;
        match &self.local_cap {
            None => Ok(None),
            Some((_, sem)) => sem
                .clone()
                .try_acquire_many_owned(n)
                .map(Some)
                .map_err(|_| Error::no_permits(self.name(), NoPermitsReason::LocalCap)),
        }
    }

    /// Releases the entry `id` by id (one round trip, a plain `release.lua` call; idempotent):
    /// whoever holds it learns it at its next renewal. Returns whether it existed.
    pub(crate) async fn release_by_id(&self, id: &str) -> Result<bool, Error> {
        let mut conn = self.ctx.conn.clone();
        let target = self.remote.target();
        let ids = [id];
        let found = protocol::release(&mut conn, &target, &Removal::of(&ids), false)
            .await
            .map_err(|e| Error::from_call(e, self.name()))?;
        Ok(found > 0)
    }
}

/// An adoption in flight: if dropped while it holds the id (cancelled, failed after the call
/// was sent), the entry is detached in the background, so that it is not left in a session of
/// this handle that no permit accounts for.
struct Unadopted<'a> {
    handle: &'a Handle,
    id: Option<String>,
}

impl Drop for Unadopted<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.handle.table.detach_in_background(id);
        }
    }
}

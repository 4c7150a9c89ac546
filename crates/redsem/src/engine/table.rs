//! [`Table`]: one handle's [`HandleState`] behind the handle's one lock, and the I/O its
//! changes lead to (the releaser for what nobody waits for, the heartbeat's wake-up).
//!
//! A waiter is resolved exactly once, by whichever comes first: the reply of its own acquire
//! call, a notification, the heartbeat, or closing the handle. Whatever is resolved after
//! its acquire was dropped is released in the background, so nothing leaks.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::releaser::{Job, Releaser};
use super::remote::Remote;
use super::signal::LossSignal;
use crate::core::{Effect, Grid, HandleState, Outcome, Resolved, Timing};
use crate::error::LostReason;

/// How the engine resolves one pending acquire: the channel its future waits on. Counts the
/// waiter in `redsem_client_waiters` while it lives (feature `metrics`).
pub(crate) struct Resolver {
    tx: oneshot::Sender<Outcome>,
    gauge: crate::metrics::WaiterGauge,
}

impl Resolver {
    /// A waiter of the semaphore `name`, resolved through `tx`.
    pub(crate) fn new(tx: oneshot::Sender<Outcome>, name: &str) -> Resolver {
        let gauge = crate::metrics::WaiterGauge::new(name);
        Resolver { tx, gauge }
    }

    /// Resolves it: no longer waiting (out of the gauge before its acquire can see the
    /// outcome). The outcome back if nobody waits any more.
    fn send(self, what: Outcome) -> Result<(), Outcome> {
        self.gauge.done();
        self.tx.send(what)
    }
}

/// A handle's state as the engine keeps it.
pub(crate) type State = HandleState<Resolver, Arc<LossSignal>>;

/// One use of a lease length by a pending acquisition that asked for it: its session is
/// renewed while the use lives (a permit's uses are in the state: see
/// [`HandleState::permit_uses_lease`]).
pub(crate) struct LeaseUse {
    table: Arc<Table>,
    ms: u64,
}

impl LeaseUse {
    /// The lease length used, in ms.
    pub(crate) fn ms(&self) -> u64 {
        self.ms
    }
}

impl Drop for LeaseUse {
    fn drop(&mut self) {
        self.table.lock().unuse_lease(self.ms, Instant::now());
    }
}

/// The state of one handle under its lock, and what acting on it needs.
pub(crate) struct Table {
    state: Mutex<State>,
    remote: Arc<Remote>,
    /// The handle's channel id, which starts the ids of its sessions.
    channel_id: String,
    releaser: Releaser,
    /// Wakes the heartbeat to recompute its schedule.
    pub(crate) poke: Arc<Notify>,
}

impl Table {
    pub(crate) fn new(
        remote: Arc<Remote>,
        releaser: Releaser,
        (timing, grid): (Timing, Grid),
        channel_id: String,
    ) -> Table {
        Table {
            state: Mutex::new(HandleState::new(timing, grid, Instant::now())),
            remote,
            channel_id,
            releaser,
            poke: Arc::new(Notify::new()),
        }
    }

    /// The handle's one lock. Held only for state changes, never across an `.await`.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// An entry of this handle is about to use a lease of `len`: its session is renewed
    /// from now on, as long as the returned [`LeaseUse`] (or another use of the length) lives.
    pub(crate) fn use_lease(self: &Arc<Self>, len: Duration) -> LeaseUse {
        let ms = len.as_millis() as u64;
        self.lock().use_lease(ms);
        LeaseUse {
            table: self.clone(),
            ms,
        }
    }

    /// The sessions of this handle, with their leases in ms: `(id, lease)`.
    pub(crate) fn sessions(&self) -> Vec<(String, u64)> {
        self.lock().sessions(&self.channel_id)
    }

    /// Ends this handle's sessions in Redis in the background (each only if no entry is left
    /// in it), those in use and those that went out of use less than their lease ago: the
    /// handle is gone.
    pub(crate) fn end_sessions(&self) {
        let sessions = self.lock().sessions_to_end(&self.channel_id);
        let remote = self.remote.clone();
        self.releaser.send(Job::EndSessions { remote, sessions });
    }

    /// Detaches the holder `id` in Redis in the background: it leaves this handle's session
    /// and expires with the lease it has.
    pub(crate) fn detach_in_background(&self, id: String) {
        let remote = self.remote.clone();
        self.releaser.send(Job::Detach { remote, id });
    }

    /// Removes `id` from Redis in the background (idempotent).
    pub(crate) fn release_in_background(&self, id: String) {
        self.releaser.release(&self.remote, id);
    }

    /// Redis confirmed the release of `id` (an in-place release): kept to be sent again after
    /// a resync ([`Released`](super::releaser::Released)).
    pub(crate) fn released(&self, id: &str) {
        self.releaser
            .released
            .record(&self.remote, &[id.to_owned()]);
    }

    /// A permit's holder is done with it (released, dropped or lost).
    pub(crate) fn forget_holder(&self, id: &str) {
        self.lock().remove_holder(id);
    }

    /// Resolves the pending acquire `id`, if it is still pending. The first resolution wins;
    /// a grant nobody waits for any more is released.
    pub(crate) fn deliver(&self, id: &str, what: Outcome) {
        let granted = matches!(what, Outcome::Granted(_));
        let mut st = self.lock();
        let resolver = match st.resolve(id, granted, || Arc::new(LossSignal::new())) {
            Resolved::Pending(resolver) => resolver,
            Resolved::Gone { release } => {
                drop(st);
                if release {
                    self.release_in_background(id.to_owned());
                }
                return;
            }
        };
        if let Err(Outcome::Granted(_)) = resolver.send(what) {
            st.remove_holder(id);
            drop(st);
            self.release_in_background(id.to_owned());
            return;
        }
        drop(st);
        // the heartbeat's schedule changed (a new holder to renew, one waiter fewer)
        self.poke.notify_one();
    }

    /// Resolves every waiter with [`Outcome::Closed`].
    pub(crate) fn close_waiters(&self) {
        let resolvers = self.lock().take_waiters();
        for r in resolvers {
            let _ = r.send(Outcome::Closed);
        }
        self.poke.notify_one();
    }

    /// Carries out what the core decided, in order.
    pub(crate) fn apply(&self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Resolve(id, outcome) => self.deliver(&id, outcome),
                Effect::Lose(id, reason) => self.lose(&id, reason),
            }
        }
    }

    /// Declares the holder `id` lost for `reason` and deals with what is left of its entry in
    /// Redis, in the background:
    /// - lost because renewals failed ([`LostReason::Unreachable`]): the lease may still run
    ///   in Redis (the holder is told a safety margin before it could end there, so that the
    ///   program stops its work in time), so the entry is detached, not released: it keeps
    ///   that lease, nobody renews it, and nobody else is granted its slots before it ends
    ///   (a release would hand them on while the program is still stopping); dropping the
    ///   permit releases it at once, as after [`LostReason::MaxHold`];
    /// - an entry another handle adopted (that handle's now), or in keys another program's
    ///   data overwrote (a release would be refused): nothing;
    /// - otherwise (the entry is gone from Redis, the semaphore deleted, renewals refused, a
    ///   shutdown) released: whatever is left of it.
    pub(crate) fn lose(&self, id: &str, reason: LostReason) {
        if !self.declare_lost(id, reason) {
            return;
        }
        match reason {
            LostReason::HandedOff | LostReason::Overwritten => {}
            LostReason::Unreachable => self.detach_in_background(id.to_owned()),
            _ => self.release_in_background(id.to_owned()),
        }
    }

    /// The holder `id` reached its maximum hold time: it is lost ([`LostReason::MaxHold`])
    /// and, unless it was lost or released before, detached in Redis (in the background):
    /// its entry leaves the handle's session for one nobody renews, and expires with the
    /// lease it has. Not released: the program may still be stopping its work, and the
    /// permit's drop releases it.
    pub(crate) fn max_hold_reached(&self, id: &str) {
        if self.declare_lost(id, LostReason::MaxHold) {
            self.detach_in_background(id.to_owned());
        }
    }

    /// Declares the holder `id` lost for `reason` locally (no longer renewed, the permit
    /// learns it): false if it was no longer a holder (released or lost meanwhile).
    fn declare_lost(&self, id: &str, reason: LostReason) -> bool {
        let Some(holder) = self.lock().remove_holder(id) else {
            return false; // released or lost meanwhile
        };
        let (ticket, slots) = holder
            .grant
            .map(|g| (g.ticket, g.slots))
            .unwrap_or_default();
        let name = self.remote.name();
        tracing::warn!(semaphore = %name, holder = id, ticket, ?slots, %reason, "lease lost");
        crate::metrics::lease_lost(name, reason);
        holder.signal.lose(reason);
        true
    }
}

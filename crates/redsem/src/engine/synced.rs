//! Synced mode: a grant counts once enough replicas have it.
//!
//! Redis replicates asynchronously. If a master fails after granting a permit but before any
//! replica received the grant, the promoted replica does not know the holder and may grant
//! the same slot to someone else. With
//! [`ClientBuilder::synced_replicas`](crate::ClientBuilder::synced_replicas), every grant is
//! confirmed before `acquire` returns: one more script call renews the new holder and, on the
//! same connection, `WAIT n timeout` waits until `n` replicas have processed it (replication
//! is ordered, so they have the grant too). Too few acknowledgements in time: the permit is
//! released and the acquire fails with [`Error::NotReplicated`].
//!
//! The heartbeat's renewals are `WAIT`ed the same way (`heartbeat.rs`): a renewal too few
//! replicas acknowledged does not count as a confirmation, so a failover cannot promote a
//! replica whose copy of a lease is older than the holder believes.

use std::sync::Arc;

use super::handle::Handle;
use super::held::Held;
use crate::error::{Error, LostReason};
use crate::protocol::{self, EntryState};

impl Handle {
    /// Returns `permit` once the grant is on enough replicas (at once when synced mode is off).
    pub(crate) async fn confirm_synced(self: &Arc<Self>, permit: Held) -> Result<Held, Error> {
        let Some((replicas, timeout)) = self.ctx.synced else {
            return Ok(permit);
        };
        let mut conn = self.ctx.conn.clone();
        let target = self.remote.target();
        let sessions = self.table.sessions();
        let sessions: Vec<protocol::Session<'_>> =
            sessions.iter().map(|(s, ms)| (s.as_str(), *ms)).collect();
        let reply = protocol::renew_and_wait(
            &mut conn,
            &target,
            &sessions,
            &[permit.id()],
            replicas,
            timeout,
        )
        .await
        .map(|(mut renewal, acked)| (renewal.states.remove(0), acked));
        match reply {
            Ok((EntryState::Held(_), acked)) if acked >= replicas => Ok(permit),
            Ok((EntryState::Held(_), acked)) => {
                tracing::warn!(semaphore = %self.name(), acked, wanted = replicas,
                    "synced mode: too few replicas acknowledged the grant; releasing it");
                let _ = permit.release().await;
                Err(Error::NotReplicated {
                    name: self.name().to_owned(),
                    acked,
                    wanted: replicas,
                    timeout,
                })
            }
            Ok(_) => {
                drop(permit);
                Err(Error::lease_lost(self.name(), LostReason::NotHolder))
            }
            Err(e) => {
                drop(permit);
                Err(Error::from_call(e, self.name()))
            }
        }
    }
}

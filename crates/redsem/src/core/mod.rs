//! The core: what one semaphore handle knows and decides, with no I/O. The engine's tasks
//! feed it events and carry out the effects it returns; it never reads the clock (every
//! `now` is an argument), never touches a socket, a task or a Redis type, and is tested
//! directly in simulated time.
//!
//! The events and the effects they lead to are tabled in docs/ARCHITECTURE.md ("The core").
//!
//! # The client rules
//!
//! This module's files are the one place these rules are written; the protocol's rules (what
//! the scripts do) are in docs/PROTOCOL.md.
//! - **Lease trust** ([`lease`]): a holder trusts its lease until `trusted confirmation +
//!   lease − margin` (the margin: a tenth, at most 1 s). The trusted confirmation is one a
//!   failover to a replica lagging less than one renewal interval cannot have lost: an
//!   anchor, made trusted by a confirmation sent at least one interval after the anchor's
//!   answer ([`lease::Confirmations`]). A change of lease length counts at once when shorter,
//!   and from a trusted confirmation sent after it when longer ([`lease::LeaseClock`]).
//! - **Renewal rhythm** ([`schedule`]): holders are renewed one interval after their anchor's
//!   answer, waiters checked every fallback interval (at most every renewal interval), both
//!   rounded up to the client's 50 ms grid; a reported expiry in Redis is looked at 2 ms
//!   after it; failures back off from 200 ms, doubling, to at most 2 s or one interval.
//! - **Doubt** ([`HandleState::doubted_waiters`]): a waiter is checked one by one only when
//!   its place is below the head of the queue, its ticket at or below the highest granted in
//!   its class, or after a reconnect, a failed beat or an expired waiters' session.
//! - **Loss** ([`HandleState::on_renewal`]): a holder is lost when a renewal finds its entry
//!   gone, waiting, moved to another handle, or granted afresh with another grant, or when
//!   its deadline passes without a confirmed renewal.

mod lease;
mod renewal;
mod schedule;
mod state;
mod time;

pub(crate) use lease::{LeaseClock, Timing, deadline_after, min_lease_message};
pub use lease::{MIN_LEASE, margin};
pub(crate) use renewal::{Effect, RenewalCall};
pub(crate) use schedule::Grid;
pub(crate) use state::{HandleState, Outcome, Queued, Resolved};

//! Fair, crash-safe distributed semaphores on Redis and Valkey.
//!
//! When several replicas share a downstream that allows only N calls at once — a licensed
//! API, a fragile legacy service, a GPU pool — the limit has to live where they all see it.
//! `redsem` keeps it in Redis:
//!
//! - **FIFO**: acquirers are served in ticket order across all processes;
//! - **leases**: a crashed holder's slot comes back within one lease, a crashed waiter leaves
//!   the queue; live leases are renewed by one batched call per open semaphore handle;
//! - **targeted wake-up**: a release grants the next tickets inside the same Redis script and
//!   notifies only the process that owns each granted ticket, which starts without another
//!   round trip — a constant number of round trips per acquisition whatever the number of
//!   waiters;
//! - **slots and fencing tokens** on every permit, for device pools and for resources that
//!   must reject a holder paused past its lease;
//! - **one limit** stored in Redis for every replica, resizable live;
//! - `tokio::sync::Semaphore`-style API: [`acquire`](Semaphore::acquire),
//!   [`try_acquire`](Semaphore::try_acquire), [`acquire_many`](Semaphore::acquire_many),
//!   RAII [`Permit`]s, documented cancel safety;
//! - operator functions on [`Client`] that never create a semaphore:
//!   [`list_semaphores`](Client::list_semaphores), [`inspect`](Client::inspect),
//!   [`resize_existing`](Client::resize_existing),
//!   [`add_permits_existing`](Client::add_permits_existing),
//!   [`force_release_existing`](Client::force_release_existing).
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//!
//! # async fn call_licensed_api(_slot: u32) {}
//! #[tokio::main]
//! async fn main() -> Result<(), redsem::Error> {
//!     let client = redsem::Client::connect("redis://127.0.0.1:6379/").await?;
//!     // At most 4 calls at once, across every process that opens "licensed-api".
//!     let sem = client
//!         .semaphore("licensed-api", 4)
//!         .lease(Duration::from_secs(10))
//!         .open()
//!         .await?;
//!
//!     let permit = sem.acquire().await?; // waits in FIFO order
//!     let slot = permit.slots()[0]; // 0..4, unique among live holders
//!     // The work is cancelled if the slot is lost (its lease could not be renewed).
//!     permit.run(call_licensed_api(slot)).await?;
//!     client.shutdown().await; // every release done before the process exits
//!     Ok(())
//! }
//! ```
//!
//! # How it works
//!
//! Every state change is one Lua script run atomically by Redis, with time from Redis `TIME`.
//! Each script first *reaps* expired leases, then grants the head of the queue while capacity
//! allows, then publishes each grant on the channel of the handle that owns the waiter. See
//! [`guide`] for choosing leases, the failure model and the guarantees, and
//! [`fencing`] for protecting a resource against paused holders.
//!
//! # Cost
//!
//! Per [`Client`]: two Redis connections (commands, notifications; on a Redis Cluster, two
//! per node the client talks to) and three background tasks (releases; routing
//! notifications; resubscribing after a reconnect), five through Sentinel (following the
//! master), plus a heartbeat and a batching task per open semaphore handle. Per acquisition:
//! at most one script call (acquisitions made while a call is in flight share the next one),
//! plus at most one to release (background releases are batched too). Per open semaphore
//! handle: one renewal per renewal interval while holding, and per fallback or renewal
//! interval, whichever is shorter, while waiting; it renews the handle's session (the leases
//! of all its holders and waiters), so its cost does not grow with the number of waiters.
//! The renewals of a client's handles share calls (one per Redis node, or per hash slot on a
//! cluster, for the handles whose renewals fall due in the same 50 ms step), so the calls do
//! not grow with the number of semaphores either.
//!
//! # Feature flags
//!
//! | feature | what it adds |
//! |---|---|
//! | `tower` | `redsem::tower`: a tower `Layer`/`Service` limiting in-flight requests across replicas (axum, hyper, reqwest, tonic stacks) |
//! | `metrics` | counters, histograms and gauges through the `metrics` facade; names in [the metrics module](crate::metrics) |
//! | `tls` | `rediss://` URLs (rustls) |
//! | `blocking` | `redsem::blocking`: the same API for programs without async, on a runtime thread of its own (as `reqwest::blocking`) |
//!
//! [`tracing`](https://docs.rs/tracing) spans and events are always emitted (see
//! [Observability](guide#observability)); they cost nothing without a subscriber.
//!
//! # Other languages
//!
//! The protocol (keys, scripts, messages) is open and documented in `docs/PROTOCOL.md`:
//! a Python service and a Rust service can share one semaphore, fairly.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// Layers, top to bottom; a module imports only from layers below its own (see
// docs/ARCHITECTURE.md; checked by tests/layers.rs):
//   public API: semaphore, options, builder, permit, client, admin, blocking, tower, fencing,
//               stats, guide
//   engine:     engine/ (acquire, batching, heartbeat, releaser, notifier, table, ...)
//   protocol:   protocol/ (the Lua scripts, their arguments and the only reply parser)
//   transport:  backend/ (URLs, TLS, standalone, cluster, Sentinel connections)
//   bottom:     metrics, keys, error

// public API
mod admin;
#[cfg(feature = "blocking")]
#[cfg_attr(docsrs, doc(cfg(feature = "blocking")))]
pub mod blocking;
mod builder;
mod client;
pub mod fencing;
pub mod guide;
mod handoff;
mod options;
mod permit;
mod semaphore;
mod stats;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;
// engine
mod engine;
// core (pure: no I/O)
mod core;
// protocol
mod protocol;
// transport
mod backend;
// bottom
mod backoff;
mod codes;
mod error;
pub mod metrics;

pub use crate::core::MIN_LEASE;
#[doc(hidden)]
pub use admin::{ForceReleased, RejectedWaiter, Resized};
pub use backend::redact_url;
pub use builder::{LimitPolicy, SemaphoreBuilder};
pub use client::{Client, ClientBuilder, DEFAULT_PREFIX};
pub use error::display_name;
pub use error::{BackendError, Error, LostReason, NoPermitsReason};
pub use handoff::HandoffToken;
pub use options::{AcquireOptions, MAX_DURATION, MAX_PRIORITY, check_label};
pub use permit::{Fence, Permit};
#[doc(hidden)]
pub use protocol::keys::Keys;
pub use protocol::keys::{MAX_NAME_LEN, PROTOCOL_VERSION, check_limit};
pub use semaphore::{MAX_LIMIT, Semaphore};
pub use stats::{HolderInfo, MAX_LISTED, STATS_LISTED, Stats, WaiterInfo};

#[doc(hidden)]
pub mod bindings;

/// The protocol's rules that the workspace's other crates (the chaos suite's checker and
/// snapshots) must apply exactly as the library does: imported from here, never re-derived.
/// Not a public API: no stability promise.
#[doc(hidden)]
pub mod internals {
    pub use crate::core::margin;
    pub use crate::protocol::ids::session_id;
    pub use crate::protocol::keys::Keys;
    pub use crate::protocol::script_source;
}

//! The engine: everything between the public handles and the scripts — batching, the
//! waiter/holder table, the heartbeat, notifications, background releases, synced mode.
//!
//! The public types are thin: a `Client` is an `Arc<`[`Context`]`>`, a `Semaphore` an
//! `Arc<`[`Handle`]`>`, a `Permit` a [`Held`] entry with its fences. The engine never names
//! them; it hands back what they wrap.
//!
//! Files, each importing only those listed before it (and the layers below the engine:
//! `protocol`, `backend`, `keys`, `error`, `metrics`):
//!
//! | file | what |
//! |---|---|
//! | `lease.rs` | `Timing` (lease, renewal, margins) and the state of one held lease |
//! | `remote.rs` | `Remote`: one semaphore in Redis (keys, last limit seen); `Calls`, the script calls of background work |
//! | `notifier.rs` | the subscriber connection; routes messages to a `Listener` per channel |
//! | `releaser.rs` | the background releaser (what `Drop` may not do) |
//! | `renewer.rs` | the client-wide renewer: the heartbeats' renewals, several semaphores per call; the grid their wake-ups align on |
//! | `batch.rs` | the batching task: concurrent acquisitions share one script call |
//! | `table.rs` | the waiter/holder table of a handle, and how a waiter is resolved |
//! | `context.rs` | [`Context`]: what the handles of one client share; connecting it |
//! | `heartbeat.rs` | renewals, fallback polls, lost-permit detection, and their schedule |
//! | `handle.rs` | [`Handle`]: the per-handle shared state; opening a handle |
//! | `held.rs` | [`Held`]: one granted entry, released on drop |
//! | `synced.rs` | synced mode: a grant counts once enough replicas have it |
//! | `acquire.rs` | the acquire state machine |
//! | `handoff.rs` | hand-off by id: adopting an exported holder, releasing one by id |

mod acquire;
mod batch;
mod combine;
mod context;
mod handle;
mod handoff;
mod heartbeat;
mod held;
mod notifier;
mod releaser;
mod remote;
mod renewer;
mod signal;
mod synced;
mod table;

pub(crate) use crate::core::Timing;
pub(crate) use acquire::Ask;
pub(crate) use batch::Custom;
pub(crate) use context::{ConnectSettings, Context};
pub(crate) use handle::{Handle, OpenSettings, OtherLimit};
pub(crate) use held::Held;

//! `redsem-chaos`: many worker processes share several redsem semaphores while faults are
//! injected at random (reproducibly from a seed); every process logs what it believed and
//! did, the runner logs the faults, the fenced resource's decisions and periodic snapshots
//! of the semaphores in Redis, and a checker proves the guarantees from those logs.
//!
//! - [`runner`]: starts a private Redis (with `failover-replica`, a replica too; with
//!   `clock-step`, a Valkey on a clock of its own), one [`proxy::ClientProxy`] per worker slot,
//!   the worker processes, the fenced resource, the snapshotter and the fault schedule;
//! - [`worker`]: one worker process (acquire, hold with fenced writes, release; in a loop);
//! - [`checker`]: the properties, checked from the logs (see its module docs);
//! - [`config`]: the parameters of a run, saved beside the logs so a check can be re-run.
#![forbid(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod checker;
pub mod cli;
pub mod config;
pub mod events;
pub mod proxy;
pub mod runner;
pub mod snapshot;
pub mod worker;

/// Microseconds since the Unix epoch, from `CLOCK_REALTIME` (shared by every process of a
/// run, and by Redis `TIME`).
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

//! The checker: proves the guarantees from the logs of one run.
//!
//! It has three sources of evidence, all timed by the one `CLOCK_REALTIME` of the machine
//! (which Redis `TIME` reads too):
//!
//! - what each worker **believed** (`w<id>.log`): a holder believes it holds its permit from
//!   `acq` until `done`, `cancel` or `lost`, or its process's death;
//! - what **Redis** held: a snapshot of every semaphore every few tens of milliseconds
//!   (`snapshots.log`); an entry's lease is *valid* at a snapshot when its expiry is later than
//!   the snapshot's Redis time;
//! - what the **runner** did (`runner.log`): every fault with its start and end, process
//!   spawns and exits, Redis restarts, and every decision of the fenced resource.
//!
//! The properties, one file each (its header says what it checks, which bound it allows and
//! why); each violation names one:
//!
//! 1. `limit-in-redis` (`limit_in_redis.rs`): the holders with valid leases in a snapshot
//!    never exceed the limit, and their slots are distinct and mapped to them. No exception.
//! 2. `limit-believed` (`limit_believed.rs`): the holders that *believe* they hold never
//!    exceed the limit, except while one of them was stale in Redis (property 3).
//! 3. `stale-belief` (`stale_belief.rs`): a holder believing while its lease is not valid in
//!    Redis is explained by a documented fault, and gives up within one renewal interval of
//!    the first moment it could learn.
//! 4. `fencing` (`fencing.rs`): the fenced resource's decisions replay, generations are
//!    unique and increasing, stale writes after a newer holder's are rejected.
//! 5. `recovery` (`recovery.rs`): a SIGKILLed worker's entries leave Redis within one lease
//!    of the kill while a live waiter wants them.
//! 6. `wait-while-free` (`wait_while_free.rs`): no live waiter waits while permits are free,
//!    or for the news of its grant, longer than the fallback interval.
//! 7. `run-cancel` (`run_cancel.rs`): `Permit::run` drops the work of a lost permit at once.
//! 8. `cleanup` (`cleanup.rs`): nothing but the configuration is left once every worker
//!    exited and the leases ran out.
//! 9. `liveness` (`liveness.rs`): every worker exits on SIGTERM, none crashes, every acquire
//!    returns.
//! 10. `fifo` (`fifo.rs`): tickets are issued in arrival order and granted in ticket order
//!     (no waiter overtaken), after a loss of `queue` or `cfg` too.
//!
//! The other files: `logs.rs` (the runner's and the workers' logs, parsed), `snapshots.rs`
//! (a line of `snapshots.log` parsed: a semaphore's entries, their ids, the workers' excuses),
//! `scan.rs` (the one pass over `snapshots.log` that feeds properties 1, 5, 6 and 10 and
//! records what Redis held for each op), `report.rs` (the figures and the violations),
//! `time.rs` (times in ms, printed, and windows of them). This file only declares them and
//! runs the properties: what they share lives in those files, so imports point one way.

mod cleanup;
mod fencing;
mod fifo;
mod limit_believed;
mod limit_in_redis;
mod liveness;
mod logs;
mod recovery;
mod report;
mod run_cancel;
mod scan;
mod snapshots;
mod stale_belief;
mod time;
mod wait_while_free;

use std::path::Path;

pub use report::{Report, Violation};

/// Checks the run in `dir` (written by [`crate::runner::execute`]).
///
/// # Errors
/// Missing or unreadable logs.
pub fn check(dir: &Path) -> anyhow::Result<Report> {
    let mut logs = logs::Logs::load(dir)?;
    let mut r = Report {
        seed: logs.cfg.seed,
        seconds: logs.cfg.seconds,
        workers_started: logs.workers.len(),
        ..Report::default()
    };
    report::figures(&logs, &mut r);
    scan::check(dir, &mut logs, &mut r)?;
    let inv = stale_belief::check(&logs, &mut r);
    limit_believed::check(&logs, &inv, &mut r);
    fencing::check(&logs, &inv, &mut r);
    wait_while_free::notices(&logs, &mut r);
    run_cancel::check(&logs, &mut r);
    cleanup::check(&logs, &mut r);
    liveness::check(&logs, &mut r);
    Ok(r)
}

//! Property 8, `cleanup`: once every worker has exited, nothing leaks (from `final.json`,
//! written by the runner).
//!
//! - Every entry left in Redis has a lease: no orphan that would never expire.
//! - No lease outlives the last worker by more than one lease (+ slack): a lease is renewed
//!   only by a live process.
//! - No subscription, connection or foreign key is left.
//! - Once the leases ran out, a redsem call leaves only the configuration (limit, free
//!   slots, fences). No exception.

use super::logs::Logs;
use super::report::Report;

/// Checks property 8.
pub(super) fn check(logs: &Logs, r: &mut Report) {
    let Some(f) = &logs.final_state else {
        r.violation(
            "cleanup",
            "final.json is missing: the run did not finish".into(),
        );
        return;
    };
    if let Some(e) = &f.error {
        r.violation("cleanup", format!("reading the final state failed: {e}"));
    }
    for o in &f.orphans {
        r.violation(
            "cleanup",
            format!("{o} is left without a lease: it would never expire"),
        );
    }
    for l in &f.leases_too_long {
        r.violation("cleanup", l.clone());
    }
    for k in &f.foreign_keys {
        r.violation("cleanup", format!("key {k} is left in Redis"));
    }
    for c in &f.channels {
        r.violation("cleanup", format!("channel {c} is still subscribed"));
    }
    for c in &f.clients {
        r.violation("cleanup", format!("a client connection is still open: {c}"));
    }
    for a in &f.after_reap {
        r.violation("cleanup", a.clone());
    }
}

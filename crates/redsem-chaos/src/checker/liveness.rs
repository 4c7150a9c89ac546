//! Property 9, `liveness`: every worker exits within 20 s of SIGTERM (no acquire, work or
//! release hangs), none crashes, and every acquire it started returned and every work it
//! started finished. The 20 s bound is the runner's: far beyond every timeout of a run
//! (acquires, renewals, reconnections), so only a hang reaches it. A worker killed by a fault
//! is excused, and so is one stopped before it connected.

use super::logs::Logs;
use super::report::Report;

/// Checks property 9.
pub(super) fn check(logs: &Logs, r: &mut Report) {
    for (&id, w) in &logs.workers {
        match w.exit.as_ref().map(|e| e.1.as_str()) {
            Some("killed") | Some("ok") => {}
            Some("hung") => r.violation(
                "liveness",
                format!("worker {id} did not exit within 20 s of SIGTERM: an acquire, a work or a release hung"),
            ),
            Some("signal:15") if !w.stopped && w.client_id.is_none() => {}
            other => r.violation(
                "liveness",
                format!("worker {id} exited abnormally ({other:?}): see w{id}.err"),
            ),
        }
    }
    for o in &logs.ops {
        let w = &logs.workers[&o.worker];
        if !w.stopped {
            continue;
        }
        if o.acq.is_none() && o.fail.is_none() {
            r.violation(
                "liveness",
                format!(
                    "op {}: its acquire never returned before the worker stopped",
                    o.name
                ),
            );
        }
        if o.acq.is_some() && o.done.is_none() && o.cancel.is_none() && o.lost.is_none() {
            r.violation(
                "liveness",
                format!(
                    "op {}: its work never finished before the worker stopped",
                    o.name
                ),
            );
        }
    }
}

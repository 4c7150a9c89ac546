//! `scale`: 3 processes x 300 tasks, one job each (900 jobs), limit 5, 20 ms, lease 5 s, 20 s
//! run timeout (a run that hits it is reported as `timeout` with the jobs done, not repeated).
//! Run by the shared job run ([`super::jobs`]).

use super::ScenarioParams;

/// The workload, the task count (= jobs per process) multiplied by `n`'s scale.
pub(super) fn params(n: impl Fn(f64, u64) -> u64) -> ScenarioParams {
    let w = n(300.0, 2);
    ScenarioParams {
        procs: 3,
        workers: w as u32,
        jobs_per_proc: w,
        limit: 5,
        hold_ms: 20.0,
        lease_ms: 5000,
        run_timeout_s: 20.0,
        ..ScenarioParams::default()
    }
}

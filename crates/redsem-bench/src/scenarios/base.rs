//! `base`: the reference's workload, 3 processes x 10 tasks, limit 5, 600 jobs (200 per
//! process) x 20 ms, lease 5 s. Run by the shared job run ([`super::jobs`]); its job lines
//! are kept for the charts ([`crate::chart`]).

use super::ScenarioParams;

/// The workload, job counts multiplied by `n`'s scale.
pub(super) fn params(n: impl Fn(f64, u64) -> u64) -> ScenarioParams {
    ScenarioParams {
        procs: 3,
        workers: 10,
        jobs_per_proc: n(200.0, 1),
        limit: 5,
        hold_ms: 20.0,
        lease_ms: 5000,
        run_timeout_s: 30.0,
        ..ScenarioParams::default()
    }
}

//! `throughput`: uncontended, 1 process, 64 tasks, limit 64, zero hold, 20,000
//! acquire/release cycles. Run by the shared job run ([`super::jobs`]).

use super::ScenarioParams;

/// The workload, the cycle count multiplied by `n`'s scale.
pub(super) fn params(n: impl Fn(f64, u64) -> u64) -> ScenarioParams {
    ScenarioParams {
        procs: 1,
        workers: 64,
        jobs_per_proc: n(20_000.0, 64),
        limit: 64,
        hold_ms: 0.0,
        lease_ms: 5000,
        run_timeout_s: 30.0,
        ..ScenarioParams::default()
    }
}

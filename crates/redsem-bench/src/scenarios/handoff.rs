//! `handoff`: limit 1, 3 processes x 2 tasks (5 always waiting), 150 jobs x 10 ms. Measures
//! release -> next holder: from the releaser's `rel_ns` to the next `acq_ns`. Run by the
//! shared job run ([`super::jobs`]), which adds the figures below.

use std::collections::BTreeMap;

use super::ScenarioParams;
use crate::metrics::{self, JobRecord};

/// The workload, job counts multiplied by `n`'s scale.
pub(super) fn params(n: impl Fn(f64, u64) -> u64) -> ScenarioParams {
    ScenarioParams {
        procs: 3,
        workers: 2,
        jobs_per_proc: n(50.0, 4),
        limit: 1,
        hold_ms: 10.0,
        lease_ms: 5000,
        run_timeout_s: 30.0,
        ..ScenarioParams::default()
    }
}

/// Hand-off gaps of a limit-1 run: `handoff_p50_ms`, `_p99_ms`, `_max_ms`, `_mean_ms` over
/// every release followed by the next grant, and `handoff_overlaps` (grants before the
/// previous release, which a limit of 1 never allows).
pub(super) fn figures(jobs: &[JobRecord], fig: &mut BTreeMap<String, f64>) {
    let mut sorted: Vec<&JobRecord> = jobs.iter().collect();
    sorted.sort_by_key(|j| j.acq_ns);
    let mut gaps = Vec::new();
    let mut overlapping = 0u64;
    for w in sorted.windows(2) {
        let (prev, next) = (w[0], w[1]);
        if next.acq_ns >= prev.rel_ns {
            gaps.push((next.acq_ns - prev.rel_ns) as f64 / 1e6);
        } else {
            overlapping += 1;
        }
    }
    if let Some(l) = metrics::latency(&gaps) {
        fig.insert("handoff_p50_ms".into(), l.p50_ms);
        fig.insert("handoff_p99_ms".into(), l.p99_ms);
        fig.insert("handoff_max_ms".into(), l.max_ms);
        fig.insert("handoff_mean_ms".into(), l.mean_ms);
    }
    fig.insert("handoff_overlaps".into(), overlapping as f64);
}

//! The run shared by the scenarios made of jobs (`base`, `scale`, `throughput`, `handoff`):
//! P contract worker processes started together, every job line collected, and the figures
//! computed from the job lines and Redis' `INFO` before and after (as `driver.py` does).

use std::collections::BTreeMap;
use std::time::Duration;

use super::{RepResult, RunArgs, ScenarioKind, ScenarioParams, now_ms, worker_problems};
use crate::designs::DesignKind;
use crate::harness::{Harness, WorkerSpec};
use crate::metrics::{self, JobRecord};

/// One run of a throughput-style scenario (base, scale, throughput, handoff).
pub async fn run_once(
    h: &Harness,
    a: &RunArgs,
    kind: ScenarioKind,
    design: DesignKind,
    p: &ScenarioParams,
    rep: u32,
) -> anyhow::Result<RepResult> {
    h.reset().await?;
    let before = h.snapshot().await?;
    let cpu0 = metrics::children_cpu_s();
    let start_at_ms = now_ms() + a.start_margin_ms;
    let spec = WorkerSpec {
        design,
        name: "bench".into(),
        limit: p.limit,
        workers: p.workers,
        jobs: p.jobs_per_proc,
        hold_ms: p.hold_ms,
        lease_ms: p.lease_ms,
        start_at_ms,
        announce: false,
        semaphores: 1,
        synced_replicas: p.synced_replicas.unwrap_or(0),
    };
    let specs = vec![spec; p.procs as usize];
    let (outs, timed_out) = h
        .run_procs(&specs, Duration::from_secs_f64(p.run_timeout_s))
        .await?;
    let after = h.snapshot().await?;
    let client_cpu_s = metrics::children_cpu_s() - cpu0;

    let mut r = RepResult {
        rep,
        timed_out,
        start_ns: start_at_ms * 1_000_000,
        jobs_expected: u64::from(p.procs) * p.jobs_per_proc,
        commandstats: after.commandstats.clone(),
        ..Default::default()
    };
    worker_problems(&outs, &mut r.notes);
    let mut late: f64 = 0.0;
    let mut release_errors = 0.0;
    for o in &outs {
        if let Some(s) = &o.summary {
            late = late.max(s.get("late_ms").and_then(|v| v.as_f64()).unwrap_or(0.0));
            release_errors += s
                .get("release_errors")
                .and_then(|v| v.as_f64())
                .unwrap_or(0.0);
        }
    }
    let jobs: Vec<JobRecord> = outs.into_iter().flat_map(|o| o.jobs).collect();
    let n = jobs.len() as u64;
    r.jobs_done = n;
    r.complete = n == r.jobs_expected && !timed_out;
    let fig = &mut r.figures;
    let end_ns = jobs
        .iter()
        .map(|j| j.done_ns.unwrap_or(j.rel_ns))
        .max()
        .unwrap_or(r.start_ns);
    let run_s = end_ns.saturating_sub(r.start_ns) as f64 / 1e9;
    fig.insert("run_s".into(), run_s);
    fig.insert("jobs_done".into(), n as f64);
    let lower = p.lower_bound_s();
    fig.insert("lower_bound_s".into(), lower);
    if r.complete && lower > 0.0 && run_s > 0.0 {
        fig.insert("efficiency".into(), lower / run_s);
        hold_figures(&jobs, p.limit, run_s, fig);
    }
    if run_s > 0.0 && n > 0 {
        fig.insert("jobs_per_s".into(), n as f64 / run_s);
    }
    let waits: Vec<f64> = jobs.iter().map(|j| j.wait_ms).collect();
    if let Some(l) = metrics::latency(&waits) {
        fig.insert("wait_p50_ms".into(), l.p50_ms);
        fig.insert("wait_p99_ms".into(), l.p99_ms);
        fig.insert("wait_max_ms".into(), l.max_ms);
        fig.insert("wait_mean_ms".into(), l.mean_ms);
    }
    let intervals: Vec<(u64, u64)> = jobs.iter().map(|j| (j.acq_ns, j.rel_ns)).collect();
    fig.insert(
        "max_holders".into(),
        metrics::max_overlap(&intervals) as f64,
    );
    fig.insert(
        "acquire_errors".into(),
        jobs.iter().map(|j| j.errors).sum::<u64>() as f64,
    );
    fig.insert("release_errors".into(), release_errors);
    fig.insert("max_start_late_ms".into(), late);
    if n > 0 {
        let nf = n as f64;
        fig.insert(
            "redis_cmds_per_job".into(),
            after.work_commands() as f64 / nf,
        );
        fig.insert(
            "round_trips_per_job".into(),
            design.sent_commands(&after.commandstats) as f64 / nf,
        );
        fig.insert(
            "script_calls_per_job".into(),
            after.script_calls() as f64 / nf,
        );
        fig.insert(
            "redis_cpu_ms_per_job".into(),
            (after.cpu_s - before.cpu_s) * 1000.0 / nf,
        );
        fig.insert("client_cpu_ms_per_job".into(), client_cpu_s * 1000.0 / nf);
        fig.insert(
            "net_bytes_per_job".into(),
            after.net_bytes.saturating_sub(before.net_bytes) as f64 / nf,
        );
    }
    if kind == ScenarioKind::Handoff || p.limit == 1 {
        super::handoff::figures(&jobs, fig);
    }
    if kind == ScenarioKind::Base {
        r.jobs = jobs;
    }
    Ok(r)
}

/// The holds as the holders measured them (`rel_ns - acq_ns` of every job): their mean and
/// p99, in ms, and *slot use*, the share of the run during which the permits were actually
/// held (sum of the holds / limit / run). The nominal efficiency charges the design with any
/// overshoot of the hold itself; slot use does not.
fn hold_figures(jobs: &[JobRecord], limit: u32, run_s: f64, fig: &mut BTreeMap<String, f64>) {
    let holds_ms: Vec<f64> = jobs
        .iter()
        .map(|j| j.rel_ns.saturating_sub(j.acq_ns) as f64 / 1e6)
        .collect();
    let held_s = holds_ms.iter().sum::<f64>() / 1e3;
    if limit > 0 {
        fig.insert("slot_use".into(), held_s / f64::from(limit) / run_s);
    }
    if let Some(l) = metrics::latency(&holds_ms) {
        fig.insert("hold_mean_ms".into(), l.mean_ms);
        fig.insert("hold_p99_ms".into(), l.p99_ms);
    }
}

/// The progress line of one run.
pub(super) fn one_line(r: &RepResult) -> String {
    let f = |k: &str| r.figures.get(k).copied().unwrap_or(f64::NAN);
    format!(
        "run {:.2}s jobs {}/{} p50 {:.0}ms p99 {:.0}ms max {:.0}ms holders {} cmds/job {:.1} errs {}",
        f("run_s"),
        r.jobs_done,
        r.jobs_expected,
        f("wait_p50_ms"),
        f("wait_p99_ms"),
        f("wait_max_ms"),
        f("max_holders"),
        f("redis_cmds_per_job"),
        f("acquire_errors")
    )
}

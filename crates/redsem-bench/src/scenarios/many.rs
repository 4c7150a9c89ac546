//! `many`: one process holding and waiting on many semaphores. One worker process opens 1,000
//! semaphores (limit 1, lease 10 s, one client; `--semaphores`) and runs two tasks on each:
//! one holds its permit for the whole run, the other waits behind it. Once every semaphore has
//! its holder and its waiter (asked with `inspect` before the window) and one fallback
//! interval has passed, Redis is watched as in [`idle`](super::idle): script calls
//! per second (during the window they are all renewals and checks), the same per semaphore,
//! and Redis' CPU as % of one core. The count of semaphores is multiplied by `--jobs-scale`.
//!
//! Only the `redsem` design, as `idle`.

use std::time::Duration;

use tokio::time::Instant;

use super::idle::{finish, stop, wait_queued, watch};
use super::{RepResult, RunArgs, ScenarioParams};
use crate::designs::DesignKind;
use crate::harness::{Harness, WorkerSpec};

/// The workload: `n(1000)` semaphores, a holder and a waiter on each.
pub(super) fn params(n: impl Fn(f64, u64) -> u64, a: &RunArgs) -> ScenarioParams {
    let k = n(1000.0, 2);
    ScenarioParams {
        procs: 1,
        workers: 2 * k as u32,
        jobs_per_proc: 2 * k,
        limit: 1,
        hold_ms: 3_600_000.0,
        lease_ms: 10_000,
        run_timeout_s: a.idle_queue_timeout_s,
        window_s: Some(a.idle_window_s),
        semaphores: Some(k as u32),
        ..ScenarioParams::default()
    }
}

/// One line for reports.
pub(super) fn describe(p: &ScenarioParams) -> String {
    format!(
        "1 process, {} semaphores (limit 1, lease {} s) through one client, on each one task \
         holding and one waiting; Redis watched for {} s once all are in place",
        p.semaphores.unwrap_or(1),
        p.lease_ms / 1000,
        p.window_s.unwrap_or(0.0)
    )
}

/// One repetition.
pub async fn run_once(
    h: &Harness,
    design: DesignKind,
    p: &ScenarioParams,
    rep: u32,
) -> anyhow::Result<RepResult> {
    h.reset().await?;
    let k = p.semaphores.unwrap_or(1);
    let mut r = RepResult {
        rep,
        jobs_expected: u64::from(k),
        ..Default::default()
    };
    let spec = WorkerSpec {
        design,
        name: "many".into(),
        limit: p.limit,
        workers: p.workers,
        jobs: p.jobs_per_proc,
        hold_ms: p.hold_ms,
        lease_ms: p.lease_ms,
        start_at_ms: 0,
        announce: true,
        semaphores: k,
        synced_replicas: 0,
    };
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(p.run_timeout_s);
    let mut procs = vec![h.spawn(&spec, 0)?];
    let held = procs[0].wait_acquired(k as usize, deadline).await.is_some();
    let names: Vec<String> = if k > 1 {
        (0..k).map(|i| format!("many-{i}")).collect()
    } else {
        vec!["many".into()]
    };
    let queued = if held {
        wait_queued(h, &names, 1, u64::from(k), &mut procs, deadline).await
    } else {
        super::idle::Queued {
            count: 0,
            error: None,
            ended: false,
        }
    };
    let ready = held && queued.count == u64::from(k);
    let fig = &mut r.figures;
    fig.insert("semaphores".into(), f64::from(k));
    fig.insert("queued".into(), queued.count as f64);
    fig.insert("queue_s".into(), started.elapsed().as_secs_f64());
    if ready {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let w = watch(h, &procs, p.window_s.unwrap_or(10.0)).await?;
        w.record(fig);
        if let Some(&calls) = fig.get("script_calls_per_s") {
            fig.insert("script_calls_per_s_per_sem".into(), calls / f64::from(k));
        }
    } else {
        r.timed_out = true;
        let why = if held {
            queued.why(u64::from(k), started)
        } else {
            format!(
                "not all {k} holders acquired within {:.1} s",
                p.run_timeout_s
            )
        };
        r.notes.insert("error".into(), why);
    }
    let outs = stop(procs).await;
    r.complete = finish(&mut r, &outs, k as usize, ready);
    Ok(r)
}

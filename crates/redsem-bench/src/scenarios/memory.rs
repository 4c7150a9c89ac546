//! `memory`: 1 process with 10,000 tasks waiting behind a slot another process holds (limit
//! 1): peak RSS (VmHWM) - RSS before, per waiting task; Redis connections the process holds
//! (CLIENT LIST, matched by the process's socket ports); Redis `used_memory` growth per
//! waiter. Run for `redsem` and `fifo-notify` only (the polling designs would only measure a
//! saturated Redis: 10,000 waiters x 50 polls/s).

use std::time::Duration;

use tokio::time::Instant;

use super::{
    RepResult, RunArgs, ScenarioParams, holder_spec, now_ms, spawn_holder, worker_problems,
};
use crate::designs::DesignKind;
use crate::harness::{Harness, WorkerSpec};
use crate::metrics;
use crate::worker::now_ns;

/// The workload, the waiter count multiplied by `n`'s scale.
pub(super) fn params(n: impl Fn(f64, u64) -> u64) -> ScenarioParams {
    let w = n(10_000.0, 10);
    ScenarioParams {
        procs: 1,
        workers: w as u32,
        jobs_per_proc: w,
        limit: 1,
        hold_ms: 0.0,
        lease_ms: 60_000,
        run_timeout_s: 30.0,
        ..ScenarioParams::default()
    }
}

/// One line for reports.
pub(super) fn describe(p: &ScenarioParams) -> String {
    format!(
        "1 process with {} tasks waiting behind a slot held by another process (limit 1, lease {} s)",
        p.workers,
        p.lease_ms / 1000
    )
}

/// The progress line of one repetition.
pub(super) fn one_line(r: &RepResult) -> String {
    let f = |k: &str| r.figures.get(k).copied().unwrap_or(f64::NAN);
    format!(
        "{} waiters: {:.0} B/waiter RSS, {} Redis connections, {:.0} B/waiter in Redis",
        f("waiters"),
        f("rss_bytes_per_waiter"),
        f("redis_connections"),
        f("redis_bytes_per_waiter")
    )
}

/// One repetition of the memory scenario.
pub async fn run_once(
    h: &Harness,
    a: &RunArgs,
    design: DesignKind,
    p: &ScenarioParams,
    rep: u32,
) -> anyhow::Result<RepResult> {
    h.reset().await?;
    let mut r = RepResult {
        rep,
        ..Default::default()
    };
    let holder_spec = holder_spec(design, "memory", p.lease_ms);
    let Some(holder) = spawn_holder(h, &holder_spec, &mut r).await? else {
        return Ok(r);
    };
    let mem_before = h.snapshot().await?.used_memory;
    let start_at_ms = now_ms() + a.start_margin_ms.max(300);
    let waiter_spec = WorkerSpec {
        workers: p.workers,
        jobs: p.jobs_per_proc,
        hold_ms: 0.0,
        start_at_ms,
        announce: false,
        ..holder_spec
    };
    let waiter = h.spawn(&waiter_spec, 1)?;
    let pid = waiter.pid;
    let at = |ms: u64| {
        let target_ns = ms * 1_000_000;
        Instant::now() + Duration::from_nanos(target_ns.saturating_sub(now_ns()))
    };
    tokio::time::sleep_until(at(start_at_ms - 100)).await;
    let before = metrics::proc_rss_kib(pid);
    tokio::time::sleep_until(at(start_at_ms + a.memory_settle_ms)).await;
    // then wait until RSS stops growing (at most 3 s more)
    let mut last = metrics::proc_rss_kib(pid);
    let stop = Instant::now() + Duration::from_secs(3);
    while Instant::now() < stop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = metrics::proc_rss_kib(pid);
        if now.map(|x| x.0) == last.map(|x| x.0) {
            break;
        }
        last = now;
    }
    let peak = metrics::proc_rss_kib(pid);
    let ports = metrics::process_tcp_ports(pid);
    let list = h.client_list().await?;
    let conns = metrics::count_clients_from(&list, &ports);
    let mem_after = h.snapshot().await?.used_memory;
    waiter.kill_group();
    holder.kill_group();
    let wout = waiter.finish().await;
    let hout = holder.finish().await;
    worker_problems(&[wout, hout], &mut r.notes);
    let n = f64::from(p.workers);
    let fig = &mut r.figures;
    fig.insert("waiters".into(), n);
    if let (Some((rss0, _)), Some((rss1, hwm))) = (before, peak) {
        fig.insert("rss_before_kib".into(), rss0 as f64);
        fig.insert("rss_after_kib".into(), rss1 as f64);
        fig.insert("rss_peak_kib".into(), hwm as f64);
        fig.insert(
            "rss_bytes_per_waiter".into(),
            hwm.saturating_sub(rss0) as f64 * 1024.0 / n,
        );
        r.complete = true;
    } else {
        r.notes.insert(
            "error".into(),
            "waiter process gone before it was measured".into(),
        );
    }
    fig.insert("redis_connections".into(), conns as f64);
    fig.insert(
        "redis_bytes_per_waiter".into(),
        mem_after.saturating_sub(mem_before) as f64 / n,
    );
    Ok(r)
}

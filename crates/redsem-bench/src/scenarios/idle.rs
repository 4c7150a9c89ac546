//! `idle`: what waiters cost Redis while nothing moves. One holder process holds the only
//! slot (limit 1, lease 10 s, the library's default) for the whole run; N waiting tasks, spread
//! over 4 worker processes, queue behind it. Once Redis' queue holds all N (asked with
//! `inspect`, one script call, before the window) and one fallback interval (1 s) has passed,
//! Redis is watched for `--idle-window-s` (10 s): its CPU (`used_cpu_user + used_cpu_sys`
//! delta) as % of one core, the script calls it ran per second (`INFO commandstats`: EVALSHA,
//! EVAL, ...; during the window nothing is acquired or released, so they are the heartbeats'
//! renewals and checks), and the CPU of the worker processes (`/proc/<pid>/stat`). Rows for 1k,
//! 10k and 100k waiters. Queueing is bounded (`--idle-queue-timeout-s`): when not every waiter
//! is queued by then, the row says how many were, and Redis is not watched.
//!
//! Only the `redsem` design: every waiter of the reference's designs polls Redis itself, so
//! idle waiters would measure a saturated Redis.
//!
//! Its window (`watch`) is shared with the `many` scenario.

use std::time::Duration;

use tokio::time::Instant;

use super::{RepResult, RunArgs, ScenarioParams, holder_spec, spawn_holder, worker_problems};
use crate::designs::DesignKind;
use crate::harness::{Harness, WorkerOutput, WorkerProc, WorkerSpec};
use crate::metrics::{self, RedisSnapshot};

/// Waiter processes.
const PROCS: u32 = 4;
/// Waiters of the rows, before `--jobs-scale`.
const WAITERS: [f64; 3] = [1_000.0, 10_000.0, 100_000.0];
/// Lease of every entry: the library's default.
const LEASE_MS: u64 = 10_000;
/// The library's default fallback interval: once everyone is queued, the window starts after
/// one, so that every process's heartbeat has run in steady state.
const SETTLE: Duration = Duration::from_secs(1);
/// The holder: one task, one job held for an hour.
const HOLD_MS: f64 = 3_600_000.0;

/// One workload per row (1k, 10k, 100k waiters, multiplied by `scale`, at least one task
/// per process).
pub(super) fn variants(scale: f64, a: &RunArgs) -> Vec<ScenarioParams> {
    WAITERS
        .iter()
        .map(|&n| {
            let w = ((n * scale / f64::from(PROCS)).round() as u64).max(1);
            ScenarioParams {
                procs: PROCS,
                workers: w as u32,
                jobs_per_proc: w,
                limit: 1,
                hold_ms: HOLD_MS,
                lease_ms: LEASE_MS,
                run_timeout_s: a.idle_queue_timeout_s,
                window_s: Some(a.idle_window_s),
                ..ScenarioParams::default()
            }
        })
        .collect()
}

/// One line for reports (the table heading: rows differ in the number of waiters).
pub(super) fn describe(p: &ScenarioParams) -> String {
    format!(
        "N waiting tasks in {} processes behind one holder process (limit 1, lease {} s); Redis \
         watched for {} s once all are queued (queueing given up after {} s)",
        p.procs,
        p.lease_ms / 1000,
        p.window_s.unwrap_or(0.0),
        p.run_timeout_s
    )
}

/// The progress line of one repetition (also of `many`).
pub(super) fn one_line(r: &RepResult) -> String {
    let f = |k: &str| r.figures.get(k).copied().unwrap_or(f64::NAN);
    let mut s = format!(
        "{} of {} queued in {:.1} s",
        f("queued"),
        r.jobs_expected,
        f("queue_s")
    );
    if r.figures.contains_key("redis_cpu_pct") {
        s.push_str(&format!(
            ": Redis {:.2} % of a core, {:.1} script calls/s, clients {:.2} % of a core",
            f("redis_cpu_pct"),
            f("script_calls_per_s"),
            f("client_cpu_pct")
        ));
    }
    if let Some(e) = r.notes.get("error") {
        s.push_str(&format!(" ({e})"));
    }
    s
}

/// One repetition: the holder, then the waiters, then the window.
pub async fn run_once(
    h: &Harness,
    design: DesignKind,
    p: &ScenarioParams,
    rep: u32,
) -> anyhow::Result<RepResult> {
    h.reset().await?;
    let n = u64::from(p.procs) * p.jobs_per_proc;
    let mut r = RepResult {
        rep,
        jobs_expected: n,
        ..Default::default()
    };
    let holder_spec = holder_spec(design, "idle", p.lease_ms);
    let Some(holder) = spawn_holder(h, &holder_spec, &mut r).await? else {
        return Ok(r);
    };
    let mem_before = h.snapshot().await?.used_memory;
    let waiter_spec = WorkerSpec {
        workers: p.workers,
        jobs: p.jobs_per_proc,
        hold_ms: 0.0,
        announce: false,
        ..holder_spec
    };
    let started = Instant::now();
    let mut procs = vec![holder];
    for i in 0..p.procs as usize {
        procs.push(h.spawn(&waiter_spec, i + 1)?);
    }
    let deadline = started + Duration::from_secs_f64(p.run_timeout_s);
    let queued = wait_queued(h, &["idle".to_string()], 1, n, &mut procs, deadline).await;
    r.figures.insert("waiters".into(), n as f64);
    r.figures.insert("queued".into(), queued.count as f64);
    r.figures
        .insert("queue_s".into(), started.elapsed().as_secs_f64());
    if queued.count == n {
        let mem_after = h.snapshot().await?.used_memory;
        r.figures.insert(
            "redis_bytes_per_waiter".into(),
            mem_after.saturating_sub(mem_before) as f64 / n as f64,
        );
        tokio::time::sleep(SETTLE).await;
        let w = watch(h, &procs, p.window_s.unwrap_or(10.0)).await?;
        w.record(&mut r.figures);
    } else {
        r.timed_out = true;
        r.notes.insert("error".into(), queued.why(n, started));
    }
    let outs = stop(procs).await;
    r.complete = finish(&mut r, &outs, 1, queued.count == n);
    Ok(r)
}

/// How many waiters Redis' queues held at the last look.
pub(super) struct Queued {
    /// Waiters in the queues (the sum over the semaphores).
    pub count: u64,
    /// The last `inspect` error, if the last look failed.
    pub error: Option<String>,
    /// A worker process ended before everyone was queued.
    pub ended: bool,
}

impl Queued {
    /// Why not everyone was queued.
    pub fn why(&self, n: u64, started: Instant) -> String {
        let mut s = format!(
            "only {} of {n} waiters queued after {:.1} s",
            self.count,
            started.elapsed().as_secs_f64()
        );
        if self.ended {
            s.push_str("; a worker process ended");
        }
        if let Some(e) = &self.error {
            s.push_str(&format!("; last inspect failed: {e}"));
        }
        s
    }
}

/// Waits until the queues of `names` hold `n` waiters and each has `holders` holders (asked
/// with the library's `inspect`, one script call per semaphore, spaced so that the asking
/// costs Redis at most about a third of its time), a worker process ends, or `deadline`.
pub(super) async fn wait_queued(
    h: &Harness,
    names: &[String],
    holders: usize,
    n: u64,
    procs: &mut [WorkerProc],
    deadline: Instant,
) -> Queued {
    let mut q = Queued {
        count: 0,
        error: None,
        ended: false,
    };
    let client =
        match tokio::time::timeout_at(deadline, redsem::Client::connect(&h.redis_url)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                q.error = Some(e.to_string());
                return q;
            }
            Err(_) => return q,
        };
    loop {
        let asked = Instant::now();
        let mut count = 0u64;
        let mut all_held = true;
        q.error = None;
        for name in names {
            match tokio::time::timeout_at(deadline, client.inspect(name)).await {
                Ok(Ok(st)) => {
                    count += st.waiter_count as u64;
                    all_held &= st.holder_count == holders;
                }
                Ok(Err(e)) => {
                    q.error = Some(e.to_string());
                    all_held = false;
                }
                Err(_) => return q,
            }
        }
        q.count = count;
        if count >= n && all_held {
            return q;
        }
        for p in procs.iter_mut() {
            if p.wait_until(Instant::now()).await {
                q.ended = true;
            }
        }
        if q.ended || Instant::now() >= deadline {
            return q;
        }
        let pause = (asked.elapsed() * 2).max(Duration::from_millis(500));
        tokio::time::sleep_until((Instant::now() + pause).min(deadline)).await;
    }
}

/// What Redis and the worker processes did during the window.
pub(super) struct Watch {
    /// Length of the window, s.
    pub window_s: f64,
    /// `INFO` at its start and end.
    pub before: RedisSnapshot,
    /// See `before`.
    pub after: RedisSnapshot,
    /// CPU seconds of the worker processes in the window (None if one was gone).
    pub client_cpu_s: Option<f64>,
}

/// Watches Redis and `procs` for `window_s` seconds; nothing else talks to Redis meanwhile
/// (besides the two `INFO`s, which are not counted as work).
pub(super) async fn watch(
    h: &Harness,
    procs: &[WorkerProc],
    window_s: f64,
) -> anyhow::Result<Watch> {
    let cpu = || -> Option<f64> { procs.iter().map(|p| metrics::proc_cpu_s(p.pid)).sum() };
    let before = h.snapshot().await?;
    let cpu0 = cpu();
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(window_s)).await;
    let after = h.snapshot().await?;
    let cpu1 = cpu();
    Ok(Watch {
        window_s: t0.elapsed().as_secs_f64(),
        before,
        after,
        client_cpu_s: cpu0.zip(cpu1).map(|(a, b)| b - a),
    })
}

impl Watch {
    /// `redis_cpu_pct`, `script_calls_per_s`, `redis_cmds_per_s`,
    /// `client_cpu_pct`, `window_s`.
    pub fn record(&self, fig: &mut std::collections::BTreeMap<String, f64>) {
        let t = self.window_s;
        let delta = |f: fn(&RedisSnapshot) -> u64| f(&self.after).saturating_sub(f(&self.before));
        fig.insert("window_s".into(), t);
        fig.insert(
            "redis_cpu_pct".into(),
            (self.after.cpu_s - self.before.cpu_s) / t * 100.0,
        );
        fig.insert(
            "script_calls_per_s".into(),
            delta(RedisSnapshot::script_calls) as f64 / t,
        );
        fig.insert(
            "redis_cmds_per_s".into(),
            delta(RedisSnapshot::work_commands) as f64 / t,
        );
        if let Some(c) = self.client_cpu_s {
            fig.insert("client_cpu_pct".into(), c / t * 100.0);
        }
    }
}

/// Kills every worker process and collects what they printed.
pub(super) async fn stop(procs: Vec<WorkerProc>) -> Vec<WorkerOutput> {
    for p in &procs {
        p.kill_group();
    }
    let mut outs = Vec::new();
    for p in procs {
        outs.push(p.finish().await);
    }
    outs
}

/// Checks the run after the fact: nobody was granted beyond the `held` announced holds (a
/// grant would mean a holder lost its permit: the window did not measure idling), no worker
/// failed. Records `grants_after_queued` and `acquire_errors_seen` (counted in the stderr
/// tails, so a lower bound); returns whether the repetition is complete.
pub(super) fn finish(r: &mut RepResult, outs: &[WorkerOutput], held: usize, queued: bool) -> bool {
    worker_problems(outs, &mut r.notes);
    let acquired: usize = outs.iter().map(|o| o.acquired.len()).sum();
    let jobs: usize = outs.iter().map(|o| o.jobs.len()).sum();
    // holders announce and hold for an hour; waiters that got a slot either announced it
    // (`many`) or, holding 0 ms, printed a job line (`idle`)
    let grants = acquired.saturating_sub(held) + jobs;
    r.figures
        .insert("grants_after_queued".into(), grants as f64);
    let errors: usize = outs
        .iter()
        .map(|o| o.stderr_tail.matches("\"acquire_error\"").count())
        .sum();
    r.figures
        .insert("acquire_errors_seen".into(), errors as f64);
    r.jobs_done = jobs as u64;
    if grants > 0 {
        r.notes.insert(
            "error".into(),
            format!("{grants} grant(s) after everyone was queued: a holder lost its permit"),
        );
    }
    queued && grants == 0 && !r.notes.contains_key("worker_error")
}

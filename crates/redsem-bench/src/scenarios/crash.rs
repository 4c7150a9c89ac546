//! `crash`: limit 2, lease 2 s: 2 holder processes (1 task, 1 job, hold 1 h, `--announce`),
//! SIGKILLed (process group) 100 ms after both announced; then one fresh acquirer process;
//! recovery = its `acquired` time - kill time (gives up after `--give-up-s`). The procedure of
//! `driver.py crash`; unaffected by `--jobs-scale`.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::{RepResult, RunArgs, ScenarioParams, worker_problems};
use crate::designs::DesignKind;
use crate::harness::{Harness, WorkerSpec};
use crate::worker::now_ns;

/// The workload (`--crash-limit` holders, `--crash-lease-ms`, `--give-up-s`).
pub(super) fn params(a: &RunArgs) -> ScenarioParams {
    ScenarioParams {
        procs: a.crash_limit,
        workers: 1,
        jobs_per_proc: 1,
        limit: a.crash_limit,
        hold_ms: 3_600_000.0,
        lease_ms: a.crash_lease_ms,
        run_timeout_s: a.give_up_s,
        ..ScenarioParams::default()
    }
}

/// One line for reports.
pub(super) fn describe(p: &ScenarioParams) -> String {
    format!(
        "limit {}, lease {} ms: {} holder processes SIGKILLed while holding, then one fresh acquirer (give up after {} s)",
        p.limit, p.lease_ms, p.procs, p.run_timeout_s
    )
}

/// The progress line of one repetition.
pub(super) fn one_line(r: &RepResult) -> String {
    let f = |k: &str| r.figures.get(k).copied().unwrap_or(f64::NAN);
    if f("recovered") == 1.0 {
        format!(
            "recovered in {:.2} s after kill (lease left at kill {:.2} s)",
            f("recovery_s"),
            f("lease_left_at_kill_s")
        )
    } else {
        format!(
            "never (gave up); keys {}",
            r.notes
                .get("redis_state_at_end")
                .cloned()
                .unwrap_or_default()
        )
    }
}

/// One repetition of the crash scenario (the procedure of `driver.py crash`).
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
        jobs_expected: 1,
        ..Default::default()
    };
    let holder = WorkerSpec {
        design,
        name: "crash".into(),
        limit: p.limit,
        workers: 1,
        jobs: 1,
        hold_ms: 3_600_000.0,
        lease_ms: p.lease_ms,
        start_at_ms: 0,
        announce: true,
        semaphores: 1,
        synced_replicas: 0,
    };
    let mut holders = Vec::new();
    for i in 0..p.limit as usize {
        holders.push(h.spawn(&holder, i)?);
    }
    let mut hold_acq = Vec::new();
    for hp in holders.iter_mut() {
        match hp
            .wait_acquired(1, Instant::now() + Duration::from_secs(15))
            .await
        {
            Some(ev) => hold_acq.push(ev[0]),
            None => {
                for x in &holders {
                    x.kill_group();
                }
                let mut outs = Vec::new();
                for x in holders {
                    outs.push(x.finish().await);
                }
                worker_problems(&outs, &mut r.notes);
                r.notes
                    .insert("error".into(), "holders did not acquire".into());
                r.figures.insert("recovered".into(), 0.0);
                return Ok(r);
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let kill_ns = now_ns();
    for hp in &holders {
        hp.kill_group();
    }
    for hp in holders {
        hp.finish().await;
    }
    let state_after_kill = h.key_state().await?;
    let fresh_spec = WorkerSpec {
        hold_ms: 20.0,
        ..holder
    };
    let spawn_ns = now_ns();
    let mut fresh = h.spawn(&fresh_spec, p.limit as usize)?;
    let give_up = Duration::from_secs_f64(a.give_up_s);
    let deadline =
        Instant::now() + give_up.saturating_sub(Duration::from_nanos(now_ns() - kill_ns));
    let ev = fresh.wait_acquired(1, deadline).await;
    let state_end;
    let fig = &mut r.figures;
    match ev {
        Some(ev) => {
            state_end = h.key_state().await?;
            if !fresh
                .wait_until(Instant::now() + Duration::from_secs(10))
                .await
            {
                fresh.kill_group();
            }
            let out = fresh.finish().await;
            fig.insert("recovered".into(), 1.0);
            fig.insert(
                "recovery_s".into(),
                ev[0].saturating_sub(kill_ns) as f64 / 1e9,
            );
            if let Some(j) = out.jobs.first() {
                fig.insert("fresh_wait_ms".into(), j.wait_ms);
            }
            r.jobs_done = out.jobs.len() as u64;
            r.complete = true;
        }
        None => {
            fresh.kill_group();
            let out = fresh.finish().await;
            worker_problems(std::slice::from_ref(&out), &mut r.notes);
            state_end = h.key_state().await?;
            fig.insert("recovered".into(), 0.0);
        }
    }
    let oldest = hold_acq.iter().copied().min().unwrap_or(kill_ns);
    let newest = hold_acq.iter().copied().max().unwrap_or(kill_ns);
    fig.insert(
        "fresh_start_s".into(),
        spawn_ns.saturating_sub(kill_ns) as f64 / 1e9,
    );
    fig.insert(
        "held_before_kill_s".into(),
        kill_ns.saturating_sub(newest) as f64 / 1e9,
    );
    fig.insert(
        "lease_left_at_kill_s".into(),
        p.lease_ms as f64 / 1000.0 - kill_ns.saturating_sub(oldest) as f64 / 1e9,
    );
    fig.insert("give_up_s".into(), a.give_up_s);
    r.notes.insert(
        "redis_state_after_kill".into(),
        fmt_state(&state_after_kill),
    );
    r.notes
        .insert("redis_state_at_end".into(), fmt_state(&state_end));
    Ok(r)
}

fn fmt_state(s: &BTreeMap<String, String>) -> String {
    s.iter()
        .map(|(k, v)| format!("`{k}`={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

//! The terminal tables (markdown, one per scenario, rows = designs) and the JSON file.

use std::fmt::Write as _;
use std::path::Path;

use crate::scenarios::{Report, ScenarioKind, ScenarioResult};

/// `median (min-max)` with `prec` decimals; a single number when the range collapses at that
/// precision; `-` when absent.
pub fn cell(r: &ScenarioResult, key: &str, prec: usize) -> String {
    cell_scaled(r, key, prec, 1.0)
}

/// [`cell`] with every value multiplied by `factor` (unit changes).
pub fn cell_scaled(r: &ScenarioResult, key: &str, prec: usize, factor: f64) -> String {
    let Some(a) = r.agg.get(key) else {
        return "-".into();
    };
    let f = |x: f64| format!("{:.*}", prec, x * factor);
    let (med, lo, hi) = (f(a.median), f(a.min), f(a.max));
    if lo == hi {
        med
    } else {
        format!("{med} ({lo}-{hi})")
    }
}

fn complete_reps(r: &ScenarioResult) -> String {
    let done = r.reps.iter().filter(|x| x.complete).count();
    format!("{done}/{}", r.reps.len())
}

fn run_cell(r: &ScenarioResult) -> String {
    if r.all_complete || r.reps.is_empty() {
        return cell(r, "run_s", 2);
    }
    if let Some(t) = r.reps.iter().find(|x| x.timed_out) {
        return format!(
            "timeout >{} s ({}/{} jobs done)",
            r.params.run_timeout_s, t.jobs_done, t.jobs_expected
        );
    }
    format!("{} (incomplete)", cell(r, "run_s", 2))
}

fn crash_cell(all: &[ScenarioResult], r: &ScenarioResult) -> String {
    let Some(c) = all
        .iter()
        .find(|x| x.scenario == ScenarioKind::Crash && x.design == r.design && x.skipped.is_none())
    else {
        return "-".into();
    };
    if c.reps
        .iter()
        .any(|x| x.figures.get("recovered") == Some(&0.0))
    {
        format!("never (>{} s)", c.params.run_timeout_s)
    } else {
        cell(c, "recovery_s", 2)
    }
}

/// The headers of the measured holds' columns, with the hold asked for.
fn hold_columns(r: &ScenarioResult) -> (String, String) {
    let asked = r.params.hold_ms;
    (
        format!("mean hold ms (asked {asked})"),
        format!("p99 hold ms (asked {asked})"),
    )
}

fn row(out: &mut String, cells: &[String]) {
    out.push_str("| ");
    out.push_str(&cells.join(" | "));
    out.push_str(" |\n");
}

fn header(out: &mut String, cols: &[&str]) {
    row(out, &cols.iter().map(|c| c.to_string()).collect::<Vec<_>>());
    row(
        out,
        &cols.iter().map(|_| "---".to_string()).collect::<Vec<_>>(),
    );
}

fn skipped_row(out: &mut String, r: &ScenarioResult, ncols: usize) {
    let mut cells = vec![
        format!("`{}`", r.design),
        r.skipped.clone().unwrap_or_default(),
    ];
    cells.resize(ncols, String::new());
    row(out, &cells);
}

/// Renders every scenario's table.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let all = &report.results;
    let mut kinds: Vec<ScenarioKind> = all.iter().map(|r| r.scenario).collect();
    kinds.dedup();
    for kind in kinds {
        let rows: Vec<&ScenarioResult> = all.iter().filter(|r| r.scenario == kind).collect();
        let Some(first) = rows.first() else { continue };
        let _ = writeln!(
            out,
            "\n## Scenario `{}`: {}\n",
            kind.name(),
            first.params.describe(kind)
        );
        match kind {
            ScenarioKind::Base | ScenarioKind::Scale => base_table(&mut out, kind, &rows, all),
            ScenarioKind::Throughput => throughput_table(&mut out, &rows),
            ScenarioKind::Handoff => handoff_table(&mut out, &rows),
            ScenarioKind::Crash => crash_table(&mut out, &rows),
            ScenarioKind::Memory => memory_table(&mut out, &rows),
            ScenarioKind::Idle | ScenarioKind::Many => idle_table(&mut out, kind, &rows),
            ScenarioKind::Synced => synced_table(&mut out, &rows),
            ScenarioKind::Admin => {
                admin_table(&mut out, &rows);
                admin_memory_table(&mut out, &rows);
            }
        }
        problems(&mut out, &rows);
    }
    out.push_str(NOTES);
    out
}

/// The table of the `base` and `scale` scenarios (with crash recovery beside `base`).
fn base_table(
    out: &mut String,
    kind: ScenarioKind,
    rows: &[&ScenarioResult],
    all: &[ScenarioResult],
) {
    let Some(first) = rows.first() else { return };
    let (mean_hold, p99_hold) = hold_columns(first);
    let mut cols = vec![
        "design",
        "run s",
        "efficiency",
        "slot use",
        &mean_hold,
        &p99_hold,
        "wait p50 ms",
        "wait p99 ms",
        "wait max ms",
        "max holders",
        "round trips/job",
        "Redis cmds/job",
        "Redis CPU ms/job",
        "client CPU ms/job",
        "acquire errors",
    ];
    let with_crash =
        kind == ScenarioKind::Base && all.iter().any(|x| x.scenario == ScenarioKind::Crash);
    if with_crash {
        cols.push("crash recovery s");
    }
    cols.push("complete reps");
    header(out, &cols);
    for r in rows {
        if r.skipped.is_some() {
            skipped_row(out, r, cols.len());
            continue;
        }
        let mut c = vec![
            format!("`{}`", r.design),
            run_cell(r),
            cell(r, "efficiency", 2),
            cell(r, "slot_use", 2),
            cell(r, "hold_mean_ms", 2),
            cell(r, "hold_p99_ms", 2),
            cell(r, "wait_p50_ms", 0),
            cell(r, "wait_p99_ms", 0),
            cell(r, "wait_max_ms", 0),
            cell(r, "max_holders", 0),
            cell(r, "round_trips_per_job", 1),
            cell(r, "redis_cmds_per_job", 1),
            cell(r, "redis_cpu_ms_per_job", 3),
            cell(r, "client_cpu_ms_per_job", 2),
            cell(r, "acquire_errors", 0),
        ];
        if with_crash {
            c.push(crash_cell(all, r));
        }
        c.push(complete_reps(r));
        row(out, &c);
    }
}

/// The table of the `throughput` scenario.
fn throughput_table(out: &mut String, rows: &[&ScenarioResult]) {
    let cols = [
        "design",
        "cycles/s",
        "run s",
        "acquire p50 ms",
        "acquire p99 ms",
        "round trips/job",
        "Redis cmds/job",
        "Redis CPU µs/job",
        "client CPU µs/job",
        "acquire errors",
        "complete reps",
    ];
    header(out, &cols);
    for r in rows {
        if r.skipped.is_some() {
            skipped_row(out, r, cols.len());
            continue;
        }
        row(
            out,
            &[
                format!("`{}`", r.design),
                cell(r, "jobs_per_s", 0),
                run_cell(r),
                cell(r, "wait_p50_ms", 2),
                cell(r, "wait_p99_ms", 2),
                cell(r, "round_trips_per_job", 1),
                cell(r, "redis_cmds_per_job", 1),
                cell_scaled(r, "redis_cpu_ms_per_job", 1, 1000.0),
                cell_scaled(r, "client_cpu_ms_per_job", 1, 1000.0),
                cell(r, "acquire_errors", 0),
                complete_reps(r),
            ],
        );
    }
}

/// The table of the `handoff` scenario.
fn handoff_table(out: &mut String, rows: &[&ScenarioResult]) {
    let Some(first) = rows.first() else { return };
    let (mean_hold, p99_hold) = hold_columns(first);
    let cols = [
        "design",
        "handoff p50 ms",
        "handoff p99 ms",
        "handoff max ms",
        "run s",
        "efficiency",
        "slot use",
        &mean_hold,
        &p99_hold,
        "wait p99 ms",
        "max holders",
        "round trips/job",
        "Redis cmds/job",
        "complete reps",
    ];
    header(out, &cols);
    for r in rows {
        if r.skipped.is_some() {
            skipped_row(out, r, cols.len());
            continue;
        }
        row(
            out,
            &[
                format!("`{}`", r.design),
                cell(r, "handoff_p50_ms", 2),
                cell(r, "handoff_p99_ms", 2),
                cell(r, "handoff_max_ms", 2),
                run_cell(r),
                cell(r, "efficiency", 2),
                cell(r, "slot_use", 2),
                cell(r, "hold_mean_ms", 2),
                cell(r, "hold_p99_ms", 2),
                cell(r, "wait_p99_ms", 0),
                cell(r, "max_holders", 0),
                cell(r, "round_trips_per_job", 1),
                cell(r, "redis_cmds_per_job", 1),
                complete_reps(r),
            ],
        );
    }
}

/// The table of the `crash` scenario.
fn crash_table(out: &mut String, rows: &[&ScenarioResult]) {
    let cols = [
        "design",
        "recovered",
        "recovery s after kill",
        "fresh acquirer's acquire() ms",
        "lease left at kill s",
        "Redis keys right after the kill (last rep)",
    ];
    header(out, &cols);
    for r in rows {
        if r.skipped.is_some() {
            skipped_row(out, r, cols.len());
            continue;
        }
        let recovered = r
            .reps
            .iter()
            .filter(|x| x.figures.get("recovered") == Some(&1.0))
            .count();
        let rec = if recovered == 0 {
            format!("never (>{} s)", r.params.run_timeout_s)
        } else {
            cell(r, "recovery_s", 2)
        };
        row(
            out,
            &[
                format!("`{}`", r.design),
                format!("{recovered}/{}", r.reps.len()),
                rec,
                cell(r, "fresh_wait_ms", 0),
                cell(r, "lease_left_at_kill_s", 2),
                r.reps
                    .last()
                    .and_then(|x| x.notes.get("redis_state_after_kill").cloned())
                    .unwrap_or_default(),
            ],
        );
    }
}

/// The table of the `memory` scenario.
fn memory_table(out: &mut String, rows: &[&ScenarioResult]) {
    let cols = [
        "design",
        "waiting tasks",
        "RSS before MiB",
        "peak RSS MiB",
        "RSS bytes per waiting task",
        "Redis connections",
        "Redis bytes per waiter",
        "complete reps",
    ];
    header(out, &cols);
    for r in rows {
        if r.skipped.is_some() {
            skipped_row(out, r, cols.len());
            continue;
        }
        row(
            out,
            &[
                format!("`{}`", r.design),
                cell(r, "waiters", 0),
                cell_scaled(r, "rss_before_kib", 1, 1.0 / 1024.0),
                cell_scaled(r, "rss_peak_kib", 1, 1.0 / 1024.0),
                cell(r, "rss_bytes_per_waiter", 0),
                cell(r, "redis_connections", 0),
                cell(r, "redis_bytes_per_waiter", 0),
                complete_reps(r),
            ],
        );
    }
}

/// The errors the workers reported, if any.
fn problems(out: &mut String, rows: &[&ScenarioResult]) {
    let errs: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            r.reps.iter().filter_map(move |x| {
                x.notes
                    .get("worker_error")
                    .or(x.notes.get("error"))
                    .map(|e| format!("- `{}` rep {}: {e}", r.design, x.rep))
            })
        })
        .collect();
    if !errs.is_empty() {
        let _ = writeln!(out, "\nProblems:\n{}", errs.join("\n"));
    }
}

/// The `synced` table: one row per design and mode.
fn synced_table(out: &mut String, rows: &[&ScenarioResult]) {
    let cols = [
        "design",
        "mode",
        "cycles/s",
        "acquire p50 ms",
        "acquire p99 ms",
        "round trips/job",
        "Redis cmds/job",
        "Redis CPU µs/job",
        "acquire errors",
        "complete reps",
    ];
    table(out, &cols, rows, |r| {
        vec![
            format!("`{}`", r.design),
            crate::scenarios::synced::mode(&r.params),
            cell(r, "jobs_per_s", 0),
            cell(r, "wait_p50_ms", 3),
            cell(r, "wait_p99_ms", 3),
            cell(r, "round_trips_per_job", 1),
            cell(r, "redis_cmds_per_job", 1),
            cell_scaled(r, "redis_cpu_ms_per_job", 1, 1000.0),
            cell(r, "acquire_errors", 0),
            complete_reps(r),
        ]
    });
}

/// The `admin` table: one row per operation, number of waiters and limit.
fn admin_table(out: &mut String, rows: &[&ScenarioResult]) {
    use crate::scenarios::admin::{Op, SMALL_LIMIT};
    let cols = [
        "op",
        "waiters",
        "limit",
        "Redis µs/op",
        "vs 0 waiters, limit 10",
        "target",
        "round trips/op",
        "commands inside scripts/op",
        "client ms/op",
        "requests/op (last rep)",
        "complete reps",
    ];
    header(out, &cols);
    let measured: Vec<&ScenarioResult> = rows
        .iter()
        .copied()
        .filter(|r| r.skipped.is_none())
        .collect();
    for r in rows.iter().filter(|r| r.skipped.is_some()) {
        skipped_row(out, r, cols.len());
    }
    let base = measured
        .iter()
        .find(|r| r.params.waiters == Some(0) && r.params.limit == SMALL_LIMIT);
    for op in Op::ALL {
        let key = |k: &str| format!("{}_{k}", op.name());
        let us = key("redis_us");
        let base_us = base.and_then(|b| b.median(&us));
        for r in &measured {
            let ratio = r.median(&us).zip(base_us).map(|(x, b)| x / b);
            row(
                out,
                &[
                    format!("`{}`", op.name()),
                    r.params.waiters.unwrap_or(0).to_string(),
                    r.params.limit.to_string(),
                    cell(r, &us, 0),
                    ratio.map_or("-".into(), |x| format!("{x:.2}")),
                    admin_latency_target(op, r, base_us),
                    cell(r, &key("round_trips"), 2),
                    cell(r, &key("inner_cmds"), 0),
                    cell(r, &key("wall_ms"), 1),
                    r.reps
                        .last()
                        .and_then(|x| x.notes.get(&key("sent")).cloned())
                        .unwrap_or_default(),
                    complete_reps(r),
                ],
            );
        }
    }
}

/// The target cell of an `admin` row: set on the rows the target is about (`open` and `stats`
/// with [`TARGET_WAITERS`](crate::scenarios::admin::TARGET_WAITERS) waiters, limit 10).
fn admin_latency_target(
    op: crate::scenarios::admin::Op,
    r: &ScenarioResult,
    base_us: Option<f64>,
) -> String {
    use crate::scenarios::admin::{SMALL_LIMIT, TARGET_RATIO, TARGET_US, TARGET_WAITERS};
    let about = op.has_target()
        && r.params.waiters == Some(TARGET_WAITERS)
        && r.params.limit == SMALL_LIMIT;
    let us = r.median(&format!("{}_redis_us", op.name()));
    match (about, us, base_us) {
        (true, Some(us), Some(base)) => format!(
            "≤ {TARGET_RATIO}x and ≤ {} ms: {}",
            TARGET_US / 1000.0,
            met(crate::scenarios::admin::latency_target_met(us, base))
        ),
        _ => String::new(),
    }
}

fn met(yes: bool) -> &'static str {
    if yes { "met" } else { "not met" }
}

/// The `admin` scenario's memory table: the semaphore's keys, per row.
fn admin_memory_table(out: &mut String, rows: &[&ScenarioResult]) {
    use crate::scenarios::admin::{BIG_LIMIT, TARGET_BYTES, memory_target_met};
    let cols = [
        "waiters",
        "limit",
        "keys",
        "Redis bytes once queued",
        "Redis bytes after the operations",
        "target",
    ];
    let _ = writeln!(
        out,
        "
Memory of the semaphore (MEMORY USAGE SAMPLES 0 of each key, summed):
"
    );
    header(out, &cols);
    for r in rows.iter().filter(|r| r.skipped.is_none()) {
        let idle_big = r.params.waiters == Some(0) && r.params.limit == BIG_LIMIT;
        let most = r
            .median("memory_bytes")
            .zip(r.median("memory_after_ops_bytes"));
        let target = match most.filter(|_| idle_big) {
            Some((a, b)) => format!(
                "≤ {} KiB: {}",
                TARGET_BYTES / 1024.0,
                met(memory_target_met(a.max(b)))
            ),
            None => String::new(),
        };
        row(
            out,
            &[
                r.params.waiters.unwrap_or(0).to_string(),
                r.params.limit.to_string(),
                cell(r, "keys", 0),
                cell(r, "memory_bytes", 0),
                cell(r, "memory_after_ops_bytes", 0),
                target,
            ],
        );
    }
}

/// A table: the header, then one row per result (`cells`), or the reason it was skipped.
fn table(
    out: &mut String,
    cols: &[&str],
    rows: &[&ScenarioResult],
    cells: impl Fn(&ScenarioResult) -> Vec<String>,
) {
    header(out, cols);
    for r in rows {
        if r.skipped.is_some() {
            skipped_row(out, r, cols.len());
        } else {
            row(out, &cells(r));
        }
    }
}

/// The `idle` table (one row per design and number of waiters) and the `many` table.
fn idle_table(out: &mut String, kind: ScenarioKind, rows: &[&ScenarioResult]) {
    let many = kind == ScenarioKind::Many;
    let mut cols = vec!["design"];
    cols.extend(if many {
        ["semaphores", "waiters queued"]
    } else {
        ["waiters", "queued"]
    });
    cols.extend(["time to queue s", "Redis CPU % of a core", "script calls/s"]);
    cols.push(if many {
        "script calls/s per semaphore"
    } else {
        "Redis bytes per waiter"
    });
    cols.extend([
        "Redis cmds/s",
        "worker processes' CPU % of a core",
        "complete reps",
    ]);
    table(out, &cols, rows, |r| {
        let n = u64::from(r.params.procs) * r.params.jobs_per_proc;
        let mut c = vec![format!("`{}`", r.design)];
        if many {
            let k = r.params.semaphores.unwrap_or(1);
            c.push(k.to_string());
        } else {
            c.push(n.to_string());
        }
        c.push(cell(r, "queued", 0));
        c.extend([
            cell(r, "queue_s", 1),
            cell(r, "redis_cpu_pct", 2),
            cell(r, "script_calls_per_s", 1),
        ]);
        c.push(if many {
            cell(r, "script_calls_per_s_per_sem", 2)
        } else {
            cell(r, "redis_bytes_per_waiter", 0)
        });
        c.extend([
            cell(r, "redis_cmds_per_s", 0),
            cell(r, "client_cpu_pct", 2),
            complete_reps(r),
        ]);
        c
    });
}

/// How the columns are computed (printed under the tables).
pub const NOTES: &str = "
Cells are `median (min-max)` over the complete repetitions. *run s*: shared start to the last
release returned; *efficiency*: (processes x jobs x hold / limit) / run s; *slot use*: the same with the holds
the holders measured (sum of [acquired, release called] / limit / run s): the nominal
efficiency also charges any overshoot of the hold itself to the design; *mean / p99 hold*: those
measured holds (hdrhistogram), beside the hold asked for (a tokio sleep to 2 ms before the end,
then a thread sleep with 1 ns timer slack: see `src/hold.rs`); *wait*: time inside
acquire() per job, all processes pooled (hdrhistogram, 3 significant digits; max exact); *max
holders*: peak overlap of all [acquired, release called] intervals across processes; *round
trips/job*: commands the clients sent themselves, from INFO commandstats (script calls
EVAL/EVALSHA/SCRIPT LOAD plus each design's top-level commands; a MULTI/EXEC transaction counts
MULTI, every queued command and EXEC, although it travels in one write); *Redis cmds/job*: every
command Redis executed, including those inside scripts and transactions, excluding handshakes
and the harness's own; *Redis CPU*: redis-server used_cpu_user+sys delta; *client CPU*: user+sys
of all worker processes; *handoff*: from a holder's rel_ns to the next acq_ns (limit 1);
*recovery*: fresh acquirer's `acquired` event minus the SIGKILL time (includes its process
start); *lease left at kill*: lease minus the oldest holder's age at the kill; *RSS bytes per
waiting task*: (VmHWM once all tasks wait - VmRSS just before the start) / tasks, i.e. the task,
its future and the design's per-waiter state; *Redis connections*: CLIENT LIST entries whose
address is one of the waiting process's sockets. *idle*, *many*: figures over the window
once everyone is queued (nothing is acquired or released in it); *Redis CPU %*:
used_cpu_user+sys delta / window; *script calls/s*: EVALSHA, EVAL, ... per second of the window,
i.e. the heartbeats' renewals and checks; *worker processes' CPU*: utime+stime of the holder and
waiter processes (/proc/<pid>/stat, 10 ms resolution per process) / window; *time to queue*: spawn of the waiter processes to
the `inspect` that saw every waiter queued. *admin*: *Redis µs/op*: INFO commandstats `usec` of
the commands clients sent (script calls with what ran inside them, handshakes, pub/sub, INFO,
PING) over N operations in a row, minus an idle window as long, / N, on a private redis-server;
*vs 0 waiters, limit 10*: the ratio to that row's median; *round trips/op*: those commands'
calls; *commands inside scripts/op*: every other command's calls; *client ms/op*: wall time of
the N operations / N; `open` = open + close of a handle on a connected client, `stats` =
`inspect` (as `redsem stats`: 100 holders and waiters listed at most), `counts` =
`inspect_listing(name, 1)` (as `redsem list`: the counts and the head of the queue), `run` = one
`redsem run --limit L --timeout 50ms NAME -- true` process (with waiters it queues, gives up,
leaves the queue and reads the counts, `inspect_listing(name, 0)`, for its message).
";

/// Writes the report as pretty JSON.
pub fn write_json(report: &Report, path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(path, text)?;
    Ok(())
}

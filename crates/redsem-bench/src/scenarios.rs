//! The scenarios and the run loop: every selected design in every selected scenario, `--reps`
//! times, Redis flushed and its statistics reset before each run (as `driver.py`).
//!
//! | scenario | workload |
//! |---|---|
//! | `base` | the reference's: 3 processes x 10 tasks, limit 5, 600 jobs (200 per process) x 20 ms, lease 5 s |
//! | `crash` | limit 2, lease 2 s: 2 holder processes (1 task, 1 job, hold 1 h, `--announce`), SIGKILLed (process group) 100 ms after both announced; then one fresh acquirer process; recovery = its `acquired` time - kill time (gives up after 10 s) |
//! | `scale` | 3 x 300 tasks, one job each (900 jobs), limit 5, 20 ms, lease 5 s, 20 s run timeout |
//! | `throughput` | uncontended: 1 process, 64 tasks, limit 64, zero hold, 20,000 acquire/release cycles |
//! | `handoff` | limit 1, 3 x 2 tasks (5 always waiting), 150 jobs x 10 ms: release -> next holder, from the releaser's `rel_ns` to the next `acq_ns` |
//! | `memory` | 1 process with 10,000 tasks waiting behind a slot another process holds (limit 1): peak RSS (VmHWM) - RSS before, per waiting task; Redis connections the process holds (CLIENT LIST, matched by the process's socket ports); Redis `used_memory` growth per waiter. Run for `redsem` and `fifo-notify` (the polling designs would only measure a saturated Redis: 10,000 waiters x 50 polls/s) |
//!
//! `--jobs-scale F` multiplies job counts (and the `scale` task count, the `memory` waiter
//! count) for quick smoke runs; `crash` is unaffected.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::designs::{self, DesignKind};
use crate::harness::{Harness, WorkerOutput, WorkerSpec};
use crate::metrics::{self, Agg, JobRecord};
use crate::worker::now_ns;

/// Options of the `run` sub-command (the default).
#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// Comma list of scenarios: base,crash,scale,throughput,handoff,memory (default: all).
    #[arg(long, value_delimiter = ',')]
    pub scenarios: Vec<String>,
    /// Comma list of designs: counter,zset-poll,fifo-poll,fifo-notify,redsem (default: all).
    #[arg(long, value_delimiter = ',')]
    pub designs: Vec<String>,
    /// Repetitions per design and scenario (median and range are reported).
    #[arg(long, default_value_t = 3)]
    pub reps: u32,
    /// Multiply job counts by this factor (e.g. 0.05 for a quick smoke run).
    #[arg(long, default_value_t = 1.0)]
    pub jobs_scale: f64,
    /// Write all figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Directory for the SVG charts.
    #[arg(long, default_value = "target/redsem-bench")]
    pub svg_dir: PathBuf,
    /// Do not write SVG charts.
    #[arg(long)]
    pub no_svg: bool,
    /// Redis to use (it is FLUSHALLed before every run!); unset: a private redis-server on a
    /// free loopback port is started and stopped.
    #[arg(long, env = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// Time from spawning the worker processes to their shared start, ms.
    #[arg(long, default_value_t = 1000)]
    pub start_margin_ms: u64,
    /// Lease of the crash scenario, ms.
    #[arg(long, default_value_t = 2000)]
    pub crash_lease_ms: u64,
    /// Limit (= number of killed holders) of the crash scenario.
    #[arg(long, default_value_t = 2)]
    pub crash_limit: u32,
    /// Crash scenario: give up waiting for recovery after this many seconds.
    #[arg(long, default_value_t = 10.0)]
    pub give_up_s: f64,
    /// Memory scenario: how long the waiters settle before peak RSS is read, ms.
    #[arg(long, default_value_t = 2000)]
    pub memory_settle_ms: u64,
}

/// The scenarios, in run order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScenarioKind {
    /// The reference's workload.
    Base,
    /// SIGKILLed holders, time to recovery.
    Crash,
    /// 900 waiters.
    Scale,
    /// Uncontended cycles per second.
    Throughput,
    /// Release -> next holder latency.
    Handoff,
    /// Memory and connections per waiting task.
    Memory,
}

impl ScenarioKind {
    /// All, in run order.
    pub const ALL: [ScenarioKind; 6] = [
        ScenarioKind::Base,
        ScenarioKind::Crash,
        ScenarioKind::Scale,
        ScenarioKind::Throughput,
        ScenarioKind::Handoff,
        ScenarioKind::Memory,
    ];

    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            ScenarioKind::Base => "base",
            ScenarioKind::Crash => "crash",
            ScenarioKind::Scale => "scale",
            ScenarioKind::Throughput => "throughput",
            ScenarioKind::Handoff => "handoff",
            ScenarioKind::Memory => "memory",
        }
    }

    /// Parses a command-line name.
    pub fn parse(s: &str) -> Option<ScenarioKind> {
        ScenarioKind::ALL.into_iter().find(|k| k.name() == s.trim())
    }
}

/// Workload of one scenario (for the crash and memory scenarios only the relevant fields).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScenarioParams {
    /// Worker processes.
    pub procs: u32,
    /// Tasks per process.
    pub workers: u32,
    /// Jobs per process.
    pub jobs_per_proc: u64,
    /// Semaphore limit.
    pub limit: u32,
    /// Hold per job, ms.
    pub hold_ms: f64,
    /// Lease, ms.
    pub lease_ms: u64,
    /// Run timeout, s (a run that hits it is killed, reported, not repeated).
    pub run_timeout_s: f64,
}

impl ScenarioParams {
    /// The workload of `kind` with job counts multiplied by `scale`.
    pub fn of(kind: ScenarioKind, scale: f64, a: &RunArgs) -> ScenarioParams {
        let n = |base: f64, min: u64| ((base * scale).round() as u64).max(min);
        match kind {
            ScenarioKind::Base => ScenarioParams {
                procs: 3,
                workers: 10,
                jobs_per_proc: n(200.0, 1),
                limit: 5,
                hold_ms: 20.0,
                lease_ms: 5000,
                run_timeout_s: 30.0,
            },
            ScenarioKind::Crash => ScenarioParams {
                procs: a.crash_limit,
                workers: 1,
                jobs_per_proc: 1,
                limit: a.crash_limit,
                hold_ms: 3_600_000.0,
                lease_ms: a.crash_lease_ms,
                run_timeout_s: a.give_up_s,
            },
            ScenarioKind::Scale => {
                let w = n(300.0, 2);
                ScenarioParams {
                    procs: 3,
                    workers: w as u32,
                    jobs_per_proc: w,
                    limit: 5,
                    hold_ms: 20.0,
                    lease_ms: 5000,
                    run_timeout_s: 20.0,
                }
            }
            ScenarioKind::Throughput => ScenarioParams {
                procs: 1,
                workers: 64,
                jobs_per_proc: n(20_000.0, 64),
                limit: 64,
                hold_ms: 0.0,
                lease_ms: 5000,
                run_timeout_s: 30.0,
            },
            ScenarioKind::Handoff => ScenarioParams {
                procs: 3,
                workers: 2,
                jobs_per_proc: n(50.0, 4),
                limit: 1,
                hold_ms: 10.0,
                lease_ms: 5000,
                run_timeout_s: 30.0,
            },
            ScenarioKind::Memory => {
                let w = n(10_000.0, 10);
                ScenarioParams {
                    procs: 1,
                    workers: w as u32,
                    jobs_per_proc: w,
                    limit: 1,
                    hold_ms: 0.0,
                    lease_ms: 60_000,
                    run_timeout_s: 30.0,
                }
            }
        }
    }

    /// One line for reports.
    pub fn describe(&self, kind: ScenarioKind) -> String {
        match kind {
            ScenarioKind::Crash => format!(
                "limit {}, lease {} ms: {} holder processes SIGKILLed while holding, then one fresh acquirer (give up after {} s)",
                self.limit, self.lease_ms, self.procs, self.run_timeout_s
            ),
            ScenarioKind::Memory => format!(
                "1 process with {} tasks waiting behind a slot held by another process (limit 1, lease {} s)",
                self.workers,
                self.lease_ms / 1000
            ),
            _ => format!(
                "{} process(es) x {} tasks, limit {}, {} jobs ({} per process) x {} ms hold, lease {} s{}",
                self.procs,
                self.workers,
                self.limit,
                u64::from(self.procs) * self.jobs_per_proc,
                self.jobs_per_proc,
                self.hold_ms,
                self.lease_ms as f64 / 1000.0,
                if self.hold_ms > 0.0 {
                    format!(" (lower bound {:.2} s)", self.lower_bound_s())
                } else {
                    String::new()
                }
            ),
        }
    }

    /// P x J x H / L, seconds.
    pub fn lower_bound_s(&self) -> f64 {
        f64::from(self.procs) * self.jobs_per_proc as f64 * self.hold_ms
            / f64::from(self.limit)
            / 1000.0
    }
}

/// One repetition's figures.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RepResult {
    /// Repetition index.
    pub rep: u32,
    /// All expected jobs done, no timeout (crash: recovered; memory: measured).
    pub complete: bool,
    /// Killed at the run timeout.
    pub timed_out: bool,
    /// Jobs reported.
    pub jobs_done: u64,
    /// Jobs expected.
    pub jobs_expected: u64,
    /// Named figures (see the report's column notes).
    pub figures: BTreeMap<String, f64>,
    /// Free-form notes (Redis key state, worker errors).
    pub notes: BTreeMap<String, String>,
    /// `INFO commandstats` calls after the run.
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub commandstats: BTreeMap<String, u64>,
    /// Job lines (kept for the charts of the base scenario; not serialised).
    #[serde(skip)]
    pub jobs: Vec<JobRecord>,
    /// Shared start of the run, epoch ns (not serialised).
    #[serde(skip)]
    pub start_ns: u64,
}

/// All repetitions of one design in one scenario.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScenarioResult {
    /// Scenario name.
    pub scenario: ScenarioKind,
    /// Design name.
    pub design: DesignKind,
    /// Design description.
    pub description: String,
    /// Workload.
    pub params: ScenarioParams,
    /// Why this combination was not run.
    pub skipped: Option<String>,
    /// Every repetition run.
    pub reps: Vec<RepResult>,
    /// Median and range of every figure over the complete repetitions (over all, for
    /// figures of incomplete ones when none is complete).
    pub agg: BTreeMap<String, Agg>,
    /// Every repetition complete.
    pub all_complete: bool,
    /// Some repetition hit the run timeout.
    pub any_timeout: bool,
}

impl ScenarioResult {
    /// Median of a figure, if any.
    pub fn median(&self, key: &str) -> Option<f64> {
        self.agg.get(key).map(|a| a.median)
    }
}

/// Everything one run of the benchmark measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// Environment and options.
    pub meta: BTreeMap<String, serde_json::Value>,
    /// One entry per scenario and design.
    pub results: Vec<ScenarioResult>,
}

/// Progress sink: the indicatif bar (hidden when stderr is not a terminal, in which case
/// lines go straight to stderr).
pub struct Progress {
    bar: indicatif::ProgressBar,
}

impl Progress {
    /// A bar for `total` runs.
    pub fn new(total: u64) -> Progress {
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(total),
            indicatif::ProgressDrawTarget::stderr(),
        );
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        Progress { bar }
    }

    /// Prints a line above the bar (or to stderr when the bar is hidden).
    pub fn println(&self, line: impl AsRef<str>) {
        if self.bar.is_hidden() {
            eprintln!("{}", line.as_ref());
        } else {
            self.bar.println(line.as_ref());
        }
    }

    /// Sets what is running.
    pub fn set_message(&self, m: String) {
        self.bar.set_message(m);
    }

    /// Counts finished runs.
    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Parses the `--scenarios` and `--designs` lists (empty = all).
pub fn selection(a: &RunArgs) -> anyhow::Result<(Vec<ScenarioKind>, Vec<DesignKind>)> {
    let mut sc = Vec::new();
    for s in a.scenarios.iter().filter(|s| !s.trim().is_empty()) {
        if s.trim() == "all" {
            sc.extend(ScenarioKind::ALL);
            continue;
        }
        sc.push(ScenarioKind::parse(s).with_context(|| {
            format!("unknown scenario {s:?} (base,crash,scale,throughput,handoff,memory)")
        })?);
    }
    if sc.is_empty() {
        sc.extend(ScenarioKind::ALL);
    }
    sc.sort();
    sc.dedup();
    let mut ds = Vec::new();
    for d in a.designs.iter().filter(|s| !s.trim().is_empty()) {
        if d.trim() == "all" {
            ds.extend(DesignKind::ALL);
            continue;
        }
        ds.push(DesignKind::parse(d).with_context(|| {
            format!("unknown design {d:?} (counter,zset-poll,fifo-poll,fifo-notify,redsem)")
        })?);
    }
    if ds.is_empty() {
        ds.extend(DesignKind::ALL);
    }
    ds.sort();
    ds.dedup();
    Ok((sc, ds))
}

fn skip_reason(kind: ScenarioKind, design: DesignKind) -> Option<String> {
    if design == DesignKind::Redsem && !designs::redsem::AVAILABLE {
        return Some("redsem design not yet available".into());
    }
    if kind == ScenarioKind::Memory
        && !matches!(design, DesignKind::Redsem | DesignKind::FifoNotify)
    {
        return Some(
            "skipped: thousands of waiters polling every 20 ms would measure a saturated Redis, not memory"
                .into(),
        );
    }
    None
}

/// Runs every selected scenario for every selected design.
pub async fn run_all(
    h: &Harness,
    a: &RunArgs,
    scenarios: &[ScenarioKind],
    designs: &[DesignKind],
    progress: &Progress,
) -> anyhow::Result<Vec<ScenarioResult>> {
    let mut results = Vec::new();
    for &kind in scenarios {
        let params = ScenarioParams::of(kind, a.jobs_scale, a);
        progress.println(format!("== {}: {}", kind.name(), params.describe(kind)));
        for &design in designs {
            let mut reps = Vec::new();
            let skipped = skip_reason(kind, design);
            if let Some(why) = &skipped {
                progress.println(format!("  [{}] {design}: {why}", kind.name()));
                progress.inc(u64::from(a.reps));
            } else {
                for rep in 0..a.reps {
                    progress.set_message(format!("{} {design} rep {rep}", kind.name()));
                    let r = match kind {
                        ScenarioKind::Crash => crash_once(h, a, design, &params, rep).await?,
                        ScenarioKind::Memory => memory_once(h, a, design, &params, rep).await?,
                        _ => bench_once(h, a, kind, design, &params, rep).await?,
                    };
                    progress.println(format!(
                        "  [{}] {design} rep{rep}: {}",
                        kind.name(),
                        one_line(kind, &r)
                    ));
                    progress.inc(1);
                    let stop = match kind {
                        ScenarioKind::Crash => r.figures.get("recovered") == Some(&0.0),
                        _ => r.timed_out,
                    };
                    reps.push(r);
                    if stop && rep + 1 < a.reps {
                        progress.println(format!(
                            "  [{}] {design}: {}, not repeated",
                            kind.name(),
                            if kind == ScenarioKind::Crash {
                                "never recovered"
                            } else {
                                "timed out"
                            }
                        ));
                        progress.inc(u64::from(a.reps - rep - 1));
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            results.push(summarise(kind, design, params.clone(), skipped, reps));
        }
    }
    Ok(results)
}

fn one_line(kind: ScenarioKind, r: &RepResult) -> String {
    let f = |k: &str| r.figures.get(k).copied().unwrap_or(f64::NAN);
    let mut s = match kind {
        ScenarioKind::Crash => {
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
        ScenarioKind::Memory => format!(
            "{} waiters: {:.0} B/waiter RSS, {} Redis connections, {:.0} B/waiter in Redis",
            f("waiters"),
            f("rss_bytes_per_waiter"),
            f("redis_connections"),
            f("redis_bytes_per_waiter")
        ),
        _ => format!(
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
        ),
    };
    if r.timed_out {
        s.push_str(" TIMEOUT");
    }
    if let Some(e) = r.notes.get("worker_error") {
        s.push_str(&format!(" WORKER ERROR: {e}"));
    }
    s
}

fn summarise(
    kind: ScenarioKind,
    design: DesignKind,
    params: ScenarioParams,
    skipped: Option<String>,
    mut reps: Vec<RepResult>,
) -> ScenarioResult {
    let mut keys: Vec<String> = reps
        .iter()
        .flat_map(|r| r.figures.keys().cloned())
        .collect();
    keys.sort();
    keys.dedup();
    let any_complete = reps.iter().any(|r| r.complete);
    let mut agg = BTreeMap::new();
    for k in keys {
        let vals = reps
            .iter()
            .filter(|r| r.complete || !any_complete)
            .map(|r| r.figures.get(&k).copied());
        if let Some(a) = metrics::agg(vals) {
            agg.insert(k, a);
        }
    }
    if kind != ScenarioKind::Base {
        for r in reps.iter_mut() {
            r.jobs.clear();
        }
    }
    ScenarioResult {
        scenario: kind,
        design,
        description: design.description().to_string(),
        params,
        all_complete: !reps.is_empty() && reps.iter().all(|r| r.complete),
        any_timeout: reps.iter().any(|r| r.timed_out),
        skipped,
        reps,
        agg,
    }
}

fn now_ms() -> u64 {
    now_ns() / 1_000_000
}

fn worker_problems(outs: &[WorkerOutput], notes: &mut BTreeMap<String, String>) {
    for (i, o) in outs.iter().enumerate() {
        let failed = o.status.is_some_and(|s| !s.success() && s.code().is_some());
        if failed {
            let tail: String = o
                .stderr_tail
                .lines()
                .rev()
                .take(3)
                .collect::<Vec<_>>()
                .join(" | ");
            notes.insert(
                "worker_error".into(),
                format!("process {i} exited with {:?}: {tail}", o.status),
            );
        }
    }
}

/// One run of a throughput-style scenario (base, scale, throughput, handoff).
pub async fn bench_once(
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
        // The same with the holds as measured by the holders themselves: the share of the
        // run during which the permits were actually held. The nominal figure also charges
        // the semaphore for the hold's own overshoot (a 20 ms tokio sleep lasts ~21 ms).
        let held_s: f64 = jobs
            .iter()
            .map(|j| j.rel_ns.saturating_sub(j.acq_ns) as f64 / 1e9)
            .sum();
        if p.limit > 0 {
            fig.insert("slot_use".into(), held_s / f64::from(p.limit) / run_s);
        }
        if n > 0 {
            fig.insert("hold_mean_ms".into(), held_s * 1e3 / n as f64);
        }
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
    if kind == ScenarioKind::Base {
        r.jobs = jobs;
    }
    Ok(r)
}

/// One repetition of the crash scenario (the procedure of `driver.py crash`).
pub async fn crash_once(
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

/// One repetition of the memory scenario.
pub async fn memory_once(
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
    let holder_spec = WorkerSpec {
        design,
        name: "memory".into(),
        limit: 1,
        workers: 1,
        jobs: 1,
        hold_ms: 3_600_000.0,
        lease_ms: p.lease_ms,
        start_at_ms: 0,
        announce: true,
    };
    let mut holder = h.spawn(&holder_spec, 0)?;
    if holder
        .wait_acquired(1, Instant::now() + Duration::from_secs(15))
        .await
        .is_none()
    {
        holder.kill_group();
        let out = holder.finish().await;
        worker_problems(std::slice::from_ref(&out), &mut r.notes);
        r.notes
            .insert("error".into(), "holder did not acquire".into());
        return Ok(r);
    }
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

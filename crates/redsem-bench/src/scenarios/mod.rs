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
//! | `idle` (only when named) | 1k, 10k, 100k waiting tasks in 4 processes behind one holder process: Redis CPU % of a core and script calls per second over a window once all are queued (`redsem` only) |
//! | `many` (only when named) | 1 process, 1,000 semaphores, one holder and one waiter on each: the same figures (`redsem` only) |
//! | `synced` (only when named) | 1 process x 1 task, sequential acquire+release cycles on a private master with one replica: plain vs synced mode (`redsem` only) |
//! | `admin` (only when named) | Redis time per `open`, `stats` (inspect) and `redsem run` behind 0 to 10,000 waiters (limit 10) and on an idle semaphore of limit 100,000, and that semaphore's memory, on a private redis-server (`redsem` only) |
//!
//! `--jobs-scale F` multiplies job counts (and the `scale` task count, the `memory`, `idle`
//! waiter counts, the `many` semaphore count) for quick smoke runs; `crash` is unaffected.
//!
//! One file per scenario (its workload, and its run when it has its own); [`jobs`] is the run
//! shared by the scenarios made of jobs (`base`, `scale`, `throughput`, `handoff`). This file
//! holds what they all share: the options, the result types, the selection and the run loop.

pub mod admin;
pub mod base;
pub mod crash;
pub mod handoff;
pub mod idle;
pub mod jobs;
pub mod many;
pub mod memory;
pub mod scale;
pub mod synced;
pub mod throughput;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::designs::{self, DesignKind};
use crate::harness::{Harness, WorkerOutput, WorkerProc, WorkerSpec};
use crate::metrics::{self, Agg, JobRecord};
use crate::worker::now_ns;

/// Options of the `run` sub-command (the default).
#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// Comma list of scenarios: base,crash,scale,throughput,handoff,memory (default and `all`:
    /// these six), idle,many,synced,admin (slow, or need a replica or a private server: only
    /// when named).
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
    /// Idle and many scenarios: how long Redis is watched once every waiter is queued, s.
    #[arg(long, default_value_t = 10.0)]
    pub idle_window_s: f64,
    /// Idle and many scenarios: give up when the waiters are not all queued after this many
    /// seconds (the row then says how many were).
    #[arg(long, default_value_t = 120.0)]
    pub idle_queue_timeout_s: f64,
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
    /// Redis CPU while waiters idle behind one holder (not in the default set).
    Idle,
    /// One process holding and waiting on many semaphores (not in the default set).
    Many,
    /// What synced mode costs per acquisition (not in the default set: it needs a replica).
    Synced,
    /// Redis time of the operator paths as the queue grows (not in the default set: it queues
    /// 10,000 waiters and takes minutes).
    Admin,
}

impl ScenarioKind {
    /// The default set (also `--scenarios all`), in run order.
    pub const ALL: [ScenarioKind; 6] = [
        ScenarioKind::Base,
        ScenarioKind::Crash,
        ScenarioKind::Scale,
        ScenarioKind::Throughput,
        ScenarioKind::Handoff,
        ScenarioKind::Memory,
    ];

    /// Every scenario: the default set, then those that run only when named (they take
    /// minutes).
    pub const EVERY: [ScenarioKind; 10] = [
        ScenarioKind::Base,
        ScenarioKind::Crash,
        ScenarioKind::Scale,
        ScenarioKind::Throughput,
        ScenarioKind::Handoff,
        ScenarioKind::Memory,
        ScenarioKind::Idle,
        ScenarioKind::Many,
        ScenarioKind::Synced,
        ScenarioKind::Admin,
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
            ScenarioKind::Idle => "idle",
            ScenarioKind::Many => "many",
            ScenarioKind::Synced => "synced",
            ScenarioKind::Admin => "admin",
        }
    }

    /// Parses a command-line name.
    pub fn parse(s: &str) -> Option<ScenarioKind> {
        ScenarioKind::EVERY
            .into_iter()
            .find(|k| k.name() == s.trim())
    }
}

/// Workload of one scenario (for the crash and memory scenarios only the relevant fields).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
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
    /// Idle and many: how long Redis is watched once everyone is queued, s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<f64>,
    /// Many: semaphores the process opens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub semaphores: Option<u32>,
    /// Synced: replicas every grant waits for (0 = plain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synced_replicas: Option<u32>,
    /// Admin: waiters queued behind the holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiters: Option<u64>,
}

impl ScenarioParams {
    /// The workloads of `kind` (`idle` has one per waiter count, every other scenario one)
    /// with job counts multiplied by `scale`.
    pub fn variants(kind: ScenarioKind, scale: f64, a: &RunArgs) -> Vec<ScenarioParams> {
        let n = |base: f64, min: u64| ((base * scale).round() as u64).max(min);
        match kind {
            ScenarioKind::Base => vec![base::params(n)],
            ScenarioKind::Crash => vec![crash::params(a)],
            ScenarioKind::Scale => vec![scale::params(n)],
            ScenarioKind::Throughput => vec![throughput::params(n)],
            ScenarioKind::Handoff => vec![handoff::params(n)],
            ScenarioKind::Memory => vec![memory::params(n)],
            ScenarioKind::Idle => idle::variants(scale, a),
            ScenarioKind::Many => vec![many::params(n, a)],
            ScenarioKind::Synced => synced::variants(n),
            ScenarioKind::Admin => admin::variants(scale, a),
        }
    }

    /// One line for reports.
    pub fn describe(&self, kind: ScenarioKind) -> String {
        match kind {
            ScenarioKind::Crash => crash::describe(self),
            ScenarioKind::Memory => memory::describe(self),
            ScenarioKind::Idle => idle::describe(self),
            ScenarioKind::Many => many::describe(self),
            ScenarioKind::Synced => synced::describe(self),
            ScenarioKind::Admin => admin::describe(self),
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
            format!("unknown scenario {s:?} (base,crash,scale,throughput,handoff,memory,idle,many,synced,admin)")
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
    if design.is_redsem() && !designs::redsem::AVAILABLE {
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
    if kind == ScenarioKind::Synced && design != DesignKind::Redsem {
        return Some("skipped: the reference's designs have no synced mode".into());
    }
    if kind == ScenarioKind::Admin && design != DesignKind::Redsem {
        return Some("skipped: the operator paths (open, stats, run) are the library's".into());
    }
    if matches!(kind, ScenarioKind::Idle | ScenarioKind::Many) && design != DesignKind::Redsem {
        return Some(
            "skipped: every waiter of the reference's designs polls Redis itself (every 20 ms, or 250 ms with notify), so idle waiters would measure a saturated Redis"
                .into(),
        );
    }
    None
}

/// How many runs [`run_all`] makes (for the progress bar).
pub fn run_count(a: &RunArgs, scenarios: &[ScenarioKind], designs: &[DesignKind]) -> u64 {
    let variants: usize = scenarios
        .iter()
        .map(|&k| ScenarioParams::variants(k, a.jobs_scale, a).len())
        .sum();
    (variants * designs.len()) as u64 * u64::from(a.reps)
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
        let variants = ScenarioParams::variants(kind, a.jobs_scale, a);
        progress.println(format!(
            "== {}: {}",
            kind.name(),
            variants[0].describe(kind)
        ));
        for &design in designs {
            let skipped = skip_reason(kind, design);
            if let Some(why) = &skipped {
                // one row says why, whatever the number of variants
                progress.println(format!("  [{}] {design}: {why}", kind.name()));
                progress.inc(u64::from(a.reps) * variants.len() as u64);
                let params = variants[0].clone();
                results.push(summarise(kind, design, params, skipped, Vec::new()));
                continue;
            }
            for params in &variants {
                let reps = run_reps(h, a, kind, design, params, progress).await?;
                results.push(summarise(kind, design, params.clone(), None, reps));
            }
        }
    }
    Ok(results)
}

/// The `--reps` repetitions of one design in one scenario variant (fewer when one times out
/// or, in `crash`, never recovers).
async fn run_reps(
    h: &Harness,
    a: &RunArgs,
    kind: ScenarioKind,
    design: DesignKind,
    params: &ScenarioParams,
    progress: &Progress,
) -> anyhow::Result<Vec<RepResult>> {
    let mut reps = Vec::new();
    for rep in 0..a.reps {
        progress.set_message(format!("{} {design} rep {rep}", kind.name()));
        let r = match kind {
            ScenarioKind::Crash => crash::run_once(h, a, design, params, rep).await?,
            ScenarioKind::Memory => memory::run_once(h, a, design, params, rep).await?,
            ScenarioKind::Idle => idle::run_once(h, design, params, rep).await?,
            ScenarioKind::Many => many::run_once(h, design, params, rep).await?,
            ScenarioKind::Synced => synced::run_once(a, design, params, rep).await?,
            ScenarioKind::Admin => admin::run_once(params, rep).await?,
            _ => jobs::run_once(h, a, kind, design, params, rep).await?,
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
    Ok(reps)
}

fn one_line(kind: ScenarioKind, r: &RepResult) -> String {
    let mut s = match kind {
        ScenarioKind::Crash => crash::one_line(r),
        ScenarioKind::Memory => memory::one_line(r),
        ScenarioKind::Idle | ScenarioKind::Many => idle::one_line(r),
        ScenarioKind::Admin => admin::one_line(r),
        _ => jobs::one_line(r),
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

/// The process that holds the only slot (limit 1) of semaphore `name` for an hour while
/// others wait behind it, announcing its grant.
fn holder_spec(design: DesignKind, name: &str, lease_ms: u64) -> WorkerSpec {
    WorkerSpec {
        design,
        name: name.into(),
        limit: 1,
        workers: 1,
        jobs: 1,
        hold_ms: 3_600_000.0,
        lease_ms,
        start_at_ms: 0,
        announce: true,
        semaphores: 1,
        synced_replicas: 0,
    }
}

/// Starts the process that holds the only slot while others wait behind it (`memory`,
/// `idle`) and waits until it announced its grant (at most 15 s). None, with a note in `r`, if
/// it did not.
async fn spawn_holder(
    h: &Harness,
    spec: &WorkerSpec,
    r: &mut RepResult,
) -> anyhow::Result<Option<WorkerProc>> {
    let mut holder = h.spawn(spec, 0)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    if holder.wait_acquired(1, deadline).await.is_some() {
        return Ok(Some(holder));
    }
    holder.kill_group();
    let out = holder.finish().await;
    worker_problems(std::slice::from_ref(&out), &mut r.notes);
    r.notes
        .insert("error".into(), "holder did not acquire".into());
    Ok(None)
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn args(extra: &[&str]) -> RunArgs {
        Cli::try_parse_from(std::iter::once("redsem-bench").chain(extra.iter().copied()))
            .unwrap()
            .run
    }

    #[test]
    fn idle_and_many_run_only_when_named() {
        let default = selection(&args(&[])).unwrap().0;
        assert_eq!(default, ScenarioKind::ALL);
        let all = selection(&args(&["--scenarios", "all"])).unwrap().0;
        assert_eq!(all, ScenarioKind::ALL);
        let named = selection(&args(&["--scenarios", "many,idle,base"]))
            .unwrap()
            .0;
        assert_eq!(
            named,
            [ScenarioKind::Base, ScenarioKind::Idle, ScenarioKind::Many]
        );
        assert!(selection(&args(&["--scenarios", "nope"])).is_err());
    }

    #[test]
    fn idle_has_one_variant_per_waiter_count_and_the_others_one() {
        let a = args(&[]);
        let idle = ScenarioParams::variants(ScenarioKind::Idle, 1.0, &a);
        let waiters: Vec<u64> = idle
            .iter()
            .map(|p| u64::from(p.procs) * p.jobs_per_proc)
            .collect();
        assert_eq!(waiters, [1_000, 10_000, 100_000]);
        let many = ScenarioParams::variants(ScenarioKind::Many, 1.0, &a);
        assert_eq!(many.len(), 1);
        assert_eq!(many[0].semaphores, Some(1000));
        assert_eq!(many[0].workers, 2000);
        let synced = ScenarioParams::variants(ScenarioKind::Synced, 1.0, &a);
        let modes: Vec<_> = synced.iter().map(|p| p.synced_replicas).collect();
        assert_eq!(modes, [Some(0), Some(1)]);
        for kind in ScenarioKind::ALL {
            assert_eq!(ScenarioParams::variants(kind, 1.0, &a).len(), 1, "{kind:?}");
        }
        let designs = [DesignKind::Redsem];
        let a = args(&["--reps", "2", "--scenarios", "idle,base"]);
        let kinds = selection(&a).unwrap().0;
        assert_eq!(run_count(&a, &kinds, &designs), 2 * (1 + 3));
    }
}

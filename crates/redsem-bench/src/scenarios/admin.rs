//! `admin`: the Redis time of the `redsem` design's operator paths, per operation, as the
//! queue grows. On a private `redis-server` started for each repetition (nothing else uses it):
//!
//! - `open`: `Client::semaphore(name, limit).open()` and `close()` of the handle, on a client
//!   connected beforehand (its handshake is not counted; its first subscription is);
//! - `stats`: `Client::inspect(name)`, what `redsem stats` calls (it lists the first 100
//!   holders and waiters);
//! - `counts`: `Client::inspect_listing(name, 1)`: the counts and the head of the queue, what
//!   `redsem list` reads of each semaphore (and `redsem run`'s message, with 0 listed);
//! - `run`: one whole `redsem run --limit L --timeout 50ms NAME -- true` process (this binary
//!   re-executed as `redsem-bench redsem ...`, which runs exactly what the `redsem` binary
//!   runs): connect, open, acquire; with free permits (0 waiters) it runs `true` and releases;
//!   behind waiters it queues, gives up after 50 ms, leaves the queue and reads the counts
//!   for its message (exit 124). Every row runs the same command line; the paths differ.
//!
//! Rows: 0, 1,000, 3,000 and 10,000 waiters on a semaphore of limit 10, and an idle one of
//! limit 100,000. Waiters are real queued entries: one client of this process opens the
//! semaphore, takes all its permits with one `acquire_many`, then runs one task per waiter,
//! each blocked in `acquire()`. Their handle has a 10-minute lease and fallback poll, so that
//! no renewal of theirs falls in a measurement.
//!
//! **Redis time** comes from `INFO commandstats` (`usec`: command execution time as Redis
//! counts it): after `CONFIG RESETSTAT`, each operation runs N times in a row, then 200 ms
//! pass for its trailing commands (a closed handle unsubscribes in the background); the sum
//! of the `usec` of the commands a client sent (script calls, handshakes, pub/sub, `INFO`,
//! `PING`...: [`metrics::sent_by_client`]; commands run inside a script are already in their
//! script call's time, so they are not added again) is read. Then an idle window of the same
//! length (`CONFIG RESETSTAT`, nothing run, the same read) measures what else ran (the
//! harness's own `CONFIG RESETSTAT`, heartbeats), which is subtracted. *Round trips* are the
//! calls of those commands the same way; *commands inside scripts* the calls of all the others.
//!
//! The semaphore's memory is the sum of `MEMORY USAGE key SAMPLES 0` (exact) over its keys
//! (`<prefix>:{name}:*`), once the waiters are queued and again after the operations.
//!
//! Only the `redsem` design (the operator paths are the library's).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{RepResult, RunArgs, ScenarioParams};
use crate::harness::Harness;
use crate::metrics::{self, RedisSnapshot};

/// The semaphore's name.
pub const NAME: &str = "admin";
/// Limit of the rows with waiters.
pub const SMALL_LIMIT: u32 = 10;
/// Limit of the idle semaphore row (the library's maximum).
pub const BIG_LIMIT: u32 = 100_000;
/// Waiters of the limit-10 rows, before `--jobs-scale` (0 stays 0).
const WAITERS: [f64; 4] = [0.0, 1_000.0, 3_000.0, 10_000.0];
/// Repetitions of each operation, before `--jobs-scale` (at least 3).
const OPS: f64 = 20.0;
/// `redsem run --timeout` (only reached behind waiters).
const RUN_TIMEOUT: &str = "50ms";
/// Lease and fallback poll of the waiters' handle: no heartbeat of theirs in a window.
const QUIET: Duration = Duration::from_secs(600);
/// Time left after the last operation for its trailing commands.
const SETTLE: Duration = Duration::from_millis(200);

/// Targets (issue 26): `open` and `stats` with [`TARGET_WAITERS`] waiters take Redis at most
/// [`TARGET_RATIO`] times as long as with none, and at most [`TARGET_US`]; an idle semaphore
/// of limit [`BIG_LIMIT`] takes at most [`TARGET_BYTES`] of Redis memory.
pub const TARGET_WAITERS: u64 = 3_000;
/// See [`TARGET_WAITERS`].
pub const TARGET_RATIO: f64 = 1.5;
/// See [`TARGET_WAITERS`], µs.
pub const TARGET_US: f64 = 1_000.0;
/// See [`TARGET_WAITERS`] (64 KiB).
pub const TARGET_BYTES: f64 = 65_536.0;

/// The operations measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Open (and close) a handle.
    Open,
    /// `inspect`, as `redsem stats`.
    Stats,
    /// `inspect_listing(name, 1)`, as `redsem list`.
    Counts,
    /// One `redsem run` process.
    Run,
}

impl Op {
    /// Every operation, in table order.
    pub const ALL: [Op; 4] = [Op::Open, Op::Stats, Op::Counts, Op::Run];

    /// The name, also the prefix of its figures (`open_redis_us`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Op::Open => "open",
            Op::Stats => "stats",
            Op::Counts => "counts",
            Op::Run => "run",
        }
    }

    /// Whether the latency target applies to it (`counts` is shown beside `stats`: what
    /// a snapshot costs when it lists one entry rather than a hundred).
    pub fn has_target(self) -> bool {
        matches!(self, Op::Open | Op::Stats)
    }
}

/// One workload per row: 0 to 10,000 waiters at limit 10, then the idle limit-100,000 one.
pub(super) fn variants(scale: f64, a: &RunArgs) -> Vec<ScenarioParams> {
    let ops = ((OPS * scale).round() as u64).max(3);
    let row = |waiters: u64, limit: u32| ScenarioParams {
        procs: 1,
        workers: 1,
        jobs_per_proc: ops,
        limit,
        hold_ms: 0.0,
        lease_ms: QUIET.as_millis() as u64,
        run_timeout_s: a.idle_queue_timeout_s,
        waiters: Some(waiters),
        ..ScenarioParams::default()
    };
    let scaled = |n: f64| {
        if n == 0.0 {
            0
        } else {
            ((n * scale).round() as u64).max(1)
        }
    };
    let mut v: Vec<ScenarioParams> = WAITERS
        .iter()
        .map(|&n| row(scaled(n), SMALL_LIMIT))
        .collect();
    v.push(row(0, BIG_LIMIT));
    v
}

/// One line for reports (the table heading).
pub(super) fn describe(p: &ScenarioParams) -> String {
    format!(
        "Redis time of `open`, `stats` (inspect: 100 listed), `counts` (inspect_listing 1) and \
         `redsem run --timeout {RUN_TIMEOUT} -- true`, \
         each {} times, behind N waiters (limit {SMALL_LIMIT}, one holder holding it) and on an idle \
         semaphore of limit {BIG_LIMIT}; private redis-server, INFO commandstats minus an idle window",
        p.jobs_per_proc
    )
}

/// The progress line of one repetition.
pub(super) fn one_line(r: &RepResult) -> String {
    let f = |k: &str| r.figures.get(k).copied().unwrap_or(f64::NAN);
    let mut s = Op::ALL
        .iter()
        .map(|op| {
            format!(
                "{} {:.0} µs",
                op.name(),
                f(&format!("{}_redis_us", op.name()))
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    s.push_str(&format!(", {:.0} bytes", f("memory_bytes")));
    if let Some(e) = r.notes.get("error") {
        s.push_str(&format!(" ({e})"));
    }
    s
}

/// One repetition on a fresh private server.
pub async fn run_once(p: &ScenarioParams, rep: u32) -> anyhow::Result<RepResult> {
    let mut server = crate::start_private_redis(Vec::new())?;
    let h = Harness::new(&server.url()).await?;
    let r = measure_all(&h, p, rep).await;
    drop(h);
    server.stop();
    r
}

/// The waiters, the memory, every operation, the memory again.
async fn measure_all(h: &Harness, p: &ScenarioParams, rep: u32) -> anyhow::Result<RepResult> {
    let waiters = p.waiters.unwrap_or(0);
    let mut r = RepResult {
        rep,
        jobs_expected: waiters,
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs_f64(p.run_timeout_s);
    let queue = Queue::fill(&h.redis_url, p.limit, waiters).await?;
    let queued = queue.wait_queued(waiters, deadline).await?;
    r.jobs_done = queued;
    r.figures.insert("waiters".into(), waiters as f64);
    r.figures.insert("queued".into(), queued as f64);
    if queued < waiters {
        let why = format!(
            "{queued} of {waiters} waiters queued in {} s",
            p.run_timeout_s
        );
        r.notes.insert("error".into(), why);
        queue.stop().await;
        return Ok(r);
    }
    let (bytes, keys) = memory(h).await?;
    r.figures.insert("memory_bytes".into(), bytes);
    r.figures.insert("keys".into(), keys);
    for op in Op::ALL {
        let cost = measure(h, op, p, &mut r.notes).await?;
        cost.record(op, &mut r);
    }
    r.figures
        .insert("memory_after_ops_bytes".into(), memory(h).await?.0);
    queue.stop().await;
    r.complete = !r.notes.contains_key("error");
    Ok(r)
}

/// The waiters and their holder: one client, one handle.
struct Queue {
    client: redsem::Client,
    _holder: Option<redsem::Permit>,
    tasks: tokio::task::JoinSet<()>,
}

impl Queue {
    /// Opens the semaphore; with waiters, takes every permit, then queues one task per waiter.
    async fn fill(url: &str, limit: u32, waiters: u64) -> anyhow::Result<Queue> {
        let client = redsem::Client::connect(url).await?;
        let sem = client
            .semaphore(NAME, limit)
            .lease(QUIET)
            .fallback_poll(QUIET)
            .open()
            .await?;
        let sem = Arc::new(sem);
        let mut q = Queue {
            client,
            _holder: None,
            tasks: tokio::task::JoinSet::new(),
        };
        if waiters > 0 {
            q._holder = Some(sem.acquire_many(limit).await?);
        }
        for _ in 0..waiters {
            let sem = sem.clone();
            q.tasks.spawn(async move {
                // never granted: the holder keeps every permit until the end
                let _permit = sem.acquire().await;
                std::future::pending::<()>().await;
            });
        }
        Ok(q)
    }

    /// How many waiters Redis has queued, once all are or at the deadline.
    async fn wait_queued(&self, waiters: u64, deadline: Instant) -> anyhow::Result<u64> {
        loop {
            let queued = self.client.inspect(NAME).await?.waiter_count as u64;
            if queued >= waiters || Instant::now() >= deadline {
                return Ok(queued);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Gives everything up (the server is stopped next: bounded).
    async fn stop(mut self) {
        self.tasks.abort_all();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.client.shutdown()).await;
    }
}

/// Redis memory of the semaphore's keys (bytes, exact) and their number.
async fn memory(h: &Harness) -> anyhow::Result<(f64, f64)> {
    let pattern = format!("{}:{{{NAME}}}:*", redsem::DEFAULT_PREFIX);
    let keys: Vec<String> = h.query(redis::cmd("KEYS").arg(pattern)).await?;
    let mut bytes = 0u64;
    for k in &keys {
        let usage = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(k)
            .arg("SAMPLES")
            .arg(0)
            .clone();
        bytes += h.query::<Option<u64>>(&usage).await?.unwrap_or(0);
    }
    Ok((bytes as f64, keys.len() as f64))
}

/// Runs `op` N times between two `INFO commandstats` readings, then an idle window as long.
async fn measure(
    h: &Harness,
    op: Op,
    p: &ScenarioParams,
    notes: &mut BTreeMap<String, String>,
) -> anyhow::Result<Cost> {
    // connected before the window: its handshake is not an operation's
    let client = redsem::Client::connect(&h.redis_url).await?;
    h.reset_stats().await?;
    let started = Instant::now();
    for _ in 0..p.jobs_per_proc {
        once(op, &client, h, p, notes).await?;
    }
    let busy_for = started.elapsed();
    tokio::time::sleep(SETTLE).await;
    let window = started.elapsed();
    let busy = h.snapshot().await?;
    h.reset_stats().await?;
    tokio::time::sleep(window).await;
    let idle = h.snapshot().await?;
    client.shutdown().await;
    Ok(Cost::new(&busy, &idle, p.jobs_per_proc, busy_for))
}

/// One operation.
async fn once(
    op: Op,
    client: &redsem::Client,
    h: &Harness,
    p: &ScenarioParams,
    notes: &mut BTreeMap<String, String>,
) -> anyhow::Result<()> {
    match op {
        Op::Open => client.semaphore(NAME, p.limit).open().await?.close(),
        Op::Stats => drop(client.inspect(NAME).await?),
        Op::Counts => drop(client.inspect_listing(NAME, 1).await?),
        Op::Run => {
            let out = redsem_run(&h.redis_url, p.limit).await?;
            // 0: run with free permits; 124: gave up behind the waiters, as it should
            if !matches!(out.status.code(), Some(0 | 124)) {
                let err = String::from_utf8_lossy(&out.stderr);
                notes.insert(
                    "error".into(),
                    format!("redsem run exited with {}: {}", out.status, err.trim()),
                );
            }
        }
    }
    Ok(())
}

/// `redsem run --limit L --timeout 50ms NAME -- true`, by this binary in its `redsem` mode.
async fn redsem_run(url: &str, limit: u32) -> anyhow::Result<std::process::Output> {
    let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
    cmd.arg("redsem")
        .args(["--redis-url", url, "run", "--limit", &limit.to_string()])
        .args(["--timeout", RUN_TIMEOUT, NAME, "--", "true"])
        .env_remove("REDSEM_URL")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    Ok(cmd.output().await?)
}

/// What one operation cost Redis, on average.
struct Cost {
    redis_us: f64,
    round_trips: f64,
    inner_cmds: f64,
    wall_ms: f64,
    /// Client requests per operation by command, e.g. `evalsha 1.00, subscribe 0.05`.
    sent: String,
}

impl Cost {
    /// The busy window's counts minus the idle window's, per operation.
    fn new(busy: &RedisSnapshot, idle: &RedisSnapshot, n: u64, busy_for: Duration) -> Cost {
        let n = n.max(1) as f64;
        let delta = |m: fn(&RedisSnapshot) -> &BTreeMap<String, u64>, k: &str| {
            let get = |s: &RedisSnapshot| m(s).get(k).copied().unwrap_or(0) as f64;
            (get(busy) - get(idle)) / n
        };
        let (mut redis_us, mut round_trips, mut inner_cmds) = (0.0, 0.0, 0.0);
        let mut sent = Vec::new();
        for name in busy.commandstats.keys().chain(idle.commandstats.keys()) {
            if sent.iter().any(|(k, _)| k == name) {
                continue;
            }
            let calls = delta(|s| &s.commandstats, name);
            if metrics::sent_by_client(name) {
                redis_us += delta(|s| &s.commandstats_usec, name);
                round_trips += calls;
            } else {
                inner_cmds += calls;
            }
            sent.push((name.clone(), calls));
        }
        let sent = sent
            .into_iter()
            // (a net count below 0: the idle window saw more of it, e.g. a health-check PING)
            .filter(|(k, c)| metrics::sent_by_client(k) && *c >= 0.005)
            .map(|(k, c)| format!("{k} {c:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        Cost {
            redis_us: redis_us.max(0.0),
            round_trips: round_trips.max(0.0),
            inner_cmds: inner_cmds.max(0.0),
            wall_ms: busy_for.as_secs_f64() * 1e3 / n,
            sent,
        }
    }

    /// Into the repetition's figures (`<op>_redis_us`, ...) and notes (`<op>_sent`).
    fn record(self, op: Op, r: &mut RepResult) {
        let op = op.name();
        let fig = &mut r.figures;
        fig.insert(format!("{op}_redis_us"), self.redis_us);
        fig.insert(format!("{op}_round_trips"), self.round_trips);
        fig.insert(format!("{op}_inner_cmds"), self.inner_cmds);
        fig.insert(format!("{op}_wall_ms"), self.wall_ms);
        r.notes.insert(format!("{op}_sent"), self.sent);
    }
}

/// Whether the latency target is met: `at` (with [`TARGET_WAITERS`] waiters) within
/// [`TARGET_RATIO`] of `none` (without) and at most [`TARGET_US`].
pub fn latency_target_met(at_us: f64, none_us: f64) -> bool {
    at_us <= TARGET_RATIO * none_us && at_us <= TARGET_US
}

/// Whether the memory target is met by an idle semaphore of limit [`BIG_LIMIT`].
pub fn memory_target_met(bytes: f64) -> bool {
    bytes <= TARGET_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(lines: &[&str]) -> RedisSnapshot {
        RedisSnapshot::parse(&lines.join("\r\n"))
    }

    #[test]
    fn cost_counts_client_requests_minus_the_idle_window() {
        let busy = snap(&[
            "cmdstat_evalsha:calls=21,usec=2100,usec_per_call=100.00",
            "cmdstat_zrange:calls=40,usec=800,usec_per_call=20.00",
            "cmdstat_subscribe:calls=1,usec=5,usec_per_call=5.00",
            "cmdstat_config|resetstat:calls=1,usec=9,usec_per_call=9.00",
        ]);
        let idle = snap(&[
            "cmdstat_evalsha:calls=1,usec=100,usec_per_call=100.00",
            "cmdstat_config|resetstat:calls=1,usec=9,usec_per_call=9.00",
        ]);
        let c = Cost::new(&busy, &idle, 20, Duration::from_millis(40));
        // the scripts' inner commands are in the script calls' usec already
        assert_eq!(c.redis_us, (2000.0 + 5.0) / 20.0);
        assert_eq!(c.round_trips, 21.0 / 20.0);
        assert_eq!(c.inner_cmds, 2.0);
        assert_eq!(c.wall_ms, 2.0);
        assert_eq!(c.sent, "evalsha 1.00, subscribe 0.05");
    }

    #[test]
    fn targets() {
        assert!(latency_target_met(150.0, 100.0));
        assert!(!latency_target_met(151.0, 100.0));
        assert!(!latency_target_met(1_200.0, 1_000.0));
        assert!(memory_target_met(65_536.0));
        assert!(!memory_target_met(65_537.0));
    }

    #[test]
    fn rows_are_the_waiter_counts_then_the_big_idle_semaphore() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            run: RunArgs,
        }
        let a = Cli::try_parse_from(["redsem-bench"]).unwrap().run;
        let rows: Vec<(u64, u32)> = variants(1.0, &a)
            .iter()
            .map(|p| (p.waiters.unwrap(), p.limit))
            .collect();
        assert_eq!(
            rows,
            [
                (0, 10),
                (1_000, 10),
                (3_000, 10),
                (10_000, 10),
                (0, 100_000)
            ]
        );
        assert_eq!(variants(0.001, &a)[1].waiters, Some(1));
        assert_eq!(variants(0.001, &a)[0].jobs_per_proc, 3);
    }
}

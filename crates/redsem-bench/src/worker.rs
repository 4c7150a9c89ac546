//! The contract worker: one OS process running `workers` concurrent tasks against one
//! semaphore, following `shared/bench/CONTRACT.md` (v1) exactly, so the peers' `driver.py`
//! can run it unchanged.
//!
//! ```text
//! redsem-bench worker --design <counter|zset-poll|fifo-poll|fifo-notify|redsem> [--threads N]
//!     --redis-url URL --name NAME --limit L --workers W --jobs J --hold-ms H
//!     --lease-ms T --start-at-ms S [--announce]
//! ```
//!
//! Every contract flag can also come from its environment variable (`SEM_REDIS_URL`,
//! `SEM_NAME`, `SEM_LIMIT`, `SEM_WORKERS`, `SEM_JOBS`, `SEM_HOLD_MS`, `SEM_LEASE_MS`,
//! `SEM_START_AT_MS`, `SEM_ANNOUNCE`; and `SEM_DESIGN`, `SEM_THREADS`, `SEM_SEMAPHORES`);
//! flags win. `--threads 0` (default) runs
//! the tasks on a single-threaded tokio runtime, like the Python (asyncio) and Node peers;
//! `--threads N` uses a multi-threaded one.
//!
//! Behaviour: connect and set up (scripts, subscription) before `start-at`, sleep until it
//! (report lateness in the summary's `late_ms`), run W tasks that take jobs from a
//! process-local counter: `req` = now; acquire (a failed attempt is logged to stderr, counted
//! in `errors` and retried: at once when the waiter's own queue entry expired, after 10 ms on a
//! Redis/library error; `wait_ms` runs from the first attempt); `acq` = now; with `--announce`
//! print `{"event":"acquired","acq_ns":..}`; sleep `hold-ms` from `acq` (skipped when 0; precise
//! to tens of microseconds, see [`crate::hold`], where tokio's timer alone would add ~1 ms); `rel` = now;
//! `release().await` (so `done_ns` is after the release round trip); `done` = now; print the job
//! line. Every line goes through a locked stdout and is flushed; timestamps are integer
//! CLOCK_REALTIME nanoseconds. Then one summary line and exit 0.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::designs::{AcquireError, DesignKind, Params, Permit, Semaphore};

/// Command-line (and environment) of the worker mode.
#[derive(Clone, Debug, clap::Args)]
pub struct WorkerArgs {
    /// Which semaphore design to run.
    #[arg(long, env = "SEM_DESIGN", value_enum)]
    pub design: DesignKind,
    /// Redis URL, e.g. redis://127.0.0.1:16379/0.
    #[arg(long, env = "SEM_REDIS_URL")]
    pub redis_url: String,
    /// Semaphore name; keys derive from it.
    #[arg(long, env = "SEM_NAME", default_value = "bench")]
    pub name: String,
    /// Maximum simultaneous holders across all processes.
    #[arg(long, env = "SEM_LIMIT", default_value_t = 5)]
    pub limit: u32,
    /// Concurrent tasks in this process.
    #[arg(long, env = "SEM_WORKERS", default_value_t = 10)]
    pub workers: u32,
    /// Jobs this process performs in total (shared by its tasks).
    #[arg(long, env = "SEM_JOBS", default_value_t = 200)]
    pub jobs: i64,
    /// How long each job holds its slot, ms (may be fractional; 0 = no sleep).
    #[arg(long, env = "SEM_HOLD_MS", default_value_t = 20.0)]
    pub hold_ms: f64,
    /// Lease / TTL in ms for designs that have one.
    #[arg(long, env = "SEM_LEASE_MS", default_value_t = 5000)]
    pub lease_ms: u64,
    /// Wall-clock epoch ms at which all tasks begin; 0 = at once.
    #[arg(long, env = "SEM_START_AT_MS", default_value_t = 0)]
    pub start_at_ms: u64,
    /// Also print an `acquired` event line the moment each acquisition succeeds.
    #[arg(long, env = "SEM_ANNOUNCE", action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::FalseyValueParser::new())]
    pub announce: bool,
    /// Runtime threads: 0 = single-threaded tokio runtime (default), N = multi-threaded.
    #[arg(long, env = "SEM_THREADS", default_value_t = 0)]
    pub threads: usize,
    /// Semaphores (not in the contract): with K > 1 the process opens `NAME-0` ..
    /// `NAME-<K-1>`, each with the limit, and task `i` uses semaphore `i mod K`.
    #[arg(long, env = "SEM_SEMAPHORES", default_value_t = 1)]
    pub semaphores: u32,
    /// `redsem` only (not in the contract): grants wait until this many replicas have them
    /// (the library's synced mode, 1 s timeout); 0 = off.
    #[arg(long, env = "SEM_SYNCED_REPLICAS", default_value_t = 0)]
    pub synced_replicas: u32,
}

/// CLOCK_REALTIME now, epoch nanoseconds.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Writes one JSON line to a locked stdout and flushes it. A closed stdout ends the process
/// (nobody is listening any more).
pub fn emit(line: &serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let ok = serde_json::to_writer(&mut out, line).is_ok()
        && out.write_all(b"\n").is_ok()
        && out.flush().is_ok();
    if !ok {
        std::process::exit(141);
    }
}

/// Runs the worker to completion (the `worker` sub-command).
pub fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let mut builder = if args.threads == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(args.threads);
        b
    };
    let rt = builder.enable_all().build()?;
    rt.block_on(run_async(args))
}

/// What one task needs to run its jobs.
struct Job {
    sem: Arc<Semaphore>,
    wid: u32,
    hold: Duration,
    announce: bool,
    errors_total: Arc<AtomicU64>,
    release_errors: Arc<AtomicU64>,
}

impl Job {
    /// One job: acquire (retrying errors), hold, release, report. Built from combinators so
    /// that a waiting task carries only the acquire's state, not the holding phase's (the
    /// `memory` scenario measures the cost of a waiting task): the holding phase is a
    /// separate allocation that exists only once the permit is granted.
    fn run(&self) -> impl std::future::Future<Output = ()> + Send + '_ {
        use futures_util::FutureExt as _;
        let req_ns = now_ns();
        self.acquire()
            .then(move |(permit, errors)| Box::pin(self.hold_and_release(permit, errors, req_ns)))
    }

    /// Acquires, retrying errors; returns the permit and the number of errors.
    async fn acquire(&self) -> (Permit, u64) {
        let mut errors = 0u64;
        loop {
            let retry_later = match self.sem.acquire().await {
                Ok(p) => return (p, errors),
                Err(e) => {
                    errors += 1;
                    self.errors_total.fetch_add(1, Ordering::Relaxed);
                    eprintln!(
                        "{}",
                        json!({"event": "acquire_error", "worker": self.wid, "error": e.to_string()})
                    );
                    !matches!(e, AcquireError::LeaseExpired)
                }
            };
            if retry_later {
                // boxed: the timer is not carried by every waiting task
                Box::pin(tokio::time::sleep(Duration::from_millis(10))).await;
            }
        }
    }

    async fn hold_and_release(&self, permit: Permit, errors: u64, req_ns: u64) {
        let acquired = tokio::time::Instant::now();
        let acq_ns = now_ns();
        if self.announce {
            emit(&json!({"event": "acquired", "acq_ns": acq_ns}));
        }
        if !self.hold.is_zero() {
            // to the microsecond, counted from the grant (the announce line included)
            crate::hold::until(acquired + self.hold).await;
        }
        let rel_ns = now_ns();
        if let Err(e) = self.sem.release(permit).await {
            self.release_errors.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "{}",
                json!({"event": "release_error", "worker": self.wid, "error": format!("{e:#}")})
            );
        }
        let done_ns = now_ns();
        let mut line = json!({
            "wait_ms": (acq_ns - req_ns) as f64 / 1e6,
            "acq_ns": acq_ns,
            "rel_ns": rel_ns,
            "req_ns": req_ns,
            "done_ns": done_ns,
            "worker": self.wid,
        });
        if errors > 0 {
            line["errors"] = json!(errors);
        }
        emit(&line);
    }
}

async fn run_async(a: WorkerArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.limit >= 1, "--limit must be >= 1");
    anyhow::ensure!(a.workers >= 1, "--workers must be >= 1");
    anyhow::ensure!(a.semaphores >= 1, "--semaphores must be >= 1");
    anyhow::ensure!(
        a.hold_ms >= 0.0 && a.hold_ms.is_finite(),
        "--hold-ms must be >= 0"
    );
    let params = Params {
        redis_url: a.redis_url.clone(),
        name: a.name.clone(),
        limit: a.limit,
        lease_ms: a.lease_ms,
        synced_replicas: a.synced_replicas,
    };
    let sems: Vec<Arc<Semaphore>> = Semaphore::open_many(a.design, &params, a.semaphores)
        .await?
        .into_iter()
        .map(Arc::new)
        .collect();

    // sleep until the shared wall-clock start
    let mut late_ms = 0.0;
    if a.start_at_ms > 0 {
        let start_ns = a.start_at_ms.saturating_mul(1_000_000);
        let now = now_ns();
        if start_ns > now {
            tokio::time::sleep(Duration::from_nanos(start_ns - now)).await;
        } else {
            late_ms = (now - start_ns) as f64 / 1e6;
        }
    }

    let remaining = Arc::new(AtomicI64::new(a.jobs));
    let errors_total = Arc::new(AtomicU64::new(0));
    let release_errors = Arc::new(AtomicU64::new(0));
    let hold = Duration::from_secs_f64(a.hold_ms / 1000.0);
    let mut tasks = tokio::task::JoinSet::new();
    for wid in 0..a.workers {
        let job = Job {
            sem: sems[wid as usize % sems.len()].clone(),
            wid,
            hold,
            announce: a.announce,
            errors_total: errors_total.clone(),
            release_errors: release_errors.clone(),
        };
        let remaining = remaining.clone();
        tasks.spawn(async move {
            while remaining.fetch_sub(1, Ordering::SeqCst) > 0 {
                job.run().await;
            }
        });
    }
    while let Some(res) = tasks.join_next().await {
        res?;
    }
    emit(&json!({"summary": {
        "impl": format!("rust/{}", a.design.name()),
        "jobs": a.jobs,
        "errors": errors_total.load(Ordering::Relaxed),
        "release_errors": release_errors.load(Ordering::Relaxed),
        "late_ms": (late_ms * 1000.0).round() / 1000.0,
        "pid": std::process::id(),
    }}));
    for sem in sems {
        if let Ok(sem) = Arc::try_unwrap(sem) {
            sem.close().await;
        }
    }
    Ok(())
}

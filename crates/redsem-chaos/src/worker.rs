//! One worker process: `tasks` loops that acquire a permit of a random semaphore, hold it
//! while making fenced "writes" to the runner's resource, and release it.
//!
//! Its log, `w<id>.log`, has one line per event (times in µs of `CLOCK_REALTIME`):
//!
//! | line | meaning |
//! |---|---|
//! | `start <t> <pid> <client_id>` | connected; holder ids of this process start with `<client_id>.` |
//! | `begin <t> <op> <sem> <n> <hold_ms> <mode> <style>` | about to acquire (mode `wait`, `timeout:<ms>` or `try`); the work runs under `Permit::run` (`run`) or in a `select!` with `Permit::lost` (`select`) |
//! | `acq <t> <op> <holder_id> <ticket> <slot:gen,...>` | the acquire returned this permit |
//! | `fail <t> <op> <why>` | the acquire failed (timeout, no permits, Redis unreachable, stop) |
//! | `lost <t> <op> <reason>` | the permit was reported lost (`NotHolder`, `Unreachable`) |
//! | `cancel <t> <op>` | the guarded work was dropped before it finished |
//! | `done <t> <op> <ok or rejected>` | the work finished (or stopped at a rejected write) |
//! | `rel <t> <op> <ok, err, drop or bg>` | how the permit was given back |
//! | `stall <t0> <t1>` | no timer of this process fired from `t0` to `t1` (paused or starved) |
//! | `stop <t>` | graceful exit |
//!
//! The holder believes it holds the permit from `acq` to the first of `done`, `cancel`,
//! `lost` (or the process's death).
//!
//! Messages to the runner's resource, one line each on a Unix socket: `H <worker> <task>`
//! (hello), `B <op> <sem>` (waiting), `A <op> <sem> <begin> <acq> <holder_id>
//! <slot:gen,...>` (holding), `W <seq> <op> <slot> <gen> <sent>` (a write; the reply is
//! `<seq> <A|R|X>`: accepted, rejected by the fence, or refused because the Redis incarnation
//! of the grant is unknown), `E <op>` (done with it).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use redsem::{Error, Fence, Permit, Semaphore};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::events::Log;
use crate::now_us;

/// Arguments of the hidden `worker` subcommand (set by the runner).
#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// Worker id (unique in the run).
    #[arg(long)]
    pub id: u32,
    /// Redis URL (the worker slot's proxy).
    #[arg(long)]
    pub url: String,
    /// The run's directory (config.json, resource.sock, the logs).
    #[arg(long)]
    pub dir: PathBuf,
    /// Seed of this worker's choices.
    #[arg(long)]
    pub seed: u64,
}

struct Ctx {
    id: u32,
    cfg: Config,
    sems: Vec<Semaphore>,
    log: Arc<Log>,
    stop: CancellationToken,
    dir: PathBuf,
    seed: u64,
}

/// Runs one worker process until SIGTERM.
///
/// # Errors
/// An unreadable configuration or log file.
pub fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let cfg: Config = serde_json::from_slice(
        &std::fs::read(args.dir.join("config.json")).context("reading config.json")?,
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(main(args, cfg))
}

async fn main(args: WorkerArgs, cfg: Config) -> anyhow::Result<()> {
    let log = Arc::new(Log::direct(&args.dir.join(format!("w{}.log", args.id)))?);
    let stop = CancellationToken::new();
    {
        let stop = stop.clone();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::spawn(async move {
            term.recv().await;
            stop.cancel();
        });
    }
    tokio::spawn(stall_watch(log.clone(), cfg.stall_ms));
    let lease = cfg.lease();
    let client = loop {
        let built = redsem::Client::builder(&args.url)
            .prefix(crate::config::PREFIX)
            .scripts_only(cfg.scripts_only)
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1))
            .build()
            .await;
        match built {
            Ok(c) => break c,
            Err(e) => {
                log.line(&format!("fail {} connect {}", now_us(), why(&e)));
                if stop.is_cancelled() {
                    log.line(&format!("stop {}", now_us()));
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    log.line(&format!(
        "start {} {} {}",
        now_us(),
        std::process::id(),
        client.id()
    ));
    let mut sems = Vec::new();
    for spec in &cfg.sems {
        let sem = loop {
            let opened = client
                .semaphore(&spec.name, spec.limit)
                .lease(lease)
                .renew_every(Duration::from_millis(cfg.renew_ms))
                .fallback_poll(Duration::from_millis(cfg.fallback_ms))
                .label(format!("chaos-w{}", args.id))
                .open()
                .await;
            match opened {
                Ok(s) => break s,
                Err(e) => {
                    log.line(&format!("fail {} open {}", now_us(), why(&e)));
                    if stop.is_cancelled() {
                        log.line(&format!("stop {}", now_us()));
                        return Ok(());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        sems.push(sem);
    }
    let ctx = Arc::new(Ctx {
        id: args.id,
        sems,
        log: log.clone(),
        stop: stop.clone(),
        dir: args.dir.clone(),
        seed: args.seed,
        cfg,
    });
    let tasks: Vec<_> = (0..ctx.cfg.tasks)
        .map(|t| tokio::spawn(task(ctx.clone(), t)))
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    // hand the releases of dropped permits to Redis before exiting
    let _ = tokio::time::timeout(Duration::from_secs(3), client.flush_releases()).await;
    log.line(&format!("stop {}", now_us()));
    Ok(())
}

/// A short, space-free description of an error for the log.
fn why(e: &Error) -> String {
    let s = match e {
        Error::Timeout { .. } => "timeout".to_owned(),
        Error::NoPermits { .. } => "no-permits".to_owned(),
        Error::Unreachable(_) => "unreachable".to_owned(),
        Error::Closed { .. } => "closed".to_owned(),
        other => format!("other:{other}"),
    };
    s.split_whitespace().collect::<Vec<_>>().join("_")
}

/// Logs the stretches during which no timer of this process fired (SIGSTOP, starvation):
/// the library's heartbeat could not run either.
async fn stall_watch(log: Arc<Log>, stall_ms: u64) {
    let period = Duration::from_millis(5);
    let threshold = Duration::from_millis(stall_ms);
    let mut last = tokio::time::Instant::now();
    let mut last_us = now_us();
    loop {
        tokio::time::sleep(period).await;
        let now = tokio::time::Instant::now();
        let now_real = now_us();
        let late = now.saturating_duration_since(last + period);
        if late > threshold {
            log.line(&format!(
                "stall {} {}",
                last_us + period.as_micros() as i64,
                now_real
            ));
        }
        last = now;
        last_us = now_real;
    }
}

/// The connection of one task to the runner's resource.
struct Resource {
    w: OwnedWriteHalf,
    r: BufReader<OwnedReadHalf>,
    seq: u64,
}

impl Resource {
    async fn connect(ctx: &Ctx, task: u32) -> std::io::Result<Resource> {
        let s = UnixStream::connect(ctx.dir.join("resource.sock")).await?;
        let (r, w) = s.into_split();
        let mut res = Resource {
            w,
            r: BufReader::new(r),
            seq: 0,
        };
        res.send(&format!("H {} {task}", ctx.id)).await;
        Ok(res)
    }

    async fn send(&mut self, line: &str) {
        let mut buf = line.as_bytes().to_vec();
        buf.push(b'\n');
        let _ = self.w.write_all(&buf).await;
    }

    /// A fenced write: `Some(true)` accepted, `Some(false)` rejected; `None` refused for an
    /// unknown Redis incarnation, or no answer.
    async fn write(&mut self, op: &str, f: Fence) -> Option<bool> {
        self.seq += 1;
        let seq = self.seq;
        self.send(&format!(
            "W {seq} {op} {} {} {}",
            f.slot,
            f.generation,
            now_us()
        ))
        .await;
        let mut line = String::new();
        loop {
            line.clear();
            if self.r.read_line(&mut line).await.ok()? == 0 {
                return None;
            }
            let mut it = line.split_whitespace();
            // replies to writes abandoned by a cancelled work are skipped
            if it.next()?.parse::<u64>().ok()? != seq {
                continue;
            }
            return match it.next()? {
                "A" => Some(true),
                "R" => Some(false),
                _ => None,
            };
        }
    }
}

/// Logs `cancel` if the work is dropped before it finished.
struct WorkGuard {
    log: Arc<Log>,
    op: String,
    finished: bool,
}

impl Drop for WorkGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.log.line(&format!("cancel {} {}", now_us(), self.op));
        }
    }
}

#[derive(Clone, Copy)]
enum Mode {
    Wait,
    Timeout(Duration),
    Try,
}

fn pick_hold(rng: &mut fastrand::Rng, lease_ms: u64) -> u64 {
    let r = rng.f64();
    if r < 0.55 {
        rng.u64(0..5)
    } else if r < 0.90 {
        rng.u64(5..40)
    } else if r < 0.97 {
        rng.u64(40..200)
    } else {
        // longer than the lease: only the renewals keep the permit
        rng.u64(lease_ms * 6 / 5..lease_ms * 3)
    }
}

async fn task(ctx: Arc<Ctx>, t: u32) {
    let mut rng =
        fastrand::Rng::with_seed(ctx.seed ^ (u64::from(t) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut res = loop {
        match Resource::connect(&ctx, t).await {
            Ok(r) => break r,
            Err(_) if ctx.stop.is_cancelled() => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let total_weight: u32 = ctx.cfg.sems.iter().map(|s| s.weight).sum();
    let mut k = 0u64;
    while !ctx.stop.is_cancelled() {
        k += 1;
        let op = format!("{}.{t}.{k}", ctx.id);
        let mut pick = rng.u32(0..total_weight);
        let si = ctx
            .cfg
            .sems
            .iter()
            .position(|s| {
                if pick < s.weight {
                    true
                } else {
                    pick -= s.weight;
                    false
                }
            })
            .unwrap_or(0);
        let spec = &ctx.cfg.sems[si];
        let n = rng.u32(1..=spec.max_n.min(spec.limit));
        let hold_ms = pick_hold(&mut rng, ctx.cfg.lease_ms);
        let r = rng.f64();
        let mode = if r < 0.7 {
            Mode::Wait
        } else if r < 0.9 {
            Mode::Timeout(Duration::from_millis(rng.u64(20..1000)))
        } else {
            Mode::Try
        };
        let use_run = rng.f64() < 0.6;
        // a quarter of the acquisitions carry a priority class (the checker's `fifo` orders
        // grants by place, which the class moves)
        let priority = if rng.f64() < 0.25 { rng.u8(1..=3) } else { 0 };
        let mode_name = match mode {
            Mode::Wait => "wait".to_owned(),
            Mode::Timeout(d) => format!("timeout:{}", d.as_millis()),
            Mode::Try => "try".to_owned(),
        };
        let style = if use_run { "run" } else { "select" };
        ctx.log.line(&format!(
            "begin {} {op} {si} {n} {hold_ms} {mode_name} {style}",
            now_us()
        ));
        res.send(&format!("B {op} {si}")).await;
        let begin = now_us();
        let sem = &ctx.sems[si];
        let options = redsem::AcquireOptions::new().permits(n).priority(priority);
        let acquire = sem.acquire_with(match mode {
            Mode::Wait => options,
            Mode::Timeout(d) => options.timeout(d),
            Mode::Try => options.try_only(true),
        });
        let acquired = tokio::select! {
            _ = ctx.stop.cancelled() => {
                ctx.log.line(&format!("fail {} {op} stopped", now_us()));
                res.send(&format!("E {op}")).await;
                break;
            }
            r = acquire => r,
        };
        match acquired {
            Err(e) => {
                ctx.log.line(&format!("fail {} {op} {}", now_us(), why(&e)));
                res.send(&format!("E {op}")).await;
                let pause = match e {
                    Error::NoPermits { .. } => rng.u64(5..30),
                    Error::Timeout { .. } => rng.u64(0..10),
                    _ => rng.u64(20..100),
                };
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            Ok(permit) => {
                hold(
                    &ctx, &mut res, &mut rng, &op, si, begin, permit, hold_ms, use_run,
                )
                .await;
                res.send(&format!("E {op}")).await;
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn hold(
    ctx: &Ctx,
    res: &mut Resource,
    rng: &mut fastrand::Rng,
    op: &str,
    si: usize,
    begin: i64,
    permit: Permit,
    hold_ms: u64,
    use_run: bool,
) {
    let acq = now_us();
    let fences: Vec<Fence> = permit.fences().to_vec();
    let fences_txt = fences
        .iter()
        .map(|f| format!("{}:{}", f.slot, f.generation))
        .collect::<Vec<_>>()
        .join(",");
    ctx.log.line(&format!(
        "acq {acq} {op} {} {} {fences_txt}",
        permit.holder_id(),
        permit.ticket()
    ));
    res.send(&format!(
        "A {op} {si} {begin} {acq} {} {fences_txt}",
        permit.holder_id()
    ))
    .await;
    let writes = 1 + (hold_ms / 25).min(4);
    let gap = Duration::from_millis(hold_ms / writes);
    let guard = WorkGuard {
        log: ctx.log.clone(),
        op: op.to_owned(),
        finished: false,
    };
    let log = ctx.log.clone();
    let op_owned = op.to_owned();
    let work = async move {
        // the whole guard moves in (not just the field written below): dropping the work
        // drops it
        let mut guard = guard;
        let mut rejected = false;
        'writes: for _ in 0..writes {
            for &f in &fences {
                if res.write(&op_owned, f).await == Some(false) {
                    rejected = true;
                    break 'writes;
                }
            }
            tokio::time::sleep(gap).await;
        }
        guard.finished = true;
        let how = if rejected { "rejected" } else { "ok" };
        log.line(&format!("done {} {op_owned} {how}", now_us()));
    };
    if use_run {
        match permit.run(work).await {
            Ok(()) => {}
            Err(Error::LeaseLost { reason, .. }) => {
                ctx.log
                    .line(&format!("lost {} {op} {}", now_us(), reason_name(reason)));
            }
            Err(e) => ctx
                .log
                .line(&format!("fail {} {op} run:{}", now_us(), why(&e))),
        }
        ctx.log.line(&format!("rel {} {op} bg", now_us()));
        return;
    }
    let lost = permit.lost();
    let reason = tokio::select! {
        biased;
        reason = lost => Some(reason),
        _ = work => None,
    };
    if let Some(reason) = reason {
        ctx.log
            .line(&format!("lost {} {op} {}", now_us(), reason_name(reason)));
        drop(permit);
        ctx.log.line(&format!("rel {} {op} bg", now_us()));
    } else if rng.bool() {
        let how = match permit.release().await {
            Ok(()) => "ok",
            Err(_) => "err",
        };
        ctx.log.line(&format!("rel {} {op} {how}", now_us()));
    } else {
        drop(permit);
        ctx.log.line(&format!("rel {} {op} drop", now_us()));
    }
}

fn reason_name(r: redsem::LostReason) -> &'static str {
    match r {
        redsem::LostReason::NotHolder => "NotHolder",
        redsem::LostReason::Unreachable => "Unreachable",
        redsem::LostReason::Refused => "Refused",
        redsem::LostReason::Deleted => "Deleted",
        _ => "Other",
    }
}

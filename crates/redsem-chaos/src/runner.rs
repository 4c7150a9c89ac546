//! The runner: a private Redis, one [`ClientProxy`] per worker slot, the worker processes
//! (replaced when killed), the fenced resource, the snapshotter, and the fault schedule.
//!
//! `runner.log` (times in µs of `CLOCK_REALTIME`):
//!
//! | line | meaning |
//! |---|---|
//! | `phase <t> <name>` | `start`, `faults` (injection starts), `calm` (injection stopped, every fault healed), `stop` (SIGTERM to the workers), `exited` |
//! | `spawn <t> <worker> <slot> <pid>` | a worker process started in a slot (behind that slot's proxy) |
//! | `exit <t> <worker> <how>` | it exited: `killed` (by a fault), `ok`, `code:<n>`, `signal:<n>`, `hung` (SIGKILLed at the end) |
//! | `fault <t0> <t1> <kind> <slot> <worker> <detail>` | a fault, from its start to its end (`-` where not applicable) |
//! | `restart <start> <dead> <ready>` | Redis killed at `start`, gone at `dead`, answering again (empty) at `ready` |
//! | `hold <t> <worker> <op> <sem> <epoch>` | a holder registered with the resource; `epoch` is the Redis incarnation of its grant (`?` unknown) |
//! | `write <t> <worker> <op> <sem> <slot> <epoch> <gen> <sent> <A/R/X>` | a fenced write and the resource's decision |
//!
//! The resource keeps, per semaphore and slot, the highest `(epoch, generation)` it has seen,
//! and rejects a write that carries a lower one. The epoch stands in for what a fence record
//! that survives a Redis data loss would provide (see the README's "Guarantees"); a grant whose
//! acquire overlapped a restart has an unknown epoch, and its writes are refused (`X`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use test_support::{Flavor, Server, ServerOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, FaultKind};
use crate::events::Log;
use crate::now_us;
use crate::proxy::{Class, ClientProxy};

/// The Redis incarnation that served a request sent at `from` and answered by `to`:
/// the number of restarts that were over (`dead`) before `from`, or `None` when a restart
/// (from its `start` to its `dead`) overlaps `[from, to]`. `restarts` is in start order,
/// `dead = i64::MAX` while unknown.
pub fn epoch_of(restarts: &[(i64, i64)], from: i64, to: i64) -> Option<u32> {
    let mut epoch = 0;
    for &(start, dead) in restarts {
        if to < start {
            break;
        }
        if from > dead {
            epoch += 1;
            continue;
        }
        return None;
    }
    Some(epoch)
}

#[derive(Default)]
struct WorkerState {
    id: u32,
    pid: u32,
    paused: bool,
    killing: bool,
    /// op → (semaphore, holder id)
    holding: BTreeMap<String, (usize, String)>,
    waiting: HashSet<String>,
}

#[derive(Default)]
struct ResourceState {
    /// op → (semaphore, epoch of its grant)
    ops: HashMap<String, (usize, Option<u32>)>,
    /// (semaphore, slot) → highest (epoch, generation) seen
    table: HashMap<(usize, u32), (u32, u64)>,
}

struct Shared {
    cfg: Config,
    dir: PathBuf,
    log: Log,
    restarts: Mutex<Vec<(i64, i64)>>,
    slots: Mutex<Vec<Option<WorkerState>>>,
    resource: Mutex<ResourceState>,
    respawn: AtomicBool,
    next_worker: AtomicU32,
    acquisitions: AtomicU64,
    faults: AtomicU64,
    /// An operator's redsem client, on a direct connection (for `force-release`).
    operator: tokio::sync::Mutex<Option<redsem::Client>>,
    /// A direct connection, to tell which Redis incarnation holds a grant whose acquire
    /// overlapped a restart.
    direct: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
    redis_url: String,
}

impl Shared {
    fn with_worker<R>(&self, id: u32, f: impl FnOnce(&mut WorkerState) -> R) -> Option<R> {
        let mut slots = self.slots.lock().unwrap();
        slots.iter_mut().flatten().find(|w| w.id == id).map(f)
    }
}

/// Starts everything, runs the faults for `cfg.seconds`, stops the workers, records the
/// state Redis is left in, and writes every log into `dir`.
///
/// # Errors
/// When the server, the proxies or the socket cannot be set up.
pub async fn execute(cfg: &Config, dir: &Path) -> anyhow::Result<()> {
    let flavor = match cfg.flavor.as_str() {
        "valkey" => Flavor::Valkey,
        _ => Flavor::Redis,
    };
    let server = tokio::task::spawn_blocking(move || {
        // test-support's servers persist nothing: a restart loses everything
        Server::start_with(flavor, ServerOptions::default())
    })
    .await
    .context("starting the server")?;
    let redis_addr = server.addr();
    let redis_url = server.url();
    let server = Arc::new(Mutex::new(server));

    let shared = Arc::new(Shared {
        cfg: cfg.clone(),
        dir: dir.to_owned(),
        log: Log::buffered(&dir.join("runner.log"))?,
        restarts: Mutex::new(Vec::new()),
        slots: Mutex::new((0..cfg.workers).map(|_| None).collect()),
        resource: Mutex::new(ResourceState::default()),
        respawn: AtomicBool::new(true),
        next_worker: AtomicU32::new(0),
        acquisitions: AtomicU64::new(0),
        faults: AtomicU64::new(0),
        operator: tokio::sync::Mutex::new(None),
        direct: tokio::sync::Mutex::new(None),
        redis_url: redis_url.clone(),
    });
    shared.log.line(&format!("phase {} start", now_us()));

    let sock = dir.join("resource.sock");
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).context("binding resource.sock")?;
    let resource_task = tokio::spawn(resource_server(listener, shared.clone()));

    let snap_stop = CancellationToken::new();
    let snap_task = {
        let (url, cfg, path, stop) = (
            redis_url.clone(),
            cfg.clone(),
            dir.join("snapshots.log"),
            snap_stop.clone(),
        );
        tokio::spawn(async move { crate::snapshot::run(url, cfg, &path, stop).await })
    };

    let mut proxies = Vec::new();
    for _ in 0..cfg.workers {
        proxies.push(Arc::new(ClientProxy::start(redis_addr).await?));
    }
    let proxies = Arc::new(proxies);

    let mut supervisors = JoinSet::new();
    for slot in 0..cfg.workers as usize {
        supervisors.spawn(supervise(shared.clone(), slot, proxies[slot].url()));
    }

    // let every worker connect before the first fault
    tokio::time::sleep(Duration::from_millis(1500)).await;
    shared.log.line(&format!("phase {} faults", now_us()));
    let started = Instant::now();
    let until = started + Duration::from_secs(cfg.seconds);
    let stop_faults = CancellationToken::new();
    let scheduler = tokio::spawn(schedule(
        shared.clone(),
        proxies.clone(),
        server.clone(),
        stop_faults.clone(),
    ));
    let mut progress = tokio::time::interval(Duration::from_secs(10));
    progress.tick().await;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(until.into()) => break,
            _ = progress.tick() => {
                eprintln!(
                    "redsem-chaos: {:>4}s  {} acquisitions, {} faults",
                    started.elapsed().as_secs(),
                    shared.acquisitions.load(Ordering::Relaxed),
                    shared.faults.load(Ordering::Relaxed)
                );
            }
        }
    }
    stop_faults.cancel();
    let mut in_flight = scheduler.await.unwrap_or_default();
    while in_flight.join_next().await.is_some() {}
    for p in proxies.iter() {
        p.heal();
    }
    shared.log.line(&format!("phase {} calm", now_us()));
    // a few seconds without faults: what the faults broke must heal
    tokio::time::sleep(Duration::from_secs(2)).await;

    shared.respawn.store(false, Ordering::SeqCst);
    shared.log.line(&format!("phase {} stop", now_us()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !supervisors.is_empty() {
        for w in shared.slots.lock().unwrap().iter().flatten() {
            signal(
                w.pid,
                if Instant::now() < deadline {
                    libc::SIGTERM
                } else {
                    libc::SIGKILL
                },
            );
        }
        if Instant::now() >= deadline {
            for w in shared.slots.lock().unwrap().iter_mut().flatten() {
                w.killing = true; // reported as `hung`
            }
        }
        tokio::select! {
            _ = supervisors.join_next() => {}
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
    shared.log.line(&format!("phase {} exited", now_us()));
    let exited_at = now_us();
    // the snapshots go on a little: the checker sees the last releases land
    tokio::time::sleep(Duration::from_millis(300)).await;
    snap_stop.cancel();
    let _ = snap_task.await;
    drop(proxies);
    resource_task.abort();
    *shared.direct.lock().await = None;
    *shared.operator.lock().await = None;

    let final_state = final_state(cfg, &redis_url, exited_at).await;
    std::fs::write(
        dir.join("final.json"),
        serde_json::to_vec_pretty(&final_state)?,
    )?;
    shared.log.flush();
    let server = server.clone();
    tokio::task::spawn_blocking(move || server.lock().unwrap().stop()).await?;
    Ok(())
}

fn signal(pid: u32, sig: libc::c_int) {
    if pid > 0 {
        // SAFETY: kill(2) has no memory-safety preconditions. The pid is a worker of ours,
        // taken from the slot table, which its supervisor clears right after reaping it: in
        // that instant the pid could only reach another process if Linux recycled it at
        // once, which its sequential allocation (up to pid_max) does not do.
        unsafe { libc::kill(pid as libc::pid_t, sig) };
    }
}

/// Runs worker processes in one slot, replacing each one that dies, until the stop phase.
async fn supervise(shared: Arc<Shared>, slot: usize, url: String) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut rng = fastrand::Rng::with_seed(shared.cfg.seed ^ (slot as u64 + 1) << 20);
    while shared.respawn.load(Ordering::SeqCst) {
        let id = shared.next_worker.fetch_add(1, Ordering::SeqCst);
        let seed = shared.cfg.seed ^ (u64::from(id) + 1).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        let stderr = std::fs::File::create(shared.dir.join(format!("w{id}.err")))
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null());
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("worker")
            .args([
                "--id",
                &id.to_string(),
                "--url",
                &url,
                "--seed",
                &seed.to_string(),
            ])
            .arg("--dir")
            .arg(&shared.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true);
        // SAFETY: the hook only calls prctl, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("redsem-chaos: cannot start a worker: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let pid = child.id().unwrap_or(0);
        shared.slots.lock().unwrap()[slot] = Some(WorkerState {
            id,
            pid,
            ..WorkerState::default()
        });
        shared
            .log
            .line(&format!("spawn {} {id} {slot} {pid}", now_us()));
        let status = child.wait().await;
        let t = now_us();
        let killing = shared.slots.lock().unwrap()[slot]
            .take()
            .is_some_and(|w| w.killing);
        let how = match status {
            _ if killing && shared.respawn.load(Ordering::SeqCst) => "killed".to_owned(),
            _ if killing => "hung".to_owned(),
            Ok(s) if s.success() => "ok".to_owned(),
            Ok(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
                (Some(c), _) => format!("code:{c}"),
                (_, Some(sig)) => format!("signal:{sig}"),
                _ => "unknown".to_owned(),
            },
            Err(_) => "unknown".to_owned(),
        };
        shared.log.line(&format!("exit {t} {id} {how}"));
        if shared.respawn.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(rng.u64(20..300))).await;
        }
    }
}

async fn resource_server(listener: UnixListener, shared: Arc<Shared>) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(resource_conn(stream, shared.clone()));
    }
}

async fn resource_conn(stream: UnixStream, shared: Arc<Shared>) {
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    let mut worker = u32::MAX;
    while let Ok(Some(line)) = lines.next_line().await {
        let f: Vec<&str> = line.split(' ').collect();
        match (f[0], f.len()) {
            ("H", 3) => worker = f[1].parse().unwrap_or(u32::MAX),
            ("B", 3) => {
                shared.with_worker(worker, |ws| ws.waiting.insert(f[1].to_owned()));
            }
            ("A", 7) => {
                let sem: usize = f[2].parse().unwrap_or(0);
                let begin: i64 = f[3].parse().unwrap_or(0);
                let acq: i64 = f[4].parse().unwrap_or(i64::MAX);
                let mut epoch = epoch_of(&shared.restarts.lock().unwrap(), begin, acq);
                if epoch.is_none() {
                    epoch = incarnation_holding(&shared, sem, f[5]).await;
                }
                shared
                    .resource
                    .lock()
                    .unwrap()
                    .ops
                    .insert(f[1].to_owned(), (sem, epoch));
                shared.acquisitions.fetch_add(1, Ordering::Relaxed);
                let e = epoch.map_or("?".to_owned(), |e| e.to_string());
                shared
                    .log
                    .line(&format!("hold {} {worker} {} {sem} {e}", now_us(), f[1]));
                shared.with_worker(worker, |ws| {
                    ws.waiting.remove(f[1]);
                    ws.holding.insert(f[1].to_owned(), (sem, f[5].to_owned()));
                });
            }
            ("W", 6) => {
                let (seq, op) = (f[1], f[2]);
                let slot: u32 = f[3].parse().unwrap_or(u32::MAX);
                let generation: u64 = f[4].parse().unwrap_or(0);
                let sent = f[5];
                let decision = {
                    let mut res = shared.resource.lock().unwrap();
                    let known = res.ops.get(op).copied();
                    let (sem, epoch, d) = match known {
                        Some((sem, Some(e))) => {
                            let key = (sem, slot);
                            let ok = res.table.get(&key).is_none_or(|&c| (e, generation) >= c);
                            if ok {
                                res.table.insert(key, (e, generation));
                            }
                            (sem, e.to_string(), if ok { 'A' } else { 'R' })
                        }
                        Some((sem, None)) => (sem, "?".to_owned(), 'X'),
                        None => (usize::MAX, "?".to_owned(), 'X'),
                    };
                    // logged under the resource lock: the log order is the decision order
                    shared.log.line(&format!(
                        "write {} {worker} {op} {sem} {slot} {epoch} {generation} {sent} {d}",
                        now_us()
                    ));
                    d
                };
                let _ = w.write_all(format!("{seq} {decision}\n").as_bytes()).await;
            }
            ("E", 2) => {
                shared.resource.lock().unwrap().ops.remove(f[1]);
                shared.with_worker(worker, |ws| {
                    ws.waiting.remove(f[1]);
                    ws.holding.remove(f[1]);
                });
            }
            _ => {}
        }
    }
}

/// An operator's `force_release` of `holder`: `true` (removed), `false` (already gone) or
/// `error` (Redis down or asleep: it may still have happened).
async fn force_release(shared: &Shared, name: &str, holder: &str) -> String {
    let mut op = shared.operator.lock().await;
    if op.is_none() {
        let built = redsem::Client::builder(shared.redis_url.as_str())
            .prefix(crate::config::PREFIX)
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(2))
            .build()
            .await;
        match built {
            Ok(c) => *op = Some(c),
            Err(_) => return "error".into(),
        }
    }
    let Some(client) = op.as_ref() else {
        return "error".into();
    };
    match client.force_release_existing(name, holder).await {
        Ok(existed) => existed.to_string(),
        Err(_) => "error".into(),
    }
}

/// For a grant whose acquire overlapped a restart: the current incarnation if its entry is
/// there (holder ids are unique, so the grant was made there), when no restart began while
/// looking.
async fn incarnation_holding(shared: &Shared, sem: usize, holder: &str) -> Option<u32> {
    let state = || {
        let r = shared.restarts.lock().unwrap();
        (r.len(), r.last().is_none_or(|x| x.1 != i64::MAX))
    };
    let (before, settled) = state();
    if !settled {
        return None;
    }
    let mut guard = shared.direct.lock().await;
    if guard.is_none() {
        let client = redis::Client::open(shared.redis_url.as_str()).ok()?;
        let conn = tokio::time::timeout(
            Duration::from_millis(500),
            client.get_multiplexed_async_connection(),
        )
        .await
        .ok()?
        .ok()?;
        *guard = Some(conn);
    }
    let conn = guard.as_mut()?;
    let [_, _, _, key, ..] = shared.cfg.keys(&shared.cfg.sems.get(sem)?.name).ok()?;
    let found = tokio::time::timeout(
        Duration::from_secs(2),
        redis::cmd("HEXISTS")
            .arg(&key)
            .arg(holder)
            .query_async::<i64>(conn),
    )
    .await;
    let found = match found {
        Ok(Ok(n)) => n == 1,
        _ => {
            *guard = None;
            return None;
        }
    };
    let (after, settled) = state();
    (found && settled && after == before).then_some(before as u32)
}

/// Draws faults until `stop`; returns the faults still in progress.
async fn schedule(
    shared: Arc<Shared>,
    proxies: Arc<Vec<Arc<ClientProxy>>>,
    server: Arc<Mutex<Server>>,
    stop: CancellationToken,
) -> JoinSet<()> {
    let cfg = &shared.cfg;
    let mut rng = fastrand::Rng::with_seed(cfg.seed);
    let mut running = JoinSet::new();
    let total: u32 = cfg.faults.iter().map(|k| k.weight()).sum();
    if total == 0 {
        stop.cancelled().await;
        return running;
    }
    let lease = cfg.lease_ms;
    // every enabled kind once, in a random order, then at random by weight
    let mut first_round = cfg.faults.clone();
    rng.shuffle(&mut first_round);
    loop {
        let gap = rng.u64(cfg.fault_gap_ms.0..=cfg.fault_gap_ms.1);
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_millis(gap)) => {}
        }
        while running.try_join_next().is_some() {}
        let kind = match first_round.pop() {
            Some(k) => k,
            None => {
                let mut pick = rng.u32(0..total);
                *cfg.faults
                    .iter()
                    .find(|k| {
                        if pick < k.weight() {
                            true
                        } else {
                            pick -= k.weight();
                            false
                        }
                    })
                    .expect("weights add up")
            }
        };
        // every random number is drawn here, in schedule order: the sequence of faults and
        // their parameters depends on the seed only
        let ms = match kind {
            FaultKind::PauseShort => rng.u64(20..=lease * 3 / 5),
            FaultKind::PauseLong => rng.u64(lease * 6 / 5..=lease * 3),
            FaultKind::CutCmd => {
                if rng.bool() {
                    0
                } else {
                    rng.u64(50..=400)
                }
            }
            FaultKind::BlackholeCmd => rng.u64(50..=lease * 3 / 2),
            FaultKind::BlackholePubsub => rng.u64(100..=3000),
            FaultKind::Latency => rng.u64(200..=2000),
            FaultKind::DebugSleep => rng.u64(20..=lease * 7 / 5),
            _ => 0,
        };
        let extra = rng.u64(2..=50); // latency per chunk
        let target = rng.u64(..);
        shared.faults.fetch_add(1, Ordering::Relaxed);
        running.spawn(inject(
            shared.clone(),
            proxies.clone(),
            server.clone(),
            kind,
            ms,
            extra,
            target,
        ));
    }
    running
}

/// Picks a target among the slots whose worker satisfies `eligible`.
fn pick_slot(
    shared: &Shared,
    target: u64,
    eligible: impl Fn(&WorkerState) -> bool,
) -> Option<(usize, u32, u32)> {
    let slots = shared.slots.lock().unwrap();
    let candidates: Vec<(usize, u32, u32)> = slots
        .iter()
        .enumerate()
        .filter_map(|(i, w)| {
            w.as_ref()
                .filter(|w| !w.killing && eligible(w))
                .map(|w| (i, w.id, w.pid))
        })
        .collect();
    if candidates.is_empty() {
        return None;
    }
    Some(candidates[(target % candidates.len() as u64) as usize])
}

async fn inject(
    shared: Arc<Shared>,
    proxies: Arc<Vec<Arc<ClientProxy>>>,
    server: Arc<Mutex<Server>>,
    kind: FaultKind,
    ms: u64,
    extra: u64,
    target: u64,
) {
    let log = |t0: i64, slot: Option<usize>, worker: Option<u32>, detail: String| {
        let s = slot.map_or("-".to_owned(), |s| s.to_string());
        let w = worker.map_or("-".to_owned(), |w| w.to_string());
        let d = if detail.is_empty() {
            "-".to_owned()
        } else {
            detail
        };
        shared
            .log
            .line(&format!("fault {t0} {} {kind} {s} {w} {d}", now_us()));
    };
    let d = Duration::from_millis(ms);
    match kind {
        FaultKind::KillHolder | FaultKind::KillWaiter => {
            let picked = if kind == FaultKind::KillHolder {
                pick_slot(&shared, target, |w| !w.holding.is_empty())
            } else {
                pick_slot(&shared, target, |w| {
                    !w.waiting.is_empty() && w.holding.is_empty()
                })
                .or_else(|| pick_slot(&shared, target, |w| !w.waiting.is_empty()))
            };
            let Some((slot, id, pid)) = picked else {
                return log(now_us(), None, None, "no-target".into());
            };
            let detail = {
                let mut slots = shared.slots.lock().unwrap();
                match slots[slot].as_mut().filter(|w| w.id == id) {
                    Some(w) => {
                        w.killing = true;
                        format!("holding={},waiting={}", w.holding.len(), w.waiting.len())
                    }
                    None => return,
                }
            };
            let t0 = now_us();
            signal(pid, libc::SIGKILL);
            log(t0, Some(slot), Some(id), detail);
        }
        FaultKind::PauseShort | FaultKind::PauseLong => {
            let Some((slot, id, pid)) = pick_slot(&shared, target, |w| !w.paused) else {
                return log(now_us(), None, None, "no-target".into());
            };
            {
                let mut slots = shared.slots.lock().unwrap();
                match slots[slot].as_mut().filter(|w| w.id == id) {
                    Some(w) => w.paused = true,
                    None => return,
                }
            }
            let t0 = now_us();
            signal(pid, libc::SIGSTOP);
            tokio::time::sleep(d).await;
            {
                let mut slots = shared.slots.lock().unwrap();
                // the same process, not yet reaped: its pid cannot have been reused
                if let Some(w) = slots[slot].as_mut().filter(|w| w.id == id) {
                    signal(pid, libc::SIGCONT);
                    w.paused = false;
                }
            }
            log(t0, Some(slot), Some(id), format!("ms={ms}"));
        }
        FaultKind::CutCmd | FaultKind::CutPubsub => {
            let Some((slot, id, _)) = pick_slot(&shared, target, |_| true) else {
                return log(now_us(), None, None, "no-target".into());
            };
            let class = if kind == FaultKind::CutCmd {
                Class::Cmd
            } else {
                Class::Pubsub
            };
            let t0 = now_us();
            if ms > 0 {
                proxies[slot].refuse_new(true);
            }
            let n = proxies[slot].cut(class);
            if ms > 0 {
                tokio::time::sleep(d).await;
                proxies[slot].refuse_new(false);
            }
            log(
                t0,
                Some(slot),
                Some(id),
                format!("conns={n},refuse_ms={ms}"),
            );
        }
        FaultKind::BlackholeCmd | FaultKind::BlackholePubsub => {
            let Some((slot, id, _)) = pick_slot(&shared, target, |_| true) else {
                return log(now_us(), None, None, "no-target".into());
            };
            let class = if kind == FaultKind::BlackholeCmd {
                Class::Cmd
            } else {
                Class::Pubsub
            };
            let t0 = now_us();
            proxies[slot].blackhole(class, true);
            tokio::time::sleep(d).await;
            proxies[slot].blackhole(class, false);
            log(t0, Some(slot), Some(id), format!("ms={ms}"));
        }
        FaultKind::Latency => {
            let Some((slot, id, _)) = pick_slot(&shared, target, |_| true) else {
                return log(now_us(), None, None, "no-target".into());
            };
            let t0 = now_us();
            proxies[slot].latency(Duration::from_millis(extra));
            tokio::time::sleep(d).await;
            proxies[slot].latency(Duration::ZERO);
            log(
                t0,
                Some(slot),
                Some(id),
                format!("ms={ms},delay_ms={extra}"),
            );
        }
        FaultKind::ForceRelease => {
            let Some((slot, id, _)) = pick_slot(&shared, target, |w| !w.holding.is_empty()) else {
                return log(now_us(), None, None, "no-target".into());
            };
            let picked = {
                let slots = shared.slots.lock().unwrap();
                slots[slot]
                    .as_ref()
                    .filter(|w| w.id == id)
                    .and_then(|w| w.holding.values().next().cloned())
            };
            let Some((sem, holder)) = picked else { return };
            let name = shared.cfg.sems[sem].name.clone();
            let t0 = now_us();
            let removed = force_release(&shared, &name, &holder).await;
            log(
                t0,
                Some(slot),
                Some(id),
                format!("holder={holder},removed={removed}"),
            );
        }
        FaultKind::ClientKillPubsub => {
            let t0 = now_us();
            let r = tokio::task::spawn_blocking(move || {
                server
                    .lock()
                    .unwrap()
                    .try_cmd(&["CLIENT", "KILL", "TYPE", "pubsub"])
                    .map(|r| r.as_int().unwrap_or(-1))
                    .unwrap_or(-1)
            })
            .await
            .unwrap_or(-1);
            log(t0, None, None, format!("killed={r}"));
        }
        FaultKind::DebugSleep => {
            let secs = format!("{:.3}", ms as f64 / 1000.0);
            let t0 = tokio::task::spawn_blocking(move || {
                let srv = server.lock().unwrap();
                let t0 = now_us();
                let _ = srv.try_cmd(&["DEBUG", "SLEEP", &secs]);
                t0
            })
            .await
            .unwrap_or_else(|_| now_us());
            log(t0, None, None, format!("ms={ms}"));
        }
        FaultKind::RestartDataLoss => {
            let sh = shared.clone();
            let (t0, dead, ready) = tokio::task::spawn_blocking(move || {
                let mut srv = server.lock().unwrap();
                let t0 = {
                    let mut r = sh.restarts.lock().unwrap();
                    let t0 = now_us();
                    r.push((t0, i64::MAX));
                    t0
                };
                srv.kill();
                let dead = {
                    let mut r = sh.restarts.lock().unwrap();
                    let dead = now_us();
                    if let Some(last) = r.last_mut() {
                        last.1 = dead;
                    }
                    dead
                };
                srv.restart();
                (t0, dead, now_us())
            })
            .await
            .unwrap_or((0, 0, 0));
            shared.log.line(&format!("restart {t0} {dead} {ready}"));
            log(t0, None, None, format!("dead={dead},ready={ready}"));
        }
    }
}

/// What Redis holds once every worker has exited (see [`crate::checker`], property
/// "cleanup").
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct FinalState {
    /// When the last worker had exited.
    pub exited_at: i64,
    /// When the state below was read.
    pub read_at: i64,
    /// Entries (ids in the records, queue or slot table) without a lease: they would never
    /// expire.
    pub orphans: Vec<String>,
    /// Leases that end later than one lease after the last worker exited.
    pub leases_too_long: Vec<String>,
    /// Entries (with a lease) left by the workers, per semaphore, before reaping.
    pub entries_left: Vec<(String, usize)>,
    /// Keys other than the semaphores' seven.
    pub foreign_keys: Vec<String>,
    /// Pub/sub channels still subscribed.
    pub channels: Vec<String>,
    /// Client connections still open (other than the checker's own).
    pub clients: Vec<String>,
    /// Problems after the leases ran out and a redsem call reaped them.
    pub after_reap: Vec<String>,
    /// The read failed.
    pub error: Option<String>,
}

async fn final_state(cfg: &Config, url: &str, exited_at: i64) -> FinalState {
    let mut st = FinalState {
        exited_at,
        ..FinalState::default()
    };
    if let Err(e) = read_final(cfg, url, &mut st).await {
        st.error = Some(format!("{e:#}"));
    }
    st
}

async fn read_final(cfg: &Config, url: &str, st: &mut FinalState) -> anyhow::Result<()> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    // the proxies are gone; give the server a moment to see their connections close
    let mut clients = Vec::new();
    for _ in 0..20 {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut conn)
            .await?;
        clients = list
            .lines()
            .filter(|l| !l.contains("cmd=client|list") && !l.trim().is_empty())
            .map(str::to_owned)
            .collect();
        if clients.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    st.clients = clients;
    st.channels = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("*")
        .query_async(&mut conn)
        .await?;
    st.read_at = now_us();
    let mut known: HashSet<String> = HashSet::new();
    for s in &cfg.sems {
        known.extend(cfg.keys(&s.name)?);
    }
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await?;
    st.foreign_keys = keys.into_iter().filter(|k| !known.contains(k)).collect();
    let now_ms = st.read_at / 1000;
    let mut latest_expiry = 0i64;
    for s in &cfg.sems {
        let [_, queue, exp, meta, slots, ..] = cfg.keys(&s.name)?;
        let exp: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(exp)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?;
        let with_lease: HashSet<&str> = exp.iter().map(|(id, _)| id.as_str()).collect();
        let meta: Vec<String> = redis::cmd("HKEYS").arg(meta).query_async(&mut conn).await?;
        let queue: Vec<String> = redis::cmd("ZRANGE")
            .arg(queue)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await?;
        let holders: Vec<String> = redis::cmd("HVALS")
            .arg(slots)
            .query_async(&mut conn)
            .await?;
        for id in meta.iter().chain(&queue).chain(&holders) {
            if !with_lease.contains(id.as_str()) {
                st.orphans.push(format!("{}: {id}", s.name));
            }
        }
        for (id, score) in &exp {
            let score = *score as i64;
            latest_expiry = latest_expiry.max(score);
            if score > st.exited_at / 1000 + cfg.lease_ms as i64 + cfg.slack_ms as i64 {
                st.leases_too_long.push(format!(
                    "{}: {id} expires {} ms after the last worker exited",
                    s.name,
                    score - st.exited_at / 1000
                ));
            }
        }
        st.entries_left.push((s.name.clone(), exp.len()));
    }
    // wait for the last lease to run out, then let redsem reap (any script call does)
    let wait = (latest_expiry - now_ms + cfg.slack_ms as i64).clamp(0, 3 * cfg.lease_ms as i64);
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    let rs = redsem::Client::builder(url)
        .prefix(crate::config::PREFIX)
        .build()
        .await?;
    for s in &cfg.sems {
        match rs.inspect(&s.name).await {
            Ok(stats) => {
                if !stats.holders.is_empty() || !stats.waiters.is_empty() {
                    st.after_reap.push(format!(
                        "{}: {} holders and {} waiters left after every lease ran out",
                        s.name,
                        stats.holders.len(),
                        stats.waiters.len()
                    ));
                }
            }
            Err(redsem::Error::UnknownSemaphore { .. }) => {}
            Err(e) => st
                .after_reap
                .push(format!("{}: inspect failed: {e}", s.name)),
        }
    }
    drop(rs);
    for s in &cfg.sems {
        let [cfg_key, queue, exp, meta, slots, free, _] = cfg.keys(&s.name)?;
        for key in [queue, exp, meta, slots] {
            let exists: i64 = redis::cmd("EXISTS")
                .arg(&key)
                .query_async(&mut conn)
                .await?;
            if exists != 0 {
                st.after_reap
                    .push(format!("{}: key {key} still exists", s.name));
            }
        }
        let cfg_exists: i64 = redis::cmd("EXISTS")
            .arg(cfg_key)
            .query_async(&mut conn)
            .await?;
        if cfg_exists == 1 {
            let free: i64 = redis::cmd("ZCARD").arg(free).query_async(&mut conn).await?;
            if free != i64::from(s.limit) {
                st.after_reap.push(format!(
                    "{}: {free} free slots of {} once nobody holds any",
                    s.name, s.limit
                ));
            }
        }
    }
    Ok(())
}

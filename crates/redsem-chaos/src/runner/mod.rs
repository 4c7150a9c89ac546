//! The runner: a private Redis, one [`ClientProxy`] per worker slot, the worker processes
//! (replaced when killed), the fenced resource, the snapshotter, and the fault schedule.
//!
//! With `failover-replica`, Redis has a replica, which replicates through a link (a
//! `FaultProxy`) the runner can black-hole and sever, and the runner reads Redis (snapshots,
//! operator, final state) through an unfaulted [`ClientProxy`]: a failover re-points it and
//! the workers' proxies at the promoted replica. With `clock-step`, the server (Valkey) and its
//! replica run under `libfaketime`, on one clock the runner steps forward.
//!
//! `runner.log` (times in µs of `CLOCK_REALTIME`):
//!
//! | line | meaning |
//! |---|---|
//! | `phase <t> <name>` | `start`, `faults` (injection starts), `calm` (injection stopped, every fault healed), `stop` (SIGTERM to the workers), `exited` |
//! | `spawn <t> <worker> <slot> <pid>` | a worker process started in a slot (behind that slot's proxy) |
//! | `exit <t> <worker> <how>` | it exited: `killed` (by a fault), `ok`, `code:<n>`, `signal:<n>`, `hung` (SIGKILLed at the end) |
//! | `fault <t0> <t1> <kind> <slot> <worker> <detail>` | a fault, from its start to its end (`-` where not applicable) |
//! | `restart <start> <dead> <ready> [<kept>]` | Redis killed at `start`, gone at `dead`, answering again (empty; or, after a failover, with every write made before `kept`) at `ready` |
//! | `clock <t0> <t1> <offset_us>` | Redis's clock set to real time + `offset_us` between `t0` and `t1` (`clock-step`) |
//! | `hold <t> <worker> <op> <sem> <epoch>` | a holder registered with the resource; `epoch` is the Redis incarnation of its grant (`?` unknown) |
//! | `write <t> <worker> <op> <sem> <slot> <epoch> <gen> <sent> <A/R/X>` | a fenced write and the resource's decision |
//!
//! The resource's decisions are the shipped `FencedStore`'s (`fence.lua`), on a Redis of its
//! own that no fault touches: per semaphore and slot, a write whose generation is below the
//! highest seen is rejected. Generations alone decide — they stay above earlier ones across a
//! data loss of the semaphore's Redis — so the checker proves the fencing property against
//! what the library enforces, not against the runner's knowledge of restarts (the epoch is
//! logged for the other properties). `X`: a write of an op the resource never registered.
//!
//! This file starts and stops everything and supervises the workers; `faults.rs` draws and
//! injects the faults, `resource.rs` is the fenced resource, `final_state.rs` reads what
//! Redis holds at the end (`final.json`), and `state.rs` holds what they share.

mod faults;
mod final_state;
mod resource;
mod state;

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use test_support::{FakeClock, Flavor, Server, ServerOptions};
use tokio::net::UnixListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use final_state::FinalState;
pub use state::epoch_of;

use crate::config::{Config, FaultKind};
use crate::now_us;
use crate::proxy::ClientProxy;
use faults::schedule;
use final_state::final_state;
use resource::resource_server;
use state::{Replica, Shared, Store, WorkerState, attach_replica, signal};

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
    let redis = start_redis(cfg, flavor).await?;
    let (redis_addr, redis_url) = (redis.server.addr(), redis.url.clone());
    let server = Arc::new(Mutex::new(redis.server));
    // the fenced resource's own Redis: no fault touches it
    let store_server =
        tokio::task::spawn_blocking(move || Server::start_with(flavor, ServerOptions::default()))
            .await
            .context("starting the store's server")?;
    let store_client = redsem::Client::connect(&store_server.url())
        .await
        .context("connecting to the store's server")?;
    let store = Store::new(&store_client, cfg.sems.len());
    let shared = Arc::new(Shared::new(
        cfg,
        dir,
        store,
        redis.url,
        redis.replica,
        redis.direct_proxy,
        redis.clock,
    )?);
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

    fault_phase(&shared, &proxies, &server).await;
    stop_workers(&shared, supervisors).await;
    let exited_at = now_us();
    // the snapshots go on a little: the checker sees the last releases land
    tokio::time::sleep(Duration::from_millis(300)).await;
    snap_stop.cancel();
    let _ = snap_task.await;
    drop(proxies);
    resource_task.abort();
    *shared.direct.lock().await = None;
    *shared.operator.lock().await = None;
    finish(cfg, dir, &shared, &redis_url, exited_at, server).await
}

/// The run's Redis, started.
struct Redis {
    server: Server,
    /// With `failover-replica`: the replica, and the unfaulted proxy the runner reads Redis
    /// through.
    replica: Option<Replica>,
    direct_proxy: Option<Arc<ClientProxy>>,
    /// With `clock-step`: the clock of both.
    clock: Option<FakeClock>,
    /// How the runner reaches Redis: the server, or the proxy.
    url: String,
}

/// Starts the run's Redis (`flavor`): with `failover-replica` a replica too, with
/// `clock-step` both on a clock of their own.
async fn start_redis(cfg: &Config, flavor: Flavor) -> anyhow::Result<Redis> {
    let with_replica = cfg.faults.contains(&FaultKind::FailoverReplica);
    let clock = if cfg.faults.contains(&FaultKind::ClockStep) {
        Some(FakeClock::new().context("clock-step needs libfaketime (scripts/install-deps.sh)")?)
    } else {
        None
    };
    let mut opts = ServerOptions::default();
    if let Some(c) = &clock {
        // master and replica share the clock, as two machines in sync would
        opts.env = c.env();
    }
    if with_replica {
        // a replica that resyncs (after a restart of its master) gets the data at once
        opts.extra_args = ["--repl-diskless-sync-delay", "0"].map(String::from).into();
    }
    let (server, replica) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        // test-support's servers persist nothing: a restart loses everything
        let server = Server::start_with(flavor, opts.clone());
        let replica = if with_replica {
            let r = Server::start_with(flavor, opts);
            let link = attach_replica(&r, server.addr())?;
            Some(Replica { server: r, link })
        } else {
            None
        };
        Ok((server, replica))
    })
    .await
    .context("starting the server")??;
    let direct_proxy = if with_replica {
        Some(Arc::new(ClientProxy::start(server.addr()).await?))
    } else {
        None
    };
    let url = direct_proxy
        .as_ref()
        .map_or_else(|| server.url(), |p| p.url());
    Ok(Redis {
        server,
        replica,
        direct_proxy,
        clock,
        url,
    })
}

/// The fault phase: faults for `cfg.seconds` (and a line of progress every 10 s), then every
/// fault healed and a few calm seconds.
async fn fault_phase(
    shared: &Arc<Shared>,
    proxies: &Arc<Vec<Arc<ClientProxy>>>,
    server: &Arc<Mutex<Server>>,
) {
    // let every worker connect before the first fault
    tokio::time::sleep(Duration::from_millis(1500)).await;
    shared.log.line(&format!("phase {} faults", now_us()));
    let started = Instant::now();
    let until = started + Duration::from_secs(shared.cfg.seconds);
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
}

/// The stop phase: no more replacements, SIGTERM to every worker (SIGKILL after 20 s: it is
/// reported as `hung`) until every supervisor is done.
async fn stop_workers(shared: &Shared, mut supervisors: JoinSet<()>) {
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
}

/// Records the state Redis is left in (`final.json`), writes the runner's log out and stops
/// the servers.
async fn finish(
    cfg: &Config,
    dir: &Path,
    shared: &Shared,
    redis_url: &str,
    exited_at: i64,
    server: Arc<Mutex<Server>>,
) -> anyhow::Result<()> {
    let final_state = final_state(cfg, redis_url, exited_at).await;
    std::fs::write(
        dir.join("final.json"),
        serde_json::to_vec_pretty(&final_state)?,
    )?;
    shared.log.flush();
    let replica = shared.replica.lock().unwrap().take();
    tokio::task::spawn_blocking(move || {
        server.lock().unwrap().stop();
        drop(replica);
    })
    .await?;
    Ok(())
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

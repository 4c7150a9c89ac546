//! The fault schedule: one fault every `fault_gap_ms`, every enabled kind once and then at
//! random by weight, all drawn from the seed in schedule order; and the injection of each
//! kind (signals to a worker, its proxy cutting, black-holing or slowing its connections,
//! commands to Redis, a restart that loses the data, an operator's `force_release`), logged as
//! a `fault` line from its start to its end.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redsem::internals::{self, Keys};
use test_support::Server;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::state::{Replica, Shared, WorkerState, attach_replica, signal};
use crate::config::{Config, FaultKind};
use crate::now_us;
use crate::proxy::{Class, ClientProxy};

/// Draws faults until `stop`; returns the faults still in progress.
pub(super) async fn schedule(
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
        // every random number is drawn here, in schedule order: the sequence of faults and
        // their parameters depends on the seed only
        let kind = first_round
            .pop()
            .unwrap_or_else(|| draw_kind(&mut rng, &cfg.faults, total));
        let ms = draw_length(&mut rng, kind, cfg);
        let extra = rng.u64(2..=50); // latency per chunk
        let target = rng.u64(..);
        if matches!(
            kind,
            FaultKind::FailoverLagging | FaultKind::FailoverReplica
        ) {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = failover_spacing(&shared) => {}
            }
        }
        shared.faults.fetch_add(1, Ordering::Relaxed);
        running.spawn(inject(Fault {
            shared: shared.clone(),
            proxies: proxies.clone(),
            server: server.clone(),
            kind,
            ms,
            extra,
            target,
        }));
    }
    running
}

/// A fault kind drawn by weight among `faults` (whose weights add up to `total`).
fn draw_kind(rng: &mut fastrand::Rng, faults: &[FaultKind], total: u32) -> FaultKind {
    let mut pick = rng.u32(0..total);
    *faults
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

/// The length (ms) of a fault of `kind`, drawn (`0` for a kind without one).
fn draw_length(rng: &mut fastrand::Rng, kind: FaultKind, cfg: &Config) -> u64 {
    let lease = cfg.lease_ms;
    match kind {
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
        // the replica's lag: less than one renewal interval (the documented bound), with
        // a tenth of it left for the kill itself (the master runs until it is dead; the
        // checker judges a failover that overran the bound as a loss of everything)
        FaultKind::FailoverLagging | FaultKind::FailoverReplica => {
            rng.u64(0..(cfg.renew_ms * 9 / 10).max(1))
        }
        // the step: half within the documented bound (margin + one renewal interval,
        // covered while no renewal is lost), half beyond it, up to one lease
        FaultKind::ClockStep => {
            let bound = internals::margin(cfg.lease()).as_millis() as u64 + cfg.renew_ms;
            if rng.bool() {
                rng.u64(1..=bound)
            } else {
                rng.u64(bound + 1..=lease.max(bound + 1))
            }
        }
        _ => 0,
    }
}

/// How long after a restart's death a failover may come: one lease and one renewal interval
/// after the restart was over (the documented bound; the checker judges a closer one as a
/// loss of everything), plus what a restart takes from its death to answering again.
fn failover_gap_us(shared: &Shared) -> i64 {
    const READY_SLACK_MS: u64 = 300;
    ((shared.cfg.lease_ms + shared.cfg.renew_ms + READY_SLACK_MS) * 1000) as i64
}

/// Waits until a failover may come: the documented bound covers failovers at least one lease
/// and one renewal interval apart (closer ones, a cascade, may together lose more than one
/// renewal interval of writes).
async fn failover_spacing(shared: &Shared) {
    loop {
        let last = shared.restarts.lock().unwrap().last().copied();
        let wait = match last {
            None => return,
            // still restarting
            Some((_, i64::MAX)) => Duration::from_millis(20),
            Some((_, dead)) => {
                let left = dead + failover_gap_us(shared) - now_us();
                if left <= 0 {
                    return;
                }
                Duration::from_micros(left as u64)
            }
        };
        tokio::time::sleep(wait).await;
    }
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

/// One fault to inject, with what it acts on and the parameters drawn for it.
struct Fault {
    shared: Arc<Shared>,
    proxies: Arc<Vec<Arc<ClientProxy>>>,
    server: Arc<Mutex<Server>>,
    kind: FaultKind,
    /// Its length (ms).
    ms: u64,
    /// The latency per chunk (ms; `latency`); picks the key (`key-loss`).
    extra: u64,
    /// Picks the worker (the semaphore: `key-loss`).
    target: u64,
}

/// Injects one fault: each kind's step below says what it does and logs its `fault` line.
async fn inject(f: Fault) {
    match f.kind {
        FaultKind::KillHolder | FaultKind::KillWaiter => f.kill(),
        FaultKind::PauseShort | FaultKind::PauseLong => f.pause().await,
        FaultKind::CutCmd | FaultKind::CutPubsub => f.cut().await,
        FaultKind::BlackholeCmd | FaultKind::BlackholePubsub => f.blackhole().await,
        FaultKind::Latency => f.slow_down().await,
        FaultKind::ForceRelease => f.release_a_holder().await,
        FaultKind::ClientKillPubsub => f.kill_subscribers().await,
        FaultKind::DebugSleep => f.debug_sleep().await,
        FaultKind::RestartDataLoss => f.restart_losing_data().await,
        FaultKind::KeyLoss => f.lose_keys().await,
        FaultKind::ClockStep => f.step_clock(),
        FaultKind::FailoverReplica => f.fail_over_to_replica().await,
        FaultKind::FailoverLagging => f.fail_over_lagging().await,
    }
}

impl Fault {
    /// Logs the fault, from `t0` to now, on the worker `worker` in `slot` (each `-` when not
    /// applicable), with `detail`.
    fn log(&self, t0: i64, slot: Option<usize>, worker: Option<u32>, detail: String) {
        let s = slot.map_or("-".to_owned(), |s| s.to_string());
        let w = worker.map_or("-".to_owned(), |w| w.to_string());
        let d = if detail.is_empty() {
            "-".to_owned()
        } else {
            detail
        };
        let kind = self.kind;
        self.shared
            .log
            .line(&format!("fault {t0} {} {kind} {s} {w} {d}", now_us()));
    }

    /// Logs that no worker could be picked.
    fn no_target(&self) {
        self.log(now_us(), None, None, "no-target".into());
    }

    /// Its length.
    fn length(&self) -> Duration {
        Duration::from_millis(self.ms)
    }

    /// The class of connections a `cut-*` or `blackhole-*` fault acts on.
    fn class(&self) -> Class {
        match self.kind {
            FaultKind::CutCmd | FaultKind::BlackholeCmd => Class::Cmd,
            _ => Class::Pubsub,
        }
    }

    /// Picks a worker among those that satisfy `eligible`: its slot, id and pid.
    fn pick(&self, eligible: impl Fn(&WorkerState) -> bool) -> Option<(usize, u32, u32)> {
        pick_slot(&self.shared, self.target, eligible)
    }

    /// `kill-holder`, `kill-waiter`: SIGKILL of a worker that holds a permit, or that waits
    /// (and, if possible, holds none).
    fn kill(&self) {
        let picked = if self.kind == FaultKind::KillHolder {
            self.pick(|w| !w.holding.is_empty())
        } else {
            self.pick(|w| !w.waiting.is_empty() && w.holding.is_empty())
                .or_else(|| self.pick(|w| !w.waiting.is_empty()))
        };
        let Some((slot, id, pid)) = picked else {
            return self.no_target();
        };
        let detail = {
            let mut slots = self.shared.slots.lock().unwrap();
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
        self.log(t0, Some(slot), Some(id), detail);
    }

    /// `pause-short`, `pause-long`: SIGSTOP of a worker, SIGCONT after the fault's length.
    async fn pause(&self) {
        let Some((slot, id, pid)) = self.pick(|w| !w.paused) else {
            return self.no_target();
        };
        {
            let mut slots = self.shared.slots.lock().unwrap();
            match slots[slot].as_mut().filter(|w| w.id == id) {
                Some(w) => w.paused = true,
                None => return,
            }
        }
        let t0 = now_us();
        signal(pid, libc::SIGSTOP);
        tokio::time::sleep(self.length()).await;
        {
            let mut slots = self.shared.slots.lock().unwrap();
            // the same process, not yet reaped: its pid cannot have been reused
            if let Some(w) = slots[slot].as_mut().filter(|w| w.id == id) {
                signal(pid, libc::SIGCONT);
                w.paused = false;
            }
        }
        self.log(t0, Some(slot), Some(id), format!("ms={}", self.ms));
    }

    /// `cut-cmd`, `cut-pubsub`: a reset of a worker's connections of that class, and (when the
    /// fault has a length) a refusal of its new connections for that long.
    async fn cut(&self) {
        let Some((slot, id, _)) = self.pick(|_| true) else {
            return self.no_target();
        };
        let class = self.class();
        let proxy = &self.proxies[slot];
        let t0 = now_us();
        if self.ms > 0 {
            proxy.refuse_new(true);
        }
        let n = proxy.cut(class);
        if self.ms > 0 {
            tokio::time::sleep(self.length()).await;
            proxy.refuse_new(false);
        }
        let detail = format!("conns={n},refuse_ms={}", self.ms);
        self.log(t0, Some(slot), Some(id), detail);
    }

    /// `blackhole-cmd`, `blackhole-pubsub`: a worker's connections of that class forward
    /// nothing for the fault's length.
    async fn blackhole(&self) {
        let Some((slot, id, _)) = self.pick(|_| true) else {
            return self.no_target();
        };
        let class = self.class();
        let t0 = now_us();
        self.proxies[slot].blackhole(class, true);
        tokio::time::sleep(self.length()).await;
        self.proxies[slot].blackhole(class, false);
        self.log(t0, Some(slot), Some(id), format!("ms={}", self.ms));
    }

    /// `latency`: a worker's connections slowed for the fault's length.
    async fn slow_down(&self) {
        let Some((slot, id, _)) = self.pick(|_| true) else {
            return self.no_target();
        };
        let t0 = now_us();
        self.proxies[slot].latency(Duration::from_millis(self.extra));
        tokio::time::sleep(self.length()).await;
        self.proxies[slot].latency(Duration::ZERO);
        let detail = format!("ms={},delay_ms={}", self.ms, self.extra);
        self.log(t0, Some(slot), Some(id), detail);
    }

    /// `force-release`: an operator's `force_release` of a holder.
    async fn release_a_holder(&self) {
        let Some((slot, id, _)) = self.pick(|w| !w.holding.is_empty()) else {
            return self.no_target();
        };
        let picked = {
            let slots = self.shared.slots.lock().unwrap();
            slots[slot]
                .as_ref()
                .filter(|w| w.id == id)
                .and_then(|w| w.holding.values().next().cloned())
        };
        let Some((sem, holder)) = picked else { return };
        let name = self.shared.cfg.sems[sem].name.clone();
        let t0 = now_us();
        let removed = force_release(&self.shared, &name, &holder).await;
        let detail = format!("holder={holder},removed={removed}");
        self.log(t0, Some(slot), Some(id), detail);
    }

    /// `client-kill-pubsub`: every subscriber connection killed on the server.
    async fn kill_subscribers(&self) {
        let server = self.server.clone();
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
        self.log(t0, None, None, format!("killed={r}"));
    }

    /// `debug-sleep`: Redis answers nobody for the fault's length.
    async fn debug_sleep(&self) {
        let server = self.server.clone();
        let secs = format!("{:.3}", self.ms as f64 / 1000.0);
        let t0 = tokio::task::spawn_blocking(move || {
            let srv = server.lock().unwrap();
            let t0 = now_us();
            let _ = srv.try_cmd(&["DEBUG", "SLEEP", &secs]);
            t0
        })
        .await
        .unwrap_or_else(|_| now_us());
        self.log(t0, None, None, format!("ms={}", self.ms));
    }

    /// `restart-data-loss`: Redis killed and started again, empty.
    async fn restart_losing_data(&self) {
        let (sh, server) = (self.shared.clone(), self.server.clone());
        let (t0, dead, ready) = tokio::task::spawn_blocking(move || {
            let mut srv = server.lock().unwrap();
            let (t0, dead) = kill_recorded(&sh, &mut srv);
            restart_empty(&mut srv);
            (t0, dead, now_us())
        })
        .await
        .unwrap_or((0, 0, 0));
        self.shared
            .log
            .line(&format!("restart {t0} {dead} {ready}"));
        self.log(t0, None, None, format!("dead={dead},ready={ready}"));
    }

    /// `key-loss`: keys of one semaphore deleted, in one atomic call that also reads the ids of
    /// its records (whose holders learn of the loss like of a `force_release`).
    async fn lose_keys(&self) {
        // which semaphore and which key, from the seed
        let sems = &self.shared.cfg.sems;
        let sem = &sems[(self.target % sems.len() as u64) as usize].name;
        let (key_name, lost) = LOST_KEYS[(self.extra % LOST_KEYS.len() as u64) as usize];
        let Ok(keys) = self.shared.cfg.keys(sem) else {
            return;
        };
        let lost = lost(&keys);
        let mut args = vec![
            "EVAL".to_owned(),
            "local ids = redis.call('HKEYS', KEYS[1]); \
             redis.call('DEL', unpack(KEYS, 2)); return ids"
                .to_owned(),
            (1 + lost.len()).to_string(),
            keys.meta.clone(),
        ];
        args.extend(lost.into_iter().cloned());
        let server = self.server.clone();
        let t0 = now_us();
        let r = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            server.lock().unwrap().try_cmd(&args)
        })
        .await;
        let detail = match r {
            Ok(Ok(test_support::Reply::Array(ids))) => {
                let ids: Vec<&str> = ids.iter().filter_map(|i| i.as_str()).collect();
                let holders = if key_name == "meta" && !ids.is_empty() {
                    ids.join(";")
                } else {
                    "-".to_owned()
                };
                format!("sem={sem},key={key_name},entries={holders}")
            }
            Ok(Ok(other)) => format!("unexpected:{other:?}").replace(' ', "_"),
            Ok(Err(e)) => format!("failed:{e}").replace(' ', "_"),
            Err(e) => format!("panicked:{e}").replace(' ', "_"),
        };
        self.log(t0, None, None, detail);
    }

    /// `clock-step`: Redis's clock set forward by the fault's length.
    fn step_clock(&self) {
        let Some(clock) = self.shared.clock.as_ref() else {
            return self.log(now_us(), None, None, "no-clock".into());
        };
        let (t0, offset) = {
            let mut offset = self.shared.clock_offset_ms.lock().unwrap();
            *offset += self.ms as i64;
            let t0 = now_us();
            clock.set_offset_ms(*offset);
            let t1 = now_us();
            self.shared
                .log
                .line(&format!("clock {t0} {t1} {}", *offset * 1000));
            (t0, *offset)
        };
        let detail = format!("step={}ms,offset={offset}ms", self.ms);
        self.log(t0, None, None, detail);
    }

    /// `failover-replica`: see [`failover_replica`].
    async fn fail_over_to_replica(&self) {
        let (sh, px, server) = (
            self.shared.clone(),
            self.proxies.clone(),
            self.server.clone(),
        );
        let lag = self.length();
        let outcome = tokio::task::spawn_blocking(move || failover_replica(&sh, &px, &server, lag))
            .await
            .unwrap_or_else(|e| Err(format!("panicked:{e}").replace(' ', "_")));
        self.log_failover(outcome);
    }

    /// `failover-lagging`: Redis saves its data, runs on for the fault's length, is killed,
    /// and comes back from the save.
    async fn fail_over_lagging(&self) {
        let (sh, server) = (self.shared.clone(), self.server.clone());
        let lag = self.length();
        let outcome = tokio::task::spawn_blocking(move || {
            let mut srv = server.lock().unwrap();
            // the replica's copy: every write before `kept` survives
            let kept = now_us();
            // (an error reply, e.g. a fork for a replica's sync under way, is a failure
            // too: the server would come back from an older file)
            match srv.try_cmd(&["SAVE"]) {
                Ok(test_support::Reply::Status(_)) => {}
                other => {
                    return Err(format!("save-failed:{other:?}").replace(' ', "_"));
                }
            }
            std::thread::sleep(lag);
            let (t0, dead) = kill_recorded(&sh, &mut srv);
            // comes back from the save (the server loads dump.rdb from its dir); the
            // file is removed once loaded, so a later restart loses everything again
            srv.restart();
            let ready = now_us();
            let _ = std::fs::remove_file(srv.dir().join("dump.rdb"));
            Ok((Some(kept), t0, dead, ready))
        })
        .await
        .unwrap_or_else(|e| Err(format!("panicked:{e}").replace(' ', "_")));
        self.log_failover(outcome);
    }

    /// Logs a failover (`restart … kept`, and its `fault` line from `kept`), or why it did
    /// not happen (`kept = None`: it lost everything, as a restart would).
    fn log_failover(&self, outcome: Result<(Option<i64>, i64, i64, i64), String>) {
        let log = &self.shared.log;
        match outcome {
            Ok((Some(kept), t0, dead, ready)) => {
                log.line(&format!("restart {t0} {dead} {ready} {kept}"));
                // the replica's real lag: from its copy to the kill
                let lag = (t0 - kept) / 1000;
                let detail = format!("lag={lag}ms,kill={t0},dead={dead},ready={ready}");
                self.log(kept, None, None, detail);
            }
            Ok((None, t0, dead, ready)) => {
                log.line(&format!("restart {t0} {dead} {ready}"));
                let detail = format!("promotion-failed,kill={t0},dead={dead},ready={ready}");
                self.log(t0, None, None, detail);
            }
            Err(why) => self.log(now_us(), None, None, why),
        }
    }
}

/// The keys a `key-loss` fault deletes, alone or together (drawn in this order).
type LostKeys = fn(&Keys) -> Vec<&String>;
const LOST_KEYS: [(&str, LostKeys); 7] = [
    ("meta", |k| vec![&k.meta]),
    ("free", |k| vec![&k.free]),
    ("own", |k| vec![&k.own]),
    ("cfg", |k| vec![&k.cfg]),
    ("queue", |k| vec![&k.queue]),
    ("exp", |k| vec![&k.exp]),
    ("cfg+queue", |k| vec![&k.cfg, &k.queue]),
];

/// A failover to the replica, which lags by `lag`: see [`FaultKind::FailoverReplica`].
/// Returns `(kept, kill, dead, ready)`: every write before `kept` is on the promoted replica,
/// the master was killed at `kill`, gone at `dead`, and the replica answered as the new
/// master, every proxy pointing at it, at `ready` (`kept = None`: the promotion failed and the
/// master came back empty at `ready`).
fn failover_replica(
    shared: &Shared,
    proxies: &[Arc<ClientProxy>],
    server: &Mutex<Server>,
    lag: Duration,
) -> Result<(Option<i64>, i64, i64, i64), String> {
    let mut replica = shared.replica.lock().unwrap();
    let Some(Replica { server: rep, link }) = replica.as_mut() else {
        return Err("no-replica".into());
    };
    let mut srv = server.lock().unwrap();
    // every write before `kept` is on the replica once WAIT says so; a WAIT that took half a
    // renewal interval or more (the replica still syncing) is tried again: the replica's lag,
    // from `kept` to the kill, must stay below one renewal interval (the documented bound)
    let budget = (shared.cfg.renew_ms * 1000 / 2) as i64;
    let mut kept = None;
    for _ in 0..5 {
        let start = now_us();
        let acked =
            wait_for_replica(&srv).map_err(|e| format!("wait-failed:{e}").replace(' ', "_"))?;
        if acked >= 1 && now_us() - start < budget && follows(rep, &srv) {
            kept = Some(start);
            break;
        }
    }
    let Some(kept) = kept else {
        return Err("replica-not-in-sync".into());
    };
    // from here the replica receives nothing; the master runs on until `kept + lag` (the
    // replica's lag, below one renewal interval: WAIT's time counts in it)
    link.blackhole(true);
    let lagged = Duration::from_micros((now_us() - kept).max(0) as u64);
    std::thread::sleep(lag.saturating_sub(lagged));
    let (t0, dead) = kill_recorded(shared, &mut srv);
    // what the link held never reaches the replica
    link.sever_all();
    if !matches!(
        rep.try_cmd(&["REPLICAOF", "NO", "ONE"]),
        Ok(test_support::Reply::Status(_))
    ) {
        // no promotion: the master comes back empty (everything lost, as in
        // `restart-data-loss`), and the replica follows it again
        eprintln!("redsem-chaos: the replica could not be promoted; restarting the master empty");
        restart_empty(&mut srv);
        link.blackhole(false);
        return Ok((None, t0, dead, now_us()));
    }
    // the promoted replica is the master now; the dead one is the replica-to-be
    std::mem::swap(&mut *srv, rep);
    let targets = proxies.iter().chain(shared.direct_proxy.as_ref());
    for p in targets {
        // their connections went to the dead master: reset, and new ones go to the new one
        p.cut(Class::Cmd);
        p.cut(Class::Pubsub);
        p.set_upstream(srv.addr());
    }
    let ready = now_us();
    // the old master comes back, empty, as a replica of the new one
    restart_empty(rep);
    match attach_replica(rep, srv.addr()) {
        Ok(l) => *link = l,
        Err(e) => eprintln!("redsem-chaos: the old master did not come back as a replica: {e:#}"),
    }
    Ok((Some(kept), t0, dead, ready))
}

/// A write and `WAIT 1` on one connection to `srv`: how many replicas have every write the
/// master made before it.
fn wait_for_replica(srv: &Server) -> redis::RedisResult<i64> {
    let client = redis::Client::open(srv.url())?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(1))?;
    conn.set_read_timeout(Some(Duration::from_secs(3)))?;
    let (acked,): (i64,) = redis::pipe()
        .cmd("SET")
        .arg("chaos:failover-mark")
        .arg(1)
        .ignore()
        .cmd("DEL")
        .arg("chaos:failover-mark")
        .ignore()
        .cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query(&mut conn)?;
    Ok(acked)
}

/// Whether `replica` follows `master`'s current replication stream, its full sync done. A
/// `WAIT` alone is not proof: right after the master restarted with no data (a new
/// replication id), a replica that has not yet loaded the new full sync may still acknowledge
/// its offset in the old stream, and would be promoted with the data from before the restart
/// (a lag far beyond the documented bound: a seed-9191 run promoted one 1 s after a
/// `restart-data-loss`, which brought back entries of before the restart).
fn follows(replica: &Server, master: &Server) -> bool {
    let info = |s: &Server, field: &str| -> Option<String> {
        let reply = s.try_cmd(&["INFO", "replication"]).ok()?;
        let text = reply.as_str()?.to_owned();
        text.lines().find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_owned())
        })
    };
    let replid = info(master, "master_replid");
    replid.is_some()
        && info(replica, "master_replid") == replid
        && info(replica, "master_link_status").as_deref() == Some("up")
        && info(replica, "master_sync_in_progress").as_deref() == Some("0")
}

/// Starts `srv` again with no data: without the `dump.rdb` a replica's full sync may have left
/// in its directory (a server persists nothing, but a replica stores what its master sends
/// it), which the restart would load.
fn restart_empty(srv: &mut Server) {
    let _ = std::fs::remove_file(srv.dir().join("dump.rdb"));
    srv.restart();
}

/// Kills Redis, recording the restart's start and death in `shared.restarts` (what the
/// runner uses to tell Redis incarnations apart); returns both times.
fn kill_recorded(shared: &Shared, srv: &mut Server) -> (i64, i64) {
    let t0 = now_us();
    shared.restarts.lock().unwrap().push((t0, i64::MAX));
    srv.kill();
    let dead = now_us();
    if let Some(last) = shared.restarts.lock().unwrap().last_mut() {
        last.1 = dead;
    }
    (t0, dead)
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
        Ok(found) => found.existed().to_string(),
        Err(_) => "error".into(),
    }
}

//! The checker: proves the guarantees from the logs of one run.
//!
//! It has three sources of evidence, all timed by the one `CLOCK_REALTIME` of the machine
//! (which Redis `TIME` reads too):
//!
//! - what each worker **believed** (`w<id>.log`): a holder believes it holds its permit from
//!   `acq` until `done`, `cancel` or `lost`, or its process's death;
//! - what **Redis** held: a snapshot of every semaphore every few tens of milliseconds
//!   (`snapshots.log`); an entry's lease is *valid* at a snapshot when its expiry is later than
//!   the snapshot's Redis time;
//! - what the **runner** did (`runner.log`): every fault with its start and end, process
//!   spawns and exits, Redis restarts, and every decision of the fenced resource.
//!
//! The properties (each violation names one):
//!
//! 1. `limit-in-redis`: in every snapshot, the permits of the holders whose lease is valid
//!    add up to at most the limit, their slots are distinct, below the limit, and mapped to
//!    them in the slot table. No exception.
//! 2. `limit-believed`: at every instant, the permits of the holders that *believe* they hold
//!    add up to at most the limit, on distinct slots — except while one of them was no
//!    longer valid in Redis (a stale holder, explained by property 3). Every such overlap is
//!    counted by the class of fault that explains it.
//! 3. `stale-belief`: a holder that believes while its lease is not valid in Redis (absent,
//!    expired, or with other slots) at a snapshot `s*` is explained only by a documented
//!    fault: its process was paused (SIGSTOP) or stalled (no timer fired: starved) between
//!    `s* − lease` and `s*`, Redis lost its data after the grant, or an operator
//!    force-released it (then it must learn within one renewal interval of the release's
//!    end — or by its local deadline if Redis or its connection was down meanwhile). And it
//!    must stop
//!    believing — the guarded work cancelled — within one renewal interval (+ slack) of the
//!    first moment it could learn: `max(s*, end of the pause)`, or after a data loss
//!    `max(Redis answering again, restart + lease − renewal interval)` (its client may still
//!    be reconnecting; its local deadline then ends it). Unexplained, `slack` is tolerated.
//! 4. `fencing`: the resource's decisions replay (per slot, the highest `(epoch, generation)`
//!    wins); no two grants share `(semaphore, epoch, slot, generation)`; generations of a slot
//!    increase in grant order; every write a stale holder made after a newer holder's first
//!    write was rejected; a holder still valid in Redis, and not paused, never had a write
//!    rejected; no write was sent after the work was cancelled.
//! 5. `recovery`: once a worker is SIGKILLed at `K`, none of its entries (holders or waiters)
//!    is still in Redis `lease + slack` after `K` (later only by the time a renewal it had in
//!    flight was held up by a fault) while a live waiter is queued on that semaphore whose
//!    process was not paused, stalled or cut off from Redis meanwhile; and no entry of a dead
//!    process has its lease extended past that bound.
//! 6. `wait-while-free`: no live waiter stays queued for longer than the fallback interval
//!    (+ slack) while the head of the queue fits in the permits left by valid leases (they
//!    are free: the next script run grants them); and a waiter learns of its grant within
//!    the fallback interval (+ slack) of the grant in Redis, unless its process was paused,
//!    stalled, or its command connection faulted meanwhile — lost notifications (pub/sub cut,
//!    black-holed or killed) are not an excuse: the fallback poll must find the grant; and no
//!    grant stays held in Redis longer than that by a live process that never reports it.
//! 7. `run-cancel`: every `Permit::run` whose permit was lost had its work dropped at once
//!    (and, by property 3, within one renewal interval of the loss).
//! 8. `cleanup`: once every worker has exited, every entry left in Redis has a lease (no
//!    orphan that would never expire), no lease outlives the last worker by more than one
//!    lease, no subscription, connection or foreign key is left, and once the leases ran out
//!    a redsem call leaves only the configuration (limit, free slots, fences).
//! 9. `liveness`: every worker exits within 20 s of SIGTERM (no acquire or release hangs),
//!    none crashes, and every acquire it started returned.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::config::{Config, FaultKind, Timing};
use crate::runner::{FinalState, epoch_of};

/// One broken property, with the evidence.
#[derive(Clone, Debug, Serialize)]
pub struct Violation {
    /// The property's name (see the module docs).
    pub property: &'static str,
    /// What happened, with times and ids.
    pub message: String,
}

/// The figures of a run and the violations found.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Seed of the run.
    pub seed: u64,
    /// Length of the fault phase, in seconds.
    pub seconds: u64,
    /// Worker processes started (including replacements of killed ones).
    pub workers_started: usize,
    /// Acquisitions (permits granted to a worker).
    pub acquisitions: usize,
    /// Acquire calls that failed, by reason.
    pub acquire_failures: BTreeMap<String, usize>,
    /// Permits reported lost, by reason.
    pub losses: BTreeMap<String, usize>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, usize>,
    /// Stalls (≥ the stall threshold) the workers observed outside injected pauses.
    pub stalls: usize,
    /// Longest stall outside injected pauses, in ms.
    pub longest_stall_ms: f64,
    /// Snapshots of the semaphores taken.
    pub snapshots: usize,
    /// Fenced writes: accepted, rejected, refused (unknown epoch).
    pub writes: [usize; 3],
    /// Writes made by a stale holder: rejected, and accepted before any newer holder of the
    /// slot had written.
    pub stale_writes: [usize; 2],
    /// Stale holders whose belief overlapped others' beyond the limit, by the fault class
    /// that explains them.
    pub overlaps: BTreeMap<String, usize>,
    /// Stale-belief episodes (property 3), by class.
    pub stale_beliefs: BTreeMap<String, usize>,
    /// Worst delay between the first moment a stale holder could learn and its giving up,
    /// by class, in ms.
    pub worst_detection_ms: BTreeMap<String, f64>,
    /// Entries of killed workers reaped; worst time from the kill to the first snapshot
    /// without the entry, among the holders (slots) of a killed process whose lease ran out
    /// while a live waiter was queued, when nothing (a DEBUG SLEEP, a fault delaying its last
    /// renewal) held it up (ms, to the resolution of the snapshots).
    pub dead_entries: usize,
    /// See `dead_entries`.
    pub worst_recovery_ms: f64,
    /// Recovery times of dead entries when live waiters were queued: 99th percentile (ms).
    pub p99_recovery_ms: f64,
    /// Median of the same recovery times (ms).
    pub median_recovery_ms: f64,
    /// How many dead entries those figures are computed over.
    pub recovery_samples: usize,
    /// Longest time a waiter took to learn of its grant, when not excused (ms).
    pub worst_grant_notice_ms: f64,
    /// Grants learned later than 50 ms after they were made (not excused): found by the
    /// fallback poll or a resync after a lost notification.
    pub late_grant_notices: usize,
    /// Longest time the head of a queue fitted in free permits with a live waiter (ms).
    pub worst_free_wait_ms: f64,
    /// Longest acquire (from call to grant), in ms.
    pub longest_acquire_ms: f64,
    /// Violations, in the order found.
    pub violations: Vec<Violation>,
    /// Violations by property (all of them, including those not listed in `violations`).
    pub violation_counts: BTreeMap<String, usize>,
}

const MAX_LISTED: usize = 10;

impl Report {
    fn violation(&mut self, property: &'static str, message: String) {
        *self
            .violation_counts
            .entry(property.to_owned())
            .or_default() += 1;
        if self
            .violations
            .iter()
            .filter(|v| v.property == property)
            .count()
            < MAX_LISTED
        {
            self.violations.push(Violation { property, message });
        }
    }

    /// Total number of violations.
    pub fn total_violations(&self) -> usize {
        self.violation_counts.values().sum()
    }

    /// The report as text.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "seed {}, {} s of faults, {} worker processes",
            self.seed, self.seconds, self.workers_started
        );
        let _ = writeln!(
            s,
            "acquisitions: {}   longest acquire: {:.0} ms",
            self.acquisitions, self.longest_acquire_ms
        );
        let _ = writeln!(s, "acquire failures: {}", kv(&self.acquire_failures));
        let _ = writeln!(s, "permits lost: {}", kv(&self.losses));
        let total: usize = self.faults.values().sum();
        let _ = writeln!(s, "faults injected: {total}: {}", kv(&self.faults));
        let _ = writeln!(
            s,
            "stalls observed outside injected pauses: {} (longest {:.0} ms)",
            self.stalls, self.longest_stall_ms
        );
        let _ = writeln!(
            s,
            "snapshots of Redis: {}   fenced writes: {} accepted, {} rejected, {} refused (unknown epoch)",
            self.snapshots, self.writes[0], self.writes[1], self.writes[2]
        );
        let _ = writeln!(
            s,
            "stale holders' writes: {} rejected by the fence, {} accepted before any newer holder wrote",
            self.stale_writes[0], self.stale_writes[1]
        );
        let _ = writeln!(
            s,
            "stale holders in overlaps beyond the limit (believed): {}",
            kv(&self.overlaps)
        );
        let _ = writeln!(s, "stale beliefs (explained): {}", kv(&self.stale_beliefs));
        let det: Vec<String> = self
            .worst_detection_ms
            .iter()
            .map(|(k, v)| format!("{k} {v:.0} ms"))
            .collect();
        let _ = writeln!(
            s,
            "worst time to give up a stale permit once it could know: {}",
            if det.is_empty() {
                "-".to_owned()
            } else {
                det.join(", ")
            }
        );
        let _ = writeln!(
            s,
            "dead entries reaped: {}   slots of SIGKILLed holders free again, with waiters queued ({} cases): median {:.0} ms, p99 {:.0} ms, worst {:.0} ms",
            self.dead_entries,
            self.recovery_samples,
            self.median_recovery_ms,
            self.p99_recovery_ms,
            self.worst_recovery_ms
        );
        let _ = writeln!(
            s,
            "grant notices: worst {:.0} ms, {} later than 50 ms   longest wait while permits were free: {:.0} ms",
            self.worst_grant_notice_ms, self.late_grant_notices, self.worst_free_wait_ms
        );
        let _ = writeln!(
            s,
            "violations: {} {}",
            self.total_violations(),
            if self.violation_counts.is_empty() {
                String::new()
            } else {
                format!("({})", kv(&self.violation_counts))
            }
        );
        for v in &self.violations {
            let _ = writeln!(s, "  [{}] {}", v.property, v.message);
        }
        s
    }
}

fn kv(m: &BTreeMap<String, usize>) -> String {
    if m.is_empty() {
        return "-".to_owned();
    }
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn ms(us: i64) -> f64 {
    us as f64 / 1000.0
}

// ---------------------------------------------------------------------------------------
// The logs, parsed

#[derive(Debug)]
struct Fault {
    t0: i64,
    t1: i64,
    kind: FaultKind,
    slot: Option<usize>,
    worker: Option<u32>,
    detail: String,
}

#[derive(Debug, Clone, Copy)]
struct Restart {
    start: i64,
    dead: i64,
    ready: i64,
}

#[derive(Debug, Default)]
struct Worker {
    slot: usize,
    spawn: i64,
    exit: Option<(i64, String)>,
    killed_at: Option<i64>,
    client_id: Option<String>,
    stopped: bool,
    stalls: Vec<(i64, i64)>,
    pauses: Vec<(i64, i64)>,
}

impl Worker {
    fn death(&self) -> i64 {
        self.killed_at
            .or(self.exit.as_ref().map(|e| e.0))
            .unwrap_or(i64::MAX)
    }
    fn alive(&self, t: i64) -> bool {
        self.spawn <= t && t < self.death()
    }
}

#[derive(Debug, Default)]
struct Op {
    name: String,
    worker: u32,
    sem: usize,
    n: u32,
    run_style: bool,
    begin: i64,
    acq: Option<i64>,
    holder: Option<String>,
    fences: Vec<(u32, u64)>,
    lost: Option<(i64, String)>,
    cancel: Option<i64>,
    done: Option<i64>,
    fail: Option<(i64, String)>,
    epoch: Option<u32>,
    /// Redis time (ms) of the grant, from a snapshot.
    granted_ms: Option<i64>,
    /// Snapshots of its semaphore while it could matter: (Redis µs, valid, epoch known).
    obs: Vec<(i64, bool)>,
}

impl Op {
    /// When it stopped believing it held the permit (or `None`: never held).
    fn belief_end(&self, w: &Worker) -> Option<i64> {
        self.acq?;
        let ends = [self.done, self.cancel, self.lost.as_ref().map(|l| l.0)];
        let end = ends.into_iter().flatten().min();
        Some(end.unwrap_or_else(|| w.death()).min(w.death()))
    }
}

#[derive(Debug)]
struct Write {
    worker: u32,
    op: String,
    sem: usize,
    slot: u32,
    epoch: Option<u32>,
    generation: u64,
    sent: i64,
    decision: char,
}

#[derive(Debug, Clone)]
struct Entry {
    id: u32,
    exp_ms: i64,
    queue: i64,
    n: i64,
    granted_ms: i64,
    slots: Vec<u32>,
}

struct Logs {
    cfg: Config,
    t: Timing,
    phases: HashMap<String, i64>,
    workers: BTreeMap<u32, Worker>,
    faults: Vec<Fault>,
    restarts: Vec<Restart>,
    holds: HashMap<String, Option<u32>>,
    writes: Vec<Write>,
    ops: Vec<Op>,
    op_index: HashMap<String, usize>,
    client_worker: HashMap<String, u32>,
    final_state: Option<FinalState>,
    /// (slot, from, to, worker): who occupied each slot when
    occupancy: Vec<(usize, i64, i64, u32)>,
    /// worker → windows during which its command connection was faulted
    cmd_windows: HashMap<u32, Vec<(i64, i64)>>,
    /// holder id → (start, end) of an operator's `force_release` of it
    evictions: HashMap<String, (i64, i64)>,
}

fn num<T: std::str::FromStr>(s: Option<&&str>) -> Option<T> {
    s.and_then(|s| s.parse().ok())
}

fn parse_runner(text: &str, logs: &mut Logs) {
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f[0] {
            "phase" if f.len() == 3 => {
                logs.phases
                    .insert(f[2].to_owned(), num(f.get(1)).unwrap_or(0));
            }
            "spawn" if f.len() == 5 => {
                let (Some(t), Some(id), Some(slot)) =
                    (num(f.get(1)), num::<u32>(f.get(2)), num(f.get(3)))
                else {
                    continue;
                };
                let w = logs.workers.entry(id).or_default();
                w.spawn = t;
                w.slot = slot;
            }
            "exit" if f.len() == 4 => {
                let (Some(t), Some(id)) = (num(f.get(1)), num::<u32>(f.get(2))) else {
                    continue;
                };
                logs.workers.entry(id).or_default().exit = Some((t, f[3].to_owned()));
            }
            "fault" if f.len() == 7 => {
                let Ok(kind) = f[3].parse::<FaultKind>() else {
                    continue;
                };
                logs.faults.push(Fault {
                    t0: num(f.get(1)).unwrap_or(0),
                    t1: num(f.get(2)).unwrap_or(0),
                    kind,
                    slot: num(f.get(4)),
                    worker: num(f.get(5)),
                    detail: f[6].to_owned(),
                });
            }
            "restart" if f.len() == 4 => {
                logs.restarts.push(Restart {
                    start: num(f.get(1)).unwrap_or(0),
                    dead: num(f.get(2)).unwrap_or(0),
                    ready: num(f.get(3)).unwrap_or(0),
                });
            }
            "hold" if f.len() == 6 => {
                logs.holds.insert(f[3].to_owned(), num(f.get(5)));
            }
            "write" if f.len() == 10 => {
                logs.writes.push(Write {
                    worker: num(f.get(2)).unwrap_or(u32::MAX),
                    op: f[3].to_owned(),
                    sem: num(f.get(4)).unwrap_or(usize::MAX),
                    slot: num(f.get(5)).unwrap_or(u32::MAX),
                    epoch: num(f.get(6)),
                    generation: num(f.get(7)).unwrap_or(0),
                    sent: num(f.get(8)).unwrap_or(0),
                    decision: f[9].chars().next().unwrap_or('?'),
                });
            }
            _ => {}
        }
    }
}

fn parse_worker(id: u32, text: &str, logs: &mut Logs) {
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let t: i64 = num(f.get(1)).unwrap_or(0);
        let op = |logs: &mut Logs| -> Option<usize> { logs.op_index.get(*f.get(2)?).copied() };
        match f[0] {
            "start" if f.len() == 4 => {
                logs.client_worker.insert(f[3].to_owned(), id);
                logs.workers.entry(id).or_default().client_id = Some(f[3].to_owned());
            }
            "stall" if f.len() == 3 => {
                let t1 = num(f.get(2)).unwrap_or(t);
                logs.workers.entry(id).or_default().stalls.push((t, t1));
            }
            "stop" => logs.workers.entry(id).or_default().stopped = true,
            "begin" if f.len() == 8 => {
                let o = Op {
                    name: f[2].to_owned(),
                    worker: id,
                    sem: num(f.get(3)).unwrap_or(0),
                    n: num(f.get(4)).unwrap_or(1),
                    run_style: f[7] == "run",
                    begin: t,
                    ..Op::default()
                };
                logs.op_index.insert(o.name.clone(), logs.ops.len());
                logs.ops.push(o);
            }
            "acq" if f.len() == 6 => {
                if let Some(i) = op(logs) {
                    let o = &mut logs.ops[i];
                    o.acq = Some(t);
                    o.holder = Some(f[3].to_owned());
                    o.fences = f[5]
                        .split(',')
                        .filter_map(|p| {
                            let (s, g) = p.split_once(':')?;
                            Some((s.parse().ok()?, g.parse().ok()?))
                        })
                        .collect();
                }
            }
            "fail" if f.len() == 4 => {
                if let Some(i) = op(logs) {
                    logs.ops[i].fail = Some((t, f[3].to_owned()));
                }
            }
            "lost" if f.len() == 4 => {
                if let Some(i) = op(logs) {
                    logs.ops[i].lost = Some((t, f[3].to_owned()));
                }
            }
            "cancel" if f.len() == 3 => {
                if let Some(i) = op(logs) {
                    logs.ops[i].cancel.get_or_insert(t);
                }
            }
            "done" if f.len() == 4 => {
                if let Some(i) = op(logs) {
                    logs.ops[i].done = Some(t);
                }
            }
            _ => {}
        }
    }
}

fn overlaps(windows: &[(i64, i64)], a: i64, b: i64) -> bool {
    windows.iter().any(|&(s, e)| s <= b && e >= a)
}

impl Logs {
    fn load(dir: &Path) -> anyhow::Result<Logs> {
        let cfg: Config = serde_json::from_slice(
            &std::fs::read(dir.join("config.json")).context("reading config.json")?,
        )?;
        let mut logs = Logs {
            t: cfg.us(),
            cfg,
            phases: HashMap::new(),
            workers: BTreeMap::new(),
            faults: Vec::new(),
            restarts: Vec::new(),
            holds: HashMap::new(),
            writes: Vec::new(),
            ops: Vec::new(),
            op_index: HashMap::new(),
            client_worker: HashMap::new(),
            final_state: None,
            occupancy: Vec::new(),
            cmd_windows: HashMap::new(),
            evictions: HashMap::new(),
        };
        let runner =
            std::fs::read_to_string(dir.join("runner.log")).context("reading runner.log")?;
        parse_runner(&runner, &mut logs);
        let ids: Vec<u32> = logs.workers.keys().copied().collect();
        for id in ids {
            let text = std::fs::read_to_string(dir.join(format!("w{id}.log"))).unwrap_or_default();
            parse_worker(id, &text, &mut logs);
        }
        logs.final_state = std::fs::read(dir.join("final.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        for f in &logs.faults {
            if f.kind == FaultKind::ForceRelease
                && let Some(rest) = f.detail.strip_prefix("holder=")
                && let Some((holder, removed)) = rest.split_once(",removed=")
                && removed != "false"
            {
                logs.evictions.insert(holder.to_owned(), (f.t0, f.t1));
            }
            let Some(w) = f.worker else { continue };
            match f.kind {
                FaultKind::KillHolder | FaultKind::KillWaiter => {
                    if let Some(wk) = logs.workers.get_mut(&w) {
                        wk.killed_at = Some(f.t0);
                    }
                }
                FaultKind::PauseShort | FaultKind::PauseLong => {
                    if let Some(wk) = logs.workers.get_mut(&w) {
                        wk.pauses.push((f.t0, f.t1));
                    }
                }
                _ => {}
            }
        }
        for (&id, w) in &logs.workers {
            logs.occupancy.push((w.slot, w.spawn, w.death(), id));
        }
        logs.compute_cmd_windows();
        for o in &mut logs.ops {
            o.epoch = logs.holds.get(&o.name).copied().flatten();
        }
        Ok(logs)
    }

    fn restart_pairs(&self) -> Vec<(i64, i64)> {
        self.restarts.iter().map(|r| (r.start, r.dead)).collect()
    }

    /// Windows during which `worker`'s process did not run: injected pauses and observed
    /// stalls.
    fn halts(&self, worker: u32) -> Vec<(i64, i64)> {
        let Some(w) = self.workers.get(&worker) else {
            return Vec::new();
        };
        w.pauses.iter().chain(&w.stalls).copied().collect()
    }

    /// Windows during which `worker`'s command connection was faulted (plus the time the
    /// connection manager may take to reconnect).
    fn cmd_faults(&self, worker: u32) -> Vec<(i64, i64)> {
        self.cmd_windows.get(&worker).cloned().unwrap_or_default()
    }

    fn compute_cmd_windows(&mut self) {
        let mut by_slot: HashMap<usize, Vec<(i64, i64, u32)>> = HashMap::new();
        for &(slot, from, to, w) in &self.occupancy {
            by_slot.entry(slot).or_default().push((from, to, w));
        }
        for f in &self.faults {
            let Some(slot) = f.slot else { continue };
            let after = match f.kind {
                FaultKind::CutCmd => 2_500_000,
                FaultKind::BlackholeCmd | FaultKind::Latency => 100_000,
                _ => continue,
            };
            let (a, b) = (f.t0, f.t1 + after);
            for &(from, to, w) in by_slot.get(&slot).into_iter().flatten() {
                if from <= b && to >= a {
                    self.cmd_windows.entry(w).or_default().push((a, b));
                }
            }
        }
    }

    /// Windows during which Redis did not answer anyone (DEBUG SLEEP, restarts, and the
    /// reconnection after a restart).
    fn global_halts(&self) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        for f in &self.faults {
            match f.kind {
                FaultKind::DebugSleep => out.push((f.t0, f.t1 + 100_000)),
                FaultKind::RestartDataLoss => out.push((f.t0, f.t1 + 2_500_000)),
                _ => {}
            }
        }
        out
    }

    fn worker_of_id(&self, id: &str) -> Option<u32> {
        let client = id.split('.').next()?;
        self.client_worker.get(client).copied()
    }
}

// ---------------------------------------------------------------------------------------
// The checks

/// Checks the run in `dir` (written by [`crate::runner::execute`]).
///
/// # Errors
/// Missing or unreadable logs.
pub fn check(dir: &Path) -> anyhow::Result<Report> {
    let mut logs = Logs::load(dir)?;
    let mut r = Report {
        seed: logs.cfg.seed,
        seconds: logs.cfg.seconds,
        workers_started: logs.workers.len(),
        ..Report::default()
    };
    figures(&logs, &mut r);
    snapshots(dir, &mut logs, &mut r)?;
    let inv = stale_beliefs(&logs, &mut r);
    believed_limit(&logs, &inv, &mut r);
    fencing(&logs, &inv, &mut r);
    notices(&logs, &mut r);
    run_cancel(&logs, &mut r);
    cleanup(&logs, &mut r);
    liveness(&logs, &mut r);
    Ok(r)
}

fn figures(logs: &Logs, r: &mut Report) {
    for f in &logs.faults {
        if f.detail != "no-target" {
            *r.faults.entry(f.kind.name().to_owned()).or_default() += 1;
        }
    }
    for o in &logs.ops {
        if let Some(acq) = o.acq {
            r.acquisitions += 1;
            r.longest_acquire_ms = r.longest_acquire_ms.max(ms(acq - o.begin));
        }
        if let Some((_, why)) = &o.fail {
            let key = why.split(':').next().unwrap_or(why).to_owned();
            *r.acquire_failures.entry(key).or_default() += 1;
        }
        if let Some((_, why)) = &o.lost {
            *r.losses.entry(why.clone()).or_default() += 1;
        }
    }
    for w in logs.workers.values() {
        for &(a, b) in &w.stalls {
            if !overlaps(&w.pauses, a, b) {
                r.stalls += 1;
                r.longest_stall_ms = r.longest_stall_ms.max(ms(b - a));
            }
        }
    }
    for w in &logs.writes {
        match w.decision {
            'A' => r.writes[0] += 1,
            'R' => r.writes[1] += 1,
            _ => r.writes[2] += 1,
        }
    }
}

fn parse_entry(s: &str) -> Option<Entry> {
    let f: Vec<&str> = s.split(':').collect();
    if f.len() != 7 {
        return None;
    }
    Some(Entry {
        id: f[0].parse().ok()?,
        exp_ms: f[1].parse().ok()?,
        queue: f[2].parse().ok()?,
        n: f[3].parse().ok()?,
        granted_ms: f[4].parse().ok()?,
        slots: if f[6] == "-" {
            Vec::new()
        } else {
            f[6].split(',').filter_map(|x| x.parse().ok()).collect()
        },
    })
}

/// A dead worker's entry being tracked for property 5.
struct DeadEntry {
    sem: usize,
    worker: u32,
    id: u32,
    killed: i64,
    last_seen: i64,
    gone_at: Option<i64>,
    /// A live waiter was queued when its lease ran out.
    demand: bool,
    /// It was seen after its lease ran out.
    seen_expired: bool,
    /// It held slots (a holder, not a waiter).
    held: bool,
    reported: bool,
}

/// An episode of property 6: the queue head fits in free permits.
struct FreeEpisode {
    head: u32,
    first: i64,
    last: i64,
    waiters: Vec<u32>,
}

/// Reads `snapshots.log` once, in order: properties 1, 5 and the first half of 6, and each
/// op's observations for the others.
fn snapshots(dir: &Path, logs: &mut Logs, r: &mut Report) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(dir.join("snapshots.log")).context("snapshots.log")?;
    let t = logs.t;
    let restarts = logs.restart_pairs();
    let global = logs.global_halts();
    let nsems = logs.cfg.sems.len();
    let mut names: Vec<String> = Vec::new();
    let mut id_worker: Vec<Option<u32>> = Vec::new();
    let mut op_iid: Vec<Option<u32>> = vec![None; logs.ops.len()];
    let holder_op: HashMap<String, usize> = logs
        .ops
        .iter()
        .enumerate()
        .filter_map(|(i, o)| Some((o.holder.clone()?, i)))
        .collect();
    // ops by semaphore, sorted by begin; the window in which a snapshot matters to an op
    let mut by_sem: Vec<Vec<(i64, i64, usize)>> = vec![Vec::new(); nsems];
    for (i, o) in logs.ops.iter().enumerate() {
        let w = &logs.workers[&o.worker];
        let Some(end) = o.belief_end(w) else { continue };
        by_sem[o.sem].push((o.begin, end + t.lease + t.slack, i));
    }
    for v in &mut by_sem {
        v.sort();
    }
    let mut cursor = vec![0usize; nsems];
    let mut active: Vec<Vec<usize>> = vec![Vec::new(); nsems];
    // property 5 state
    let mut dead: HashMap<u32, DeadEntry> = HashMap::new();
    let mut deadline_of: HashMap<u32, i64> = HashMap::new();
    for (&id, w) in &logs.workers {
        let Some(k) = w.killed_at else { continue };
        let mut latest = k;
        for f in &logs.faults {
            let hits_worker = f.slot.is_some_and(|s| {
                logs.occupancy
                    .iter()
                    .any(|&(slot, from, to, wk)| slot == s && wk == id && from <= k && to >= k)
            });
            let delays = match f.kind {
                FaultKind::BlackholeCmd | FaultKind::Latency => hits_worker,
                FaultKind::DebugSleep => true,
                _ => false,
            };
            if delays && f.t0 <= k && f.t1 >= k {
                latest = latest.max(f.t1);
            }
        }
        deadline_of.insert(id, latest + t.lease + t.slack);
    }
    let mut halts_cache: HashMap<u32, Vec<(i64, i64)>> = HashMap::new();
    let mut excused = |logs: &Logs, w: u32, a: i64, b: i64| -> bool {
        let h = halts_cache.entry(w).or_insert_with(|| {
            let mut v = logs.halts(w);
            v.extend(logs.cmd_faults(w));
            v
        });
        overlaps(h, a, b) || overlaps(&global, a, b)
    };
    let mut episodes: Vec<Option<FreeEpisode>> = (0..nsems).map(|_| None).collect();
    let mut recoveries: Vec<f64> = Vec::new();
    // grants in Redis that no worker reported: id → (semaphore, first and last time seen held)
    let mut unclaimed: HashMap<u32, (usize, i64, i64)> = HashMap::new();
    let mut claimed: HashSet<u32> = HashSet::new();

    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f[0] == "I" && f.len() == 3 {
            let id = f[2];
            names.push(id.to_owned());
            id_worker.push(logs.worker_of_id(id));
            if let Some(&i) = holder_op.get(id) {
                op_iid[i] = Some(names.len() as u32 - 1);
                claimed.insert(names.len() as u32 - 1);
            }
            continue;
        }
        if f[0] != "S" || f.len() != 8 {
            continue;
        }
        let (Some(sent), Some(recv), Some(now), Some(sem)) = (
            num::<i64>(f.get(1)),
            num::<i64>(f.get(2)),
            num::<i64>(f.get(3)),
            num::<usize>(f.get(4)),
        ) else {
            continue;
        };
        if sem >= nsems {
            continue;
        }
        if epoch_of(&restarts, sent, recv).is_none() {
            continue;
        }
        r.snapshots += 1;
        let limit = i64::from(logs.cfg.sems[sem].limit);
        let name = &logs.cfg.sems[sem].name;
        let entries: Vec<Entry> = if f[6] == "-" {
            Vec::new()
        } else {
            f[6].split(';').filter_map(parse_entry).collect()
        };
        let slot_table: HashMap<u32, u32> = if f[7] == "-" {
            HashMap::new()
        } else {
            f[7].split(';')
                .filter_map(|p| {
                    let (s, id) = p.split_once('=')?;
                    Some((s.parse().ok()?, id.parse().ok()?))
                })
                .collect()
        };
        let now_ms = now / 1000;
        let valid = |e: &Entry| e.exp_ms > now_ms;
        let idname = |id: u32| names.get(id as usize).map_or("?", |s| s.as_str());

        // property 1
        let holders: Vec<&Entry> = entries
            .iter()
            .filter(|e| valid(e) && !e.slots.is_empty())
            .collect();
        let used: i64 = holders.iter().map(|e| e.n.max(0)).sum();
        let mut seen_slots = HashSet::new();
        let mut problem = None;
        if used > limit {
            problem = Some(format!(
                "{used} permits held with valid leases, limit {limit}"
            ));
        }
        for e in &holders {
            if e.queue >= 0 {
                problem = Some(format!("{} is queued and holds slots", idname(e.id)));
            }
            if e.slots.len() as i64 != e.n {
                problem = Some(format!(
                    "{} holds {} slots for {} permits",
                    idname(e.id),
                    e.slots.len(),
                    e.n
                ));
            }
            for &s in &e.slots {
                if i64::from(s) >= limit {
                    problem = Some(format!("{} holds slot {s} ≥ limit", idname(e.id)));
                }
                if !seen_slots.insert(s) {
                    problem = Some(format!("slot {s} claimed by two holders with valid leases"));
                }
                if slot_table.get(&s) != Some(&e.id) {
                    problem = Some(format!(
                        "slot {s} of {} is mapped to {} in the slot table",
                        idname(e.id),
                        slot_table.get(&s).map_or("nobody", |&i| idname(i))
                    ));
                }
            }
        }
        if let Some(p) = problem {
            r.violation("limit-in-redis", format!("{name} at {}: {p}", ms_fmt(now)));
        }

        // observations for the ops active at this time
        while cursor[sem] < by_sem[sem].len() && by_sem[sem][cursor[sem]].0 < now {
            active[sem].push(by_sem[sem][cursor[sem]].2);
            cursor[sem] += 1;
        }
        let by_id: HashMap<u32, &Entry> = entries.iter().map(|e| (e.id, e)).collect();
        let ops = &mut logs.ops;
        active[sem].retain(|&i| {
            let o = &ops[i];
            let end = o.belief_end(&logs.workers[&o.worker]).unwrap_or(i64::MIN);
            end + t.lease + t.slack >= now
        });
        for &i in &active[sem] {
            let o = &mut ops[i];
            let entry = op_iid[i].and_then(|id| by_id.get(&id));
            if let Some(e) = entry
                && e.granted_ms >= 0
                && o.granted_ms.is_none()
            {
                o.granted_ms = Some(e.granted_ms);
            }
            if o.acq.is_some_and(|a| a < now) {
                // holder ids are unique: finding its entry, whichever Redis incarnation
                // answered, proves the grant lives there
                let ok = entry.is_some_and(|e| {
                    valid(e)
                        && e.queue < 0
                        && e.slots == o.fences.iter().map(|f| f.0).collect::<Vec<_>>()
                });
                o.obs.push((now, ok));
            }
        }

        // property 5: entries of killed workers
        let waiters: Vec<&Entry> = {
            let mut q: Vec<&Entry> = entries.iter().filter(|e| e.queue >= 0).collect();
            q.sort_by_key(|e| e.queue);
            q
        };
        let live_waiter =
            |logs: &Logs, excused: &mut dyn FnMut(&Logs, u32, i64, i64) -> bool, from: i64| {
                waiters.iter().any(|e| {
                    valid(e)
                        && id_worker
                            .get(e.id as usize)
                            .copied()
                            .flatten()
                            .is_some_and(|w| {
                                logs.workers.get(&w).is_some_and(|wk| wk.alive(now))
                                    && !excused(logs, w, from, now)
                            })
                })
            };
        let mut present_dead: HashSet<u32> = HashSet::new();
        for e in &entries {
            let Some(w) = id_worker.get(e.id as usize).copied().flatten() else {
                continue;
            };
            let Some(&deadline) = deadline_of.get(&w) else {
                continue;
            };
            let killed = logs.workers[&w].killed_at.unwrap_or(i64::MAX);
            if now < killed {
                continue;
            }
            present_dead.insert(e.id);
            let d = dead.entry(e.id).or_insert(DeadEntry {
                sem,
                worker: w,
                id: e.id,
                killed,
                last_seen: now,
                gone_at: None,
                demand: false,
                seen_expired: false,
                held: false,
                reported: false,
            });
            d.last_seen = now;
            if e.exp_ms * 1000 > deadline {
                if !d.reported {
                    d.reported = true;
                    r.violation(
                        "recovery",
                        format!(
                            "{name}: entry {} of worker {w} (killed at {}) has a lease until {}, {:.0} ms after the kill",
                            idname(e.id),
                            ms_fmt(killed),
                            ms_fmt(e.exp_ms * 1000),
                            ms(e.exp_ms * 1000 - killed)
                        ),
                    );
                }
                continue;
            }
            let from = deadline - t.lease - t.slack;
            let demand = live_waiter(logs, &mut excused, from);
            // wanted when its lease ran out: a live waiter queued at the last sighting
            // before the expiry, and at the first one after it (if it was still there)
            if valid(e) {
                d.demand = demand;
            } else if !d.seen_expired {
                d.seen_expired = true;
                d.demand &= demand;
            }
            if !e.slots.is_empty() {
                d.held = true;
            }
            if now >= deadline && demand && !overlaps(&global, from, now) && !d.reported {
                d.reported = true;
                r.violation(
                    "recovery",
                    format!(
                        "{name}: entry {} of worker {w} (SIGKILLed at {}) is still in Redis at {} ({:.0} ms later; bound {:.0} ms) while live waiters are queued",
                        idname(e.id),
                        ms_fmt(killed),
                        ms_fmt(now),
                        ms(now - killed),
                        ms(deadline - killed)
                    ),
                );
            }
        }
        for (id, d) in dead.iter_mut() {
            if d.sem == sem && d.gone_at.is_none() && !present_dead.contains(id) {
                d.gone_at = Some(now);
            }
        }

        // grants nobody claims (yet)
        for e in &holders {
            if claimed.contains(&e.id) {
                continue;
            }
            let u = unclaimed.entry(e.id).or_insert((sem, now, now));
            u.2 = now;
        }

        // property 6, first half: the head of the queue fits in free permits
        let head = waiters.iter().find(|e| valid(e));
        let fits = head.filter(|h| used + h.n <= limit).map(|h| h.id);
        let ep = &mut episodes[sem];
        match (fits, ep.as_mut()) {
            (Some(h), Some(e)) if e.head == h => {
                e.last = now;
                let current: HashSet<u32> =
                    waiters.iter().filter(|x| valid(x)).map(|x| x.id).collect();
                e.waiters.retain(|w| current.contains(w));
            }
            _ => {
                if let Some(e) = ep.take() {
                    close_episode(logs, &e, name, &id_worker, &names, &mut excused, r);
                }
                if let Some(h) = fits {
                    *ep = Some(FreeEpisode {
                        head: h,
                        first: now,
                        last: now,
                        waiters: waiters.iter().filter(|x| valid(x)).map(|x| x.id).collect(),
                    });
                }
            }
        }
    }
    for (sem, ep) in episodes.into_iter().enumerate() {
        if let Some(e) = ep {
            let name = logs.cfg.sems[sem].name.clone();
            close_episode(logs, &e, &name, &id_worker, &names, &mut excused, r);
        }
    }
    // a grant held in Redis for longer than the fallback interval by a live process that
    // never reported it: the waiter never learned it was granted
    for (id, (sem, first, last)) in unclaimed {
        if claimed.contains(&id) || last - first <= t.fallback + t.slack {
            continue;
        }
        let Some(w) = id_worker.get(id as usize).copied().flatten() else {
            continue;
        };
        let alive = logs
            .workers
            .get(&w)
            .is_some_and(|wk| wk.alive(first) && wk.alive(last));
        if alive && !excused(logs, w, first - t.fallback, last) {
            r.violation(
                "wait-while-free",
                format!(
                    "{}: {} (worker {w}) was granted in Redis and held from {} to {} ({:.0} ms) but the worker never learned it",
                    logs.cfg.sems[sem].name,
                    names[id as usize],
                    ms_fmt(first),
                    ms_fmt(last),
                    ms(last - first)
                ),
            );
        }
    }
    for d in dead.values() {
        r.dead_entries += 1;
        let gone = d.gone_at.unwrap_or(d.last_seen + t.snapshot);
        let held_up = deadline_of
            .get(&d.worker)
            .is_some_and(|&dl| dl > d.killed + t.lease + t.slack)
            || overlaps(&global, d.killed, gone);
        if d.demand && d.held && !held_up {
            if std::env::var_os("REDSEM_CHAOS_DEBUG").is_some()
                && gone - d.killed > t.lease + t.slack
            {
                eprintln!(
                    "recovery {} ms: worker {} entry {} killed {} gone {}",
                    ms(gone - d.killed),
                    d.worker,
                    names[d.id as usize],
                    ms_fmt(d.killed),
                    ms_fmt(gone)
                );
            }
            recoveries.push(ms(gone - d.killed));
        }
    }
    recoveries.sort_by(f64::total_cmp);
    r.recovery_samples = recoveries.len();
    if let Some(&w) = recoveries.last() {
        r.worst_recovery_ms = w;
        r.p99_recovery_ms = recoveries[(recoveries.len() * 99 / 100).min(recoveries.len() - 1)];
        r.median_recovery_ms = recoveries[recoveries.len() / 2];
    }
    Ok(())
}

fn ms_fmt(us: i64) -> String {
    // seconds within the minute and milliseconds: enough to find the line in the logs
    format!("{}.{:06}", us / 1_000_000, us % 1_000_000)
}

fn close_episode(
    logs: &Logs,
    e: &FreeEpisode,
    name: &str,
    id_worker: &[Option<u32>],
    names: &[String],
    excused: &mut dyn FnMut(&Logs, u32, i64, i64) -> bool,
    r: &mut Report,
) {
    let t = logs.t;
    let dur = e.last - e.first;
    let unexcused = e.waiters.iter().any(|&id| {
        id_worker
            .get(id as usize)
            .copied()
            .flatten()
            .is_some_and(|w| {
                logs.workers.get(&w).is_some_and(|wk| wk.alive(e.last))
                    && !excused(logs, w, e.first - t.fallback, e.last)
            })
    });
    if !unexcused {
        return;
    }
    r.worst_free_wait_ms = r.worst_free_wait_ms.max(ms(dur));
    if dur > t.fallback + t.slack {
        r.violation(
            "wait-while-free",
            format!(
                "{name}: from {} to {} ({:.0} ms) the head of the queue ({}) fitted in the permits left free by valid leases, with live waiters queued",
                ms_fmt(e.first),
                ms_fmt(e.last),
                ms(dur),
                names.get(e.head as usize).map_or("?", |s| s.as_str())
            ),
        );
    }
}

/// Since when an op's lease may have been invalid in Redis (`possible`: from the last
/// snapshot that showed it valid, when something could have made it go unseen), and since
/// when it certainly was (`sure`: a snapshot showed it invalid while it still believed).
#[derive(Clone, Copy, Default)]
struct Stale {
    possible: Option<i64>,
    sure: Option<i64>,
}

/// Property 3. Returns, per op, since when it may have been, and since when it certainly
/// was, invalid in Redis while it believed it held.
fn stale_beliefs(logs: &Logs, r: &mut Report) -> Vec<Stale> {
    let t = logs.t;
    let global = logs.global_halts();
    let mut inv = vec![Stale::default(); logs.ops.len()];
    for (i, o) in logs.ops.iter().enumerate() {
        let Some(acq) = o.acq else { continue };
        let w = &logs.workers[&o.worker];
        let end = o.belief_end(w).unwrap_or(acq);
        let first_bad = o.obs.iter().position(|&(_, ok)| !ok);
        let s_valid = o.obs[..first_bad.unwrap_or(o.obs.len())]
            .iter()
            .rev()
            .find(|x| x.1 && x.0 <= end)
            .map_or(acq, |x| x.0);
        // did it stop believing because the permit was gone, or could it have been gone
        // unseen (between two snapshots) while its process did not run?
        let died = w.killed_at.is_some_and(|k| k <= end);
        let halted = overlaps(&logs.halts(o.worker), s_valid - t.lease, end);
        // Redis loses its data when it dies, not when the restart begins: a grant received
        // between the two (its script ran before the kill) may be gone too. So may a grant
        // whose acquisition spanned the restart and that the new Redis did not hold (the
        // runner could not tell its incarnation: `hold … ?`), even if its reply or
        // notification was read after Redis died.
        let unknown_epoch = matches!(logs.holds.get(&o.name), Some(None));
        let data_lost = logs.restarts.iter().any(|rs| {
            rs.start <= end && (rs.dead >= s_valid || (unknown_epoch && rs.dead >= o.begin))
        });
        let evicted = o
            .holder
            .as_ref()
            .and_then(|h| logs.evictions.get(h))
            .copied();
        let evicted_by_end = evicted.is_some_and(|(f0, _)| f0 <= end);
        let maybe_gone = o.lost.is_some() || died || halted || data_lost || evicted_by_end;
        let s_star = match first_bad {
            Some(k) if o.obs[k].0 <= end => o.obs[k].0,
            _ => {
                if maybe_gone && s_valid < end {
                    inv[i].possible = Some(s_valid);
                }
                continue;
            }
        };
        inv[i] = Stale {
            possible: Some(s_valid),
            sure: Some(s_star),
        };
        // explanations
        let restart = logs
            .restarts
            .iter()
            .find(|rs| rs.start >= o.begin.min(acq) && rs.start <= s_star);
        // halts that could have let its lease run out unnoticed (begun by s*), and halts
        // that kept it from learning afterwards (begun before it gave up)
        let all_halts = logs.halts(o.worker);
        let caused = |&(p, c): &(i64, i64)| p <= s_star && c >= s_star - t.lease;
        let cause = all_halts.iter().any(caused);
        let paused = w.pauses.iter().any(caused);
        let last_halt_end = all_halts
            .iter()
            .filter(|&&(p, c)| p <= end && c >= s_star - t.lease)
            .map(|h| h.1)
            .max();
        // the first moment it could learn: Redis answering again after the data loss (or
        // its local deadline, if the client was still reconnecting), the end of its pause
        let mut learn_from = s_star;
        let mut class = None;
        if let Some(rs) = restart {
            learn_from = learn_from.max(rs.ready.max(rs.start + t.lease - t.renew));
            class = Some("data-loss");
        }
        if let Some((f0, f1)) = evicted
            && f0 <= s_star
        {
            // an operator removed it: its next renewal says so, if Redis answers it; if Redis
            // or its command connection was down meanwhile, its local deadline does (lease −
            // margin after its last confirmed renewal, which was sent before the removal)
            let base = f1.max(last_halt_end.unwrap_or(f1));
            let window = (f0, base + t.renew + t.slack);
            let unreachable = overlaps(&global, window.0, window.1)
                || overlaps(&logs.cmd_faults(o.worker), window.0, window.1);
            let by = if unreachable {
                base.max(f0 + t.lease - t.renew)
            } else {
                base
            };
            learn_from = learn_from.max(by);
            class = Some("eviction");
        }
        if cause {
            class.get_or_insert(if paused { "pause" } else { "stall" });
        }
        if class.is_some()
            && let Some(c) = last_halt_end
        {
            learn_from = learn_from.max(c);
        }
        let Some(class) = class else {
            if end - s_star > t.slack {
                r.violation(
                    "stale-belief",
                    format!(
                        "op {} (worker {}, {}): believed it held slots {:?} until {} although Redis had no valid lease for it at {} ({:.0} ms), with no pause, stall or data loss to explain it",
                        o.name,
                        o.worker,
                        logs.cfg.sems[o.sem].name,
                        o.fences,
                        ms_fmt(end),
                        ms_fmt(s_star),
                        ms(end - s_star)
                    ),
                );
            } else {
                *r.stale_beliefs
                    .entry("within-slack".to_owned())
                    .or_default() += 1;
            }
            continue;
        };
        *r.stale_beliefs.entry(class.to_owned()).or_default() += 1;
        let delay = end - learn_from;
        let worst = r.worst_detection_ms.entry(class.to_owned()).or_insert(0.0);
        *worst = worst.max(ms(delay.max(0)));
        if delay > t.renew + t.slack {
            r.violation(
                "stale-belief",
                format!(
                    "op {} (worker {}, {}): stale since {} ({class}), it could know from {} but believed it held until {} ({:.0} ms > one renewal interval {:.0} ms + slack)",
                    o.name,
                    o.worker,
                    logs.cfg.sems[o.sem].name,
                    ms_fmt(s_star),
                    ms_fmt(learn_from),
                    ms_fmt(end),
                    ms(delay),
                    ms(t.renew)
                ),
            );
        }
    }
    inv
}

fn class_of(logs: &Logs, o: &Op, since: i64) -> &'static str {
    let w = &logs.workers[&o.worker];
    let evicted = o
        .holder
        .as_ref()
        .and_then(|h| logs.evictions.get(h))
        .is_some_and(|&(f0, _)| f0 <= since + logs.t.snapshot * 2);
    if evicted {
        "eviction"
    } else if logs
        .restarts
        .iter()
        .any(|rs| rs.start >= o.begin && rs.start <= since + logs.t.snapshot * 2)
    {
        "data-loss"
    } else if w
        .pauses
        .iter()
        .any(|&(p, c)| p <= since + logs.t.snapshot * 2 && c >= since - logs.t.lease)
    {
        "pause"
    } else {
        "stall"
    }
}

/// Property 2.
fn believed_limit(logs: &Logs, inv: &[Stale], r: &mut Report) {
    for (sem, spec) in logs.cfg.sems.iter().enumerate() {
        let limit = spec.limit;
        let mut edges: Vec<(i64, bool, usize)> = Vec::new();
        for (i, o) in logs.ops.iter().enumerate() {
            if o.sem != sem {
                continue;
            }
            let w = &logs.workers[&o.worker];
            let (Some(acq), Some(end)) = (o.acq, o.belief_end(w)) else {
                continue;
            };
            if end > acq {
                edges.push((acq, true, i));
                edges.push((end, false, i));
            }
        }
        // at equal times, ends first
        edges.sort_by_key(|&(t, start, i)| (t, start, i));
        let mut active: Vec<usize> = Vec::new();
        let mut culprits: HashSet<usize> = HashSet::new();
        for k in 0..edges.len() {
            let (t, start, i) = edges[k];
            if start {
                active.push(i);
            } else {
                active.retain(|&x| x != i);
            }
            let next = edges.get(k + 1).map_or(t, |e| e.0);
            if next <= t {
                continue;
            }
            let over = |set: &[usize]| {
                let n: u32 = set.iter().map(|&x| logs.ops[x].n).sum();
                let mut slots = HashSet::new();
                let dup = set
                    .iter()
                    .flat_map(|&x| logs.ops[x].fences.iter().map(|f| f.0))
                    .any(|s| !slots.insert(s));
                n > limit || dup
            };
            if !over(&active) {
                continue;
            }
            // explained from the moment enough of them are stale in Redis
            let mut stale: Vec<(i64, usize)> = active
                .iter()
                .filter_map(|&x| inv[x].possible.map(|s| (s, x)))
                .collect();
            stale.sort();
            let mut remaining = active.clone();
            let mut resolved_at = None;
            let mut culprit = None;
            for &(since, x) in &stale {
                remaining.retain(|&y| y != x);
                if !over(&remaining) {
                    resolved_at = Some(since);
                    culprit = Some(x);
                    break;
                }
            }
            match (resolved_at, culprit) {
                (Some(since), Some(x)) if since <= t + 1000 => {
                    if culprits.insert(x) {
                        let class = class_of(logs, &logs.ops[x], since);
                        *r.overlaps.entry(class.to_owned()).or_default() += 1;
                    }
                }
                _ => {
                    let who: Vec<String> = active
                        .iter()
                        .map(|&x| {
                            let o = &logs.ops[x];
                            format!("{} (worker {}, slots {:?})", o.name, o.worker, o.fences)
                        })
                        .collect();
                    r.violation(
                        "limit-believed",
                        format!(
                            "{}: from {} to {} ({:.1} ms), these believed they held, beyond the limit {limit}, with none known stale in Redis: {}",
                            spec.name,
                            ms_fmt(t),
                            ms_fmt(next),
                            ms(next - t),
                            who.join(", ")
                        ),
                    );
                }
            }
        }
    }
}

/// Property 4.
fn fencing(logs: &Logs, inv: &[Stale], r: &mut Report) {
    // replay
    let mut table: HashMap<(usize, u32), (u32, u64)> = HashMap::new();
    for w in &logs.writes {
        let expect = match w.epoch {
            None => 'X',
            Some(e) => {
                let key = (w.sem, w.slot);
                if table.get(&key).is_none_or(|&c| (e, w.generation) >= c) {
                    table.insert(key, (e, w.generation));
                    'A'
                } else {
                    'R'
                }
            }
        };
        if expect != w.decision {
            r.violation(
                "fencing",
                format!(
                    "the resource decided {} for a write of {} (worker {}, slot {}, epoch {:?}, generation {}); the replay says {expect}",
                    w.decision, w.op, w.worker, w.slot, w.epoch, w.generation
                ),
            );
        }
        let Some(&i) = logs.op_index.get(&w.op) else {
            continue;
        };
        let o = &logs.ops[i];
        let wk = &logs.workers[&o.worker];
        if let Some(end) = o.belief_end(wk)
            && w.sent > end + 1000
        {
            r.violation(
                "fencing",
                format!(
                    "op {} sent a write at {} after it stopped believing it held ({}): the work was not cancelled",
                    o.name,
                    ms_fmt(w.sent),
                    ms_fmt(end)
                ),
            );
        }
        let stale = inv[i].sure.is_some_and(|s| w.sent >= s);
        let maybe_stale = inv[i].possible.is_some_and(|s| w.sent >= s);
        match (stale, w.decision) {
            (true, 'R') => r.stale_writes[0] += 1,
            (true, 'A') => r.stale_writes[1] += 1,
            (false, 'R') if !maybe_stale => {
                let halted = overlaps(&logs.halts(o.worker), o.acq.unwrap_or(0), w.sent);
                if !halted {
                    r.violation(
                        "fencing",
                        format!(
                            "a write of op {} (worker {}, {} slot {} generation {}) was rejected at {} although its lease was valid in Redis: another holder of the slot had a higher generation",
                            o.name,
                            o.worker,
                            logs.cfg.sems[o.sem].name,
                            w.slot,
                            w.generation,
                            ms_fmt(w.sent)
                        ),
                    );
                }
            }
            _ => {}
        }
    }
    // unique and increasing generations
    let mut seen: HashMap<(usize, u32, u32, u64), &str> = HashMap::new();
    // (semaphore, epoch, slot) → (grant time, generation, op)
    type Grants<'a> = HashMap<(usize, u32, u32), Vec<(i64, u64, &'a str)>>;
    let mut by_slot: Grants = HashMap::new();
    for o in &logs.ops {
        let (Some(_), Some(e)) = (o.acq, o.epoch) else {
            continue;
        };
        for &(slot, generation) in &o.fences {
            if let Some(prev) = seen.insert((o.sem, e, slot, generation), &o.name) {
                r.violation(
                    "fencing",
                    format!(
                        "{} slot {slot} generation {generation} (epoch {e}) was granted twice: to {prev} and to {}",
                        logs.cfg.sems[o.sem].name, o.name
                    ),
                );
            }
            if let Some(a) = o.granted_ms {
                by_slot
                    .entry((o.sem, e, slot))
                    .or_default()
                    .push((a, generation, &o.name));
            }
        }
    }
    for ((sem, e, slot), mut v) in by_slot {
        v.sort();
        for pair in v.windows(2) {
            if pair[0].0 < pair[1].0 && pair[0].1 >= pair[1].1 {
                r.violation(
                    "fencing",
                    format!(
                        "{} slot {slot} (epoch {e}): {} was granted generation {} after {} got generation {}",
                        logs.cfg.sems[sem].name, pair[1].2, pair[1].1, pair[0].2, pair[0].1
                    ),
                );
            }
        }
    }
}

/// Property 6, second half: grants are learned within the fallback interval.
fn notices(logs: &Logs, r: &mut Report) {
    let t = logs.t;
    let global = logs.global_halts();
    for o in &logs.ops {
        let (Some(acq), Some(a)) = (o.acq, o.granted_ms) else {
            continue;
        };
        let granted = a * 1000;
        let delay = acq - granted;
        let mut excuses = logs.halts(o.worker);
        excuses.extend(logs.cmd_faults(o.worker));
        if overlaps(&excuses, granted - t.fallback, acq)
            || overlaps(&global, granted - t.fallback, acq)
        {
            continue;
        }
        r.worst_grant_notice_ms = r.worst_grant_notice_ms.max(ms(delay));
        if delay > 50_000 {
            r.late_grant_notices += 1;
        }
        // the grant time is in whole ms: one more ms of tolerance
        if delay > t.fallback + t.slack + 1000 {
            r.violation(
                "wait-while-free",
                format!(
                    "op {} (worker {}, {}): granted in Redis at {} but the waiter learned it only at {} ({:.0} ms > fallback {:.0} ms + slack)",
                    o.name,
                    o.worker,
                    logs.cfg.sems[o.sem].name,
                    ms_fmt(granted),
                    ms_fmt(acq),
                    ms(delay),
                    ms(t.fallback)
                ),
            );
        }
    }
}

/// Property 7.
fn run_cancel(logs: &Logs, r: &mut Report) {
    let t = logs.t;
    for o in &logs.ops {
        if !o.run_style {
            continue;
        }
        let Some((lost, _)) = &o.lost else { continue };
        match o.cancel {
            Some(c) if (c - lost).abs() <= t.slack => {}
            Some(c) => r.violation(
                "run-cancel",
                format!(
                    "op {}: lost at {} but its work was dropped at {}",
                    o.name,
                    ms_fmt(*lost),
                    ms_fmt(c)
                ),
            ),
            None if o.done.is_some_and(|d| d <= *lost) => {}
            None => r.violation(
                "run-cancel",
                format!(
                    "op {}: run() reported the permit lost at {} but its work was never dropped",
                    o.name,
                    ms_fmt(*lost)
                ),
            ),
        }
    }
}

/// Property 8.
fn cleanup(logs: &Logs, r: &mut Report) {
    let Some(f) = &logs.final_state else {
        r.violation(
            "cleanup",
            "final.json is missing: the run did not finish".into(),
        );
        return;
    };
    if let Some(e) = &f.error {
        r.violation("cleanup", format!("reading the final state failed: {e}"));
    }
    for o in &f.orphans {
        r.violation(
            "cleanup",
            format!("{o} is left without a lease: it would never expire"),
        );
    }
    for l in &f.leases_too_long {
        r.violation("cleanup", l.clone());
    }
    for k in &f.foreign_keys {
        r.violation("cleanup", format!("key {k} is left in Redis"));
    }
    for c in &f.channels {
        r.violation("cleanup", format!("channel {c} is still subscribed"));
    }
    for c in &f.clients {
        r.violation("cleanup", format!("a client connection is still open: {c}"));
    }
    for a in &f.after_reap {
        r.violation("cleanup", a.clone());
    }
}

/// Property 9.
fn liveness(logs: &Logs, r: &mut Report) {
    for (&id, w) in &logs.workers {
        match w.exit.as_ref().map(|e| e.1.as_str()) {
            Some("killed") | Some("ok") => {}
            Some("hung") => r.violation(
                "liveness",
                format!("worker {id} did not exit within 20 s of SIGTERM: an acquire, a work or a release hung"),
            ),
            Some("signal:15") if !w.stopped && w.client_id.is_none() => {}
            other => r.violation(
                "liveness",
                format!("worker {id} exited abnormally ({other:?}): see w{id}.err"),
            ),
        }
    }
    for o in &logs.ops {
        let w = &logs.workers[&o.worker];
        if !w.stopped {
            continue;
        }
        if o.acq.is_none() && o.fail.is_none() {
            r.violation(
                "liveness",
                format!(
                    "op {}: its acquire never returned before the worker stopped",
                    o.name
                ),
            );
        }
        if o.acq.is_some() && o.done.is_none() && o.cancel.is_none() && o.lost.is_none() {
            r.violation(
                "liveness",
                format!(
                    "op {}: its work never finished before the worker stopped",
                    o.name
                ),
            );
        }
    }
}

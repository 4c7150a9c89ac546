//! The logs of a run, parsed: `config.json`, `runner.log` (faults, restarts, spawns and
//! exits, the fenced resource's decisions), every `w<id>.log` (what each worker believed and
//! did) and `final.json`, into one model the properties read (see `runner/mod.rs` and
//! `worker.rs` for the line formats). `snapshots.log` is read by `scan.rs`, in one pass.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use redsem::internals;

use super::time::overlaps;
use crate::config::{Config, FaultKind, Timing};
use crate::runner::FinalState;

#[derive(Debug)]
pub(super) struct Fault {
    pub(super) t0: i64,
    pub(super) t1: i64,
    pub(super) kind: FaultKind,
    pub(super) slot: Option<usize>,
    pub(super) worker: Option<u32>,
    pub(super) detail: String,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Restart {
    pub(super) start: i64,
    pub(super) dead: i64,
    pub(super) ready: i64,
    /// A failover to a lagging replica: every write before this moment survived (the
    /// restart came back from a save made then). `None`: everything was lost.
    pub(super) kept: Option<i64>,
}

impl Restart {
    /// Whether a grant received at `acq` may have been lost with this restart's data.
    pub(super) fn may_lose_grant(&self, acq: i64) -> bool {
        self.kept.is_none_or(|k| acq >= k)
    }
}

/// A step of Redis's clock (`clock-step`): from some moment between `t0` and `t1` (real
/// time), Redis's clock reads real time + `offset` (µs; the offsets only grow).
#[derive(Debug, Clone, Copy)]
pub(super) struct ClockStep {
    pub(super) t0: i64,
    pub(super) t1: i64,
    pub(super) offset: i64,
}

#[derive(Debug, Default)]
pub(super) struct Worker {
    pub(super) slot: usize,
    pub(super) spawn: i64,
    pub(super) exit: Option<(i64, String)>,
    pub(super) killed_at: Option<i64>,
    pub(super) client_id: Option<String>,
    pub(super) stopped: bool,
    pub(super) stalls: Vec<(i64, i64)>,
    pub(super) pauses: Vec<(i64, i64)>,
}

impl Worker {
    pub(super) fn death(&self) -> i64 {
        self.killed_at
            .or(self.exit.as_ref().map(|e| e.0))
            .unwrap_or(i64::MAX)
    }
    pub(super) fn alive(&self, t: i64) -> bool {
        self.spawn <= t && t < self.death()
    }
}

#[derive(Debug, Default)]
pub(super) struct Op {
    pub(super) name: String,
    pub(super) worker: u32,
    pub(super) sem: usize,
    pub(super) n: u32,
    pub(super) run_style: bool,
    pub(super) begin: i64,
    pub(super) acq: Option<i64>,
    pub(super) holder: Option<String>,
    pub(super) fences: Vec<(u32, u64)>,
    pub(super) lost: Option<(i64, String)>,
    pub(super) cancel: Option<i64>,
    pub(super) done: Option<i64>,
    pub(super) fail: Option<(i64, String)>,
    pub(super) epoch: Option<u32>,
    /// Redis time (ms) of the grant, from a snapshot.
    pub(super) granted_ms: Option<i64>,
    /// Snapshots of its semaphore while it could matter: (Redis µs, valid, epoch known).
    pub(super) obs: Vec<(i64, bool)>,
}

impl Op {
    /// When it stopped believing it held the permit (or `None`: never held).
    pub(super) fn belief_end(&self, w: &Worker) -> Option<i64> {
        self.acq?;
        let ends = [self.done, self.cancel, self.lost.as_ref().map(|l| l.0)];
        let end = ends.into_iter().flatten().min();
        Some(end.unwrap_or_else(|| w.death()).min(w.death()))
    }
}

#[derive(Debug)]
pub(super) struct Write {
    pub(super) worker: u32,
    pub(super) op: String,
    pub(super) sem: usize,
    pub(super) slot: u32,
    pub(super) epoch: Option<u32>,
    pub(super) generation: u64,
    pub(super) sent: i64,
    pub(super) decision: char,
}

pub(super) struct Logs {
    pub(super) cfg: Config,
    pub(super) t: Timing,
    pub(super) phases: HashMap<String, i64>,
    pub(super) workers: BTreeMap<u32, Worker>,
    pub(super) faults: Vec<Fault>,
    pub(super) restarts: Vec<Restart>,
    /// Steps of Redis's clock, in order.
    pub(super) clock_steps: Vec<ClockStep>,
    pub(super) holds: HashMap<String, Option<u32>>,
    pub(super) writes: Vec<Write>,
    pub(super) ops: Vec<Op>,
    pub(super) op_index: HashMap<String, usize>,
    pub(super) client_worker: HashMap<String, u32>,
    pub(super) final_state: Option<FinalState>,
    /// (slot, from, to, worker): who occupied each slot when
    pub(super) occupancy: Vec<(usize, i64, i64, u32)>,
    /// worker → windows during which its command connection was faulted
    pub(super) cmd_windows: HashMap<u32, Vec<(i64, i64)>>,
    /// holder id → (start, end) of an operator's `force_release` of it
    pub(super) evictions: HashMap<String, (i64, i64)>,
}

pub(super) fn num<T: std::str::FromStr>(s: Option<&&str>) -> Option<T> {
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
            "restart" if f.len() == 4 || f.len() == 5 => {
                let (start, dead) = (num(f.get(1)).unwrap_or(0), num(f.get(2)).unwrap_or(0));
                // A failover beyond the documented bound is judged as a restart that lost
                // everything: its replica lagged one renewal interval or more (from its copy
                // to the master's death: the runner aims below, the kill may overrun), or it
                // came less than one lease + one renewal interval after the previous restart
                // was over (a cascade: the writes lost by both may span more than one renewal
                // interval; the runner spaces failovers so)
                let t = logs.t;
                let spaced = logs
                    .restarts
                    .last()
                    .is_none_or(|p| start - p.ready >= t.lease + t.renew);
                let kept = num(f.get(4)).filter(|&k| dead - k < t.renew && spaced);
                logs.restarts.push(Restart {
                    start,
                    dead,
                    ready: num(f.get(3)).unwrap_or(0),
                    kept,
                });
            }
            "clock" if f.len() == 4 => {
                let (Some(t0), Some(t1), Some(offset)) =
                    (num(f.get(1)), num(f.get(2)), num(f.get(3)))
                else {
                    continue;
                };
                logs.clock_steps.push(ClockStep { t0, t1, offset });
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

impl Logs {
    pub(super) fn load(dir: &Path) -> anyhow::Result<Logs> {
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
            clock_steps: Vec::new(),
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
            // a lost `meta` key: every entry listed lost its record at once, and learns it
            // at its next renewal, as after a force_release of each
            if f.kind == FaultKind::KeyLoss
                && let Some(entries) = f.detail.split(",entries=").nth(1)
                && entries != "-"
            {
                for id in entries.split(';') {
                    logs.evictions.entry(id.to_owned()).or_insert((f.t0, f.t1));
                }
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

    pub(super) fn restart_pairs(&self) -> Vec<(i64, i64)> {
        self.restarts.iter().map(|r| (r.start, r.dead)).collect()
    }

    /// Windows during which `worker`'s process did not run: injected pauses and observed
    /// stalls.
    pub(super) fn halts(&self, worker: u32) -> Vec<(i64, i64)> {
        let Some(w) = self.workers.get(&worker) else {
            return Vec::new();
        };
        w.pauses.iter().chain(&w.stalls).copied().collect()
    }

    /// Windows during which `worker`'s command connection was faulted (plus the time the
    /// connection manager may take to reconnect).
    pub(super) fn cmd_faults(&self, worker: u32) -> Vec<(i64, i64)> {
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

    /// Per semaphore (in `cfg.sems` order), the `key-loss` faults that deleted its lease set
    /// `exp`: (start, end) of each.
    pub(super) fn exp_losses(&self) -> Vec<Vec<(i64, i64)>> {
        self.cfg
            .sems
            .iter()
            .map(|spec| {
                let tag = format!("sem={},key=exp,", spec.name);
                self.faults
                    .iter()
                    .filter(|f| f.kind == FaultKind::KeyLoss && f.detail.starts_with(&tag))
                    .map(|f| (f.t0, f.t1))
                    .collect()
            })
            .collect()
    }

    /// Windows during which Redis did not answer anyone (DEBUG SLEEP, restarts, and the
    /// reconnection after a restart).
    pub(super) fn global_halts(&self) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        for f in &self.faults {
            match f.kind {
                FaultKind::DebugSleep => out.push((f.t0, f.t1 + 100_000)),
                // a restart (a failover too: from its copy to the reconnection after it)
                FaultKind::RestartDataLoss | FaultKind::FailoverLagging => {
                    out.push((f.t0, f.t1 + 2_500_000))
                }
                // ...to the promoted replica's first answer: the old master's return as a
                // replica, which the fault's end includes, stops nobody
                FaultKind::FailoverReplica => {
                    let ready = f
                        .detail
                        .split(',')
                        .find_map(|p| p.strip_prefix("ready=")?.parse().ok())
                        .unwrap_or(f.t1);
                    out.push((f.t0, ready + 2_500_000))
                }
                _ => {}
            }
        }
        out
    }

    /// The offset of Redis's clock over `[from, to]` (real time), or `None` when a step
    /// happened meanwhile (which clock answered is unknown).
    pub(super) fn clock_offset(&self, from: i64, to: i64) -> Option<i64> {
        let mut offset = 0;
        for st in &self.clock_steps {
            if st.t1 < from {
                offset = st.offset;
            } else if st.t0 <= to {
                return None;
            }
        }
        Some(offset)
    }

    /// The real time at which Redis's clock first read `redis_us` (at least): the clock
    /// jumps over the times a step skipped, which all came at the step.
    pub(super) fn real_time(&self, redis_us: i64) -> i64 {
        let mut offset = 0;
        for st in &self.clock_steps {
            if redis_us - offset < st.t0 {
                break;
            }
            if redis_us - st.offset < st.t1 {
                return st.t1;
            }
            offset = st.offset;
        }
        redis_us - offset
    }

    /// The steps of Redis's clock that could have cut short a lease that was valid at
    /// `valid` and found invalid at `stale`, beyond what the clients cover for `worker`: a
    /// holder's local deadline covers a total step up to the safety margin always, and up to
    /// margin + one renewal interval while none of its renewals was lost (its command
    /// connection faulted, its process halted or Redis answering nobody would lose one).
    /// Returns the start and end of the first such step.
    pub(super) fn uncovered_step(&self, worker: u32, valid: i64, stale: i64) -> Option<(i64, i64)> {
        let t = self.t;
        let from = valid - t.lease;
        let mut before = 0;
        let mut first = None;
        for st in &self.clock_steps {
            if st.t1 < from {
                before = st.offset;
            } else if st.t0 <= stale {
                first.get_or_insert((st.t0, st.t1));
                let total = st.offset - before;
                let margin =
                    internals::margin(Duration::from_micros(t.lease as u64)).as_micros() as i64;
                let renewal_lost = || {
                    overlaps(&self.cmd_faults(worker), from, stale)
                        || overlaps(&self.halts(worker), from, stale)
                        || overlaps(&self.global_halts(), from, stale)
                };
                if total > margin + t.renew || (total > margin && renewal_lost()) {
                    return first;
                }
            }
        }
        None
    }

    pub(super) fn worker_of_id(&self, id: &str) -> Option<u32> {
        let client = id.split('.').next()?;
        self.client_worker.get(client).copied()
    }
}

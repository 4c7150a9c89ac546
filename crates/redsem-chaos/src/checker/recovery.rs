//! Property 5, `recovery`: once a worker is SIGKILLed at `K`, none of its entries (holders or
//! waiters) is still in Redis `lease + slack` after `K` while a live waiter is queued on that
//! semaphore; and no entry of a dead process has its lease extended past that bound.
//!
//! The bound is one lease: a dead process renews nothing, so its last lease ends at most one
//! lease after the kill, and the live waiters' processes wake up when the nearest lease is
//! due and reap it. It is extended only by what delays that:
//! - a renewal the dead process had in flight, held up by a fault (its command connection
//!   black-holed or slowed, Redis asleep), extends the lease from the end of that fault, or
//!   of the last of a chain of them (a black hole that ends while Redis sleeps delivers it
//!   when Redis wakes up);
//! - a loss of the semaphore's lease set (`key-loss` of `exp`) while the entry is still
//!   there (its lease may even have run out unreaped): the next script (a renewal of a live
//!   worker, within one renewal interval while anyone holds, or one fallback interval while
//!   anyone waits; later if Redis answered nobody meanwhile) gives every session of the
//!   index a lease again from then (docs/PROTOCOL.md, "Lost keys"), so the bound is one
//!   lease after that, from the snapshots after the loss on; a loss before the kill counts
//!   too when its restoration may come after it (a halt held it up, or a failover to a
//!   lagging copy brought back the keys from before it, and the next script restores again);
//! - a waiter that cannot act is no evidence: only live waiters whose process was not
//!   paused, stalled or cut off from Redis since the kill (or the end of that fault) count,
//!   and nothing is judged while Redis answers nobody.
//!
//! It also measures the recovery times (from the kill to the first snapshot without the
//! entry) of the killed holders whose slots a live waiter wanted, when nothing held them up:
//! the figures of the report.

use std::collections::{HashMap, HashSet};

use super::logs::Logs;
use super::report::Report;
use super::snapshots::{Excuses, Ids, Snapshot};
use super::time::{ms, ms_fmt, overlaps};
use crate::config::FaultKind;

/// A dead worker's entry being tracked.
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

impl DeadEntry {
    /// Entry `id` of worker `worker`, killed at `killed`, first seen dead at `now`.
    fn new(sem: usize, worker: u32, id: u32, killed: i64, now: i64) -> DeadEntry {
        DeadEntry {
            sem,
            worker,
            id,
            killed,
            last_seen: now,
            gone_at: None,
            demand: false,
            seen_expired: false,
            held: false,
            reported: false,
        }
    }
}

/// The entries of killed workers, followed through the snapshots.
pub(super) struct Recovery {
    dead: HashMap<u32, DeadEntry>,
    /// killed worker → the bound for its entries
    deadline_of: HashMap<u32, i64>,
    /// per semaphore, each loss of its lease set: (when, the bound of its entries from then)
    leases_lost: Vec<Vec<(i64, i64)>>,
}

impl Recovery {
    /// The bound of each killed worker: its kill (or the end of a fault that held up a
    /// renewal in flight at the kill), plus lease and slack.
    pub(super) fn new(logs: &Logs) -> Recovery {
        let t = logs.t;
        let mut deadline_of: HashMap<u32, i64> = HashMap::new();
        for (&id, w) in &logs.workers {
            let Some(k) = w.killed_at else { continue };
            let delays = |f: &super::logs::Fault| {
                let hits_worker = f.slot.is_some_and(|s| {
                    logs.occupancy
                        .iter()
                        .any(|&(slot, from, to, wk)| slot == s && wk == id && from <= k && to >= k)
                });
                match f.kind {
                    FaultKind::BlackholeCmd | FaultKind::Latency => hits_worker,
                    FaultKind::DebugSleep => true,
                    _ => false,
                }
            };
            // A renewal in flight at the kill arrives once every fault holding it up has
            // ended: one that covers the kill, then any that began while it was still held
            // (a black hole's end delivers it into a Redis put to sleep meanwhile).
            let mut latest = k;
            loop {
                let before = latest;
                for f in &logs.faults {
                    if f.t0 <= latest && f.t1 >= k && delays(f) {
                        latest = latest.max(f.t1);
                    }
                }
                if latest == before {
                    break;
                }
            }
            deadline_of.insert(id, latest + t.lease + t.slack);
        }
        let global = logs.global_halts();
        let leases_lost = logs
            .exp_losses()
            .into_iter()
            .map(|v| {
                v.into_iter()
                    .map(|(t0, t1)| {
                        let mut restored = t1 + t.fallback.max(t.renew);
                        for &(a, b) in &global {
                            if a <= restored && b >= t0 {
                                restored = restored.max(b + t.fallback.max(t.renew));
                            }
                        }
                        (t0, restored + t.lease + t.slack)
                    })
                    .collect()
            })
            .collect();
        Recovery {
            dead: HashMap::new(),
            deadline_of,
            leases_lost,
        }
    }

    /// The bound for the entries of killed worker `w` on semaphore `sem` at `now` (`None`:
    /// `w` was not killed): a loss of the lease set whose restoration may come after the
    /// kill gives an entry a lease again. That is a loss shortly before the kill, and also
    /// an earlier one whose restoration a halt held up (a failover to a lagging copy can
    /// bring back the keys as they were before the restoration, and the next script restores
    /// again: `leases_lost` bounds it).
    fn deadline(&self, logs: &Logs, sem: usize, w: u32, now: i64) -> Option<i64> {
        let t = logs.t;
        let &deadline = self.deadline_of.get(&w)?;
        let killed_at = logs.workers[&w].killed_at.unwrap_or(i64::MAX);
        let deadline = self.leases_lost[sem]
            .iter()
            .filter(|&&(at, bound)| {
                let restored_by = bound - t.lease - t.slack;
                at <= now && restored_by >= killed_at - t.slack
            })
            .fold(deadline, |d, &(_, bound)| d.max(bound));
        Some(deadline)
    }

    /// Checks snapshot `s`.
    pub(super) fn observe(
        &mut self,
        logs: &Logs,
        s: &Snapshot,
        ids: &Ids,
        excuses: &mut Excuses,
        r: &mut Report,
    ) {
        let t = logs.t;
        let (sem, now, name) = (s.sem, s.now, &s.name);
        let waiters = s.waiters();
        let live_waiter = |excuses: &mut Excuses, from: i64| {
            waiters.iter().any(|e| {
                s.valid(e)
                    && ids.worker(e.id).is_some_and(|w| {
                        logs.workers.get(&w).is_some_and(|wk| wk.alive(now))
                            && !excuses.excused(logs, w, from, now)
                    })
            })
        };
        let mut present_dead: HashSet<u32> = HashSet::new();
        for e in &s.entries {
            let Some(w) = ids.worker(e.id) else {
                continue;
            };
            let Some(deadline) = self.deadline(logs, sem, w, now) else {
                continue;
            };
            let killed = logs.workers[&w].killed_at.unwrap_or(i64::MAX);
            if now < killed {
                continue;
            }
            present_dead.insert(e.id);
            let d = self
                .dead
                .entry(e.id)
                .or_insert_with(|| DeadEntry::new(sem, w, e.id, killed, now));
            d.last_seen = now;
            if e.exp_ms * 1000 > deadline {
                if !d.reported {
                    d.reported = true;
                    r.violation(
                        "recovery",
                        format!(
                            "{name}: entry {} of worker {w} (killed at {}) has a lease until {}, {:.0} ms after the kill",
                            ids.name(e.id),
                            ms_fmt(killed),
                            ms_fmt(e.exp_ms * 1000),
                            ms(e.exp_ms * 1000 - killed)
                        ),
                    );
                }
                continue;
            }
            let from = deadline - t.lease - t.slack;
            let demand = live_waiter(excuses, from);
            // wanted when its lease ran out: a live waiter queued at the last sighting
            // before the expiry, and at the first one after it (if it was still there)
            if s.valid(e) {
                d.demand = demand;
            } else if !d.seen_expired {
                d.seen_expired = true;
                d.demand &= demand;
            }
            if !e.slots.is_empty() {
                d.held = true;
            }
            if now >= deadline && demand && !overlaps(excuses.global(), from, now) && !d.reported {
                d.reported = true;
                r.violation(
                    "recovery",
                    format!(
                        "{name}: entry {} of worker {w} (SIGKILLed at {}) is still in Redis at {} ({:.0} ms later; bound {:.0} ms) while live waiters are queued",
                        ids.name(e.id),
                        ms_fmt(killed),
                        ms_fmt(now),
                        ms(now - killed),
                        ms(deadline - killed)
                    ),
                );
            }
        }
        for (id, d) in self.dead.iter_mut() {
            if d.sem == sem && d.gone_at.is_none() && !present_dead.contains(id) {
                d.gone_at = Some(now);
            }
        }
    }

    /// The recovery figures, once every snapshot was read (`global`: the windows during
    /// which Redis answered nobody).
    pub(super) fn finish(self, logs: &Logs, ids: &Ids, global: &[(i64, i64)], r: &mut Report) {
        let t = logs.t;
        let mut recoveries: Vec<f64> = Vec::new();
        for d in self.dead.values() {
            r.dead_entries += 1;
            let gone = d.gone_at.unwrap_or(d.last_seen + t.snapshot);
            let held_up = self
                .deadline_of
                .get(&d.worker)
                .is_some_and(|&dl| dl > d.killed + t.lease + t.slack)
                || overlaps(global, d.killed, gone)
                || self.leases_lost[d.sem]
                    .iter()
                    .any(|&(at, _)| at >= d.killed - t.lease && at <= gone);
            if d.demand && d.held && !held_up {
                if std::env::var_os("REDSEM_CHAOS_DEBUG").is_some()
                    && gone - d.killed > t.lease + t.slack
                {
                    eprintln!(
                        "recovery {} ms: worker {} entry {} killed {} gone {}",
                        ms(gone - d.killed),
                        d.worker,
                        ids.name(d.id),
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
    }
}

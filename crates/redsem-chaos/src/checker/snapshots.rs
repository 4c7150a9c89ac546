//! The one pass over `snapshots.log` (see `snapshot.rs` for its format), in order: each
//! snapshot of a semaphore is checked by properties 1 (`limit_in_redis.rs`), 5
//! (`recovery.rs`), the first half of 6 (`wait_while_free.rs`) and 10 (`fifo.rs`), and
//! recorded, for each op
//! it may matter to, as an observation (was its lease valid in Redis then?) that properties
//! 3 and 4 read afterwards.
//!
//! A snapshot whose request or reply overlapped a Redis restart is skipped: which Redis
//! incarnation answered it is unknown; so is one that overlapped a step of Redis's clock
//! (`clock-step`). After a step, Redis's times (the snapshot's, the leases' expiries, the
//! grants') are turned into real time (see `Logs::real_time`).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::Context;

use super::fifo::Fifo;
use super::logs::{Logs, num};
use super::report::Report;
use super::wait_while_free::FreeWaits;
use super::{limit_in_redis, overlaps, recovery::Recovery};
use crate::config::FaultKind;
use crate::runner::epoch_of;

/// One entry (holder or waiter) of a semaphore in a snapshot.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    /// Its number in `snapshots.log` (see [`Ids`]).
    pub(super) id: u32,
    /// Expiry of its lease (Redis ms; `-1`: none).
    pub(super) exp_ms: i64,
    /// Rank in the queue (`-1`: not queued).
    pub(super) queue: i64,
    /// Permits.
    pub(super) n: i64,
    /// Redis time of its grant (ms; `-1`: not granted).
    pub(super) granted_ms: i64,
    /// Its ticket (`-1`: unknown, its record is gone).
    pub(super) ticket: i64,
    /// The slots it holds.
    pub(super) slots: Vec<u32>,
    /// Their generations (same order; empty for a waiter).
    pub(super) fences: Vec<u64>,
}

fn parse_entry(s: &str) -> Option<Entry> {
    let f: Vec<&str> = s.split(':').collect();
    if f.len() != 8 {
        return None;
    }
    Some(Entry {
        id: f[0].parse().ok()?,
        exp_ms: f[1].parse().ok()?,
        queue: f[2].parse().ok()?,
        n: f[3].parse().ok()?,
        granted_ms: f[4].parse().ok()?,
        ticket: f[5].parse().ok()?,
        slots: if f[6] == "-" {
            Vec::new()
        } else {
            f[6].split(',').filter_map(|x| x.parse().ok()).collect()
        },
        fences: if f[7] == "-" {
            Vec::new()
        } else {
            f[7].split(',').filter_map(|x| x.parse().ok()).collect()
        },
    })
}

/// One semaphore at one instant of Redis time.
pub(super) struct Snapshot {
    /// Redis time (µs).
    pub(super) now: i64,
    /// Index of the semaphore in the config.
    pub(super) sem: usize,
    /// Its name.
    pub(super) name: String,
    /// Its limit (from the config).
    pub(super) limit: i64,
    /// Every entry found in the lease set, the queue or the records.
    pub(super) entries: Vec<Entry>,
    /// The slot table: slot → entry.
    pub(super) slot_table: HashMap<u32, u32>,
    /// The history of the keys it belongs to (restarts and failovers so far).
    pub(super) epoch: u32,
    /// Its lease set (`exp`) was lost a moment ago (`key-loss`), and the next script may not
    /// have restored it yet: until then nothing can be reaped, so an entry without a lease
    /// counts as valid (the repair bound: the next script on the semaphore, within one
    /// renewal interval while anyone holds, one fallback interval while anyone waits).
    pub(super) leases_lost: bool,
}

impl Snapshot {
    /// Parses an `S` line; `None` for another line, an unknown semaphore, or a snapshot that
    /// overlapped a restart.
    fn parse(
        f: &[&str],
        logs: &Logs,
        restarts: &[(i64, i64)],
        exp_lost: &[Vec<(i64, i64)>],
    ) -> Option<Snapshot> {
        if f[0] != "S" || f.len() != 8 {
            return None;
        }
        let (Some(sent), Some(recv), Some(now), Some(sem)) = (
            num::<i64>(f.get(1)),
            num::<i64>(f.get(2)),
            num::<i64>(f.get(3)),
            num::<usize>(f.get(4)),
        ) else {
            return None;
        };
        let spec = logs.cfg.sems.get(sem)?;
        let epoch = epoch_of(restarts, sent, recv)?;
        // Redis's clock, stepped (`clock-step`), as real time: the snapshot's by the offset
        // it answered under (skipped if a step came meanwhile), the leases' expiries and
        // the grants' times by when Redis's clock reached them, so that validity (an
        // expiry later than the snapshot) is unchanged and every time is comparable with
        // the workers'
        let now = now - logs.clock_offset(sent, recv)?;
        let real_ms = |ms: i64| {
            if ms < 0 || logs.clock_steps.is_empty() {
                ms
            } else {
                logs.real_time(ms * 1000).div_euclid(1000)
            }
        };
        let entries: Vec<Entry> = if f[6] == "-" {
            Vec::new()
        } else {
            f[6].split(';')
                .filter_map(parse_entry)
                .map(|e| Entry {
                    exp_ms: real_ms(e.exp_ms),
                    granted_ms: real_ms(e.granted_ms),
                    ..e
                })
                .collect()
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
        Some(Snapshot {
            now,
            sem,
            name: spec.name.clone(),
            limit: i64::from(spec.limit),
            entries,
            slot_table,
            epoch,
            leases_lost: exp_lost.get(sem).is_some_and(|w| overlaps(w, now, now)),
        })
    }

    /// Whether `e`'s lease is valid at this snapshot: it expires later (or it has none
    /// because the lease set was just lost: see `leases_lost`).
    pub(super) fn valid(&self, e: &Entry) -> bool {
        e.exp_ms > self.now / 1000 || (e.exp_ms == -1 && self.leases_lost)
    }

    /// The holders with valid leases.
    pub(super) fn holders(&self) -> Vec<&Entry> {
        self.entries
            .iter()
            .filter(|e| self.valid(e) && !e.slots.is_empty())
            .collect()
    }

    /// The permits held with valid leases.
    pub(super) fn used(&self) -> i64 {
        self.holders().iter().map(|e| e.n.max(0)).sum()
    }

    /// The slots that the scripts count as taken: mapped in the slot table to an entry whose
    /// lease is valid. After a loss of the records (`meta`), a holder's slot stays taken
    /// while its lease is valid although no record lists it (docs/PROTOCOL.md, "Lost keys").
    pub(super) fn taken(&self) -> i64 {
        let valid: HashSet<u32> = self
            .entries
            .iter()
            .filter(|e| self.valid(e))
            .map(|e| e.id)
            .collect();
        self.slot_table
            .values()
            .filter(|id| valid.contains(id))
            .count() as i64
    }

    /// The queued entries, in queue order (valid or not).
    pub(super) fn waiters(&self) -> Vec<&Entry> {
        let mut q: Vec<&Entry> = self.entries.iter().filter(|e| e.queue >= 0).collect();
        q.sort_by_key(|e| e.queue);
        q
    }
}

/// The entry ids of `snapshots.log` by number: their name, and the worker whose client made
/// them.
#[derive(Default)]
pub(super) struct Ids {
    names: Vec<String>,
    workers: Vec<Option<u32>>,
}

impl Ids {
    /// The name of entry `id` (`?` if unknown).
    pub(super) fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("?", |s| s.as_str())
    }

    /// The worker that made entry `id`.
    pub(super) fn worker(&self, id: u32) -> Option<u32> {
        self.workers.get(id as usize).copied().flatten()
    }
}

/// Whether a worker had an excuse for not acting in a window: its process paused or stalled,
/// its command connection faulted, or Redis not answering anyone.
pub(super) struct Excuses {
    global: Vec<(i64, i64)>,
    halts: HashMap<u32, Vec<(i64, i64)>>,
}

impl Excuses {
    fn new(logs: &Logs) -> Excuses {
        Excuses {
            global: logs.global_halts(),
            halts: HashMap::new(),
        }
    }

    /// Whether worker `w` had an excuse during `[a, b]`.
    pub(super) fn excused(&mut self, logs: &Logs, w: u32, a: i64, b: i64) -> bool {
        let h = self.halts.entry(w).or_insert_with(|| {
            let mut v = logs.halts(w);
            v.extend(logs.cmd_faults(w));
            v
        });
        overlaps(h, a, b) || overlaps(&self.global, a, b)
    }

    /// The windows during which Redis answered nobody.
    pub(super) fn global(&self) -> &[(i64, i64)] {
        &self.global
    }
}

/// What each op's semaphore looked like in Redis while it could matter to the op (from its
/// begin to `lease + slack` after it stopped believing).
struct Observations {
    /// op → its holder's entry number, once seen
    op_iid: Vec<Option<u32>>,
    /// holder id → op
    holder_op: HashMap<String, usize>,
    /// ops by semaphore, sorted by begin: (begin, end of the window, op)
    by_sem: Vec<Vec<(i64, i64, usize)>>,
    /// per semaphore, the next op of `by_sem` to become active
    cursor: Vec<usize>,
    /// per semaphore, the ops active at the current snapshot
    active: Vec<Vec<usize>>,
}

impl Observations {
    fn new(logs: &Logs) -> Observations {
        let t = logs.t;
        let nsems = logs.cfg.sems.len();
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
        Observations {
            op_iid: vec![None; logs.ops.len()],
            holder_op,
            by_sem,
            cursor: vec![0usize; nsems],
            active: vec![Vec::new(); nsems],
        }
    }

    /// Entry number `iid` is called `id`; whether it is the holder id of an op (a grant a
    /// worker reported).
    fn intern(&mut self, id: &str, iid: u32) -> bool {
        let Some(&i) = self.holder_op.get(id) else {
            return false;
        };
        self.op_iid[i] = Some(iid);
        true
    }

    /// Records `s` for the ops active at its time: when their grant was made, and whether
    /// their lease was valid.
    fn record(&mut self, s: &Snapshot, logs: &mut Logs) {
        let t = logs.t;
        let (sem, now) = (s.sem, s.now);
        let by_sem = &self.by_sem[sem];
        let cursor = &mut self.cursor[sem];
        let active = &mut self.active[sem];
        while *cursor < by_sem.len() && by_sem[*cursor].0 < now {
            active.push(by_sem[*cursor].2);
            *cursor += 1;
        }
        let by_id: HashMap<u32, &Entry> = s.entries.iter().map(|e| (e.id, e)).collect();
        let ops = &mut logs.ops;
        let workers = &logs.workers;
        active.retain(|&i| {
            let o = &ops[i];
            let end = o.belief_end(&workers[&o.worker]).unwrap_or(i64::MIN);
            end + t.lease + t.slack >= now
        });
        for &i in active.iter() {
            let o = &mut ops[i];
            let entry = self.op_iid[i].and_then(|id| by_id.get(&id));
            // Its grant, not a later one under the same id (Redis lost the first grant while
            // the entry waited there, and granted it afresh): same slots and generations.
            let its_grant = |e: &Entry| {
                e.slots == o.fences.iter().map(|f| f.0).collect::<Vec<_>>()
                    && e.fences == o.fences.iter().map(|f| f.1).collect::<Vec<_>>()
            };
            if let Some(e) = entry
                && e.granted_ms >= 0
                && o.granted_ms.is_none()
                && its_grant(e)
            {
                o.granted_ms = Some(e.granted_ms);
            }
            if o.acq.is_some_and(|a| a < now) {
                // holder ids are unique: finding its grant, whichever Redis incarnation
                // answered, proves the grant lives there
                let ok = entry.is_some_and(|e| s.valid(e) && e.queue < 0 && its_grant(e));
                o.obs.push((now, ok));
            }
        }
    }
}

/// Reads `snapshots.log` once, in order: properties 1, 5 and the first half of 6, and each
/// op's observations for the others.
pub(super) fn check(dir: &Path, logs: &mut Logs, r: &mut Report) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(dir.join("snapshots.log")).context("snapshots.log")?;
    let restarts = logs.restart_pairs();
    // per semaphore, the windows after a loss of its lease set before the next script must
    // have restored it (see `Snapshot::leases_lost`)
    let t = logs.t;
    let exp_lost: Vec<Vec<(i64, i64)>> = logs
        .cfg
        .sems
        .iter()
        .map(|spec| {
            let tag = format!("sem={},key=exp,", spec.name);
            logs.faults
                .iter()
                .filter(|f| f.kind == FaultKind::KeyLoss && f.detail.starts_with(&tag))
                .map(|f| (f.t0, f.t1 + t.fallback.max(t.renew) + t.slack))
                .collect()
        })
        .collect();
    let mut ids = Ids::default();
    let mut excuses = Excuses::new(logs);
    let mut observations = Observations::new(logs);
    let mut recovery = Recovery::new(logs);
    let mut free = FreeWaits::new(logs.cfg.sems.len());
    let mut fifo = Fifo::new(logs.cfg.sems.len());

    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f[0] == "I" && f.len() == 3 {
            let id = f[2];
            ids.names.push(id.to_owned());
            ids.workers.push(logs.worker_of_id(id));
            let iid = ids.names.len() as u32 - 1;
            if observations.intern(id, iid) {
                free.claim(iid);
            }
            continue;
        }
        let Some(s) = Snapshot::parse(&f, logs, &restarts, &exp_lost) else {
            continue;
        };
        r.snapshots += 1;
        limit_in_redis::check(&s, &ids, r);
        observations.record(&s, logs);
        recovery.observe(logs, &s, &ids, &mut excuses, r);
        free.observe(logs, &s, &ids, &mut excuses, r);
        fifo.observe(&s, s.epoch, &ids, r);
    }
    free.finish(logs, &ids, &mut excuses, r);
    recovery.finish(logs, &ids, excuses.global(), r);
    Ok(())
}

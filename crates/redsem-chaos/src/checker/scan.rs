//! The one pass over `snapshots.log` (parsed by `snapshots.rs`), in order: each
//! snapshot of a semaphore is checked by properties 1 (`limit_in_redis.rs`), 5
//! (`recovery.rs`), the first half of 6 (`wait_while_free.rs`) and 10 (`fifo.rs`), and
//! recorded, for each op
//! it may matter to, as an observation (was its lease valid in Redis then?) that properties
//! 3 and 4 read afterwards.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;

use super::fifo::Fifo;
use super::limit_in_redis;
use super::logs::Logs;
use super::recovery::Recovery;
use super::report::Report;
use super::snapshots::{Entry, Excuses, Ids, Snapshot};
use super::wait_while_free::FreeWaits;

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
        .exp_losses()
        .into_iter()
        .map(|v| {
            v.into_iter()
                .map(|(t0, t1)| (t0, t1 + t.fallback.max(t.renew) + t.slack))
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
            let iid = ids.push(id, logs.worker_of_id(id));
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

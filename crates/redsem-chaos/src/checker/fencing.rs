//! Property 4, `fencing`: the fenced resource protects what the leases cannot.
//!
//! - The resource's decisions — made by the shipped `FencedStore` (`fence.lua`) — replay
//!   with the rule it documents: per semaphore and slot, a write is accepted when its
//!   generation is at least the highest accepted before. Generations alone: no knowledge of
//!   Redis restarts is used (generations stay above earlier ones across a data loss).
//! - No two grants share `(semaphore, slot, generation)`, across every Redis incarnation,
//!   and the generations of a slot increase in grant order, across data losses too.
//! - Every write a stale holder (property 3) made after a newer holder's first write was
//!   rejected. Writes it made before any newer holder wrote are accepted and counted: that is
//!   all a fence can do.
//! - A holder still valid in Redis, and not paused or stalled, never had a write rejected.
//! - No write was sent after the work was cancelled: 1 ms of tolerance, for the clocks read
//!   in different processes.

use std::collections::HashMap;

use super::logs::Logs;
use super::report::Report;
use super::stale_belief::Stale;
use super::time::{ms_fmt, overlaps};

/// Checks property 4, with `inv` from property 3.
pub(super) fn check(logs: &Logs, inv: &[Stale], r: &mut Report) {
    replay(logs, inv, r);
    unique_and_increasing(logs, r);
}

/// Replays the resource's decisions, and judges each write by what its op believed and what
/// Redis held (`inv`, from property 3).
fn replay(logs: &Logs, inv: &[Stale], r: &mut Report) {
    let mut table: HashMap<(usize, u32), u64> = HashMap::new();
    for w in &logs.writes {
        let expect = if w.decision == 'X' {
            'X' // an op the resource did not know (never registered): not a fence decision
        } else {
            let key = (w.sem, w.slot);
            if table.get(&key).is_none_or(|&c| w.generation >= c) {
                table.insert(key, w.generation);
                'A'
            } else {
                'R'
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
}

/// No two grants share `(semaphore, slot, generation)`, and the generations of a slot
/// increase in grant order.
fn unique_and_increasing(logs: &Logs, r: &mut Report) {
    let mut seen: HashMap<(usize, u32, u64), &str> = HashMap::new();
    // (semaphore, slot) → (grant time, generation, op), every incarnation together
    type Grants<'a> = HashMap<(usize, u32), Vec<(i64, u64, &'a str)>>;
    let mut by_slot: Grants = HashMap::new();
    for o in &logs.ops {
        if o.acq.is_none() {
            continue;
        }
        for &(slot, generation) in &o.fences {
            if let Some(prev) = seen.insert((o.sem, slot, generation), &o.name) {
                r.violation(
                    "fencing",
                    format!(
                        "{} slot {slot} generation {generation} was granted twice: to {prev} and to {}",
                        logs.cfg.sems[o.sem].name, o.name
                    ),
                );
            }
            if let Some(a) = o.granted_ms {
                by_slot
                    .entry((o.sem, slot))
                    .or_default()
                    .push((a, generation, &o.name));
            }
        }
    }
    for ((sem, slot), mut v) in by_slot {
        v.sort();
        for pair in v.windows(2) {
            if pair[0].0 < pair[1].0 && pair[0].1 >= pair[1].1 {
                r.violation(
                    "fencing",
                    format!(
                        "{} slot {slot}: {} was granted generation {} after {} got generation {}",
                        logs.cfg.sems[sem].name, pair[1].2, pair[1].1, pair[0].2, pair[0].1
                    ),
                );
            }
        }
    }
}

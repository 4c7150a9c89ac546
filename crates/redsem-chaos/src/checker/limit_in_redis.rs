//! Property 1, `limit-in-redis`: in every snapshot, the permits of the holders whose lease is
//! valid add up to at most the limit; their slots are distinct, below the limit, as many as
//! their permits, and mapped to them in the slot table; and no holder is queued too.
//!
//! No bound and no exception: every grant is decided inside one atomic script against the
//! stored limit, and the snapshot is read by one atomic script too, so no fault (a kill, a
//! pause, a lost connection, a Redis asleep or restarted empty) can excuse a breach.

use std::collections::HashSet;

use super::report::Report;
use super::snapshots::{Ids, Snapshot};

/// Checks property 1 in snapshot `s`.
pub(super) fn check(s: &Snapshot, ids: &Ids, r: &mut Report) {
    let limit = s.limit;
    let used = s.used();
    let mut seen_slots = HashSet::new();
    let mut problem = None;
    if used > limit {
        problem = Some(format!(
            "{used} permits held with valid leases, limit {limit}"
        ));
    }
    for e in &s.holders() {
        if e.queue >= 0 {
            problem = Some(format!("{} is queued and holds slots", ids.name(e.id)));
        }
        if e.slots.len() as i64 != e.n {
            problem = Some(format!(
                "{} holds {} slots for {} permits",
                ids.name(e.id),
                e.slots.len(),
                e.n
            ));
        }
        for &slot in &e.slots {
            if i64::from(slot) >= limit {
                problem = Some(format!("{} holds slot {slot} ≥ limit", ids.name(e.id)));
            }
            if !seen_slots.insert(slot) {
                problem = Some(format!(
                    "slot {slot} claimed by two holders with valid leases"
                ));
            }
            if s.slot_table.get(&slot) != Some(&e.id) {
                problem = Some(format!(
                    "slot {slot} of {} is mapped to {} in the slot table",
                    ids.name(e.id),
                    s.slot_table.get(&slot).map_or("nobody", |&i| ids.name(i))
                ));
            }
        }
    }
    if let Some(p) = problem {
        r.violation(
            "limit-in-redis",
            format!("{} at {}: {p}", s.name, super::time::ms_fmt(s.now)),
        );
    }
}

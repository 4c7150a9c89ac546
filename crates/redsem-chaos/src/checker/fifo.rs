//! Property 10, `fifo`: tickets are issued in the order the acquisitions reach Redis, and
//! granted in ticket order (docs/PROTOCOL.md, "Guarantees"), from the snapshots, key losses
//! included (the scripts detect a lost `queue` or `cfg` before they grant or issue a ticket,
//! so the documented repair bound is zero: no exception is made for them).
//!
//! - **Issue order**: an entry that a snapshot shows for the first time carries a ticket above
//!   every live waiter's of the previous snapshot of its semaphore (those reached Redis
//!   before it) that this snapshot still shows with its record and a valid lease (one that
//!   left meanwhile, e.g. reaped when its lease ran out, may have gone before the new ticket
//!   was issued: with every record gone, a re-created configuration rightly starts again at
//!   1). After `cfg` and `queue` were lost together, a counter that restarted below the live
//!   tickets breaks this.
//! - **Grant order**: no holder is granted while a live waiter with a lower place (its ticket,
//!   less 1000 and a sixteenth per priority class: docs/PROTOCOL.md, "Priority classes"),
//!   queued before that grant, stays waiting (strict FIFO within a class: nobody overtakes,
//!   not even a smaller request; a higher class only within the aging bound). After `queue`
//!   was lost, a newcomer granted at once, a pump that trusted the empty queue, or a queue
//!   rebuilt at the tickets instead of the places, breaks this.
//!
//! A waiter counts while its lease is valid and its record is there (an entry whose record
//! was lost with `meta` has no ticket: it queues again under a new id, at the back). Tickets
//! are compared within one history of the keys only: a restart or a failover (which may lose
//! the last writes) starts a new one.

use std::collections::{HashMap, HashSet};

use super::report::Report;
use super::snapshots::{Ids, Snapshot};
use super::time::ms_fmt;

/// What the earlier snapshots of one semaphore showed, in the current history.
#[derive(Default)]
struct Seen {
    epoch: u32,
    /// every entry seen so far
    ids: HashSet<u32>,
    /// live waiters (entry → ticket, first seen waiting at, µs)
    waiting: HashMap<u32, (u64, i64)>,
    /// overtakings reported (holder, waiter)
    reported: HashSet<(u32, u32)>,
}

/// The checker's state over the pass over `snapshots.log`.
pub(super) struct Fifo {
    sems: Vec<Seen>,
}

impl Fifo {
    pub(super) fn new(sems: usize) -> Fifo {
        Fifo {
            sems: (0..sems).map(|_| Seen::default()).collect(),
        }
    }

    /// Checks snapshot `s` of the history `epoch` against the earlier ones.
    pub(super) fn observe(&mut self, s: &Snapshot, epoch: u32, ids: &Ids, r: &mut Report) {
        let Some(seen) = self.sems.get_mut(s.sem) else {
            return;
        };
        if seen.epoch != epoch {
            *seen = Seen {
                epoch,
                ..Seen::default()
            };
        }
        // a live waiter: valid lease, a record without slots, a ticket
        let live_waiter = |e: &super::snapshots::Entry| {
            s.valid(e) && e.n >= 0 && e.slots.is_empty() && e.granted_ms < 0 && e.ticket >= 0
        };
        // issue order
        // the previous snapshot's highest live waiter that is still there (see the module doc)
        let still_there = |id: u32| {
            s.entries
                .iter()
                .any(|e| e.id == id && e.ticket >= 0 && s.valid(e))
        };
        let top_waiting = seen
            .waiting
            .iter()
            .filter(|&(&id, _)| still_there(id))
            .map(|(&id, &(ticket, _))| (ticket, id))
            .max();
        if let Some((top, w)) = top_waiting {
            for e in &s.entries {
                if !seen.ids.contains(&e.id) && e.ticket >= 0 && (e.ticket as u64) < top {
                    r.violation(
                        "fifo",
                        format!(
                            "{}: entry {} appeared at {} with ticket {}, below the ticket {top} of \
                             the live waiter {} queued before it",
                            s.name,
                            ids.name(e.id),
                            ms_fmt(s.now),
                            e.ticket,
                            ids.name(w)
                        ),
                    );
                }
            }
        }
        // grant order
        for h in &s.entries {
            if h.slots.is_empty() || h.granted_ms < 0 || h.ticket < 0 {
                continue;
            }
            for w in s.entries.iter().filter(|w| live_waiter(w)) {
                let Some(&(_, since)) = seen.waiting.get(&w.id) else {
                    continue;
                };
                if w.place() < h.place()
                    && since < h.granted_ms * 1000
                    && seen.reported.insert((h.id, w.id))
                {
                    r.violation(
                        "fifo",
                        format!(
                            "{}: {} (ticket {}, priority {}) was granted at {} while {} (ticket \
                             {}, priority {}, waiting since {} at the latest) was still waiting \
                             at {}",
                            s.name,
                            ids.name(h.id),
                            h.ticket,
                            h.priority,
                            ms_fmt(h.granted_ms * 1000),
                            ids.name(w.id),
                            w.ticket,
                            w.priority,
                            ms_fmt(since),
                            ms_fmt(s.now)
                        ),
                    );
                }
            }
        }
        // what the next snapshot is compared with
        let mut waiting = HashMap::new();
        for e in s.entries.iter().filter(|e| live_waiter(e)) {
            let since = seen.waiting.get(&e.id).map_or(s.now, |&(_, t)| t);
            waiting.insert(e.id, (e.ticket as u64, since));
        }
        seen.waiting = waiting;
        seen.ids.extend(s.entries.iter().map(|e| e.id));
    }
}

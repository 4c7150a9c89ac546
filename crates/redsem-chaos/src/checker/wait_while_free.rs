//! Property 6, `wait-while-free`: no waiter waits while it could be served, and every
//! waiter learns of its grant, within the fallback interval (+ slack).
//!
//! - No live waiter stays queued for longer than the fallback interval while the head of the
//!   queue fits in the permits left by valid leases (they are free: the next script run
//!   grants them).
//! - A waiter learns of its grant within the fallback interval of the grant in Redis (+ 1 ms:
//!   the grant time is in whole ms).
//! - No grant stays held in Redis longer than that by a live process that never reports it.
//!
//! The bound is the fallback interval because a waiter whose notification is lost finds its
//! grant at its next poll, at most one fallback interval later. Lost notifications (pub/sub
//! cut, black-holed or killed) are therefore no excuse. The excuses are what keeps the
//! waiter's process from polling: it was paused or stalled, its command connection faulted,
//! or Redis answered nobody, from one fallback interval before the wait began.

use std::collections::{HashMap, HashSet};

use super::logs::Logs;
use super::report::Report;
use super::snapshots::{Excuses, Ids, Snapshot};
use super::time::{ms, ms_fmt, overlaps};

/// An episode: the head of a queue fits in the free permits.
struct FreeEpisode {
    head: u32,
    first: i64,
    last: i64,
    waiters: Vec<u32>,
}

/// The first half, followed through the snapshots.
pub(super) struct FreeWaits {
    /// per semaphore, the episode in progress
    episodes: Vec<Option<FreeEpisode>>,
    /// grants in Redis that no worker reported: id → (semaphore, first and last time seen
    /// held)
    unclaimed: HashMap<u32, (usize, i64, i64)>,
    /// the entries that are grants a worker reported
    claimed: HashSet<u32>,
}

impl FreeWaits {
    pub(super) fn new(nsems: usize) -> FreeWaits {
        FreeWaits {
            episodes: (0..nsems).map(|_| None).collect(),
            unclaimed: HashMap::new(),
            claimed: HashSet::new(),
        }
    }

    /// Entry `id` is a grant a worker reported.
    pub(super) fn claim(&mut self, id: u32) {
        self.claimed.insert(id);
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
        let (sem, now) = (s.sem, s.now);
        // grants nobody claims (yet)
        for e in &s.holders() {
            if self.claimed.contains(&e.id) {
                continue;
            }
            let u = self.unclaimed.entry(e.id).or_insert((sem, now, now));
            u.2 = now;
        }

        // the head of the queue fits in free permits
        let waiters = s.waiters();
        // (a queued entry without a record, lost with `meta`, is no head: the scripts' pump
        // drops it from the queue and looks at the next; its client queues it again once a
        // renewal finds it gone)
        let head = waiters.iter().find(|e| s.valid(e) && e.n > 0);
        // what the scripts count: the records' permits, or the slot table's when a loss of
        // the records left it holding more
        let used = s.used().max(s.taken());
        let fits = head.filter(|h| used + h.n <= s.limit).map(|h| h.id);
        let ep = &mut self.episodes[sem];
        match (fits, ep.as_mut()) {
            (Some(h), Some(e)) if e.head == h => {
                e.last = now;
                let current: HashSet<u32> = waiters
                    .iter()
                    .filter(|x| s.valid(x))
                    .map(|x| x.id)
                    .collect();
                e.waiters.retain(|w| current.contains(w));
            }
            _ => {
                if let Some(e) = ep.take() {
                    close_episode(logs, &e, &s.name, ids, excuses, r);
                }
                if let Some(h) = fits {
                    *ep = Some(FreeEpisode {
                        head: h,
                        first: now,
                        last: now,
                        waiters: waiters
                            .iter()
                            .filter(|x| s.valid(x))
                            .map(|x| x.id)
                            .collect(),
                    });
                }
            }
        }
    }

    /// Closes the episodes in progress, and checks the grants nobody claimed, once every
    /// snapshot was read.
    pub(super) fn finish(self, logs: &Logs, ids: &Ids, excuses: &mut Excuses, r: &mut Report) {
        let t = logs.t;
        for (sem, ep) in self.episodes.into_iter().enumerate() {
            if let Some(e) = ep {
                let name = logs.cfg.sems[sem].name.clone();
                close_episode(logs, &e, &name, ids, excuses, r);
            }
        }
        // a grant held in Redis for longer than the fallback interval by a live process that
        // never reported it: the waiter never learned it was granted
        for (id, (sem, first, last)) in self.unclaimed {
            if self.claimed.contains(&id) || last - first <= t.fallback + t.slack {
                continue;
            }
            let Some(w) = ids.worker(id) else {
                continue;
            };
            let alive = logs
                .workers
                .get(&w)
                .is_some_and(|wk| wk.alive(first) && wk.alive(last));
            if alive && !excuses.excused(logs, w, first - t.fallback, last) {
                r.violation(
                    "wait-while-free",
                    format!(
                        "{}: {} (worker {w}) was granted in Redis and held from {} to {} ({:.0} ms) but the worker never learned it",
                        logs.cfg.sems[sem].name,
                        ids.name(id),
                        ms_fmt(first),
                        ms_fmt(last),
                        ms(last - first)
                    ),
                );
            }
        }
    }
}

fn close_episode(
    logs: &Logs,
    e: &FreeEpisode,
    name: &str,
    ids: &Ids,
    excuses: &mut Excuses,
    r: &mut Report,
) {
    let t = logs.t;
    let dur = e.last - e.first;
    let unexcused = e.waiters.iter().any(|&id| {
        ids.worker(id).is_some_and(|w| {
            logs.workers.get(&w).is_some_and(|wk| wk.alive(e.last))
                && !excuses.excused(logs, w, e.first - t.fallback, e.last)
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
                ids.name(e.head)
            ),
        );
    }
}

/// Checks the second half: grants are learned within the fallback interval.
pub(super) fn notices(logs: &Logs, r: &mut Report) {
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

//! The lines of `snapshots.log` (see `snapshot.rs` for its format): a semaphore's snapshot
//! and its entries, the entry ids by number, and the excuses a worker had for not acting.
//! `scan.rs` reads the file once and hands each snapshot to the properties.
//!
//! A snapshot whose request or reply overlapped a Redis restart is skipped: which Redis
//! incarnation answered it is unknown; so is one that overlapped a step of Redis's clock
//! (`clock-step`). After a step, Redis's times (the snapshot's, the leases' expiries, the
//! grants') are turned into real time (see `Logs::real_time`).

use std::collections::{HashMap, HashSet};

use super::logs::{Logs, num};
use super::time::overlaps;
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
    /// Its priority class (0 when none, or its record is gone).
    pub(super) priority: u8,
}

impl Entry {
    /// Its place in the queue, which orders grants (docs/PROTOCOL.md, "Priority classes";
    /// the ticket itself without a priority). Computed here from the protocol's rule, not
    /// read from the queue: the checker tests that Redis follows the rule.
    pub(super) fn place(&self) -> f64 {
        self.ticket as f64 - f64::from(self.priority) * 1000.0625
    }
}

fn parse_entry(s: &str) -> Option<Entry> {
    let f: Vec<&str> = s.split(':').collect();
    // (a log written before priority classes has 8 fields: every entry in class 0)
    if f.len() != 8 && f.len() != 9 {
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
        priority: f.get(8).map_or(Some(0), |p| p.parse().ok())?,
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
    pub(super) fn parse(
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
    /// Numbers the next entry id, made by `worker`'s client; returns its number.
    pub(super) fn push(&mut self, name: &str, worker: Option<u32>) -> u32 {
        self.names.push(name.to_owned());
        self.workers.push(worker);
        self.names.len() as u32 - 1
    }

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
    pub(super) fn new(logs: &Logs) -> Excuses {
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

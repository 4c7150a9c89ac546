//! The report of a check: the figures of the run and the violations found, each naming its
//! property (at most `MAX_LISTED` listed per property, all of them counted).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::logs::Logs;
use super::time::{ms, overlaps};

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
    /// Fenced writes: accepted, rejected (decided by the FencedStore), refused (an op the resource never registered).
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

/// Violations listed per property (the others are only counted).
const MAX_LISTED: usize = 10;

impl Report {
    pub(super) fn violation(&mut self, property: &'static str, message: String) {
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
            "snapshots of Redis: {}   fenced writes: {} accepted, {} rejected, {} refused (unknown op)",
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

/// The figures of the run, from the logs alone.
pub(super) fn figures(logs: &Logs, r: &mut Report) {
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

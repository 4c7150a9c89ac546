//! Property 2, `limit-believed`: at every instant, the permits of the holders that *believe*
//! they hold (from `acq` to `done`, `cancel`, `lost` or their death) add up to at most the
//! limit, on distinct slots.
//!
//! The exception: while one of them was no longer valid in Redis — a stale holder, explained
//! by property 3 (a pause or stall past its lease, an eviction, a data loss). No lease can
//! keep a process that does not run from believing; only fencing protects the resource then
//! (property 4). An overlap is excused from the moment enough of its holders may be stale
//! that the rest fit, with 1 ms of tolerance (the logs' clocks are read in different
//! processes); each excused stale holder is counted by the class of fault that explains it.

use std::collections::HashSet;

use super::logs::Logs;
use super::report::Report;
use super::stale_belief::{Stale, class_of};
use super::time::{ms, ms_fmt};

/// Checks property 2, with `inv` from property 3.
pub(super) fn check(logs: &Logs, inv: &[Stale], r: &mut Report) {
    for (sem, spec) in logs.cfg.sems.iter().enumerate() {
        let limit = spec.limit;
        let mut edges: Vec<(i64, bool, usize)> = Vec::new();
        for (i, o) in logs.ops.iter().enumerate() {
            if o.sem != sem {
                continue;
            }
            let w = &logs.workers[&o.worker];
            let (Some(acq), Some(end)) = (o.acq, o.belief_end(w)) else {
                continue;
            };
            if end > acq {
                edges.push((acq, true, i));
                edges.push((end, false, i));
            }
        }
        // at equal times, ends first
        edges.sort_by_key(|&(t, start, i)| (t, start, i));
        let mut active: Vec<usize> = Vec::new();
        let mut culprits: HashSet<usize> = HashSet::new();
        for k in 0..edges.len() {
            let (t, start, i) = edges[k];
            if start {
                active.push(i);
            } else {
                active.retain(|&x| x != i);
            }
            let next = edges.get(k + 1).map_or(t, |e| e.0);
            if next <= t {
                continue;
            }
            let over = |set: &[usize]| {
                let n: u32 = set.iter().map(|&x| logs.ops[x].n).sum();
                let mut slots = HashSet::new();
                let dup = set
                    .iter()
                    .flat_map(|&x| logs.ops[x].fences.iter().map(|f| f.0))
                    .any(|s| !slots.insert(s));
                n > limit || dup
            };
            if !over(&active) {
                continue;
            }
            // explained from the moment enough of them are stale in Redis
            let mut stale: Vec<(i64, usize)> = active
                .iter()
                .filter_map(|&x| inv[x].possible.map(|s| (s, x)))
                .collect();
            stale.sort();
            let mut remaining = active.clone();
            let mut resolved_at = None;
            let mut culprit = None;
            for &(since, x) in &stale {
                remaining.retain(|&y| y != x);
                if !over(&remaining) {
                    resolved_at = Some(since);
                    culprit = Some(x);
                    break;
                }
            }
            match (resolved_at, culprit) {
                (Some(since), Some(x)) if since <= t + 1000 => {
                    if culprits.insert(x) {
                        let class = class_of(logs, &logs.ops[x], since);
                        *r.overlaps.entry(class.to_owned()).or_default() += 1;
                    }
                }
                _ => {
                    let who: Vec<String> = active
                        .iter()
                        .map(|&x| {
                            let o = &logs.ops[x];
                            format!("{} (worker {}, slots {:?})", o.name, o.worker, o.fences)
                        })
                        .collect();
                    r.violation(
                        "limit-believed",
                        format!(
                            "{}: from {} to {} ({:.1} ms), these believed they held, beyond the limit {limit}, with none known stale in Redis: {}",
                            spec.name,
                            ms_fmt(t),
                            ms_fmt(next),
                            ms(next - t),
                            who.join(", ")
                        ),
                    );
                }
            }
        }
    }
}

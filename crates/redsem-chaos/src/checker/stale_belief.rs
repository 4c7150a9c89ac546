//! Property 3, `stale-belief`: a holder that believes it holds while its lease is not valid
//! in Redis (absent, expired, or with other slots) at a snapshot `s*` is explained only by a
//! documented fault, and gives its permit up soon after it could know.
//!
//! The faults that explain it:
//! - its process was paused (SIGSTOP) or stalled (no timer fired: starved) between
//!   `s* − lease` and `s*`: a process that does not run cannot renew, nor learn;
//! - Redis lost its data after the grant (a restart without persistence, or a failover to a
//!   replica that lags: then only the grants made after the replica's copy are lost; one
//!   made before keeps a valid lease, since the lag is below one renewal interval and the
//!   holder's deadline counts from a renewal answered at least one interval before a later
//!   one was sent — PROTOCOL.md rule 4; a failover beyond that bound, or less than one
//!   lease + one renewal interval after the previous restart, counts as a loss of
//!   everything, see `logs.rs`);
//! - an operator force-released it, or its record was lost with the semaphore's `meta` key
//!   (the `key-loss` fault; counted as an eviction: it learns the same way);
//! - Redis's clock stepped forward (`clock-step`) between `s_valid − lease` and `s*`, by more
//!   than the documented bound covers for it (PROTOCOL.md rule 4): in total more than
//!   margin + one renewal interval, or more than the margin when one of its renewals may
//!   have been lost (its command connection faulted, its process halted, Redis answering
//!   nobody). A smaller step explains nothing: its local deadline must come first.
//!
//! The bound: it stops believing (the guarded work cancelled) within one renewal interval
//! (+ slack) of the first moment it could learn, because its next renewal tells it:
//! - `max(s*, end of the pause)`;
//! - after a data loss, `max(Redis answering again, restart + lease − renewal interval)`:
//!   its client may still be reconnecting, and then its local deadline ends it;
//! - after an eviction, the end of the `force_release` (or of a later pause) — or, if Redis
//!   or its command connection was down meanwhile, its local deadline (lease − margin after
//!   its last confirmed renewal, sent before the removal), since no renewal could tell it;
//! - after a clock step, the step (or the end of a later pause), or its local deadline
//!   likewise.
//!
//! Unexplained, only the slack is tolerated (snapshot and scheduling resolution). The result,
//! per op, since when it may have been and since when it certainly was stale, explains the
//! overlaps of property 2 and the rejected writes of property 4.

use super::logs::{Logs, Op};
use super::report::Report;
use super::time::{ms, ms_fmt, overlaps};

/// Since when an op's lease may have been invalid in Redis (`possible`: from the last
/// snapshot that showed it valid, when something could have made it go unseen), and since
/// when it certainly was (`sure`: a snapshot showed it invalid while it still believed).
#[derive(Clone, Copy, Default)]
pub(super) struct Stale {
    pub(super) possible: Option<i64>,
    pub(super) sure: Option<i64>,
}

/// Checks property 3. Returns, per op, since when it may have been, and since when it
/// certainly was, invalid in Redis while it believed it held.
pub(super) fn check(logs: &Logs, r: &mut Report) -> Vec<Stale> {
    let global = logs.global_halts();
    let mut inv = vec![Stale::default(); logs.ops.len()];
    for (i, o) in logs.ops.iter().enumerate() {
        let Some(acq) = o.acq else { continue };
        let seen = Seen::of(logs, o, acq);
        let maybe_gone = may_be_gone(logs, o, acq, &seen);
        let Some(s_star) = seen.s_star else {
            if maybe_gone && seen.s_valid < seen.end {
                inv[i].possible = Some(seen.s_valid);
            }
            continue;
        };
        inv[i] = Stale {
            possible: Some(seen.s_valid),
            sure: Some(s_star),
        };
        let (class, learn_from) = explain(logs, &global, o, acq, &seen, s_star);
        judge(logs, o, class, learn_from, s_star, seen.end, r);
    }
    inv
}

/// What the snapshots showed of one op's lease while it believed it held.
struct Seen {
    /// When it stopped believing (its grant, if it is not known to have).
    end: i64,
    /// The last snapshot that showed its lease valid by `end`, before any that showed it
    /// invalid (its grant, if none).
    s_valid: i64,
    /// `s*`: the first snapshot that showed its lease invalid by `end`.
    s_star: Option<i64>,
}

impl Seen {
    fn of(logs: &Logs, o: &Op, acq: i64) -> Seen {
        let w = &logs.workers[&o.worker];
        let end = o.belief_end(w).unwrap_or(acq);
        let first_bad = o.obs.iter().position(|&(_, ok)| !ok);
        let s_valid = o.obs[..first_bad.unwrap_or(o.obs.len())]
            .iter()
            .rev()
            .find(|x| x.1 && x.0 <= end)
            .map_or(acq, |x| x.0);
        let s_star = first_bad.map(|k| o.obs[k].0).filter(|&s| s <= end);
        Seen {
            end,
            s_valid,
            s_star,
        }
    }
}

/// Whether the runner could not tell op `o`'s Redis incarnation (`hold … ?`: its acquisition
/// spanned a restart, and the new Redis did not hold it).
fn unknown_epoch(logs: &Logs, o: &Op) -> bool {
    matches!(logs.holds.get(&o.name), Some(None))
}

/// When an operator force-released op `o`'s holder, or its record was lost (`key-loss`).
fn evicted(logs: &Logs, o: &Op) -> Option<(i64, i64)> {
    o.holder
        .as_ref()
        .and_then(|h| logs.evictions.get(h))
        .copied()
}

/// Whether op `o` stopped believing because its permit was gone, or could have been gone
/// unseen (between two snapshots) while its process did not run.
fn may_be_gone(logs: &Logs, o: &Op, acq: i64, seen: &Seen) -> bool {
    let t = logs.t;
    let (end, s_valid) = (seen.end, seen.s_valid);
    let died = logs.workers[&o.worker].killed_at.is_some_and(|k| k <= end);
    let halted = overlaps(&logs.halts(o.worker), s_valid - t.lease, end);
    // Redis loses its data when it dies, not when the restart begins: a grant received
    // between the two (its script ran before the kill) may be gone too. So may a grant
    // whose acquisition spanned the restart and that the new Redis did not hold (the
    // runner could not tell its incarnation: `hold … ?`), even if its reply or
    // notification was read after Redis died.
    let unknown_epoch = unknown_epoch(logs, o);
    // (a failover to a lagging replica loses only the grants made after its save)
    let data_lost = logs.restarts.iter().any(|rs| {
        rs.start <= end
            && rs.may_lose_grant(acq)
            && (rs.dead >= s_valid || (unknown_epoch && rs.dead >= o.begin))
    });
    let evicted_by_end = evicted(logs, o).is_some_and(|(f0, _)| f0 <= end);
    let stepped = logs.uncovered_step(o.worker, s_valid, end).is_some();
    o.lost.is_some() || died || halted || data_lost || evicted_by_end || stepped
}

/// The fault that explains why op `o` was stale in Redis at `s_star` (`None`: none does), and
/// the first moment it could learn it.
fn explain(
    logs: &Logs,
    global: &[(i64, i64)],
    o: &Op,
    acq: i64,
    seen: &Seen,
    s_star: i64,
) -> (Option<&'static str>, i64) {
    let t = logs.t;
    // (the data loss that lost the grant: not one over before it was made, which an op
    // that waited long may have seen too — only a grant whose incarnation is unknown
    // may come from a Redis that died before it was read)
    let restart = logs.restarts.iter().find(|rs| {
        rs.start >= o.begin.min(acq)
            && rs.start <= s_star
            && rs.may_lose_grant(acq)
            && (rs.dead >= acq || unknown_epoch(logs, o))
    });
    // halts that could have let its lease run out unnoticed (begun by s*), and halts
    // that kept it from learning afterwards (begun before it gave up)
    let all_halts = logs.halts(o.worker);
    let caused = |&(p, c): &(i64, i64)| p <= s_star && c >= s_star - t.lease;
    let cause = all_halts.iter().any(caused);
    let paused = logs.workers[&o.worker].pauses.iter().any(caused);
    let last_halt_end = all_halts
        .iter()
        .filter(|&&(p, c)| p <= seen.end && c >= s_star - t.lease)
        .map(|h| h.1)
        .max();
    // the first moment it could learn: Redis answering again after the data loss (or
    // its local deadline, if the client was still reconnecting), the end of its pause
    let mut learn_from = s_star;
    let mut class = None;
    if let Some(rs) = restart {
        learn_from = learn_from.max(rs.ready.max(rs.start + t.lease - t.renew));
        class = Some("data-loss");
    }
    // its lease taken from it (removed, or cut short by Redis's clock) during `(f0, f1)`:
    // its next renewal says so, if Redis answers it; if Redis or its command connection
    // was down meanwhile, its local deadline does (lease − margin after its last
    // confirmed renewal, which was sent before `f0`)
    let learn_by = |f0: i64, f1: i64| {
        let base = f1.max(last_halt_end.unwrap_or(f1));
        let window = (f0, base + t.renew + t.slack);
        let unreachable = overlaps(global, window.0, window.1)
            || overlaps(&logs.cmd_faults(o.worker), window.0, window.1);
        if unreachable {
            base.max(f0 + t.lease - t.renew)
        } else {
            base
        }
    };
    if let Some((f0, f1)) = evicted(logs, o)
        && f0 <= s_star
    {
        // an operator removed it
        learn_from = learn_from.max(learn_by(f0, f1));
        class = Some("eviction");
    }
    if let Some((c0, c1)) = logs.uncovered_step(o.worker, seen.s_valid, s_star) {
        // Redis's clock jumped past its lease
        learn_from = learn_from.max(learn_by(c0, c1));
        class.get_or_insert("clock-step");
    }
    if cause {
        class.get_or_insert(if paused { "pause" } else { "stall" });
    }
    if class.is_some()
        && let Some(c) = last_halt_end
    {
        learn_from = learn_from.max(c);
    }
    (class, learn_from)
}

/// Judges op `o`, stale in Redis from `s_star` while it believed it held until `end`: a
/// violation unless a fault (`class`) explains it and it gave up within one renewal interval
/// (+ slack) of `learn_from`, the first moment it could learn; counted in the report.
fn judge(
    logs: &Logs,
    o: &Op,
    class: Option<&'static str>,
    learn_from: i64,
    s_star: i64,
    end: i64,
    r: &mut Report,
) {
    let t = logs.t;
    let Some(class) = class else {
        if end - s_star > t.slack {
            r.violation(
                "stale-belief",
                format!(
                    "op {} (worker {}, {}): believed it held slots {:?} until {} although Redis had no valid lease for it at {} ({:.0} ms), with no pause, stall or data loss to explain it",
                    o.name,
                    o.worker,
                    logs.cfg.sems[o.sem].name,
                    o.fences,
                    ms_fmt(end),
                    ms_fmt(s_star),
                    ms(end - s_star)
                ),
            );
        } else {
            *r.stale_beliefs
                .entry("within-slack".to_owned())
                .or_default() += 1;
        }
        return;
    };
    *r.stale_beliefs.entry(class.to_owned()).or_default() += 1;
    let delay = end - learn_from;
    let worst = r.worst_detection_ms.entry(class.to_owned()).or_insert(0.0);
    *worst = worst.max(ms(delay.max(0)));
    if delay > t.renew + t.slack {
        r.violation(
            "stale-belief",
            format!(
                "op {} (worker {}, {}): stale since {} ({class}), it could know from {} but believed it held until {} ({:.0} ms > one renewal interval {:.0} ms + slack)",
                o.name,
                o.worker,
                logs.cfg.sems[o.sem].name,
                ms_fmt(s_star),
                ms_fmt(learn_from),
                ms_fmt(end),
                ms(delay),
                ms(t.renew)
            ),
        );
    }
}

/// The fault that explains why op `o` was stale in Redis at `since`: `eviction`,
/// `data-loss`, `clock-step`, `pause` or (its process starved of CPU) `stall`.
pub(super) fn class_of(logs: &Logs, o: &Op, since: i64) -> &'static str {
    let w = &logs.workers[&o.worker];
    let evicted = evicted(logs, o).is_some_and(|(f0, _)| f0 <= since + logs.t.snapshot * 2);
    if evicted {
        "eviction"
    } else if logs.restarts.iter().any(|rs| {
        rs.start >= o.begin
            && rs.start <= since + logs.t.snapshot * 2
            && o.acq.is_none_or(|acq| rs.may_lose_grant(acq))
    }) {
        "data-loss"
    } else if logs
        .uncovered_step(o.worker, since, since + logs.t.snapshot * 2)
        .is_some()
    {
        "clock-step"
    } else if w
        .pauses
        .iter()
        .any(|&(p, c)| p <= since + logs.t.snapshot * 2 && c >= since - logs.t.lease)
    {
        "pause"
    } else {
        "stall"
    }
}

//! What a renewal's answer means for a handle: the state changes it makes at once (leases
//! confirmed, the schedule, the doubt marks) and the [`Effect`]s the engine carries out
//! (resolving waiters, declaring permits lost). Pure: [`HandleState::on_renewal`] is tested
//! with made-up replies in simulated time.

use std::sync::Arc;

use super::state::{HandleState, Outcome};
use super::time::Instant;
use crate::error::LostReason;
use crate::protocol::{EntryState, RemovedBy, Renewal};

/// What the engine must do after an event, in order.
pub(crate) enum Effect {
    /// Resolve the waiter `id` ([`HandleState::resolve`], then its resolver).
    Resolve(Arc<str>, Outcome),
    /// Declare the holder `id` lost for this reason (and remove what is left of its entry in
    /// Redis, unless another handle adopted it).
    Lose(String, LostReason),
}

/// One renewal call as it was sent, and its answer.
pub(crate) struct RenewalCall<'a> {
    /// When it was sent and answered.
    pub(crate) sent: Instant,
    pub(crate) answered: Instant,
    /// The lease lengths (ms) of the sessions it renewed, in order (none: a check only).
    pub(crate) sessions: &'a [u64],
    /// The holders it checked, then the waiters, in order.
    pub(crate) holders: &'a [String],
    pub(crate) waiters: &'a [Arc<str>],
    /// Whether it counts (synced mode: enough replicas acknowledged it).
    pub(crate) replicated: bool,
}

impl<W, H> HandleState<W, H> {
    /// A renewal call answered `renewal`: confirms the leases it renewed (if it counts),
    /// moves the schedule on, marks the waiters in doubt, and returns what the engine must
    /// do. A holder is lost when its entry is gone, waiting, handed off or granted afresh
    /// (not its grant); a waiter is resolved when granted, gone, or removed by someone else.
    pub(crate) fn on_renewal(&mut self, call: &RenewalCall<'_>, renewal: Renewal) -> Vec<Effect> {
        let (sent, now) = (call.sent, call.answered);
        // the waiters' session (the handle's lease) kept its lease: they are renewed
        let wait_ms = self.timing().lease.as_millis() as u64;
        let waiters_kept = call
            .sessions
            .iter()
            .zip(&renewal.had_lease)
            .any(|(ms, &had)| *ms == wait_ms && had);
        if call.replicated {
            self.schedule.succeeded(now, renewal.next_expiry);
        } else {
            // retried like a failed call; the holders' deadlines stay where they were
            self.schedule.failed(now);
        }
        self.schedule.doubt_below = renewal.head.map_or(f64::INFINITY, |h| h as f64);
        self.schedule.served = renewal.served;
        self.schedule.issued = renewal.issued;
        if !call.sessions.is_empty() && !waiters_kept {
            // the waiters' session had expired: they may have been reaped
            self.schedule.check_all = true;
        }
        if call.replicated && waiters_kept {
            self.waiters_renewed(sent, now);
        }
        let mut effects = Vec::new();
        // Removed by someone else: holders are lost; a waiter an operator removed fails, a
        // rejected one asks again (Redis answers with the current limit). First: a waiter checked below finds its entry gone
        // too, which alone would queue it again.
        for (id, by) in renewal.removed {
            effects.push(if self.holder(&id).is_some() {
                Effect::Lose(id, LostReason::NotHolder)
            } else {
                let outcome = match by {
                    RemovedBy::Operator => Outcome::Removed,
                    RemovedBy::Rejected => Outcome::Rejected,
                };
                Effect::Resolve(id.into(), outcome)
            });
        }
        let gone = if renewal.deleted {
            LostReason::Deleted
        } else {
            LostReason::NotHolder
        };
        let mut states = renewal.states.into_iter();
        for (id, state) in call.holders.iter().zip(states.by_ref()) {
            if let Some(reason) = self.holder_renewed(id, state, call, gone) {
                effects.push(Effect::Lose(id.clone(), reason));
            }
        }
        for (id, state) in call.waiters.iter().zip(states) {
            let outcome = match state {
                EntryState::Held(grant) => Outcome::Granted(Box::new(grant)),
                EntryState::Gone | EntryState::Moved => Outcome::Lost,
                EntryState::Waiting => continue,
            };
            effects.push(Effect::Resolve(id.clone(), outcome));
        }
        effects
    }

    /// The renewal found the holder `id` in `state`: confirms its lease, or says why it is
    /// lost (`gone`: the reason for an entry that vanished).
    fn holder_renewed(
        &mut self,
        id: &str,
        state: EntryState,
        call: &RenewalCall<'_>,
        gone: LostReason,
    ) -> Option<LostReason> {
        // a holder released or lost meanwhile is nobody's concern here
        let holder = self.holder_mut(id)?;
        match state {
            // granted again under the same id after Redis lost this grant
            EntryState::Held(g) if !holder.grant.as_ref().is_none_or(|mine| *mine == g) => {
                Some(LostReason::NotHolder)
            }
            EntryState::Held(_) => {
                if call.replicated {
                    holder.clock.renewed(call.sent, call.answered);
                }
                None
            }
            EntryState::Gone | EntryState::Waiting => Some(gone),
            EntryState::Moved => Some(LostReason::HandedOff),
        }
    }

    /// A renewal call failed at `now` (an error or no answer in time): retried with backoff.
    pub(crate) fn on_renewal_failed(&mut self, now: Instant) {
        self.schedule.failed(now);
    }

    /// A beat did not complete: every waiter is checked at the next one.
    pub(crate) fn check_all_next(&mut self) {
        self.schedule.check_all = true;
    }

    /// Redis refused the renewal for lack of permission (`detail`, in redsem's words): no
    /// renewal can succeed, so the permits are lost now and the waiters fail with the
    /// refusal (retried later all the same: the rule may be fixed meanwhile).
    pub(crate) fn on_renewal_refused(&mut self, now: Instant, detail: &str) -> Vec<Effect> {
        self.schedule.failed(now);
        let lost = self.holder_ids().into_iter();
        let lost = lost.map(|id| Effect::Lose(id, LostReason::Refused));
        let refused = self.waiter_ids().into_iter();
        let refused = refused.map(|id| Effect::Resolve(id, Outcome::Refused(detail.to_owned())));
        lost.chain(refused).collect()
    }

    /// The renewal found a key of the semaphore overwritten by another program's data (a
    /// foreign type, a foreign hash, an unreadable record): no renewal can succeed, and the
    /// semaphore's record of its holders is no longer to be trusted, so the permits are lost
    /// now ([`LostReason::Overwritten`]) rather than when their leases run out; the waiters
    /// ask again, and their acquisition reports what it finds.
    pub(crate) fn on_renewal_overwritten(&mut self, now: Instant) -> Vec<Effect> {
        self.schedule.failed(now);
        let lost = self.holder_ids().into_iter();
        let lost = lost.map(|id| Effect::Lose(id, LostReason::Overwritten));
        let retry = self.waiter_ids().into_iter();
        let retry = retry.map(|id| Effect::Resolve(id, Outcome::Lost));
        lost.chain(retry).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::core::{Grid, LeaseClock, Queued, Timing};
    use crate::protocol::Grant;

    const RENEW: Duration = Duration::from_secs(1);
    const LEASE: Duration = Duration::from_secs(3);

    type Plain = HandleState<(), ()>;

    fn grant(ticket: u64) -> Grant {
        Grant {
            ticket,
            slots: vec![0],
            fences: vec![7],
        }
    }

    /// A handle holding "h" (ticket 1) and "x" (ticket 2), both granted at `t0`, with the
    /// waiters "w1", "w2" queued.
    fn state(t0: Instant) -> Plain {
        let timing = Timing::new(LEASE, RENEW, RENEW);
        let mut st: Plain = HandleState::new(timing, Grid::new(t0), t0);
        for (id, ticket) in [("h", 1), ("x", 2)] {
            st.insert_holder(id.into(), LeaseClock::new(t0, t0, LEASE, RENEW), ());
            st.holder_mut(id).unwrap().grant = Some(grant(ticket));
        }
        for (id, ticket) in [("w1", 3), ("w2", 4)] {
            st.add_waiter(id.into(), (), t0);
            st.waiter_queued(
                id,
                Queued {
                    ticket,
                    priority: 0,
                },
            );
        }
        st
    }

    fn renewal(states: Vec<EntryState>) -> Renewal {
        Renewal {
            next_expiry: None,
            states,
            seen: (1, 1),
            had_lease: vec![true],
            head: Some(4),
            served: vec![3],
            issued: Some(4),
            removed: Vec::new(),
            deleted: false,
        }
    }

    fn describe(effects: &[Effect]) -> Vec<String> {
        effects
            .iter()
            .map(|e| match e {
                Effect::Lose(id, reason) => format!("lose {id} {reason:?}"),
                Effect::Resolve(id, o) => format!(
                    "resolve {id} {}",
                    match o {
                        Outcome::Granted(g) => format!("granted {}", g.ticket),
                        Outcome::Rejected => "rejected".into(),
                        Outcome::Removed => "removed".into(),
                        Outcome::Lost => "lost".into(),
                        Outcome::Closed => "closed".into(),
                        Outcome::Refused(d) => format!("refused {d}"),
                    }
                ),
            })
            .collect()
    }

    /// A renewal that finds its holders held confirms their leases (a renewal sent an
    /// interval after the grant's answer makes the grant trusted, the next one that one); one that finds a holder gone, moved, or granted afresh loses it;
    /// a waiter found granted is resolved with its grant, one found gone queues again.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_confirms_holders_and_says_which_are_lost_or_granted() {
        let t0 = Instant::now();
        let mut st = state(t0);
        let (holders, waiters) = (["h".into(), "x".into()], ["w1".into(), "w2".into()]);
        let at = |s: u32| t0 + RENEW * s;
        let call = |sent, replicated| RenewalCall {
            sent,
            answered: sent,
            sessions: &[3000],
            holders: &holders,
            waiters: &waiters,
            replicated,
        };
        let held = || {
            let waiting = [EntryState::Waiting, EntryState::Waiting];
            let held = [EntryState::Held(grant(1)), EntryState::Held(grant(2))];
            held.into_iter().chain(waiting).collect::<Vec<_>>()
        };
        for s in 1..=2 {
            assert!(
                st.on_renewal(&call(at(s), true), renewal(held()))
                    .is_empty()
            );
        }
        assert_eq!(st.holder("h").unwrap().clock.trusted_from(), at(1));
        // one that does not count (synced mode, too few replicas) confirms nothing
        st.on_renewal(&call(at(3), false), renewal(held()));
        assert_eq!(st.holder("h").unwrap().clock.trusted_from(), at(1));
        let states = vec![
            EntryState::Held(grant(9)), // h: granted afresh, not its grant
            EntryState::Moved,          // x: adopted by another handle
            EntryState::Held(grant(3)), // w1
            EntryState::Gone,           // w2
        ];
        let effects = st.on_renewal(&call(at(4), true), renewal(states));
        assert_eq!(
            describe(&effects),
            [
                "lose h NotHolder",
                "lose x HandedOff",
                "resolve w1 granted 3",
                "resolve w2 lost"
            ]
        );
    }

    /// Entries someone else removed: a holder is lost, a waiter learns why (an operator:
    /// removed; a shrink: rejected, it asks again), before
    /// the states (a removed waiter is also found gone); a deleted semaphore loses its
    /// holders with `Deleted`.
    #[tokio::test(start_paused = true)]
    async fn removals_come_first_and_deletion_is_named() {
        let t0 = Instant::now();
        let mut st = state(t0);
        let mut r = renewal(vec![EntryState::Gone, EntryState::Gone]);
        r.removed = vec![
            ("x".into(), RemovedBy::Operator),
            ("w1".into(), RemovedBy::Operator),
            ("w2".into(), RemovedBy::Rejected),
        ];
        r.deleted = true;
        let holders = ["h".to_owned()];
        let waiters = ["w1".into()];
        let call = RenewalCall {
            sent: t0,
            answered: t0,
            sessions: &[3000],
            holders: &holders,
            waiters: &waiters,
            replicated: true,
        };
        let effects = st.on_renewal(&call, r);
        assert_eq!(
            describe(&effects),
            [
                "lose x NotHolder",
                "resolve w1 removed",
                "resolve w2 rejected",
                "lose h Deleted",
                "resolve w1 lost"
            ]
        );
    }

    /// The answer moves the doubt marks: a head of the queue above a waiter's place, a
    /// served ticket at or above its ticket, or a highest issued ticket below it (the
    /// semaphore was re-created since it queued), puts it in doubt; a waiters' session that
    /// had lost its lease puts every waiter in doubt.
    #[tokio::test(start_paused = true)]
    async fn the_answer_sets_what_to_doubt() {
        let t0 = Instant::now();
        let mut st = state(t0);
        let none = std::collections::HashSet::new();
        let call = RenewalCall {
            sent: t0,
            answered: t0,
            sessions: &[3000],
            holders: &[],
            waiters: &[],
            replicated: true,
        };
        let mut r = renewal(Vec::new());
        r.head = Some(4);
        r.served = vec![0];
        st.on_renewal(&call, r);
        assert_eq!(st.doubted_waiters(&none), [Arc::<str>::from("w1")]);
        // re-created (a FLUSHALL): 2 tickets issued since, served and head below both
        let mut r = renewal(Vec::new());
        r.head = Some(1);
        r.served = vec![1];
        r.issued = Some(3);
        st.on_renewal(&call, r);
        assert_eq!(st.doubted_waiters(&none), [Arc::<str>::from("w2")]);
        let mut r = renewal(Vec::new());
        r.had_lease = vec![false];
        r.head = None;
        st.on_renewal(&call, r);
        assert_eq!(
            st.doubted_waiters(&none).len(),
            2,
            "all after an expired session"
        );
    }

    /// A refusal by ACL loses every holder and fails every waiter with the refusal.
    #[tokio::test(start_paused = true)]
    async fn a_refused_renewal_loses_holders_and_fails_waiters() {
        let t0 = Instant::now();
        let mut st = state(t0);
        let mut effects = describe(&st.on_renewal_refused(t0, "no EVALSHA"));
        effects.sort();
        assert_eq!(
            effects,
            [
                "lose h Refused",
                "lose x Refused",
                "resolve w1 refused no EVALSHA",
                "resolve w2 refused no EVALSHA"
            ]
        );
        assert!(st.next_wakeup().is_some_and(|t| t > t0), "retried later");
    }

    /// A renewal that finds a key overwritten by another program's data loses every holder
    /// at once (not when the lease runs out) and sends every waiter back to ask again (its
    /// acquisition then reports what it finds).
    #[tokio::test(start_paused = true)]
    async fn an_overwritten_key_loses_holders_and_requeues_waiters() {
        let t0 = Instant::now();
        let mut st = state(t0);
        let mut effects = describe(&st.on_renewal_overwritten(t0));
        effects.sort();
        assert_eq!(
            effects,
            [
                "lose h Overwritten",
                "lose x Overwritten",
                "resolve w1 lost",
                "resolve w2 lost"
            ]
        );
        assert!(st.next_wakeup().is_some_and(|t| t > t0), "retried later");
    }
}

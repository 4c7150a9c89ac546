//! The background releaser: the task that performs the I/O which `Drop` may not do.
//!
//! Dropping a [`Permit`](crate::Permit) or a pending acquire sends a [`Job`] here: a
//! synchronous, non-blocking channel send that never panics. The task batches the releases
//! that are waiting (one script call per semaphore per round) and retries a failed call a
//! few times, then again every [`RETRY_LATER`] while the client lives: an entry whose
//! release never reached Redis would otherwise live on in its session, which this process
//! keeps renewing. If the runtime is gone, the send fails silently and the entries expire
//! with their sessions. One per client.
//!
//! A release Redis confirmed can still be lost: a failover promotes a replica that had not
//! received it (Sentinel promotes without pausing the old master, and replication is
//! asynchronous). The entry then lives on in a session this process keeps renewing, held or
//! queued for ever by nobody. So the releases confirmed in the last [`REPLAY_WINDOW`] are
//! kept ([`Released`], those of the handles' in-place releases too), and sent again
//! [`REPLAY_DELAY`] after the notifier re-subscribed (a reconnect, or a move to a new master:
//! [`Notifier::resyncs`]); a release is idempotent and ids are never reused, so sending one
//! again is harmless. Cost: one release call per semaphore that released something in the
//! window, per resync; none otherwise.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::notifier::Notifier;
use super::remote::{Calls, Remote};
use crate::backoff::Backoff;
use crate::protocol::{Conn, Removal};

/// Work for the releaser.
pub(crate) enum Job {
    /// Remove a holder or a queued waiter (idempotent).
    Release { remote: Arc<Remote>, id: String },
    /// Detach a holder: it leaves the handle's session for one nobody renews, and expires
    /// with the lease it has ([`Permit::detach`](crate::Permit::detach)).
    Detach { remote: Arc<Remote>, id: String },
    /// A semaphore handle is gone: end its sessions (those with no entry left), after the
    /// releases sent before.
    EndSessions {
        remote: Arc<Remote>,
        sessions: Vec<String>,
    },
    /// A semaphore handle was dropped: stop listening on its channel.
    Unsubscribe { channel: String },
    /// Answer once every job sent before this one has been done
    /// ([`Client::flush_releases`](crate::Client::flush_releases)).
    Flush(oneshot::Sender<()>),
    /// End the task once the jobs taken with this one are done
    /// ([`Client::shutdown`](crate::Client::shutdown)); later jobs are dropped.
    Stop,
}

/// How long a confirmed release is kept to be sent again after a resync: longer than a
/// failover's lost writes reach back (Sentinel's promotion, the old master's last writes).
const REPLAY_WINDOW: Duration = Duration::from_secs(10);
/// Most releases kept (the oldest go first): a bound on the memory and on the one call per
/// semaphore that sends them again.
const REPLAY_CAP: usize = 16_384;
/// How long after a resync the kept releases are sent again: releases still in flight to
/// the old master when the client moved have come back by then (or failed, and are retried).
const REPLAY_DELAY: Duration = Duration::from_secs(2);

/// The releases Redis confirmed in the last [`REPLAY_WINDOW`], at most [`REPLAY_CAP`]: sent
/// again after a resync (see the module's doc). Shared by the releaser task and the handles'
/// in-place releases.
#[derive(Clone, Default)]
pub(crate) struct Released(Arc<Mutex<Log>>);

/// When each release was confirmed, of which semaphore, and its entry's id; oldest first.
type Log = VecDeque<(Instant, Arc<Remote>, String)>;

impl Released {
    /// Redis confirmed the releases of `ids` of the semaphore `remote`.
    pub(crate) fn record(&self, remote: &Arc<Remote>, ids: &[String]) {
        if ids.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut log = self.0.lock().unwrap();
        prune(&mut log, now);
        for id in ids {
            if log.len() == REPLAY_CAP {
                log.pop_front();
            }
            log.push_back((now, remote.clone(), id.clone()));
        }
    }

    /// The releases confirmed in the last [`REPLAY_WINDOW`], oldest first.
    fn recent(&self) -> Vec<(Arc<Remote>, String)> {
        let mut log = self.0.lock().unwrap();
        prune(&mut log, Instant::now());
        log.iter()
            .map(|(_, r, id)| (r.clone(), id.clone()))
            .collect()
    }
}

/// Drops the releases older than [`REPLAY_WINDOW`].
fn prune(log: &mut Log, now: Instant) {
    while log
        .front()
        .is_some_and(|(at, ..)| now - *at > REPLAY_WINDOW)
    {
        log.pop_front();
    }
}

/// Sender side of the releaser task, held by the client and its handles.
#[derive(Clone)]
pub(crate) struct Releaser {
    tx: mpsc::UnboundedSender<Job>,
    /// The confirmed releases, kept to be sent again after a resync.
    pub(crate) released: Released,
}

impl Releaser {
    pub(crate) fn spawn(conn: Conn, notifier: Arc<Notifier>) -> Releaser {
        let (tx, rx) = mpsc::unbounded_channel();
        let released = Released::default();
        let replay = replay(tx.downgrade(), released.clone(), notifier.resyncs());
        tokio::spawn(run(rx, tx.downgrade(), conn, notifier, released.clone()));
        tokio::spawn(replay);
        Releaser { tx, released }
    }

    /// A releaser with no task behind it: the jobs go to the returned receiver (for the
    /// unit tests of the tasks that send them).
    #[cfg(test)]
    pub(crate) fn detached() -> (Releaser, mpsc::UnboundedReceiver<Job>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let released = Released::default();
        (Releaser { tx, released }, rx)
    }

    /// Never blocks, never panics; a closed channel means the runtime is gone and the lease
    /// will expire by itself.
    pub(crate) fn send(&self, job: Job) {
        let _ = self.tx.send(job);
    }

    /// Removes `id` from the semaphore `remote` in the background (idempotent).
    pub(crate) fn release(&self, remote: &Arc<Remote>, id: String) {
        self.send(Job::Release {
            remote: remote.clone(),
            id,
        });
    }

    /// Resolves once every job sent before this call has been done (at once if the task is
    /// gone).
    pub(crate) async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Job::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// Most jobs taken from the channel in one round (their releases are grouped by semaphore).
const JOBS_PER_ROUND: usize = 256;
/// Tries of one release call in a row.
const ATTEMPTS: u32 = 6;
/// After [`ATTEMPTS`] failed tries, the jobs go back to the channel this much later.
const RETRY_LATER: Duration = Duration::from_secs(5);

/// Sends the kept releases again [`REPLAY_DELAY`] after each resync of the notifier; ends
/// with the releaser (its channel) or the notifier.
async fn replay(
    again: mpsc::WeakUnboundedSender<Job>,
    released: Released,
    mut resyncs: tokio::sync::watch::Receiver<u64>,
) {
    while resyncs.changed().await.is_ok() {
        tokio::time::sleep(REPLAY_DELAY).await;
        resyncs.borrow_and_update(); // (resyncs meanwhile are covered by this replay)
        let Some(tx) = again.upgrade() else { return };
        let recent = released.recent();
        if !recent.is_empty() {
            tracing::debug!(
                releases = recent.len(),
                "releaser: sending the releases of the last seconds again after a resync"
            );
        }
        for (remote, id) in recent {
            if tx.send(Job::Release { remote, id }).is_err() {
                return;
            }
        }
    }
}

async fn run(
    mut rx: mpsc::UnboundedReceiver<Job>,
    again: mpsc::WeakUnboundedSender<Job>,
    conn: Conn,
    notifier: Arc<Notifier>,
    released: Released,
) {
    let mut buf = Vec::with_capacity(JOBS_PER_ROUND);
    while rx.recv_many(&mut buf, JOBS_PER_ROUND).await > 0 {
        // group releases by semaphore, keeping arrival order within each (a group's call
        // removes its entries before it ends its sessions)
        let mut groups: Vec<Group> = Vec::new();
        let mut index: HashMap<usize, usize> = HashMap::new();
        let mut group_of = |remote: Arc<Remote>| -> usize {
            let key = Arc::as_ptr(&remote) as usize;
            *index.entry(key).or_insert_with(|| {
                groups.push(Group {
                    remote,
                    ids: Vec::new(),
                    detach: Vec::new(),
                    end: Vec::new(),
                });
                groups.len() - 1
            })
        };
        let mut jobs: Vec<(usize, Vec<String>, Kind)> = Vec::new();
        let mut flushed = Vec::new();
        let mut stop = false;
        for job in buf.drain(..) {
            if stop && !matches!(job, Job::Flush(_)) {
                continue; // sent after the stop: dropped
            }
            match job {
                Job::Release { remote, id } => {
                    jobs.push((group_of(remote), vec![id], Kind::Release))
                }
                Job::Detach { remote, id } => jobs.push((group_of(remote), vec![id], Kind::Detach)),
                Job::EndSessions { remote, sessions } => {
                    jobs.push((group_of(remote), sessions, Kind::End))
                }
                Job::Unsubscribe { channel } => notifier.unsubscribe(&channel).await,
                Job::Flush(done) => flushed.push(done),
                Job::Stop => stop = true,
            }
        }
        for (i, items, kind) in jobs {
            let g = &mut groups[i];
            match kind {
                Kind::Release => g.ids.extend(items),
                Kind::Detach => g.detach.extend(items),
                Kind::End => g.end.extend(items),
            }
        }
        for g in groups {
            if release_with_retry(conn.clone(), &g).await {
                released.record(&g.remote, &g.ids);
            } else if !stop {
                retry_later(again.clone(), g);
            }
        }
        for done in flushed {
            let _ = done.send(());
        }
        if stop {
            return;
        }
    }
}

/// What a job asks of its entries or sessions.
enum Kind {
    Release,
    Detach,
    End,
}

/// The releases, detachments and session ends of one semaphore in one round: one call.
struct Group {
    remote: Arc<Remote>,
    ids: Vec<String>,
    detach: Vec<String>,
    end: Vec<String>,
}

/// Sends the jobs of `g` back to the releaser after [`RETRY_LATER`] (nothing if the client
/// is gone by then: the entries expire with its sessions).
fn retry_later(again: mpsc::WeakUnboundedSender<Job>, g: Group) {
    tokio::spawn(async move {
        tokio::time::sleep(RETRY_LATER).await;
        let Some(tx) = again.upgrade() else { return };
        let remote = g.remote;
        for id in g.ids {
            let _ = tx.send(Job::Release {
                remote: remote.clone(),
                id,
            });
        }
        for id in g.detach {
            let _ = tx.send(Job::Detach {
                remote: remote.clone(),
                id,
            });
        }
        if !g.end.is_empty() {
            let _ = tx.send(Job::EndSessions {
                remote,
                sessions: g.end,
            });
        }
    });
}

/// One release call for the group `g`, tried [`ATTEMPTS`] times with a doubling delay
/// (50 ms, at most 2 s) between tries. Returns whether it succeeded.
async fn release_with_retry(mut conn: impl Calls, g: &Group) -> bool {
    fn refs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let (ids, detach, end) = (refs(&g.ids), refs(&g.detach), refs(&g.end));
    let removal = Removal {
        ids: &ids,
        detach: &detach,
        end: &end,
    };
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    for attempt in 1..=ATTEMPTS {
        match conn.release(&g.remote, &removal).await {
            Ok(_) => return true,
            Err(e) => {
                tracing::warn!(semaphore = %g.remote.name(), attempt, error = %e, "background release failed");
                if attempt < ATTEMPTS {
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
    }
    tracing::warn!(semaphore = %g.remote.name(), entries = g.ids.len() + g.detach.len(),
        "background release failed {ATTEMPTS} times: tried again in {RETRY_LATER:?}");
    crate::metrics::releases_abandoned(g.remote.name(), g.ids.len() + g.detach.len());
    false
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::time::Instant;

    use super::*;
    use crate::error::{CallError, CallResult};
    use crate::protocol::keys::Keys;
    use crate::protocol::{AcquireArgs, AcquireReply};

    /// When a release call was made, and the ids it carried.
    type Call = (Instant, Vec<String>);

    /// Fails the first `failures` release calls, and records each call.
    #[derive(Clone)]
    struct Flaky {
        failures: u32,
        calls: Arc<Mutex<Vec<Call>>>,
    }

    impl Calls for Flaky {
        async fn acquire(
            &mut self,
            _: &Remote,
            _: &[AcquireArgs<'_>],
        ) -> CallResult<Vec<AcquireReply>> {
            unreachable!("the releaser does not acquire")
        }

        async fn release(&mut self, _: &Remote, r: &Removal<'_>) -> CallResult<u64> {
            let mut calls = self.calls.lock().unwrap();
            calls.push((
                Instant::now(),
                r.ids.iter().map(|s| s.to_string()).collect(),
            ));
            if calls.len() as u32 <= self.failures {
                let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
                return Err(CallError::Redis(refused.into()));
            }
            Ok(r.ids.len() as u64)
        }
    }

    /// The delays between the calls of one `release_with_retry` against `failures` failures.
    async fn delays(failures: u32) -> (Vec<u128>, usize) {
        let flaky = Flaky {
            failures,
            calls: Default::default(),
        };
        let remote = Arc::new(Remote::new(Keys::new("redsem", "r").unwrap(), 1, "PUBLISH"));
        let ids = vec!["a".to_owned(), "b".to_owned()];
        let group = Group {
            remote,
            ids: ids.clone(),
            detach: vec![],
            end: vec![],
        };
        release_with_retry(flaky.clone(), &group).await;
        let calls = flaky.calls.lock().unwrap();
        assert!(
            calls.iter().all(|(_, sent)| *sent == ids),
            "one call for both"
        );
        let gaps = calls
            .windows(2)
            .map(|w| (w[1].0 - w[0].0).as_millis())
            .collect();
        (gaps, calls.len())
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_that_succeeds_is_not_retried() {
        assert_eq!(delays(0).await, (vec![], 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_release_is_retried_with_a_doubling_delay() {
        assert_eq!(delays(2).await, (vec![50, 100], 3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_that_keeps_failing_is_put_aside_after_six_tries() {
        assert_eq!(delays(100).await, (vec![50, 100, 200, 400, 800], 6));
    }

    /// The confirmed releases are kept for [`REPLAY_WINDOW`], at most [`REPLAY_CAP`] of them
    /// (the oldest go first), to be sent again after a resync.
    #[tokio::test(start_paused = true)]
    async fn confirmed_releases_are_kept_for_the_window_and_up_to_the_cap() {
        let remote = Arc::new(Remote::new(Keys::new("redsem", "r").unwrap(), 1, "PUBLISH"));
        let released = Released::default();
        let ids = |r: &Released| r.recent().into_iter().map(|(_, id)| id).collect::<Vec<_>>();
        released.record(&remote, &["a".into(), "b".into()]);
        tokio::time::advance(REPLAY_WINDOW / 2).await;
        released.record(&remote, &["c".into()]);
        assert_eq!(ids(&released), ["a", "b", "c"]);
        tokio::time::advance(REPLAY_WINDOW / 2 + Duration::from_millis(1)).await;
        assert_eq!(ids(&released), ["c"], "older than the window");
        let many: Vec<String> = (0..REPLAY_CAP).map(|i| i.to_string()).collect();
        released.record(&remote, &many);
        let kept = ids(&released);
        assert_eq!(kept.len(), REPLAY_CAP);
        assert_eq!(
            (kept[0].as_str(), kept[REPLAY_CAP - 1].as_str()),
            ("0", "16383")
        );
    }
}

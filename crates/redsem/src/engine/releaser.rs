//! The background releaser: the task that performs the I/O which `Drop` may not do.
//!
//! Dropping a [`Permit`](crate::Permit) or a pending acquire sends a [`Job`] here: a
//! synchronous, non-blocking channel send that never panics. The task batches the releases
//! that are waiting (one script call per semaphore per round) and retries a failed call a
//! few times; if Redis stays unreachable, the entries expire with their leases. If the
//! runtime is gone, the send fails silently and the leases expire too. One per client.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::notifier::Notifier;
use super::remote::{Calls, Remote};
use crate::scripts::Conn;

/// Work for the releaser.
pub(crate) enum Job {
    /// Remove a holder or a queued waiter (idempotent).
    Release { remote: Arc<Remote>, id: String },
    /// A semaphore handle was dropped: stop listening on its channel.
    Unsubscribe { channel: String },
    /// Answer once every job sent before this one has been done
    /// ([`Client::flush_releases`](crate::Client::flush_releases)).
    Flush(oneshot::Sender<()>),
    /// End the task once the jobs taken with this one are done
    /// ([`Client::shutdown`](crate::Client::shutdown)); later jobs are dropped.
    Stop,
}

/// Sender side of the releaser task, held by the client and its handles.
#[derive(Clone)]
pub(crate) struct Releaser {
    tx: mpsc::UnboundedSender<Job>,
}

impl Releaser {
    pub(crate) fn spawn(conn: Conn, notifier: Arc<Notifier>) -> Releaser {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, conn, notifier));
        Releaser { tx }
    }

    /// A releaser with no task behind it: the jobs go to the returned receiver (for the
    /// unit tests of the tasks that send them).
    #[cfg(test)]
    pub(crate) fn detached() -> (Releaser, mpsc::UnboundedReceiver<Job>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Releaser { tx }, rx)
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
/// Tries of one release call before giving up.
const ATTEMPTS: u32 = 6;

async fn run(mut rx: mpsc::UnboundedReceiver<Job>, conn: Conn, notifier: Arc<Notifier>) {
    let mut buf = Vec::with_capacity(JOBS_PER_ROUND);
    while rx.recv_many(&mut buf, JOBS_PER_ROUND).await > 0 {
        // group releases by semaphore, keeping arrival order within each
        let mut groups: Vec<(Arc<Remote>, Vec<String>)> = Vec::new();
        let mut index: HashMap<usize, usize> = HashMap::new();
        let mut flushed = Vec::new();
        let mut stop = false;
        for job in buf.drain(..) {
            match job {
                Job::Release { remote, id } => {
                    let key = Arc::as_ptr(&remote) as usize;
                    match index.get(&key) {
                        Some(&i) => groups[i].1.push(id),
                        None => {
                            index.insert(key, groups.len());
                            groups.push((remote, vec![id]));
                        }
                    }
                }
                Job::Unsubscribe { channel } => notifier.unsubscribe(&channel).await,
                Job::Flush(done) => flushed.push(done),
                Job::Stop => stop = true,
            }
        }
        for (remote, ids) in groups {
            release_with_retry(conn.clone(), &remote, &ids).await;
        }
        for done in flushed {
            let _ = done.send(());
        }
        if stop {
            return;
        }
    }
}

/// One release call for `ids`, tried [`ATTEMPTS`] times with a doubling delay (50 ms, at
/// most 2 s) between tries.
async fn release_with_retry(mut conn: impl Calls, remote: &Remote, ids: &[String]) {
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut delay = Duration::from_millis(50);
    for attempt in 1..=ATTEMPTS {
        match conn.release(remote, &refs).await {
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(semaphore = %remote.name(), attempt, error = %e, "background release failed");
                if attempt < ATTEMPTS {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
    tracing::warn!(semaphore = %remote.name(), entries = ids.len(),
        "giving up the background release: the entries will expire with their leases");
    crate::metrics::releases_abandoned(remote.name(), ids.len());
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::time::Instant;

    use super::*;
    use crate::error::{CallError, CallResult};
    use crate::keys::Keys;
    use crate::scripts::{AcquireArgs, AcquireReply};

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

        async fn release(&mut self, _: &Remote, ids: &[&str]) -> CallResult<u64> {
            let mut calls = self.calls.lock().unwrap();
            calls.push((Instant::now(), ids.iter().map(|s| s.to_string()).collect()));
            if calls.len() as u32 <= self.failures {
                let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
                return Err(CallError::Redis(refused.into()));
            }
            Ok(ids.len() as u64)
        }
    }

    /// The delays between the calls of one `release_with_retry` against `failures` failures.
    async fn delays(failures: u32) -> (Vec<u128>, usize) {
        let flaky = Flaky {
            failures,
            calls: Default::default(),
        };
        let remote = Remote::new(Keys::new("redsem", "r").unwrap(), 1, "PUBLISH");
        let ids = vec!["a".to_owned(), "b".to_owned()];
        release_with_retry(flaky.clone(), &remote, &ids).await;
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
    async fn a_release_that_keeps_failing_is_given_up_after_six_tries() {
        assert_eq!(delays(100).await, (vec![50, 100, 200, 400, 800], 6));
    }
}

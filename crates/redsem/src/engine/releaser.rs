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
use super::remote::Remote;
use crate::scripts::{self, Conn};

/// Work for the releaser.
pub(crate) enum Job {
    /// Remove a holder or a queued waiter (idempotent).
    Release { remote: Arc<Remote>, id: String },
    /// A semaphore handle was dropped: stop listening on its channel.
    Unsubscribe { channel: String },
    /// Answer once every job sent before this one has been done
    /// ([`Client::flush_releases`](crate::Client::flush_releases)).
    Flush(oneshot::Sender<()>),
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
            }
        }
        for (remote, ids) in groups {
            release_with_retry(conn.clone(), &remote, &ids).await;
        }
        for done in flushed {
            let _ = done.send(());
        }
    }
}

async fn release_with_retry(mut conn: Conn, remote: &Remote, ids: &[String]) {
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut delay = Duration::from_millis(50);
    for attempt in 1..=ATTEMPTS {
        match scripts::release(&mut conn, &remote.target(), &refs, false).await {
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

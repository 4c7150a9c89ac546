//! The background task that performs the I/O which `Drop` may not do.
//!
//! Dropping a [`Permit`](crate::Permit) or a pending acquire sends a message here: a
//! synchronous, non-blocking channel send that never panics. The task batches the releases
//! that are waiting (one script call per semaphore per batch) and retries a failed call a few
//! times; if Redis stays unreachable, the entries expire with their leases. If the runtime is
//! gone, the send fails silently and the leases expire too.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::notifier::Notifier;
use crate::scripts::{self, Conn};
use crate::semaphore::Core;

pub(crate) enum Msg {
    /// Remove a holder or a queued waiter (idempotent).
    Release { core: Arc<Core>, id: String },
    /// A semaphore handle was dropped: stop listening on its channel.
    Unsubscribe { channel: String },
    /// Answer once every message sent before this one has been handled
    /// ([`Client::flush_releases`](crate::Client::flush_releases)).
    Flush(oneshot::Sender<()>),
}

/// Sender side, held by the client.
#[derive(Clone)]
pub(crate) struct Driver {
    tx: mpsc::UnboundedSender<Msg>,
}

impl Driver {
    pub(crate) fn spawn(conn: Conn, notifier: Arc<Notifier>) -> Driver {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, conn, notifier));
        Driver { tx }
    }

    /// Never blocks, never panics; a closed channel means the runtime is gone and the lease
    /// will expire by itself.
    pub(crate) fn send(&self, msg: Msg) {
        let _ = self.tx.send(msg);
    }

    /// Resolves once every message sent before this call has been handled (at once if the
    /// task is gone).
    pub(crate) async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

const MAX_BATCH: usize = 256;
const ATTEMPTS: u32 = 6;

async fn run(mut rx: mpsc::UnboundedReceiver<Msg>, conn: Conn, notifier: Arc<Notifier>) {
    let mut buf = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut buf, MAX_BATCH).await > 0 {
        // group releases by semaphore, keeping arrival order within each
        let mut groups: Vec<(Arc<Core>, Vec<String>)> = Vec::new();
        let mut index: HashMap<usize, usize> = HashMap::new();
        let mut flushed = Vec::new();
        for msg in buf.drain(..) {
            match msg {
                Msg::Release { core, id } => {
                    let key = Arc::as_ptr(&core) as usize;
                    match index.get(&key) {
                        Some(&i) => groups[i].1.push(id),
                        None => {
                            index.insert(key, groups.len());
                            groups.push((core, vec![id]));
                        }
                    }
                }
                Msg::Unsubscribe { channel } => notifier.unsubscribe(&channel).await,
                Msg::Flush(done) => flushed.push(done),
            }
        }
        for (core, ids) in groups {
            release_with_retry(conn.clone(), &core, &ids).await;
        }
        for done in flushed {
            let _ = done.send(());
        }
    }
}

async fn release_with_retry(mut conn: Conn, core: &Core, ids: &[String]) {
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut delay = Duration::from_millis(50);
    for attempt in 1..=ATTEMPTS {
        match scripts::release(&mut conn, &core.target(), &refs, false).await {
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(semaphore = %core.keys.name, attempt, error = %e, "background release failed");
                if attempt < ATTEMPTS {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
    tracing::warn!(semaphore = %core.keys.name, entries = ids.len(),
        "giving up the background release: the entries will expire with their leases");
    crate::metrics::releases_abandoned(&core.keys.name, ids.len());
}

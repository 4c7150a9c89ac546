//! [`Context`]: what every semaphore handle of one client shares — the two connections, the
//! notifier, the background releaser, the renewer — and how it is connected.
//!
//! Tasks per client: the notifier's router and its resync task, the releaser, the renewer; through
//! Sentinel, two more (the master follower and the `+switch-master` listener). Per open
//! semaphore handle: its batching task and its heartbeat.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::notifier::Notifier;
use super::releaser::{Job, Releaser};
use super::renewer::Renewer;
use crate::backend::{Backend, TlsPems, redact_url};
use crate::error::{BackendError, Error};
use crate::protocol::Conn;

/// A semaphore handle as its client sees it: what [`Context::shutdown`] does to it.
pub(crate) trait Member: Send + Sync {
    /// Closes the handle for good: its pending acquires fail, its waiters' and holders'
    /// entries are handed to the releaser (holders are declared lost first), its heartbeat
    /// stops and its channel is unsubscribed. No I/O here: the releaser does it.
    fn shut_down(&self);
}

/// The state of one client, shared by its handles (the public `Client` is an `Arc` of it).
pub(crate) struct Context {
    /// Unique per process and client: the first part of its handles' channel ids.
    pub(crate) id: String,
    pub(crate) prefix: String,
    pub(crate) conn: Conn,
    pub(crate) notifier: Arc<Notifier>,
    pub(crate) releaser: Releaser,
    /// Sends the renewals of every handle's heartbeat, several semaphores per call.
    pub(crate) renewer: Renewer,
    pub(crate) response_timeout: Duration,
    pub(crate) publish: &'static str,
    /// Synced mode: replicas that must acknowledge a grant, and how long to wait for them.
    pub(crate) synced: Option<(u32, Duration)>,
    next_channel: AtomicU64,
    /// Cancelled when the client is dropped or shut down: stops the notifier's and the
    /// Sentinel follower's tasks.
    stop: CancellationToken,
    /// The handles opened from this client (dead ones are pruned as handles join).
    members: Mutex<Vec<Weak<dyn Member>>>,
    /// Set by [`shutdown`](Self::shutdown): no handle opens any more.
    shut: CancellationToken,
}

/// What [`Context::connect`] needs (validated by the client builder).
pub(crate) struct ConnectSettings {
    pub(crate) url: String,
    pub(crate) prefix: String,
    pub(crate) pems: TlsPems,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) synced: Option<(u32, Duration)>,
    /// Run redsem's scripts as scripts, never as the Functions library.
    pub(crate) scripts_only: bool,
}

impl Context {
    /// Connects both connections and starts the background tasks. The whole of it (both
    /// connections, the client library's own retries included) gets one connect timeout;
    /// a failure is then explained ([`Backend::explain`], which may probe the server for
    /// up to a second more).
    pub(crate) async fn connect(s: ConnectSettings) -> Result<Context, Error> {
        let shown = redact_url(&s.url);
        let mut backend = Backend::new(&s.url, s.pems, s.connect_timeout, s.response_timeout)?;
        backend.scripts_only = s.scripts_only;
        let stop = CancellationToken::new();
        let connect = async {
            let conn = backend.connect(&stop).await?;
            let notifier = Notifier::connect(&backend, &conn).await?;
            Ok::<_, Error>((conn, notifier))
        };
        let limit = s.connect_timeout;
        let outcome = tokio::time::timeout(limit, connect).await;
        let (conn, (notifier, pushes)) = match outcome {
            Ok(Ok(connected)) => connected,
            Ok(Err(e)) => {
                stop.cancel();
                return Err(backend.explain(e).await);
            }
            Err(_) => {
                stop.cancel();
                let e = Error::Unreachable(BackendError::timed_out(format!(
                    "no connection to {shown} within {limit:?}"
                )));
                return Err(backend.explain(e).await);
            }
        };

        let notifier = Arc::new(notifier);
        let releaser = Releaser::spawn(conn.clone(), notifier.clone());
        let renewer = Renewer::spawn(conn.clone());
        Notifier::spawn_router(&notifier, pushes, stop.clone());
        // 64 random bits (fastrand's generator is seeded from the OS per thread)
        let id = format!("{:016x}", fastrand::u64(..));
        Ok(Context {
            id,
            prefix: s.prefix,
            conn,
            notifier,
            releaser,
            renewer,
            response_timeout: s.response_timeout,
            publish: backend.publish_command(),
            synced: s.synced,
            next_channel: AtomicU64::new(0),
            stop,
            members: Mutex::new(Vec::new()),
            shut: CancellationToken::new(),
        })
    }

    /// Registers an opened handle, so that [`shutdown`](Self::shutdown) reaches it.
    /// `Err(Closed)` once the client is shut down.
    pub(crate) fn join(&self, member: Weak<dyn Member>, name: &str) -> Result<(), Error> {
        let mut members = self.members.lock().unwrap();
        if self.shut.is_cancelled() {
            return Err(Error::Closed {
                name: name.to_owned(),
            });
        }
        members.retain(|m| m.strong_count() > 0);
        members.push(member);
        Ok(())
    }

    /// The command connection, for an operator call about the semaphore `name` (`""`: about
    /// none): `Err(Closed)` once the client is shut down, so that nothing is sent for a
    /// client its program closed.
    pub(crate) fn conn_for(&self, name: &str) -> Result<Conn, Error> {
        if self.shut.is_cancelled() {
            return Err(Error::closed(name));
        }
        Ok(self.conn.clone())
    }

    /// Whether [`shutdown`](Self::shutdown) was called.
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut.is_cancelled()
    }

    /// Shuts every handle down, waits until the releaser has performed every release handed
    /// to it (the handles' and those queued before), then stops the releaser and the
    /// notifier's tasks and closes both connections (the command connection once the calls in
    /// flight on it have returned: every later call fails with [`Error::Closed`]). Idempotent:
    /// a second call only waits for the releaser.
    pub(crate) async fn shutdown(&self) {
        let members = {
            let mut members = self.members.lock().unwrap();
            self.shut.cancel();
            std::mem::take(&mut *members)
        };
        for member in members.iter().filter_map(Weak::upgrade) {
            member.shut_down();
        }
        self.releaser.flush().await;
        self.releaser.send(Job::Stop);
        self.stop.cancel();
        self.notifier.close();
        self.conn.close();
    }

    /// A fresh channel id for one opened semaphore handle
    /// ([`ids::channel_id`](crate::protocol::ids::channel_id)).
    pub(crate) fn new_channel_id(&self) -> String {
        let n = self.next_channel.fetch_add(1, Ordering::Relaxed);
        crate::protocol::ids::channel_id(&self.id, n)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

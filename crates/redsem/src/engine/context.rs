//! [`Context`]: what every semaphore handle of one client shares — the two connections, the
//! notifier, the background releaser — and how it is connected.
//!
//! Tasks per client: the notifier's router and its resync task, the releaser; through
//! Sentinel, two more (the master follower and the `+switch-master` listener). Per open
//! semaphore handle: its batching task and its heartbeat.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::notifier::Notifier;
use super::releaser::Releaser;
use crate::backend::{Backend, TlsPems, redact_url};
use crate::error::{BackendError, Error};
use crate::scripts::Conn;

/// The state of one client, shared by its handles (the public `Client` is an `Arc` of it).
pub(crate) struct Context {
    /// Unique per process and client: the first part of its handles' channel ids.
    pub(crate) id: String,
    pub(crate) prefix: String,
    pub(crate) conn: Conn,
    pub(crate) notifier: Arc<Notifier>,
    pub(crate) releaser: Releaser,
    pub(crate) response_timeout: Duration,
    pub(crate) publish: &'static str,
    /// Synced mode: replicas that must acknowledge a grant, and how long to wait for them.
    pub(crate) synced: Option<(u32, Duration)>,
    next_channel: AtomicU64,
    stop: CancellationToken,
}

/// What [`Context::connect`] needs (validated by the client builder).
pub(crate) struct ConnectSettings {
    pub(crate) url: String,
    pub(crate) prefix: String,
    pub(crate) pems: TlsPems,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) synced: Option<(u32, Duration)>,
}

impl Context {
    /// Connects both connections and starts the background tasks. The whole of it (both
    /// connections, the client library's own retries included) gets one connect timeout.
    pub(crate) async fn connect(s: ConnectSettings) -> Result<Context, Error> {
        let shown = redact_url(&s.url);
        let backend = Backend::new(&s.url, s.pems, s.connect_timeout, s.response_timeout)?;
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
                return Err(e);
            }
            Err(_) => {
                stop.cancel();
                return Err(Error::Unreachable(BackendError::timed_out(format!(
                    "no connection to {shown} within {limit:?}"
                ))));
            }
        };

        let notifier = Arc::new(notifier);
        let releaser = Releaser::spawn(conn.clone(), notifier.clone());
        Notifier::spawn_router(&notifier, pushes, stop.clone());
        let id = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
        Ok(Context {
            id,
            prefix: s.prefix,
            conn,
            notifier,
            releaser,
            response_timeout: s.response_timeout,
            publish: backend.publish_command(),
            synced: s.synced,
            next_channel: AtomicU64::new(0),
            stop,
        })
    }

    /// A fresh channel id for one opened semaphore handle: `<client id>.<n>`.
    pub(crate) fn new_channel_id(&self) -> String {
        let n = self.next_channel.fetch_add(1, Ordering::Relaxed);
        format!("{}.{}", self.id, n)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

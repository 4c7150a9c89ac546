//! [`Client`]: the connections and background tasks one process shares between its semaphores.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::IntoConnectionInfo;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio_util::sync::CancellationToken;

use crate::driver::Driver;
use crate::error::{BackendError, Error};
use crate::keys::validate_prefix;
use crate::notifier::Notifier;
use crate::scripts::Conn;
use crate::semaphore::SemaphoreBuilder;

/// Default key prefix: keys are named `redsem:{<name>}:<suffix>`.
pub const DEFAULT_PREFIX: &str = "redsem";

/// A connection to one Redis (or Valkey) deployment, shared by every semaphore of a process.
///
/// A client holds exactly two connections whatever the number of semaphores, waiters and
/// holders: one multiplexed connection for commands (every script call, pipelined), and one
/// RESP3 connection on which grants are pushed to this process. It also runs one background
/// task that performs the releases of dropped permits. Cloning is cheap (an `Arc`).
///
/// Create it once per process, inside a Tokio runtime, and open semaphores from it with
/// [`Client::semaphore`].
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

pub(crate) struct ClientInner {
    /// Unique per process and client: the suffix of this client's notification channels.
    pub(crate) id: String,
    pub(crate) prefix: String,
    pub(crate) conn: Conn,
    pub(crate) notifier: Arc<Notifier>,
    pub(crate) driver: Driver,
    pub(crate) response_timeout: Duration,
    pub(crate) publish: &'static str,
    next_channel: AtomicU64,
    stop: CancellationToken,
}

impl ClientInner {
    /// A fresh channel suffix for one opened semaphore handle.
    pub(crate) fn channel_suffix(&self) -> String {
        let n = self.next_channel.fetch_add(1, Ordering::Relaxed);
        format!("{}.{}", self.id, n)
    }
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.inner.id)
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects with default settings. `url` is `redis://[user:password@]host:port[/db]`
    /// or `unix:///path/to/socket`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a URL that does not parse, [`Error::Unreachable`] when
    /// no connection could be made within the connect timeout (3 s by default),
    /// [`Error::Auth`] for wrong credentials.
    pub async fn connect(url: &str) -> Result<Client, Error> {
        ClientBuilder::new(url).build().await
    }

    /// Starts a builder for finer control (key prefix, timeouts).
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder::new(url)
    }

    /// Starts opening the semaphore `name` whose limit is `limit` permits shared by every
    /// replica. Nothing is sent to Redis until [`SemaphoreBuilder::open`].
    pub fn semaphore(&self, name: impl Into<String>, limit: u32) -> SemaphoreBuilder {
        SemaphoreBuilder::new(self.clone(), name.into(), limit)
    }

    /// The key prefix of this client's semaphores.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// This client's unique id (it names the channel on which its waiters are notified and
    /// appears in the holder ids it creates).
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Sends `PING` on the command connection: a cheap health check.
    ///
    /// # Errors
    /// [`Error::Unreachable`] when Redis does not answer in time.
    pub async fn ping(&self) -> Result<(), Error> {
        let mut conn = self.inner.conn.clone();
        redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| Error::from_redis(e, ""))
    }
}

/// Configures and connects a [`Client`].
#[derive(Clone, Debug)]
#[must_use]
pub struct ClientBuilder {
    url: String,
    prefix: String,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl ClientBuilder {
    /// A builder for `url` with the defaults: prefix `redsem`, connect timeout 3 s, response
    /// timeout 5 s.
    pub fn new(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: Duration::from_secs(3),
            response_timeout: Duration::from_secs(5),
        }
    }

    /// Key prefix (default `redsem`). Replicas that share a semaphore must use the same one.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long [`build`](Self::build) tries to reach Redis before failing with
    /// [`Error::Unreachable`] (default 3 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// How long one command may take before it fails (default 5 s). Renewals that time out
    /// are retried until the lease could have expired.
    pub fn response_timeout(mut self, d: Duration) -> Self {
        self.response_timeout = d;
        self
    }

    /// Connects both connections and starts the background tasks.
    ///
    /// Must be called inside a Tokio runtime (the background tasks are spawned on it).
    ///
    /// # Errors
    /// See [`Client::connect`].
    pub async fn build(self) -> Result<Client, Error> {
        validate_prefix(&self.prefix)?;
        if self.connect_timeout.is_zero() || self.response_timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "connect and response timeouts must be greater than zero".into(),
            ));
        }
        let shown = redact(&self.url);
        let info = self.url.as_str().into_connection_info().map_err(|e| {
            Error::InvalidArgument(format!(
                "cannot parse Redis URL {shown:?}: {e} (expected redis://[user:password@]host:port[/db] or unix:///path)"
            ))
        })?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(2));

        let connect = async {
            let client = redis::Client::open(info.clone()).map_err(|e| Error::from_redis(e, ""))?;
            let conn = ConnectionManager::new_with_config(client, manager_config.clone())
                .await
                .map_err(|e| Error::from_redis(e, ""))?;
            let notifier = Notifier::connect(info.clone(), manager_config.clone()).await?;
            Ok::<_, Error>((conn, notifier))
        };
        let limit = self.connect_timeout * 2;
        let (conn, (notifier, pushes)) = match tokio::time::timeout(limit, connect).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(Error::Unreachable(BackendError::timed_out(format!(
                    "no connection to {shown} within {limit:?}"
                ))));
            }
        };

        let stop = CancellationToken::new();
        let notifier = Arc::new(notifier);
        let driver = Driver::spawn(conn.clone(), notifier.clone());
        Notifier::spawn_router(&notifier, pushes, stop.clone());
        let id = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
        Ok(Client {
            inner: Arc::new(ClientInner {
                id,
                prefix: self.prefix,
                conn,
                notifier,
                driver,
                response_timeout: self.response_timeout,
                publish: "PUBLISH",
                next_channel: AtomicU64::new(0),
                stop,
            }),
        })
    }
}

/// The URL with its password replaced, for messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redact_hides_passwords() {
        assert_eq!(
            super::redact("redis://app:secret@h:1/0"),
            "redis://app:***@h:1/0"
        );
        assert_eq!(super::redact("redis://h:1"), "redis://h:1");
    }
}

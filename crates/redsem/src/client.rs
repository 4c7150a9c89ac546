//! [`Client`]: the connections and background tasks one process shares between its semaphores.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::TlsPems;
use crate::engine::{ConnectSettings, Context};
use crate::error::Error;
use crate::protocol::keys::validate_prefix;

/// Default key prefix: keys are named `redsem:{<name>}:<suffix>`.
pub const DEFAULT_PREFIX: &str = "redsem";

/// A connection to one Redis (or Valkey) deployment, shared by every semaphore of a process.
///
/// A client holds exactly two connections whatever the number of semaphores, waiters and
/// holders (on a cluster, two per node): one multiplexed connection for commands (every
/// script call, pipelined), and one RESP3 connection on which grants are pushed to this
/// process. It runs three background tasks: one that performs the releases of dropped
/// permits, and two for the notification connection (routing messages; resubscribing after
/// a reconnect). Through Sentinel, two more follow the master (polling the sentinels;
/// listening for `+switch-master`). Each open semaphore handle adds two (batching and
/// heartbeat). Cloning is cheap (an `Arc`).
///
/// Create it once per process, inside a Tokio runtime, and open semaphores from it with
/// [`Client::semaphore`].
///
/// The URL scheme chooses the deployment (see [`Client::connect`]): one server, a Redis
/// Cluster (`redis+cluster://`) or a master found through Sentinel (`redis+sentinel://`),
/// each with or without TLS (`rediss…`).
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Context>,
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
    /// Connects with default settings. The URL scheme chooses the deployment:
    ///
    /// | URL | deployment |
    /// |---|---|
    /// | `redis://[user:password@]host:port[/db]` | one server |
    /// | `unix:///path/to/socket` | one server, over a Unix socket |
    /// | `redis+cluster://[user:password@]host:port[,host:port…]` | Redis Cluster (the hosts are seeds) |
    /// | `redis+sentinel://[user:password@]host:port[,host:port…]/master-name[/db]` | the master named by these sentinels, followed across failovers |
    ///
    /// `rediss://`, `rediss+cluster://` and `rediss+sentinel://` are the same over TLS
    /// (crate feature `tls`; a private CA and client certificates are set on the
    /// [`builder`](Client::builder)). The user and password are those of the data nodes;
    /// sentinels are contacted without credentials, unless the query gives
    /// `?sentinel_username=…&sentinel_password=…`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a URL that does not parse, [`Error::Unreachable`] when
    /// the connections could not be made within the connect timeout (3 s by default, for
    /// both connections together),
    /// [`Error::Auth`] for wrong credentials.
    ///
    /// # Panics
    /// When polled outside a Tokio runtime (with its time and I/O drivers enabled): the
    /// client's connections and background tasks live on the runtime it is made in. Without
    /// one, use [`blocking::Client`](crate::blocking::Client).
    pub async fn connect(url: &str) -> Result<Client, Error> {
        ClientBuilder::new(url).build().await
    }

    /// Starts a builder for finer control (key prefix, timeouts).
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder::new(url)
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

    /// Sends `PING` on the command connection: a cheap health check (on a cluster, to every
    /// master).
    ///
    /// # Errors
    /// [`Error::Unreachable`] when Redis does not answer in time; [`Error::Closed`] after
    /// [`shutdown`](Self::shutdown).
    pub async fn ping(&self) -> Result<(), Error> {
        let mut conn = self.inner.conn_for("")?;
        redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(Error::from_server)
    }

    /// Shuts the client down gracefully; call it before a process exits.
    ///
    /// In order:
    /// 1. every semaphore handle opened from this client (and its clones) is closed:
    ///    pending and later acquires fail with [`Error::Closed`], and opening a semaphore
    ///    from this client fails the same way;
    /// 2. permits still held are given up: each is declared lost
    ///    ([`LostReason::Shutdown`](crate::LostReason::Shutdown): [`Permit::run`](crate::Permit::run)
    ///    cancels its work, [`Permit::lost`](crate::Permit::lost) resolves) and released;
    /// 3. it waits until every release is done — those of step 2, of queued tickets, and of
    ///    permits dropped earlier — so that a process that exits right after does not leave
    ///    slots or tickets behind until their leases expire;
    /// 4. it unsubscribes and stops the background tasks (releases, notifications, Sentinel
    ///    following; each handle's heartbeat and batching task), and closes both
    ///    connections (the command connection once the calls in flight on it have returned;
    ///    on Sentinel, the connection to the master closes when the last clone of the client
    ///    and of its handles is dropped). From then on, every call of the client
    ///    ([`ping`](Self::ping), the operator calls such as [`inspect`](Self::inspect)) and of
    ///    its handles ([`Semaphore::stats`](crate::Semaphore::stats), ...) fails with
    ///    [`Error::Closed`] without sending anything.
    ///
    /// Returning from `main` without it drops the releases still queued: a quick rerun then
    /// waits up to one lease for the slots of the first run. An acquisition whose script
    /// call is in flight when `shutdown` starts is released if its reply comes before the
    /// releases are done, and otherwise expires with its lease.
    ///
    /// Idempotent. Bound it with a timeout if Redis may be unreachable: each release is tried
    /// a few times (a few seconds in all, more if Redis does not answer) before being left to expire.
    ///
    /// # Cost
    /// One script call per semaphore with something to release (batched), one `UNSUBSCRIBE`
    /// per handle.
    pub async fn shutdown(&self) {
        self.inner.shutdown().await;
    }

    /// Whether [`shutdown`](Self::shutdown) was called.
    pub fn is_shut_down(&self) -> bool {
        self.inner.is_shut_down()
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
    tls_ca: Option<Pem>,
    tls_cert: Option<Pem>,
    tls_key: Option<Pem>,
    synced: Option<(u32, Duration)>,
    scripts_only: bool,
}

/// A PEM file, or its contents.
#[derive(Clone)]
enum Pem {
    File(PathBuf),
    Bytes(Vec<u8>),
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pem::File(p) => p.fmt(f),
            Pem::Bytes(_) => f.write_str("<PEM bytes>"),
        }
    }
}

impl Pem {
    fn load(pem: Option<&Pem>, what: &str) -> Result<Option<Vec<u8>>, Error> {
        match pem {
            None => Ok(None),
            Some(Pem::Bytes(b)) => Ok(Some(b.clone())),
            Some(Pem::File(path)) => std::fs::read(path).map(Some).map_err(|e| {
                Error::InvalidArgument(format!(
                    "cannot read the TLS {what} file {}: {e}",
                    path.display()
                ))
            }),
        }
    }
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
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            synced: None,
            scripts_only: false,
        }
    }

    /// Key prefix (default `redsem`). Replicas that share a semaphore must use the same one.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long [`build`](Self::build) tries to reach Redis before failing with
    /// [`Error::Unreachable`] (default 3 s): one bound for the whole connect, both
    /// connections (commands and notifications) and their retries included.
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

    /// TLS: trust only the CA certificates in this PEM file (instead of the system's roots)
    /// to verify the server. Needs a `rediss…` URL and the crate feature `tls`. The CLI takes
    /// it as `--tls-ca` (or `REDSEM_TLS_CA`).
    pub fn tls_ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_ca = Some(Pem::File(path.into()));
        self
    }

    /// TLS: present this client certificate (PEM file; with [`tls_key`](Self::tls_key)), for
    /// servers started with `tls-auth-clients yes`. CLI: `--tls-cert` / `REDSEM_TLS_CERT`.
    pub fn tls_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_cert = Some(Pem::File(path.into()));
        self
    }

    /// TLS: the private key of the client certificate (PEM file). CLI: `--tls-key` /
    /// `REDSEM_TLS_KEY`.
    pub fn tls_key(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_key = Some(Pem::File(path.into()));
        self
    }

    /// [`tls_ca`](Self::tls_ca) from PEM contents instead of a file.
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_ca = Some(Pem::Bytes(pem.into()));
        self
    }

    /// [`tls_cert`](Self::tls_cert) from PEM contents instead of a file.
    pub fn tls_cert_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_cert = Some(Pem::Bytes(pem.into()));
        self
    }

    /// [`tls_key`](Self::tls_key) from PEM contents instead of a file.
    pub fn tls_key_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_key = Some(Pem::Bytes(pem.into()));
        self
    }

    /// Runs redsem's scripts with `EVALSHA` (sent once per server with `SCRIPT LOAD`) instead
    /// of its Redis Functions library (default `false`: the library, `FCALL`).
    ///
    /// With the library, each call only runs the operation's function: its helpers were
    /// created once, when the library was loaded (`FUNCTION LOAD`, once per server and
    /// version, by the first client that finds it missing), where a script re-creates them on
    /// every call; that saves Redis CPU on every call (the README's benchmark shows both
    /// paths). A client falls back to the scripts by itself, with one log line, where the
    /// library cannot be used (Redis before 7.0, an ACL or a managed service that refuses
    /// `FCALL` or `FUNCTION LOAD`: docs/security.md gives the rules); set this to skip the
    /// attempt. Both run the same code on the same keys: clients of either kind share a
    /// semaphore.
    pub fn scripts_only(mut self, scripts_only: bool) -> Self {
        self.scripts_only = scripts_only;
        self
    }

    /// Synced mode: after every grant, wait (Redis `WAIT`) until `replicas` replicas of the
    /// master have the grant, for at most `timeout`. If fewer acknowledge in time, the permit
    /// is released and the acquire fails with [`Error::NotReplicated`].
    ///
    /// Redis replicates asynchronously: a master that fails right after a grant may lose it,
    /// and the promoted replica may grant the same slot again. Synced mode narrows that window
    /// to grants no replica has seen, at the cost of one more round trip and the replication
    /// delay on every acquisition (see the README's "Running at scale" for a measured
    /// figure). It is not consensus: `WAIT` does not make a write durable against every
    /// failure. `replicas` 0 turns it off (the default).
    pub fn synced_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.synced = (replicas > 0).then_some((replicas, timeout));
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
        crate::options::check_duration("connect timeout", self.connect_timeout)?;
        crate::options::check_duration("response timeout", self.response_timeout)?;
        if let Some((_, timeout)) = self.synced {
            crate::options::check_duration("synced-mode timeout", timeout)?;
        }
        if let Some((_, timeout)) = self.synced
            && timeout.is_zero()
        {
            return Err(Error::InvalidArgument(
                "the synced-mode timeout must be greater than zero".into(),
            ));
        }
        let pems = TlsPems {
            ca: Pem::load(self.tls_ca.as_ref(), "CA")?,
            cert: Pem::load(self.tls_cert.as_ref(), "client certificate")?,
            key: Pem::load(self.tls_key.as_ref(), "client key")?,
        };
        let ctx = Context::connect(ConnectSettings {
            url: self.url,
            prefix: self.prefix,
            pems,
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
            synced: self.synced,
            scripts_only: self.scripts_only,
        })
        .await?;
        Ok(Client {
            inner: Arc::new(ctx),
        })
    }
}

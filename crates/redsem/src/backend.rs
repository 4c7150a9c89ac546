//! The deployments redsem runs on, chosen by the URL scheme, and their connections.
//!
//! | URL | deployment |
//! |---|---|
//! | `redis://[user:pass@]host:port[/db]`, `rediss://…` (TLS), `unix:///path` | one server |
//! | `redis+cluster://[user:pass@]host:port[,host:port…]`, `rediss+cluster://…` | Redis Cluster (the hosts are seeds) |
//! | `redis+sentinel://[user:pass@]host:port[,host:port…]/master-name[/db]`, `rediss+sentinel://…` | the master that Sentinel names |
//!
//! Each deployment gives a command connection ([`Conn`], what every script runs on) and a
//! subscriber connection ([`SubConn`], where grants are pushed):
//!
//! - **one server**: a [`ConnectionManager`] each (reconnects with backoff);
//! - **cluster**: a [`ClusterConnection`] each. It routes every script to the master of its
//!   hash slot (a semaphore's keys and channels share one hash tag), follows `MOVED` after a
//!   failover, and the subscriber uses sharded pub/sub (`SSUBSCRIBE`; the scripts
//!   `SPUBLISH`);
//! - **Sentinel**: a [`ConnectionManager`] to the current master, replaced when the master
//!   changes ([`Sentinel`]). redis-rs resolves a master once but never follows a failover, so
//!   this module does: it asks the sentinels again on `+switch-master`, on `READONLY`, on
//!   connection errors and timeouts, and every few seconds; it checks `ROLE` before switching,
//!   and it never holds a lock while it resolves (commands keep using the old connection and
//!   fail fast until the new one is swapped in).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionInfo, ErrorKind, IntoConnectionInfo, Pipeline,
    ProtocolVersion, PushInfo, RedisConnectionInfo, RedisError, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::client::redact;
use crate::error::Error;

/// How often a Sentinel client asks the sentinels which node is master, besides the
/// `+switch-master` events and the errors that make it ask at once.
const SENTINEL_CHECK: Duration = Duration::from_secs(2);

/// The description of errors that redsem builds to name a missing ACL permission
/// (see [`denied`]); [`Error::from_redis`] turns them into [`Error::NoPermission`].
pub(crate) const DENIED: &str = "permission denied";

/// A `NOPERM` error whose detail says, in words, what the user may not do.
pub(crate) fn denied(detail: String) -> RedisError {
    RedisError::from((ErrorKind::Server(ServerErrorKind::NoPerm), DENIED, detail))
}

/// PEM contents of the TLS files given to the client builder.
#[derive(Clone, Default)]
pub(crate) struct TlsPems {
    pub(crate) ca: Option<Vec<u8>>,
    pub(crate) cert: Option<Vec<u8>>,
    pub(crate) key: Option<Vec<u8>>,
}

impl TlsPems {
    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }
}

#[cfg(feature = "tls")]
type Certs = redis::TlsCertificates;
// without TLS there are never certificates (an uninhabited type keeps the code paths alike)
#[cfg(not(feature = "tls"))]
type Certs = std::convert::Infallible;

/// A `redis::Client` for `info`, with the custom CA and client certificate if any.
fn client_for(info: ConnectionInfo, certs: &Option<Certs>) -> RedisResult<redis::Client> {
    match certs {
        #[cfg(feature = "tls")]
        Some(c) => redis::Client::build_with_tls(info, c.clone()),
        #[cfg(not(feature = "tls"))]
        Some(c) => match *c {},
        None => redis::Client::open(info),
    }
}

/// Where the client connects: one server, a cluster, or a master found through sentinels.
#[derive(Clone, Debug)]
pub(crate) enum Topology {
    Standalone(ConnectionInfo),
    Cluster(Vec<ConnectionInfo>),
    Sentinel(SentinelSpec),
}

#[derive(Clone, Debug)]
pub(crate) struct SentinelSpec {
    pub(crate) sentinels: Vec<ConnectionInfo>,
    pub(crate) master_name: String,
    /// User, password and database for the master (from the URL).
    pub(crate) data: RedisConnectionInfo,
    pub(crate) tls: bool,
}

const URL_FORMS: &str = "redis://[user:password@]host:port[/db], rediss://… (TLS), unix:///path, \
     redis+cluster://host:port[,host:port…], or redis+sentinel://host:port[,host:port…]/master-name";

/// Parses a URL into a topology (see the module documentation for the schemes).
pub(crate) fn parse_url(url: &str) -> Result<Topology, Error> {
    let shown = redact(url);
    let bad = |why: String| {
        Error::InvalidArgument(format!(
            "cannot parse Redis URL {shown:?}: {why} (expected {URL_FORMS})"
        ))
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad("no scheme".into()));
    };
    let scheme = scheme.to_ascii_lowercase();
    let (base, kind) = match scheme.split_once('+') {
        Some((base, kind)) if kind == "cluster" || kind == "sentinel" => (base, kind),
        _ => {
            let info = url.into_connection_info().map_err(|e| bad(e.to_string()))?;
            return Ok(Topology::Standalone(info));
        }
    };
    if base != "redis" && base != "rediss" {
        return Err(bad(format!("unknown scheme {scheme:?}")));
    }
    // authority = [creds@]host[:port][,host[:port]...]; then /path, ?query, #fragment
    let cut = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(cut);
    let (creds, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let hosts: Vec<&str> = hosts.split(',').filter(|h| !h.is_empty()).collect();
    if hosts.is_empty() {
        return Err(bad("no host".into()));
    }
    let (tail, fragment) = match tail.split_once('#') {
        Some((t, f)) => (t, format!("#{f}")),
        None => (tail, String::new()),
    };
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    // sentinel_username / sentinel_password are ours; the rest goes to redis-rs
    let (mut sentinel_user, mut sentinel_pass) = (None, None);
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("sentinel_username", v)) => sentinel_user = Some(percent_decode(v)),
            Some(("sentinel_password", v)) => sentinel_pass = Some(percent_decode(v)),
            _ => rest.push(pair),
        }
    }
    let query = if rest.is_empty() {
        String::new()
    } else {
        format!("?{}", rest.join("&"))
    };
    let node = |host: &str, creds: &str, path: &str| -> Result<ConnectionInfo, Error> {
        format!("{base}://{creds}{host}{path}{query}{fragment}")
            .as_str()
            .into_connection_info()
            .map_err(|e| bad(format!("host {host:?}: {e}")))
    };
    if kind == "cluster" {
        let nodes = hosts
            .iter()
            .map(|h| node(h, creds, path))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Topology::Cluster(nodes));
    }
    // sentinel: /master-name[/db]
    let mut parts = path.trim_start_matches('/').split('/');
    let master_name = parts.next().unwrap_or_default().to_owned();
    if master_name.is_empty() {
        return Err(bad(
            "a Sentinel URL names the master: redis+sentinel://host:port/master-name".into(),
        ));
    }
    let db = match parts.next() {
        Some(db) if !db.is_empty() => format!("/{db}"),
        _ => String::new(),
    };
    let data = node("127.0.0.1:6379", creds, &db)?.redis_settings().clone();
    let sentinels = hosts
        .iter()
        .map(|h| {
            // sentinels listen on 26379 by default
            let has_port = h.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']'));
            let h = if has_port {
                h.to_string()
            } else {
                format!("{h}:26379")
            };
            let info = node(&h, "", "")?;
            let mut settings = info.redis_settings().clone().set_db(0);
            if let Some(u) = &sentinel_user {
                settings = settings.set_username(u);
            }
            if let Some(p) = &sentinel_pass {
                settings = settings.set_password(p);
            }
            Ok(info.set_redis_settings(settings))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(Topology::Sentinel(SentinelSpec {
        sentinels,
        master_name,
        data,
        tls: base == "rediss",
    }))
}

/// Everything needed to (re)connect: the topology, TLS material and timeouts.
pub(crate) struct Backend {
    pub(crate) topology: Topology,
    certs: Option<Certs>,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

fn uses_tls(topology: &Topology) -> bool {
    let tls = |i: &ConnectionInfo| matches!(i.addr(), redis::ConnectionAddr::TcpTls { .. });
    match topology {
        Topology::Standalone(i) => tls(i),
        Topology::Cluster(nodes) => nodes.iter().any(tls),
        Topology::Sentinel(s) => s.tls,
    }
}

impl Backend {
    pub(crate) fn new(
        url: &str,
        pems: TlsPems,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Backend, Error> {
        let topology = parse_url(url)?;
        let tls = uses_tls(&topology);
        if !pems.is_empty() && !tls {
            return Err(Error::InvalidArgument(format!(
                "TLS files (CA, client certificate or key) were given but {:?} does not use TLS: \
                 use the rediss:// form of the URL",
                redact(url)
            )));
        }
        if pems.cert.is_some() != pems.key.is_some() {
            return Err(Error::InvalidArgument(
                "a TLS client certificate needs its key and a key needs its certificate: give both"
                    .into(),
            ));
        }
        #[cfg(not(feature = "tls"))]
        if tls {
            return Err(Error::InvalidArgument(format!(
                "{:?} uses TLS, but redsem was built without its `tls` feature",
                redact(url)
            )));
        }
        Ok(Backend {
            certs: certs(pems)?,
            topology,
            connect_timeout,
            response_timeout,
        })
    }

    /// The publish command the scripts use: sharded pub/sub on a cluster.
    pub(crate) fn publish_command(&self) -> &'static str {
        match self.topology {
            Topology::Cluster(_) => "SPUBLISH",
            _ => "PUBLISH",
        }
    }

    fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(2))
    }

    fn cluster_builder(&self, nodes: &[ConnectionInfo]) -> redis::cluster::ClusterClientBuilder {
        let b = redis::cluster::ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.response_timeout)
            .retries(3)
            .min_retry_wait(50)
            .max_retry_wait(1000);
        #[cfg(feature = "tls")]
        let b = match &self.certs {
            Some(c) => b.certs(c.clone()),
            None => b,
        };
        b
    }

    /// Connects the command connection.
    pub(crate) async fn connect(&self, stop: &CancellationToken) -> Result<Conn, Error> {
        let map = |e: RedisError| Error::from_redis(e, "");
        Ok(match &self.topology {
            Topology::Standalone(info) => {
                let client = client_for(info.clone(), &self.certs).map_err(map)?;
                Conn::Standalone(
                    ConnectionManager::new_with_config(client, self.manager_config())
                        .await
                        .map_err(map)?,
                )
            }
            Topology::Cluster(nodes) => {
                let client = self.cluster_builder(nodes).build().map_err(map)?;
                Conn::Cluster(client.get_async_connection().await.map_err(map)?)
            }
            #[allow(clippy::clone_on_copy)] // Certs is Copy only without the tls feature
            Topology::Sentinel(spec) => Conn::Sentinel(
                Sentinel::connect(
                    spec.clone(),
                    self.certs.clone(),
                    self.connect_timeout,
                    self.response_timeout,
                    stop,
                )
                .await?,
            ),
        })
    }

    /// Connects the subscriber connection, whose pushes (messages, disconnections) go to `tx`.
    /// `conn` is the command connection (a Sentinel subscriber follows its master).
    pub(crate) async fn connect_subscriber(
        &self,
        conn: &Conn,
        tx: mpsc::UnboundedSender<PushInfo>,
    ) -> Result<SubConn, Error> {
        let map = |e: RedisError| Error::from_redis(e, "");
        Ok(match &self.topology {
            Topology::Cluster(nodes) => {
                let nodes: Vec<ConnectionInfo> = nodes.iter().map(resp3).collect();
                let client = self
                    .cluster_builder(&nodes)
                    .use_protocol(ProtocolVersion::RESP3)
                    .push_sender(tx)
                    .build()
                    .map_err(map)?;
                SubConn::Cluster(client.get_async_connection().await.map_err(map)?)
            }
            Topology::Sentinel(_) => {
                let Conn::Sentinel(s) = conn else {
                    unreachable!("a Sentinel topology has a Sentinel connection")
                };
                SubConn::Single(s.connect_subscriber(tx).await.map_err(map)?)
            }
            Topology::Standalone(info) => {
                let client = client_for(resp3(info), &self.certs).map_err(map)?;
                let config = self
                    .manager_config()
                    .set_push_sender(tx)
                    .set_automatic_resubscription();
                SubConn::Single(
                    ConnectionManager::new_with_config(client, config)
                        .await
                        .map_err(map)?,
                )
            }
        })
    }
}

/// Decodes `%XX` escapes (for credentials given in the query).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        if bytes[i] == b'%'
            && let Some(b) = hex
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn resp3(info: &ConnectionInfo) -> ConnectionInfo {
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    info.clone().set_redis_settings(settings)
}

#[cfg(feature = "tls")]
fn certs(pems: TlsPems) -> Result<Option<Certs>, Error> {
    if pems.is_empty() {
        return Ok(None);
    }
    Ok(Some(redis::TlsCertificates {
        client_tls: match (pems.cert, pems.key) {
            (Some(client_cert), Some(client_key)) => Some(redis::ClientTlsConfig {
                client_cert,
                client_key,
            }),
            _ => None,
        },
        root_cert: pems.ca,
    }))
}

#[cfg(not(feature = "tls"))]
fn certs(pems: TlsPems) -> Result<Option<Certs>, Error> {
    if pems.is_empty() {
        Ok(None)
    } else {
        Err(Error::InvalidArgument(
            "TLS files were given, but redsem was built without its `tls` feature".into(),
        ))
    }
}

/// The command connection: every script runs on it, pipelined with the others.
#[derive(Clone)]
pub(crate) enum Conn {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<Sentinel>),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Standalone(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(s) => {
                let s = s.clone();
                Box::pin(async move {
                    s.request(|mut c| async move { c.req_packed_command(cmd).await })
                        .await
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(s) => {
                let s = s.clone();
                Box::pin(async move {
                    s.request(|mut c| async move {
                        c.req_packed_commands(pipeline, offset, count).await
                    })
                    .await
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Standalone(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(s) => s.spec.data.db(),
        }
    }
}

impl Conn {
    /// `SCAN MATCH pattern` over every master (one page at a time per master), deduplicated.
    pub(crate) async fn scan_match(&mut self, pattern: &str) -> RedisResult<Vec<String>> {
        let masters = match self {
            Conn::Cluster(c) => Some(cluster_masters(c).await?),
            _ => None,
        };
        let mut out = Vec::new();
        let targets: Vec<Option<(String, u16)>> = match masters {
            Some(m) => m.into_iter().map(Some).collect(),
            None => vec![None],
        };
        for target in targets {
            let mut cursor: u64 = 0;
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000);
                let reply = match (&target, &mut *self) {
                    (Some((host, port)), Conn::Cluster(c)) => {
                        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port: *port,
                        });
                        c.route_command(cmd, routing).await?
                    }
                    _ => cmd.query_async::<Value>(self).await?,
                };
                let (next, keys): (u64, Vec<String>) = redis::from_redis_value(reply)?;
                out.extend(keys);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Sends `pipeline` to the master that holds `key` (the node a script on `key` runs on).
    pub(crate) async fn pipeline_on_key(
        &mut self,
        key: &str,
        pipeline: &Pipeline,
    ) -> RedisResult<Vec<Value>> {
        match self {
            Conn::Cluster(c) => {
                let route =
                    SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
                c.route_pipeline(pipeline.clone(), 0, pipeline.len(), route)
                    .await
            }
            _ => pipeline.query_async(self).await,
        }
    }
}

/// The (host, port) of every master of the cluster, from `CLUSTER SLOTS`.
async fn cluster_masters(c: &mut ClusterConnection) -> RedisResult<Vec<(String, u16)>> {
    let reply = c
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await?;
    let mut masters = Vec::new();
    if let Value::Array(ranges) = reply {
        for range in ranges {
            if let Value::Array(items) = range
                && let Some(Value::Array(master)) = items.get(2)
                && let (Some(host), Some(port)) = (master.first(), master.get(1))
            {
                let host: String = redis::from_redis_value_ref(host)?;
                let port: u16 = redis::from_redis_value_ref(port)?;
                if !masters.contains(&(host.clone(), port)) {
                    masters.push((host, port));
                }
            }
        }
    }
    Ok(masters)
}

/// The subscriber connection, on which the scripts' grants are pushed.
#[derive(Clone)]
pub(crate) enum SubConn {
    /// One server (or the current Sentinel master): `SUBSCRIBE`.
    Single(ConnectionManager),
    /// A cluster: sharded pub/sub, `SSUBSCRIBE` on the master of each channel's slot.
    Cluster(ClusterConnection),
}

impl SubConn {
    pub(crate) async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            SubConn::Single(c) => c.subscribe(channel).await,
            SubConn::Cluster(c) => c.ssubscribe(channel).await,
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            SubConn::Single(c) => c.unsubscribe(channel).await,
            SubConn::Cluster(c) => c.sunsubscribe(channel).await,
        }
    }

    pub(crate) async fn ping(&mut self) -> RedisResult<()> {
        match self {
            SubConn::Single(c) => redis::cmd("PING").query_async::<Value>(c).await.map(drop),
            SubConn::Cluster(c) => redis::cmd("PING").query_async::<Value>(c).await.map(drop),
        }
    }
}

/// The current master, as the sentinels named it.
#[derive(Clone)]
struct Master {
    generation: u64,
    host: String,
    port: u16,
    conn: ConnectionManager,
}

/// A command connection that follows the master named by Sentinel.
pub(crate) struct Sentinel {
    spec: SentinelSpec,
    certs: Option<Certs>,
    connect_timeout: Duration,
    response_timeout: Duration,
    /// Held only to clone or swap the current master (never across an await).
    current: RwLock<Master>,
    /// The generation of the current master, for whoever must follow it (the notifier).
    changed: watch::Sender<u64>,
    /// Asks the follower task to check the master now.
    wake: Notify,
    /// The sentinel that answered last (asked first next time).
    preferred: AtomicUsize,
}

impl Sentinel {
    async fn connect(
        spec: SentinelSpec,
        certs: Option<Certs>,
        connect_timeout: Duration,
        response_timeout: Duration,
        stop: &CancellationToken,
    ) -> Result<Arc<Sentinel>, Error> {
        let mut link = Link::default();
        let probe = Sentinel {
            spec,
            certs,
            connect_timeout,
            response_timeout,
            current: RwLock::new(Master {
                generation: 0,
                host: String::new(),
                port: 0,
                conn: placeholder_manager()?,
            }),
            changed: watch::Sender::new(0),
            wake: Notify::new(),
            preferred: AtomicUsize::new(0),
        };
        let (host, port) = probe
            .lookup(&mut link)
            .await
            .map_err(|e| Error::from_redis(e, ""))?;
        let conn = probe
            .connect_master(&host, port)
            .await
            .map_err(|e| Error::from_redis(e, ""))?;
        tracing::info!(master = %probe.spec.master_name, host, port, "sentinel: connected to the master");
        *probe.current.write().unwrap() = Master {
            generation: 1,
            host,
            port,
            conn,
        };
        probe.changed.send_replace(1);
        let this = Arc::new(probe);
        tokio::spawn(follow(Arc::downgrade(&this), link, stop.clone()));
        tokio::spawn(listen_switch_master(Arc::downgrade(&this), stop.clone()));
        Ok(this)
    }

    fn current(&self) -> Master {
        self.current.read().unwrap().clone()
    }

    /// Follows master changes (the value is a generation number).
    pub(crate) fn subscribe_changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// A RESP3 subscriber connection to the current master.
    pub(crate) async fn connect_subscriber(
        &self,
        tx: mpsc::UnboundedSender<PushInfo>,
    ) -> RedisResult<ConnectionManager> {
        let m = self.current();
        let info = resp3(&self.node_info(&m.host, m.port)?);
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1))
            .set_push_sender(tx)
            .set_automatic_resubscription();
        ConnectionManager::new_with_config(client_for(info, &self.certs)?, config).await
    }

    fn node_info(&self, host: &str, port: u16) -> RedisResult<ConnectionInfo> {
        let scheme = if self.spec.tls { "rediss" } else { "redis" };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        let info = format!("{scheme}://{host}:{port}").into_connection_info()?;
        Ok(info.set_redis_settings(self.spec.data.clone()))
    }

    /// Runs one request on the current master. On an error that suggests the master moved
    /// (`READONLY`, a connection error, a timeout), asks the follower to look, waits a little
    /// for a new master, and retries once there. (redsem's scripts are idempotent.)
    async fn request<T, F, Fut>(&self, f: F) -> RedisResult<T>
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = RedisResult<T>>,
    {
        let m = self.current();
        let first = match tokio::time::timeout(self.response_timeout, f(m.conn)).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if !master_may_have_moved(&e) => return Err(e),
            Ok(Err(e)) => e,
            Err(_) => timed_out("no reply from the master"),
        };
        self.wake.notify_one();
        let mut rx = self.changed.subscribe();
        let moved =
            tokio::time::timeout(self.response_timeout, rx.wait_for(|g| *g != m.generation))
                .await
                .is_ok_and(|r| r.is_ok());
        if !moved {
            return Err(first);
        }
        let m = self.current();
        match tokio::time::timeout(self.response_timeout, f(m.conn)).await {
            Ok(r) => r,
            Err(_) => Err(timed_out("no reply from the new master")),
        }
    }

    /// Asks the sentinels, the last one that answered first, for the master's address.
    async fn lookup(&self, link: &mut Link) -> RedisResult<(String, u16)> {
        let n = self.spec.sentinels.len();
        let start = self.preferred.load(Ordering::Relaxed);
        let mut last = None;
        for k in 0..n {
            let i = (start + k) % n;
            match self.ask(link, i).await {
                Ok(Some(addr)) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok(addr);
                }
                Ok(None) => {
                    last = Some(RedisError::from((
                        ErrorKind::Client,
                        "a sentinel does not know the master",
                        format!(
                            "sentinel {} has no master named {:?}",
                            addr_of(&self.spec.sentinels[i]),
                            self.spec.master_name
                        ),
                    )));
                }
                Err(e) => {
                    tracing::debug!(sentinel = %addr_of(&self.spec.sentinels[i]), error = %e, "sentinel: no answer");
                    link.conn = None;
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| timed_out("no sentinel")))
    }

    async fn ask(&self, link: &mut Link, i: usize) -> RedisResult<Option<(String, u16)>> {
        let conn = match &mut link.conn {
            Some((j, c)) if *j == i => c,
            _ => {
                let client = client_for(self.spec.sentinels[i].clone(), &self.certs)?;
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.response_timeout));
                let c = tokio::time::timeout(
                    self.connect_timeout * 2,
                    client.get_multiplexed_async_connection_with_config(&config),
                )
                .await
                .map_err(|_| timed_out("cannot connect to the sentinel"))??;
                &mut link.conn.insert((i, c)).1
            }
        };
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.spec.master_name)
            .query_async::<Option<(String, u16)>>(conn)
            .await
    }

    /// Connects to `host:port` and checks that it is a master.
    async fn connect_master(&self, host: &str, port: u16) -> RedisResult<ConnectionManager> {
        let client = client_for(self.node_info(host, port)?, &self.certs)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let mut conn = tokio::time::timeout(
            self.connect_timeout * 2,
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| timed_out("cannot connect to the master"))??;
        match redis::cmd("ROLE").query_async::<Value>(&mut conn).await {
            Ok(Value::Array(items)) => {
                let role: Option<String> = items
                    .first()
                    .and_then(|v| redis::from_redis_value_ref(v).ok());
                if role.as_deref() != Some("master") {
                    return Err(RedisError::from((
                        ErrorKind::Server(ServerErrorKind::ReadOnly),
                        "not a master yet",
                        format!("{host}:{port} answers ROLE with {role:?}"),
                    )));
                }
            }
            // a user without +role: trust the sentinels (READONLY errors would tell otherwise)
            Err(e) if e.code() == Some("NOPERM") => {}
            Ok(other) => tracing::debug!(?other, "sentinel: unexpected ROLE reply"),
            Err(e) => return Err(e),
        }
        Ok(conn)
    }

    /// Looks until the current master answers, or the sentinels name another one that does
    /// (then swaps it in).
    async fn refresh(&self, link: &mut Link, stop: &CancellationToken) {
        let mut delay = Duration::from_millis(100);
        loop {
            let current = self.current();
            match self.lookup(link).await {
                Ok((host, port))
                    if (host.as_str(), port) != (current.host.as_str(), current.port) =>
                {
                    match self.connect_master(&host, port).await {
                        Ok(conn) => {
                            let generation = current.generation + 1;
                            *self.current.write().unwrap() = Master {
                                generation,
                                host: host.clone(),
                                port,
                                conn,
                            };
                            self.changed.send_replace(generation);
                            tracing::warn!(master = %self.spec.master_name, from = %format!("{}:{}", current.host, current.port),
                                to = %format!("{host}:{port}"), "sentinel: following the new master");
                            return;
                        }
                        Err(e) => {
                            tracing::debug!(host, port, error = %e, "sentinel: the named master is not ready")
                        }
                    }
                }
                Ok(_) => {
                    let mut conn = current.conn.clone();
                    let ping = tokio::time::timeout(
                        self.connect_timeout,
                        redis::cmd("PING").query_async::<Value>(&mut conn),
                    )
                    .await;
                    if matches!(ping, Ok(Ok(_))) {
                        return;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "sentinel: no sentinel answered"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }
}

/// The follower's connection to one sentinel (kept between lookups).
#[derive(Default)]
struct Link {
    conn: Option<(usize, MultiplexedConnection)>,
}

/// A lazy manager that never connects (for the moment before the first master is known).
fn placeholder_manager() -> Result<ConnectionManager, Error> {
    let client =
        redis::Client::open("redis://127.0.0.1:1/").map_err(|e| Error::from_redis(e, ""))?;
    ConnectionManager::new_lazy_with_config(client, ConnectionManagerConfig::new())
        .map_err(|e| Error::from_redis(e, ""))
}

/// The follower task: checks the master when asked (errors, `+switch-master`) and every few
/// seconds.
async fn follow(weak: Weak<Sentinel>, mut link: Link, stop: CancellationToken) {
    let mut tick = tokio::time::interval(SENTINEL_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let Some(s) = weak.upgrade() else { return };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = s.wake.notified() => {}
            _ = tick.tick() => {}
        }
        s.refresh(&mut link, &stop).await;
    }
}

/// Listens for `+switch-master` on one sentinel at a time, and wakes the follower.
async fn listen_switch_master(weak: Weak<Sentinel>, stop: CancellationToken) {
    let mut i = 0usize;
    let mut delay = Duration::from_millis(200);
    loop {
        let Some(s) = weak.upgrade() else { return };
        let n = s.spec.sentinels.len();
        let info = s.spec.sentinels[i % n].clone();
        let name = s.spec.master_name.clone();
        let connect_timeout = s.connect_timeout;
        let client = client_for(info, &s.certs);
        drop(s);
        let pubsub = match client {
            Ok(client) => tokio::time::timeout(connect_timeout * 2, client.get_async_pubsub())
                .await
                .ok()
                .and_then(Result::ok),
            Err(_) => None,
        };
        if let Some(mut pubsub) = pubsub
            && pubsub.subscribe("+switch-master").await.is_ok()
        {
            delay = Duration::from_millis(200);
            let mut messages = pubsub.on_message();
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    msg = messages.next() => match msg {
                        Some(msg) => {
                            // "<name> <old-ip> <old-port> <new-ip> <new-port>"
                            let payload: String = msg.get_payload().unwrap_or_default();
                            if payload.split(' ').next() == Some(name.as_str()) {
                                tracing::info!(%payload, "sentinel: +switch-master");
                                match weak.upgrade() {
                                    Some(s) => s.wake.notify_one(),
                                    None => return,
                                }
                            }
                        }
                        None => break,
                    },
                }
            }
        }
        i += 1;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

fn master_may_have_moved(e: &RedisError) -> bool {
    e.is_timeout()
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
        || e.to_string().contains("READONLY")
}

fn timed_out(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        what.to_owned(),
    ))
}

fn addr_of(info: &ConnectionInfo) -> String {
    match info.addr() {
        redis::ConnectionAddr::Tcp(h, p) => format!("{h}:{p}"),
        redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_choose_the_topology() {
        assert!(matches!(
            parse_url("redis://u:p@h:1/2").unwrap(),
            Topology::Standalone(_)
        ));
        let Topology::Cluster(nodes) =
            parse_url("redis+cluster://app:s%40cret@a:7000,b:7001,[::1]:7002").unwrap()
        else {
            panic!()
        };
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[1].redis_settings().username(), Some("app"));
        assert_eq!(nodes[1].redis_settings().password(), Some("s@cret"));
        assert_eq!(addr_of(&nodes[0]), "a:7000");
        let Topology::Sentinel(s) =
            parse_url("redis+sentinel://u:pw@s1:5000,s2/mymaster/3").unwrap()
        else {
            panic!()
        };
        assert_eq!(s.master_name, "mymaster");
        assert_eq!(s.data.db(), 3);
        assert_eq!(s.data.password(), Some("pw"));
        assert_eq!(addr_of(&s.sentinels[1]), "s2:26379");
        assert_eq!(s.sentinels[0].redis_settings().password(), None);
        assert!(!s.tls);
        let Topology::Sentinel(s) = parse_url(
            "redis+sentinel://s1:5000/m?sentinel_username=watch&sentinel_password=p%40ss",
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(s.sentinels[0].redis_settings().username(), Some("watch"));
        assert_eq!(s.sentinels[0].redis_settings().password(), Some("p@ss"));
        assert_eq!(s.data.password(), None);
        assert_eq!(percent_decode("a%2Fb%"), "a/b%");
        for bad in [
            "redis+sentinel://s1:5000",
            "redis+cluster://",
            "redis+bogus://h:1",
            "http://h:1",
            "ftp+cluster://h:1",
        ] {
            assert!(
                matches!(parse_url(bad), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
    }
}

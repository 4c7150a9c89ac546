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
//! - **cluster** ([`cluster`]): a [`ClusterConnection`] each, routed by hash slot; the
//!   subscriber uses sharded pub/sub;
//! - **Sentinel** ([`sentinel`]): a [`ConnectionManager`] to the current master, replaced
//!   when the master changes.
//!
//! The files: [`url`] (what a URL names, and how it is shown), [`tls`] (certificates),
//! [`cluster`], [`sentinel`], [`probe`] (why a connect failed); this one ties them into the
//! two connections. Nothing here
//! knows about semaphores.

mod cluster;
mod probe;
mod sentinel;
mod tls;
mod url;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{
    Cmd, ConnectionInfo, Pipeline, ProtocolVersion, PushInfo, RedisError, RedisFuture, RedisResult,
    Value,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
pub(crate) use sentinel::Sentinel;
pub(crate) use tls::TlsPems;
use tls::{Certs, client_for};
pub use url::redact_url;
use url::{Topology, addr_of, parse_url, resp3};

/// Everything needed to (re)connect: the topology, TLS material and timeouts.
pub(crate) struct Backend {
    /// The URL as given (shown redacted).
    url: String,
    topology: Topology,
    certs: Option<Certs>,
    connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    /// Run redsem's scripts as scripts (`EVALSHA`), never as the Functions library.
    pub(crate) scripts_only: bool,
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
                redact_url(url)
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
                redact_url(url)
            )));
        }
        Ok(Backend {
            url: url.to_owned(),
            certs: tls::certs(pems)?,
            topology,
            connect_timeout,
            response_timeout,
            scripts_only: false,
        })
    }

    /// The error of a failed connect, in words that say what is wrong with the URL when the
    /// failure shows it (one error per mistake, all [`Error::InvalidArgument`] but NOAUTH,
    /// which is [`Error::Auth`]):
    ///
    /// - the server is not Redis (its reply is not RESP, or it answers `PING` with
    ///   something else);
    /// - `rediss://` on a plaintext port, `redis://` on a TLS port;
    /// - a cluster URL on a server without cluster support, a Sentinel URL on a server that
    ///   is not a sentinel.
    ///
    /// Some of these are confirmed by a probe ([`probe`]) of the first host of the URL,
    /// which adds at most [`probe::PROBE_TIME`] to the failure. Any other error is returned
    /// as it is.
    pub(crate) async fn explain(&self, err: Error) -> Error {
        let shown = redact_url(&self.url);
        let first = match &self.topology {
            Topology::Standalone(i) => Some(i),
            Topology::Cluster(nodes) => nodes.first(),
            Topology::Sentinel(s) => s.sentinels.first(),
        };
        let target = first.and_then(|i| match i.addr() {
            redis::ConnectionAddr::Tcp(h, p) => Some((h.clone(), *p, false)),
            redis::ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port, true)),
            _ => None,
        });
        let addr = first.map(addr_of).unwrap_or_default();
        let bad = |why: String| Error::InvalidArgument(format!("Redis URL {shown:?}: {why}"));
        let text = match &err {
            Error::Backend(e) | Error::Unreachable(e) => e.to_string(),
            _ => return err,
        };
        let lower = text.to_ascii_lowercase();
        match &self.topology {
            Topology::Cluster(_) if lower.contains("cluster support disabled") => {
                return bad(format!(
                    "{addr} is a single server, not a Redis Cluster node (its cluster support \
                     is disabled): use redis://{addr}/ for one server"
                ));
            }
            Topology::Sentinel(_)
                if lower.contains("unknown command") && lower.contains("sentinel") =>
            {
                return bad(format!(
                    "{addr} is not a Sentinel (it does not know the SENTINEL command): list \
                     the sentinels' addresses (port 26379 by default) in the URL, or use \
                     redis://{addr}/ for a single server"
                ));
            }
            _ => {}
        }
        let Some((host, port, tls)) = target else {
            return err;
        };
        // a reply that is not RESP (the cluster client reports it as an I/O error)
        let parse_error = matches!(&err, Error::Backend(e) if e.is_parse_error())
            || lower.contains("parse error");
        let refused = matches!(&err, Error::Unreachable(e) if e.is_refusal());
        let timed_out = matches!(&err, Error::Unreachable(e) if e.is_timeout());
        let not_redis = |line: &str| {
            bad(format!(
                "{addr} is not a Redis server (it answers {line:?}): check the host and port"
            ))
        };
        if parse_error {
            return match probe::plain(&host, port).await {
                probe::Answer::Other(line) => not_redis(&line),
                _ => bad(format!(
                    "{addr} is not a Redis server (its reply is not RESP: {text}): check the \
                     host and port"
                )),
            };
        }
        // (the cluster client says so in its own words)
        let refused = refused || lower.contains("connection refused");
        if refused {
            return self.refused(err);
        }
        if !matches!(err, Error::Unreachable(_)) {
            return err;
        }
        if tls {
            // a plaintext Redis waits for a command that the TLS handshake never ends
            return match probe::plain(&host, port).await {
                probe::Answer::Redis(_) => bad(format!(
                    "{addr} speaks plaintext Redis, not TLS: use redis:// instead of rediss://"
                )),
                probe::Answer::Other(line) => not_redis(&line),
                _ => err,
            };
        }
        if timed_out {
            return err;
        }
        // reset or closed at once: a TLS port drops a plaintext client
        match probe::tls(&host, port).await {
            probe::Answer::Tls => bad(format!(
                "{addr} expects TLS: use rediss:// instead of redis://"
            )),
            probe::Answer::Other(line) => not_redis(&line),
            _ => err,
        }
    }

    /// [`explain`](Self::explain) of a refused connection: for Sentinel and Cluster, which
    /// servers refused and what they should be (one server's refusal says it all).
    fn refused(&self, err: Error) -> Error {
        let list =
            |infos: &[ConnectionInfo]| infos.iter().map(addr_of).collect::<Vec<_>>().join(", ");
        let why = match &self.topology {
            Topology::Sentinel(s) => format!(
                "no sentinel accepts connections ({}: connection refused): check that the \
                 sentinels run and the URL lists their addresses (port 26379 by default)",
                list(&s.sentinels)
            ),
            Topology::Cluster(nodes) => format!(
                "no seed node of the cluster accepts connections ({}: connection refused): \
                 check that the nodes run and the URL lists some of them",
                list(nodes)
            ),
            Topology::Standalone(_) => return err,
        };
        Error::Unreachable(crate::error::BackendError::refused(why))
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
        cluster::builder(
            nodes,
            self.connect_timeout,
            self.response_timeout,
            &self.certs,
        )
    }

    /// One connection attempt to a single server, without the connection manager's retries
    /// (which retry every failure, a few times over a second): a refusal that no retry can
    /// change (a wrong password, a database number out of range, a user not allowed to
    /// connect: every failure but [`Code::Unavailable`](crate::codes::Code)) fails at once,
    /// as what it is, rather than after the retries or, with a short connect timeout, as an
    /// unreachable server. A server not reachable yet is left to the manager's retries. On
    /// that connection, [`not_a_cluster_node`](Self::not_a_cluster_node) checks the server is
    /// not a cluster node. The connection is dropped: the manager makes its own (one more
    /// handshake per client).
    async fn first_attempt(&self, client: &redis::Client) -> Result<(), Error> {
        let once = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout));
        match client
            .get_multiplexed_async_connection_with_config(&once)
            .await
        {
            Err(e) if crate::codes::Code::of(&e) != crate::codes::Code::Unavailable => {
                Err(Error::from_server(e))
            }
            Err(_) => Ok(()),
            Ok(mut conn) => self.not_a_cluster_node(&mut conn).await,
        }
    }

    /// A `redis://` URL must not name a node of a Redis Cluster: redsem would reach that node
    /// alone, which holds only its own slots' keys (`list` would miss the others, calls about
    /// them fail with `MOVED`). One `INFO cluster` (a server that refuses or does not know it
    /// is taken as a single server).
    async fn not_a_cluster_node(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> Result<(), Error> {
        let info: RedisResult<String> = redis::cmd("INFO").arg("cluster").query_async(conn).await;
        match info {
            Ok(text) if text.lines().any(|l| l.trim() == "cluster_enabled:1") => {
                let Topology::Standalone(i) = &self.topology else {
                    return Ok(());
                };
                let addr = addr_of(i);
                let tls = matches!(i.addr(), redis::ConnectionAddr::TcpTls { .. });
                let scheme = if tls {
                    "rediss+cluster"
                } else {
                    "redis+cluster"
                };
                Err(Error::InvalidArgument(format!(
                    "Redis URL {:?}: {addr} is a node of a Redis Cluster: use \
                     {scheme}://{addr}/ (a one-server URL reaches this node alone, which holds \
                     only its own slots' keys)",
                    redact_url(&self.url)
                )))
            }
            _ => Ok(()),
        }
    }

    /// Connects the command connection.
    pub(crate) async fn connect(&self, stop: &CancellationToken) -> Result<Conn, Error> {
        let map = |e: RedisError| Error::from_server(e);
        let link = match &self.topology {
            Topology::Standalone(info) => {
                let client = client_for(info.clone(), &self.certs).map_err(map)?;
                self.first_attempt(&client).await?;
                Link::Standalone(
                    ConnectionManager::new_with_config(client, self.manager_config())
                        .await
                        .map_err(map)?,
                )
            }
            Topology::Cluster(nodes) => {
                let client = self.cluster_builder(nodes).build().map_err(map)?;
                Link::Cluster(client.get_async_connection().await.map_err(map)?)
            }
            #[allow(clippy::clone_on_copy)] // Certs is Copy only without the tls feature
            Topology::Sentinel(spec) => Link::Sentinel(
                Sentinel::connect(
                    spec.clone(),
                    self.certs.clone(),
                    self.connect_timeout,
                    self.response_timeout,
                    stop,
                )
                .await?,
            ),
        };
        Ok(Conn::new(link, self.scripts_only))
    }

    /// Connects the subscriber connection, whose pushes (messages, disconnections) go to `tx`.
    /// `conn` is the command connection (a Sentinel subscriber follows its master).
    pub(crate) async fn connect_subscriber(
        &self,
        conn: &Conn,
        tx: mpsc::UnboundedSender<PushInfo>,
    ) -> Result<SubConn, Error> {
        let map = |e: RedisError| Error::from_server(e);
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
                let Some(s) = conn.sentinel() else {
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

/// The command connection: every script runs on it, pipelined with the others. Its clones
/// share the link and what was learned about the server's scripting ([`Scripting`]), and
/// [`close`](Conn::close) closes it for all of them: the link lives in one place, and each
/// call takes a clone of it (an `Arc`'s count) for as long as it runs.
#[derive(Clone)]
pub(crate) struct Conn {
    link: Arc<std::sync::RwLock<Option<Link>>>,
    /// What the link is (kept outside the lock: read by every batching decision).
    cluster: bool,
    sentinel: Option<Arc<Sentinel>>,
    db: i64,
    scripting: Arc<Scripting>,
}

#[derive(Clone)]
enum Link {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<Sentinel>),
}

/// How redsem's scripts run on a connection's server(s): as the functions of redsem's Redis
/// Functions library (`FCALL`), or as scripts (`EVALSHA`) when the library cannot be used
/// there (the protocol decides, and says why once) or the client asked for scripts.
pub(crate) struct Scripting {
    /// The scripts run: the client asked for them, or the library was refused (read on
    /// every call, without the lock).
    scripts: std::sync::atomic::AtomicBool,
    /// The client asked for the scripts.
    forced: bool,
    /// Why the library cannot be used here, once a call found out (then the scripts run).
    refused: std::sync::Mutex<Option<String>>,
}

impl Scripting {
    /// Functions first, or scripts only.
    pub(crate) fn new(scripts_only: bool) -> Scripting {
        Scripting {
            scripts: std::sync::atomic::AtomicBool::new(scripts_only),
            forced: scripts_only,
            refused: std::sync::Mutex::new(None),
        }
    }

    /// Whether calls use the scripts (else the Functions library).
    pub(crate) fn scripts(&self) -> bool {
        self.scripts.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Why the library cannot be used here, if a call found that it cannot (`None` too when
    /// the client asked for the scripts).
    pub(crate) fn refused(&self) -> Option<String> {
        self.refused.lock().unwrap().clone()
    }

    /// Uses the scripts from now on, because the library was refused (`why`); `true` if this
    /// changed it (the caller then says why, once).
    pub(crate) fn use_scripts(&self, why: &str) -> bool {
        let mut refused = self.refused.lock().unwrap();
        if self.forced || refused.is_some() {
            return false;
        }
        *refused = Some(why.to_owned());
        self.scripts
            .store(true, std::sync::atomic::Ordering::Relaxed);
        true
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let link = self.link();
        Box::pin(async move {
            match link? {
                Link::Standalone(mut c) => c.req_packed_command(cmd).await,
                Link::Cluster(mut c) => c.req_packed_command(cmd).await,
                Link::Sentinel(s) => {
                    s.request(|mut c| async move { c.req_packed_command(cmd).await })
                        .await
                }
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let link = self.link();
        Box::pin(async move {
            match link? {
                Link::Standalone(mut c) => c.req_packed_commands(pipeline, offset, count).await,
                Link::Cluster(mut c) => c.req_packed_commands(pipeline, offset, count).await,
                Link::Sentinel(s) => {
                    s.request(|mut c| async move {
                        c.req_packed_commands(pipeline, offset, count).await
                    })
                    .await
                }
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

impl Conn {
    fn new(link: Link, scripts_only: bool) -> Conn {
        let (cluster, sentinel, db) = match &link {
            Link::Standalone(c) => (false, None, c.get_db()),
            Link::Cluster(c) => (true, None, c.get_db()),
            Link::Sentinel(s) => (false, Some(s.clone()), s.db()),
        };
        Conn {
            link: Arc::new(std::sync::RwLock::new(Some(link))),
            cluster,
            sentinel,
            db,
            scripting: Arc::new(Scripting::new(scripts_only)),
        }
    }

    /// The link, for one call; an error once [`close`](Self::close)d.
    fn link(&self) -> RedisResult<Link> {
        let link = self.link.read().unwrap_or_else(|e| e.into_inner());
        link.clone().ok_or_else(shut_down)
    }

    /// Closes the connection for every clone (at the client's shutdown): the link is dropped
    /// here, and closes once the calls in flight, which hold it, have returned; every later
    /// call fails at once.
    pub(crate) fn close(&self) {
        let link = self.link.write().unwrap_or_else(|e| e.into_inner()).take();
        drop(link);
    }

    /// The Sentinel that names this connection's master, if it follows one.
    pub(crate) fn sentinel(&self) -> Option<&Arc<Sentinel>> {
        self.sentinel.as_ref()
    }

    /// How scripts run on this connection (shared by its clones).
    pub(crate) fn scripting(&self) -> &Scripting {
        &self.scripting
    }

    /// `SCAN MATCH pattern` over every master (one page at a time per master), deduplicated.
    pub(crate) async fn scan_match(&mut self, pattern: &str) -> RedisResult<Vec<String>> {
        let mut out = match self.link()? {
            Link::Cluster(mut c) => cluster::scan_masters(&mut c, pattern).await?,
            _ => {
                let mut out = Vec::new();
                let mut cursor: u64 = 0;
                loop {
                    let reply = cluster::scan_page(cursor, pattern)
                        .query_async::<Value>(self)
                        .await?;
                    let (next, keys): (u64, Vec<String>) = redis::from_redis_value(reply)?;
                    out.extend(keys);
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
                out
            }
        };
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Which calls on `key` may share a script call with calls on other keys: all of them on
    /// one server (or the current Sentinel master), those of one hash slot on a cluster (a
    /// script's keys must share a slot there).
    pub(crate) fn node_of(&self, key: &str) -> Node {
        if self.cluster {
            Node::Slot(Slot::for_key(key))
        } else {
            Node::Single
        }
    }

    /// Sends `pipeline` to the master that holds `key` (the node a script on `key` runs on).
    pub(crate) async fn pipeline_on_key(
        &mut self,
        key: &str,
        pipeline: &Pipeline,
    ) -> RedisResult<Vec<Value>> {
        match self.link()? {
            Link::Cluster(mut c) => cluster::pipeline_on_key(&mut c, key, pipeline).await,
            _ => pipeline.query_async(self).await,
        }
    }
}

/// Where a key lives, as far as a script call's keys must agree ([`Conn::node_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Node {
    /// One server: any keys.
    Single,
    /// A cluster: the keys of one hash slot.
    Slot(Slot),
}

/// The subscriber connection, on which the scripts' grants are pushed.
#[derive(Clone)]
pub(crate) enum SubConn {
    /// One server (or the current Sentinel master): `SUBSCRIBE`.
    Single(ConnectionManager),
    /// A cluster: sharded pub/sub, `SSUBSCRIBE` on the master of each channel's slot.
    Cluster(ClusterConnection),
    /// The client was shut down: the connection was dropped (closed), and every call fails.
    Closed,
}

impl SubConn {
    pub(crate) async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            SubConn::Single(c) => c.subscribe(channel).await,
            SubConn::Cluster(c) => c.ssubscribe(channel).await,
            SubConn::Closed => Err(shut_down()),
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            SubConn::Single(c) => c.unsubscribe(channel).await,
            SubConn::Cluster(c) => c.sunsubscribe(channel).await,
            SubConn::Closed => Err(shut_down()),
        }
    }

    pub(crate) async fn ping(&mut self) -> RedisResult<()> {
        match self {
            SubConn::Single(c) => redis::cmd("PING").query_async::<Value>(c).await.map(drop),
            SubConn::Cluster(c) => redis::cmd("PING").query_async::<Value>(c).await.map(drop),
            SubConn::Closed => Err(shut_down()),
        }
    }
}

/// The error of a call on a connection of a client that was shut down (its callers say
/// [`Error::Closed`] before they get there).
fn shut_down() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "the client was shut down: its connections are closed",
    ))
}

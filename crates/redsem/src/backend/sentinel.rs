//! The Sentinel follower: a command connection that follows the master Sentinel names.
//!
//! redis-rs resolves a master once but never follows a failover, so this module does: it asks
//! the sentinels again on `+switch-master`, on `READONLY`, on connection errors and timeouts,
//! and every few seconds; it checks `ROLE` before switching, and it never holds a lock while
//! it resolves (commands keep using the old connection and fail fast until the new one is
//! swapped in). The notifier follows the same master through [`Sentinel::subscribe_changes`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, ConnectionInfo, ErrorKind, IntoConnectionInfo, PushInfo, RedisError,
    RedisResult, ServerErrorKind, Value,
};
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::tls::{Certs, client_for};
use super::url::{SentinelSpec, addr_of, resp3};
use crate::backoff::Backoff;
use crate::error::Error;

/// How often a Sentinel client asks the sentinels which node is master, besides the
/// `+switch-master` events and the errors that make it ask at once.
const SENTINEL_CHECK: Duration = Duration::from_secs(2);

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
    pub(super) async fn connect(
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
        let (host, port) = probe.lookup(&mut link).await.map_err(Error::from_server)?;
        let conn = probe
            .connect_master(&host, port)
            .await
            .map_err(Error::from_server)?;
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

    /// The database of the master connection (from the URL).
    pub(super) fn db(&self) -> i64 {
        self.spec.data.db()
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
    pub(super) async fn request<T, F, Fut>(&self, f: F) -> RedisResult<T>
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
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
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
                _ = tokio::time::sleep(backoff.next_delay()) => {}
            }
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
    let client = redis::Client::open("redis://127.0.0.1:1/").map_err(Error::from_server)?;
    ConnectionManager::new_lazy_with_config(client, ConnectionManagerConfig::new())
        .map_err(Error::from_server)
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
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
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
            backoff.reset();
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
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
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

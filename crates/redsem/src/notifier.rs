//! The per-client subscriber: one RESP3 connection on which Redis pushes grants.
//!
//! Each opened semaphore handle subscribes to its own channel
//! `<prefix>:{<name>}:c:<client>.<n>`. The scripts publish a grant on the channel of the
//! client that owns the granted waiter, so a release wakes exactly the waiter that got the
//! slot, and only the process that owns it receives a message. The router task hands each
//! record to the semaphore handle, which completes that one waiter.
//!
//! Pub/sub is at-most-once. When the connection drops, the client library reconnects and
//! re-subscribes; the router then re-subscribes explicitly (the library ignores the result
//! of its own attempt) and asks every semaphore to re-check its waiters at once. Grants lost
//! in any other way are found by the heartbeat's fallback poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionInfo, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::semaphore::SemShared;

/// Interval of the notifier's health check (a `PING` on the subscriber connection). A dead
/// connection that sent no disconnect notice is found within this time.
const HEALTH_CHECK: Duration = Duration::from_secs(5);

pub(crate) struct Notifier {
    conn: ConnectionManager,
    routes: Mutex<HashMap<String, Weak<SemShared>>>,
}

impl Notifier {
    pub(crate) async fn connect(
        info: ConnectionInfo,
        config: ConnectionManagerConfig,
    ) -> Result<(Notifier, mpsc::UnboundedReceiver<PushInfo>), Error> {
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let info = info.set_redis_settings(settings);
        let client = redis::Client::open(info).map_err(|e| Error::from_redis(e, ""))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let config = config.set_push_sender(tx).set_automatic_resubscription();
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| Error::from_redis(e, ""))?;
        Ok((
            Notifier {
                conn,
                routes: Mutex::new(HashMap::new()),
            },
            rx,
        ))
    }

    /// Subscribes `channel` and routes its messages to `sem`. Returns once Redis confirmed
    /// the subscription, so no grant published afterwards is missed.
    pub(crate) async fn subscribe(
        &self,
        channel: &str,
        sem: Weak<SemShared>,
        name: &str,
    ) -> Result<(), Error> {
        self.routes.lock().unwrap().insert(channel.to_owned(), sem);
        let mut conn = self.conn.clone();
        if let Err(e) = conn.subscribe(channel).await {
            self.routes.lock().unwrap().remove(channel);
            return Err(Error::from_redis(e, name));
        }
        Ok(())
    }

    pub(crate) async fn unsubscribe(&self, channel: &str) {
        self.routes.lock().unwrap().remove(channel);
        let mut conn = self.conn.clone();
        if let Err(e) = conn.unsubscribe(channel).await {
            tracing::debug!(channel, error = %e, "unsubscribe failed");
        }
    }

    fn route(&self, channel: &str) -> Option<Arc<SemShared>> {
        self.routes.lock().unwrap().get(channel)?.upgrade()
    }

    fn all_routes(&self) -> Vec<(String, Arc<SemShared>)> {
        self.routes
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(c, w)| Some((c.clone(), w.upgrade()?)))
            .collect()
    }

    pub(crate) fn spawn_router(
        this: &Arc<Notifier>,
        pushes: mpsc::UnboundedReceiver<PushInfo>,
        stop: CancellationToken,
    ) {
        tokio::spawn(router(Arc::downgrade(this), pushes, stop));
    }

    /// Makes sure the connection is up and every channel subscribed, then has every
    /// semaphore re-check its waiters (grants published meanwhile were lost).
    async fn resync(&self) {
        let mut delay = Duration::from_millis(50);
        loop {
            let mut conn = self.conn.clone();
            match redis::cmd("PING").query_async::<Value>(&mut conn).await {
                Ok(_) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "notifier: waiting for the subscriber connection");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
        for (channel, sem) in self.all_routes() {
            let mut conn = self.conn.clone();
            if let Err(e) = conn.subscribe(&channel).await {
                tracing::warn!(channel, error = %e, "notifier: re-subscribe failed");
            }
            sem.recheck_now();
        }
        tracing::debug!("notifier: subscriptions restored, waiters re-checked");
    }
}

async fn router(
    notifier: Weak<Notifier>,
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    stop: CancellationToken,
) {
    let mut health = tokio::time::interval(HEALTH_CHECK);
    health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let push = tokio::select! {
            _ = stop.cancelled() => return,
            p = pushes.recv() => match p { Some(p) => p, None => return },
            _ = health.tick() => {
                let Some(n) = notifier.upgrade() else { return };
                if n.routes.lock().unwrap().is_empty() { continue; }
                let mut conn = n.conn.clone();
                let ok = tokio::time::timeout(HEALTH_CHECK, redis::cmd("PING").query_async::<Value>(&mut conn)).await;
                if !matches!(ok, Ok(Ok(_))) {
                    tracing::warn!("notifier: subscriber connection unhealthy, resynchronising");
                    tokio::select! { _ = stop.cancelled() => return, _ = n.resync() => {} }
                }
                continue;
            }
        };
        let Some(n) = notifier.upgrade() else { return };
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                let (Some(channel), Some(payload)) =
                    (text(push.data.first()), text(push.data.get(1)))
                else {
                    continue;
                };
                if let Some(sem) = n.route(&channel) {
                    sem.on_notices(&payload);
                }
            }
            PushKind::Disconnection => {
                tracing::info!("notifier: subscriber connection lost; reconnecting");
                tokio::select! { _ = stop.cancelled() => return, _ = n.resync() => {} }
            }
            _ => {}
        }
    }
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

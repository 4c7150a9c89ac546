//! The per-client subscriber: one RESP3 connection on which Redis pushes grants.
//!
//! Each opened semaphore handle subscribes to its own channel
//! `<prefix>:{<name>}:c:<channel id>` (the channel id is `<client id>.<n>`). The scripts
//! publish a grant on the channel of the handle that owns the granted waiter, so a release
//! wakes exactly the waiter that got the slot, and only the process that owns it receives a
//! message. The router task hands each message to the handle's [`Listener`], which completes
//! that one waiter.
//!
//! On a cluster the channels are *shard* channels (`SSUBSCRIBE`, and the scripts `SPUBLISH`):
//! a channel lives on the master of its hash slot, the same as the semaphore's keys, so the
//! subscriber holds one connection per master that serves an opened semaphore. On Sentinel
//! the subscriber moves to each new master the command connection follows.
//!
//! Pub/sub is at-most-once. Whenever the subscription may have lapsed — the connection
//! dropped (a `Disconnection` push), a health-check `PING` failed, the server dropped a shard
//! channel (an `SUNSUBSCRIBE` push after a failover or a slot migration), or the master
//! changed — the resync task subscribes every channel again (explicitly: redis-rs ignores the
//! result of its own automatic resubscription) and, right after each channel is confirmed,
//! has its semaphore re-check its waiters, so grants published meanwhile are found at once.
//! Grants lost in any other way are found by the heartbeat's fallback poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use redis::{PushInfo, PushKind, Value};
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, Conn, Sentinel, SubConn};
use crate::backoff::Backoff;
use crate::error::{CallError, Error};
use crate::protocol::explain_denied_subscription;

/// What the notifier calls back: one per subscribed channel (a semaphore handle).
pub(crate) trait Listener: Send + Sync {
    /// A message arrived on the channel.
    fn on_message(&self, payload: &str);
    /// The channel was subscribed again after the subscription may have lapsed: messages
    /// published meanwhile may be lost, so the waiters should be checked now.
    fn on_resubscribed(&self);
}

/// Interval of the notifier's health check (a `PING` on the subscriber connection). A dead
/// connection that sent no disconnect notice is found within this time.
const HEALTH_CHECK: Duration = Duration::from_secs(5);

pub(crate) struct Notifier {
    /// Held only to clone or swap the connection (never across an await).
    conn: RwLock<SubConn>,
    routes: Mutex<HashMap<String, Weak<dyn Listener>>>,
    response_timeout: Duration,
    /// Sentinel: the master to follow, and where new subscriber connections send pushes.
    sentinel: Option<(Arc<Sentinel>, mpsc::UnboundedSender<PushInfo>)>,
    /// Asks the resync task to subscribe every channel again and re-check the waiters.
    resync: Notify,
    /// Counts the resyncs done ([`resyncs`](Self::resyncs)).
    resynced: watch::Sender<u64>,
}

impl Notifier {
    pub(crate) async fn connect(
        backend: &Backend,
        conn: &Conn,
    ) -> Result<(Notifier, mpsc::UnboundedReceiver<PushInfo>), Error> {
        let (tx, rx) = mpsc::unbounded_channel();
        let sub = backend.connect_subscriber(conn, tx.clone()).await?;
        let sentinel = conn.sentinel().map(|s| (s.clone(), tx));
        Ok((
            Notifier {
                conn: RwLock::new(sub),
                routes: Mutex::new(HashMap::new()),
                response_timeout: backend.response_timeout,
                sentinel,
                resync: Notify::new(),
                resynced: watch::Sender::new(0),
            },
            rx,
        ))
    }

    fn conn(&self) -> SubConn {
        self.conn.read().unwrap().clone()
    }

    /// Drops the subscriber connection (it closes once the calls in flight on it are done):
    /// for [`Context::shutdown`](super::Context::shutdown), after the tasks that use it stopped.
    pub(crate) fn close(&self) {
        *self.conn.write().unwrap() = SubConn::Closed;
    }

    /// Subscribes `channel` and routes its messages to `listener`. Returns once Redis
    /// confirmed the subscription, so no grant published afterwards is missed.
    pub(crate) async fn subscribe(
        &self,
        channel: &str,
        listener: Weak<dyn Listener>,
        name: &str,
    ) -> Result<(), Error> {
        self.routes
            .lock()
            .unwrap()
            .insert(channel.to_owned(), listener);
        // A subscriber connection found broken (killed, reset) is being replaced: the
        // subscription is tried again on the new one, within the response timeout.
        let deadline = tokio::time::Instant::now() + self.response_timeout;
        let mut delay = Duration::from_millis(20);
        let result = loop {
            let mut conn = self.conn();
            match tokio::time::timeout_at(deadline, conn.subscribe(channel)).await {
                Ok(Err(e))
                    if (e.is_io_error() || e.is_connection_dropped())
                        && tokio::time::Instant::now() + delay < deadline =>
                {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Ok(r) => break r.map_err(|e| explain_denied_subscription(e, channel)),
                Err(_) => {
                    break Err(CallError::Redis(redis::RedisError::from(
                        std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "no subscription confirmation",
                        ),
                    )));
                }
            }
        };
        if let Err(e) = result {
            self.routes.lock().unwrap().remove(channel);
            return Err(Error::from_call(e, name));
        }
        Ok(())
    }

    pub(crate) async fn unsubscribe(&self, channel: &str) {
        self.routes.lock().unwrap().remove(channel);
        let mut conn = self.conn();
        match tokio::time::timeout(self.response_timeout, conn.unsubscribe(channel)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(channel, error = %e, "unsubscribe failed"),
            Err(_) => tracing::debug!(channel, "unsubscribe timed out"),
        }
    }

    fn route(&self, channel: &str) -> Option<Arc<dyn Listener>> {
        self.routes.lock().unwrap().get(channel)?.upgrade()
    }

    fn channels(&self) -> Vec<String> {
        self.routes.lock().unwrap().keys().cloned().collect()
    }

    pub(crate) fn spawn_router(
        this: &Arc<Notifier>,
        pushes: mpsc::UnboundedReceiver<PushInfo>,
        stop: CancellationToken,
    ) {
        tokio::spawn(router(Arc::downgrade(this), pushes, stop.clone()));
        let masters = this.sentinel.as_ref().map(|(s, _)| s.subscribe_changes());
        tokio::spawn(resync_task(Arc::downgrade(this), masters, stop));
    }

    /// Subscribes every channel again (each until it is confirmed, with backoff) and has its
    /// semaphore re-check its waiters right after its confirmation. If the master changes
    /// meanwhile (Sentinel), the subscriber moves to it first and every channel is redone.
    async fn resync(&self, stop: &CancellationToken, masters: &mut Option<watch::Receiver<u64>>) {
        let mut pending = self.channels();
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        while !pending.is_empty() {
            let mut conn = self.conn();
            let mut failed = Vec::new();
            // one connection: the first failure says it is down; a cluster: other shards
            // may be fine
            let single = matches!(conn, SubConn::Single(_));
            let mut channels = pending.into_iter();
            while let Some(channel) = channels.next() {
                if self.route(&channel).is_none() {
                    continue; // unsubscribed meanwhile
                }
                let ok =
                    tokio::time::timeout(self.response_timeout, conn.subscribe(&channel)).await;
                let error = match ok {
                    Ok(Ok(())) => {
                        if let Some(listener) = self.route(&channel) {
                            listener.on_resubscribed();
                        }
                        continue;
                    }
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "timed out".to_owned(),
                };
                tracing::debug!(channel, error, "notifier: re-subscribe failed");
                failed.push(channel);
                if single {
                    failed.extend(channels.by_ref());
                }
            }
            pending = failed;
            if pending.is_empty() {
                break;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(backoff.next_delay()) => {}
                changed = next_change(masters) => {
                    if changed.is_ok() {
                        self.follow_master(stop).await;
                        pending = self.channels();
                        backoff.reset();
                        continue;
                    }
                    *masters = None;
                }
            }
        }
        tracing::debug!("notifier: subscriptions restored, waiters re-checked");
        self.resynced.send_modify(|n| *n += 1);
    }

    /// Changes once after each resync (the subscriber reconnected, or moved to a new master):
    /// the releaser then sends its recent releases again, in case the failover lost them.
    pub(crate) fn resyncs(&self) -> watch::Receiver<u64> {
        self.resynced.subscribe()
    }

    /// Sentinel: moves the subscriber to the new master (retrying until it answers).
    async fn follow_master(&self, stop: &CancellationToken) {
        let Some((sentinel, tx)) = &self.sentinel else {
            return;
        };
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        loop {
            match sentinel.connect_subscriber(tx.clone()).await {
                Ok(conn) => {
                    *self.conn.write().unwrap() = SubConn::Single(conn);
                    tracing::info!("notifier: subscriber moved to the new master");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "notifier: cannot reach the new master yet"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }
}

/// Runs the resyncs one at a time (a trigger during a run causes one more run).
async fn resync_task(
    notifier: Weak<Notifier>,
    mut masters: Option<watch::Receiver<u64>>,
    stop: CancellationToken,
) {
    if let Some(rx) = &mut masters {
        rx.borrow_and_update();
    }
    loop {
        let Some(n) = notifier.upgrade() else { return };
        let master_changed = tokio::select! {
            _ = stop.cancelled() => return,
            _ = n.resync.notified() => false,
            changed = next_change(&mut masters) => {
                if changed.is_err() {
                    masters = None;
                    continue;
                }
                true
            }
        };
        if master_changed {
            n.follow_master(&stop).await;
        }
        n.resync(&stop, &mut masters).await;
    }
}

async fn next_change(rx: &mut Option<watch::Receiver<u64>>) -> Result<(), watch::error::RecvError> {
    match rx {
        Some(rx) => rx.changed().await,
        None => std::future::pending().await,
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
                let mut conn = n.conn();
                let ok = tokio::time::timeout(HEALTH_CHECK, conn.ping()).await;
                if !matches!(ok, Ok(Ok(()))) {
                    tracing::warn!("notifier: subscriber connection unhealthy, resynchronising");
                    n.resync.notify_one();
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
                if let Some(listener) = n.route(&channel) {
                    listener.on_message(&payload);
                }
            }
            PushKind::Disconnection => {
                tracing::info!("notifier: subscriber connection lost; reconnecting");
                n.resync.notify_one();
            }
            // The server dropped a channel we still want: its slot moved (failover, resharding).
            PushKind::SUnsubscribe | PushKind::Unsubscribe => {
                if let Some(channel) = text(push.data.first())
                    && n.route(&channel).is_some()
                {
                    tracing::info!(
                        channel,
                        "notifier: the server dropped a subscription; resubscribing"
                    );
                    n.resync.notify_one();
                }
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

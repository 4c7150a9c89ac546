//! The renewer: the task, one per client, that sends the renewals of all its handles'
//! heartbeats, and the [`Grid`] their wake-ups are aligned on.
//!
//! A heartbeat hands its renewal (the semaphore, the handle's sessions, the ids to check) to
//! [`Renewer::renew`] and awaits its own [`Renewal`]. The task sends every request waiting
//! for a node as one `renew_many.lua` call (at most [`SEMAPHORES_PER_CALL`] semaphores per
//! call; more leave as several calls at once, pipelined on the connection): all of them on one
//! server or Sentinel master, one call per hash slot on a cluster (a script's keys must share
//! a slot), the calls of every slot at once. While a node's calls are in flight, new requests
//! for it gather and leave together when they return (as in `batch.rs`); a request with no
//! call in flight for its node leaves at once, and one alone is one `renew.lua` call, as it
//! would be without the renewer. A semaphore whose renewal fails (a foreign key type, another
//! protocol version, a refusal by ACL) fails alone, with the error its own call would give.
//!
//! Cancellation: a request whose heartbeat stopped waiting before it was sent (its deadline
//! came first) is skipped; one in flight is renewed all the same, which is harmless.
//!
//! What it costs: per renewal interval, one call per node (per slot used on a cluster) for
//! every [`Grid`] step in which some handle's renewal falls due (below), instead of one call
//! per handle. Synced-mode renewals (`renew + WAIT` on one connection) do not come here.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::remote::Remote;
use crate::core::Grid;
use crate::error::{CallError, CallResult};
use crate::protocol::{self, Conn, Node, RenewArgs, Renewal, Session};

/// Most semaphores renewed by one call (its arguments, and its reply, held in memory at once).
const SEMAPHORES_PER_CALL: usize = 256;

/// Most requests taken from the channel at once.
const REQUESTS_PER_ROUND: usize = 4096;

/// One handle's renewal, waiting to be sent.
struct Request {
    remote: Arc<Remote>,
    sessions: Vec<(String, u64)>,
    ids: Vec<String>,
    reply: oneshot::Sender<CallResult<Renewal>>,
}

/// The renewal calls the renewer makes: on Redis through a [`Conn`], or on a stand-in in the
/// unit tests.
pub(crate) trait RenewCalls: Clone + Send + Sync + 'static {
    /// Which renewals may share a call with which ([`Conn::node_of`]).
    fn node_of(&self, remote: &Remote) -> Node;

    /// Renews one semaphore ([`protocol::renew`]).
    fn renew(&mut self, args: &RenewArgs<'_>) -> impl Future<Output = CallResult<Renewal>> + Send;

    /// Renews several semaphores of one node ([`protocol::renew_many`]): one result each.
    fn renew_many(
        &mut self,
        batch: &[RenewArgs<'_>],
    ) -> impl Future<Output = CallResult<Vec<CallResult<Renewal>>>> + Send;
}

impl RenewCalls for Conn {
    fn node_of(&self, remote: &Remote) -> Node {
        Conn::node_of(self, &remote.keys.cfg)
    }

    async fn renew(&mut self, a: &RenewArgs<'_>) -> CallResult<Renewal> {
        protocol::renew(self, &a.target, a.sessions, a.ids).await
    }

    async fn renew_many(
        &mut self,
        batch: &[RenewArgs<'_>],
    ) -> CallResult<Vec<CallResult<Renewal>>> {
        protocol::renew_many(self, batch).await
    }
}

/// The sender side of the renewer task, held by the client and its heartbeats; the task ends
/// when every one is gone.
#[derive(Clone)]
pub(crate) struct Renewer {
    tx: mpsc::UnboundedSender<Request>,
    grid: Grid,
}

impl Renewer {
    /// Starts the task, with its grid starting now.
    pub(crate) fn spawn(conn: impl RenewCalls) -> Renewer {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, conn));
        Renewer {
            tx,
            grid: Grid::new(Instant::now()),
        }
    }

    /// The client's grid.
    pub(crate) fn grid(&self) -> Grid {
        self.grid
    }

    /// Renews `sessions` of the semaphore `remote` and checks `ids` (as [`protocol::renew`]),
    /// in a call shared with the other renewals waiting for the same node.
    pub(crate) async fn renew(
        &self,
        remote: &Arc<Remote>,
        sessions: &[Session<'_>],
        ids: &[&str],
    ) -> CallResult<Renewal> {
        let (reply, rx) = oneshot::channel();
        let request = Request {
            remote: remote.clone(),
            sessions: sessions
                .iter()
                .map(|(s, ms)| (s.to_string(), *ms))
                .collect(),
            ids: ids.iter().map(|id| id.to_string()).collect(),
            reply,
        };
        if self.tx.send(request).is_err() {
            return Err(stopped());
        }
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }
}

/// The task is gone (the runtime is shutting down).
fn stopped() -> CallError {
    CallError::Redis(redis::RedisError::from((
        redis::ErrorKind::Client,
        "the client's renewer has stopped",
    )))
}

async fn run(mut rx: mpsc::UnboundedReceiver<Request>, conn: impl RenewCalls) {
    let mut waiting: HashMap<Node, Vec<Request>> = HashMap::new();
    let mut busy: HashSet<Node> = HashSet::new();
    let mut calls = FuturesUnordered::new();
    let mut buf: Vec<Request> = Vec::new();
    let mut open = true;
    loop {
        // every node with requests and no call in flight: send them now
        let ready: Vec<Node> = waiting
            .keys()
            .filter(|node| !busy.contains(*node))
            .copied()
            .collect();
        for node in ready {
            let mut requests = waiting.remove(&node).unwrap_or_default();
            // their heartbeat stopped waiting: nothing to send
            requests.retain(|r| !r.reply.is_closed());
            if !requests.is_empty() {
                busy.insert(node);
                calls.push(round(conn.clone(), node, requests));
            }
        }
        if !open && calls.is_empty() {
            return;
        }
        tokio::select! {
            n = rx.recv_many(&mut buf, REQUESTS_PER_ROUND), if open => {
                open = n > 0;
                for r in buf.drain(..) {
                    waiting.entry(conn.node_of(&r.remote)).or_default().push(r);
                }
            }
            Some(node) = calls.next(), if !calls.is_empty() => {
                busy.remove(&node);
            }
        }
    }
}

/// Sends `requests` (all for `node`), [`SEMAPHORES_PER_CALL`] per call, every call at once;
/// returns `node` once all have answered.
async fn round(conn: impl RenewCalls, node: Node, mut requests: Vec<Request>) -> Node {
    let mut chunks = Vec::new();
    while !requests.is_empty() {
        let rest = requests.split_off(requests.len().min(SEMAPHORES_PER_CALL));
        chunks.push(std::mem::replace(&mut requests, rest));
    }
    futures_util::future::join_all(chunks.into_iter().map(|chunk| call(conn.clone(), chunk))).await;
    node
}

/// One call for `requests`: `renew.lua` for one, `renew_many.lua` for more; answers each.
async fn call(mut conn: impl RenewCalls, requests: Vec<Request>) {
    let sessions: Vec<Vec<Session<'_>>> = requests
        .iter()
        .map(|r| r.sessions.iter().map(|(s, ms)| (s.as_str(), *ms)).collect())
        .collect();
    let ids: Vec<Vec<&str>> = requests
        .iter()
        .map(|r| r.ids.iter().map(String::as_str).collect())
        .collect();
    let args: Vec<RenewArgs<'_>> = requests
        .iter()
        .zip(sessions.iter().zip(&ids))
        .map(|(r, (sessions, ids))| RenewArgs {
            target: r.remote.target(),
            sessions,
            ids,
        })
        .collect();
    tracing::trace!(semaphores = args.len(), "renewal call");
    let results: Vec<CallResult<Renewal>> = match args.as_slice() {
        [one] => vec![conn.renew(one).await],
        batch => match conn.renew_many(batch).await {
            Ok(results) => results,
            // Redis checks the keys a call names before it runs it: keys of one semaphore that
            // the user may not touch refuse the whole call. Each semaphore then has its own
            // call, and its own answer.
            Err(CallError::Denied(_)) => {
                let single = |a| {
                    let mut conn = conn.clone();
                    async move { conn.renew(a).await }
                };
                futures_util::future::join_all(batch.iter().map(single)).await
            }
            Err(e) => batch.iter().map(|_| Err(e.clone())).collect(),
        },
    };
    drop(args);
    for (request, result) in requests.into_iter().zip(results) {
        let _ = request.reply.send(result);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::protocol::keys::Keys;

    /// The calls made: whether each was a `renew_many` call, and its semaphores.
    type Log = Arc<Mutex<Vec<(bool, Vec<String>)>>>;

    /// Answers every renewal after `delay` with an empty renewal, except those of the
    /// semaphores named `bad*`, which fail alone; records the semaphores of each call, and
    /// whether it was a `renew_many` call.
    #[derive(Clone)]
    struct Recorder {
        delay: Duration,
        calls: Log,
        /// Semaphores named `slot-<n>…` live in hash slot n; the others on one node.
        cluster: bool,
    }

    fn renewal() -> Renewal {
        Renewal {
            next_expiry: None,
            states: Vec::new(),
            seen: (1, 1),
            had_lease: Vec::new(),
            head: None,
            served: Vec::new(),
            issued: None,
            removed: Vec::new(),
            deleted: false,
        }
    }

    fn result_for(name: &str) -> CallResult<Renewal> {
        if name.starts_with("bad") {
            Err(CallError::Unreadable(format!("{name} failed")))
        } else if name.starts_with("denied") {
            Err(CallError::Denied(format!("{name} refused")))
        } else {
            Ok(renewal())
        }
    }

    impl RenewCalls for Recorder {
        fn node_of(&self, remote: &Remote) -> Node {
            match remote.name().strip_prefix("slot-") {
                Some(rest) if self.cluster => {
                    let n: u16 = rest.split('-').next().unwrap().parse().unwrap();
                    Node::Slot(redis::cluster_routing::Slot::new(n).unwrap())
                }
                _ => Node::Single,
            }
        }

        async fn renew(&mut self, a: &RenewArgs<'_>) -> CallResult<Renewal> {
            let name = a.target.keys.name.clone();
            self.calls.lock().unwrap().push((false, vec![name.clone()]));
            tokio::time::sleep(self.delay).await;
            result_for(&name)
        }

        async fn renew_many(
            &mut self,
            batch: &[RenewArgs<'_>],
        ) -> CallResult<Vec<CallResult<Renewal>>> {
            let names: Vec<String> = batch.iter().map(|a| a.target.keys.name.clone()).collect();
            self.calls.lock().unwrap().push((true, names.clone()));
            tokio::time::sleep(self.delay).await;
            // as Redis: keys the user may not touch refuse the whole call
            if let Some(denied) = names.iter().find(|n| n.starts_with("denied")) {
                return Err(CallError::Denied(format!("{denied} refused")));
            }
            Ok(names.iter().map(|n| result_for(n)).collect())
        }
    }

    fn start(cluster: bool) -> (Renewer, Log) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let recorder = Recorder {
            delay: Duration::from_millis(10),
            calls: calls.clone(),
            cluster,
        };
        (Renewer::spawn(recorder), calls)
    }

    fn remote(name: &str) -> Arc<Remote> {
        Arc::new(Remote::new(
            Keys::new("redsem", name).unwrap(),
            1,
            "PUBLISH",
        ))
    }

    /// Renews the semaphore `name` from a task of its own (as a heartbeat does).
    fn spawn_renewal(
        renewer: &Renewer,
        name: &str,
    ) -> tokio::task::JoinHandle<CallResult<Renewal>> {
        let (renewer, remote) = (renewer.clone(), remote(name));
        tokio::spawn(async move { renewer.renew(&remote, &[("s~1", 1)], &["id"]).await })
    }

    /// Renews `names`, each from its own task; one result each, in order.
    async fn renew_all(renewer: &Renewer, names: &[String]) -> Vec<CallResult<Renewal>> {
        let tasks: Vec<_> = names.iter().map(|n| spawn_renewal(renewer, n)).collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    }

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn one_renewal_alone_is_one_renew_call() {
        let (renewer, calls) = start(false);
        let results = renew_all(&renewer, &names("a", 1)).await;
        assert!(results[0].is_ok());
        assert_eq!(*calls.lock().unwrap(), [(false, vec!["a0".to_owned()])]);
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_made_during_a_call_leave_together() {
        let (renewer, calls) = start(false);
        let first = spawn_renewal(&renewer, "first");
        tokio::task::yield_now().await; // the first leaves at once
        let results = renew_all(&renewer, &names("r", 300)).await;
        assert!(first.await.unwrap().is_ok());
        assert!(results.iter().all(Result::is_ok));
        let calls = calls.lock().unwrap();
        assert_eq!(calls[0], (false, vec!["first".to_owned()]));
        // the other 300 gathered meanwhile: at most 256 per call, sent at once
        let sizes: Vec<(bool, usize)> = calls[1..].iter().map(|(m, n)| (*m, n.len())).collect();
        assert_eq!(sizes, [(true, 256), (true, 44)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_semaphore_fails_alone() {
        let (renewer, calls) = start(false);
        let list: Vec<String> = vec!["ok0".into(), "bad".into(), "ok1".into()];
        // sent while nothing is in flight, from one task: they may leave in one or two calls
        let results = renew_all(&renewer, &list).await;
        assert!(results[0].is_ok() && results[2].is_ok());
        assert!(matches!(&results[1], Err(CallError::Unreadable(t)) if t == "bad failed"));
        let sent: usize = calls.lock().unwrap().iter().map(|(_, n)| n.len()).sum();
        assert_eq!(sent, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_refused_for_one_semaphore_is_retried_one_call_each() {
        let (renewer, calls) = start(false);
        let first = spawn_renewal(&renewer, "first");
        tokio::task::yield_now().await; // in flight: the next three leave together
        let list: Vec<String> = vec!["ok0".into(), "denied".into(), "ok1".into()];
        let results = renew_all(&renewer, &list).await;
        assert!(first.await.unwrap().is_ok());
        assert!(results[0].is_ok() && results[2].is_ok());
        assert!(matches!(&results[1], Err(CallError::Denied(t)) if t == "denied refused"));
        let calls = calls.lock().unwrap();
        assert_eq!(calls[1], (true, list.clone()));
        let singles: Vec<&(bool, Vec<String>)> = calls[2..].iter().collect();
        assert_eq!(singles.len(), 3, "{calls:?}");
        assert!(singles.iter().all(|(many, _)| !many));
    }

    #[tokio::test(start_paused = true)]
    async fn on_a_cluster_each_slot_has_its_calls() {
        let (renewer, calls) = start(true);
        let mut list = names("slot-1-", 3);
        list.extend(names("slot-2-", 3));
        let results = renew_all(&renewer, &list).await;
        assert!(results.iter().all(Result::is_ok));
        for (_, names) in calls.lock().unwrap().iter() {
            let slot = &names[0][..6];
            assert!(names.iter().all(|n| n.starts_with(slot)), "{names:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_abandoned_before_it_was_sent_is_skipped() {
        let (renewer, calls) = start(false);
        let first = spawn_renewal(&renewer, "first");
        tokio::task::yield_now().await; // in flight
        let abandoned = spawn_renewal(&renewer, "abandoned");
        tokio::task::yield_now().await;
        abandoned.abort();
        let _ = abandoned.await;
        let kept = renew_all(&renewer, &names("kept", 1)).await;
        assert!(first.await.unwrap().is_ok() && kept[0].is_ok());
        let sent: Vec<String> = calls
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, n)| n.clone())
            .collect();
        assert_eq!(sent, ["first", "kept0"]);
    }
}

//! Batching of concurrent acquisitions and of concurrent in-place releases.
//!
//! Every acquire of a semaphore handle goes through one task that sends the requests waiting
//! for it as one `acquire.lua` call, in arrival order. With no other request pending, a
//! request is sent at once (no added latency); while a call is in flight, new requests
//! gather and leave together with the next one. A burst of N acquires thus costs a few round
//! trips instead of N, and a waiting task does not keep a script call of its own in flight.
//!
//! Cancellation: a request whose acquire was dropped before it was sent is skipped, and so
//! is every request once the handle is closed (its acquire fails with `Closed`). One
//! dropped while its call was in flight is released by this task once the call returned, so
//! the release always reaches Redis after the entry was created.

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::releaser::Releaser;
use super::remote::{Calls, Remote};
use crate::error::CallResult;
use crate::protocol::{AcquireArgs, AcquireReply, Removal};

/// Most acquisitions sent in one script call.
const ACQUIRES_PER_CALL: usize = 256;

/// One acquisition waiting to be sent.
pub(crate) struct Request {
    pub(crate) id: Arc<str>,
    pub(crate) n: u32,
    pub(crate) try_only: bool,
    /// A holder lease or label other than the handle's.
    pub(crate) custom: Option<Arc<Custom>>,
    pub(crate) reply: oneshot::Sender<CallResult<AcquireReply>>,
}

/// What one acquisition may set for itself instead of taking the handle's settings
/// (validated by the public layer).
#[derive(Debug, Default)]
pub(crate) struct Custom {
    /// The holder's lease (the waiter's stays the handle's).
    pub(crate) lease: Option<std::time::Duration>,
    /// The label shown in the semaphore's stats.
    pub(crate) label: Option<String>,
    /// The priority class (0: the default, plain FIFO).
    pub(crate) priority: u8,
    /// The longest the permit may be held (not sent to Redis: the permit's own timer, see
    /// `Held`).
    pub(crate) max_hold: Option<std::time::Duration>,
}

/// The request settings of one handle: what every acquisition it sends shares.
pub(crate) struct RequestSettings {
    pub(crate) lease_ms: u64,
    pub(crate) wait_lease_ms: u64,
    /// The handle's channel id (where its grants are published).
    pub(crate) channel_id: String,
    pub(crate) label: String,
}

/// Starts the batching task of one semaphore handle; it ends when the sender is dropped.
/// `conn`: a connection (or a stand-in, in the unit tests).
pub(crate) fn spawn(
    remote: Arc<Remote>,
    closed: CancellationToken,
    conn: impl Calls,
    releaser: Releaser,
    settings: RequestSettings,
) -> mpsc::UnboundedSender<Request> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(rx, remote, closed, conn, releaser, settings));
    tx
}

async fn run(
    mut rx: mpsc::UnboundedReceiver<Request>,
    remote: Arc<Remote>,
    closed: CancellationToken,
    mut conn: impl Calls,
    releaser: Releaser,
    settings: RequestSettings,
) {
    let mut buf: Vec<Request> = Vec::with_capacity(ACQUIRES_PER_CALL);
    loop {
        // Once the handle is closed, nothing more is sent: dropping the receiver answers
        // every request sent later `Closed`.
        let received = tokio::select! {
            n = rx.recv_many(&mut buf, ACQUIRES_PER_CALL) => n,
            _ = closed.cancelled() => 0,
        };
        if received == 0 {
            return;
        }
        // abandoned before anything was sent, or the handle closed: nothing to do in Redis
        // (a dropped reply sender tells the acquire `Closed`)
        if closed.is_cancelled() {
            buf.clear();
        }
        buf.retain(|r| !r.reply.is_closed());
        if buf.is_empty() {
            continue;
        }
        let args: Vec<AcquireArgs<'_>> = buf
            .iter()
            .map(|r| {
                let custom = r.custom.as_deref();
                AcquireArgs {
                    id: &r.id,
                    n: r.n,
                    lease_ms: custom
                        .and_then(|c| c.lease)
                        .map_or(settings.lease_ms, |l| l.as_millis() as u64),
                    wait_lease_ms: settings.wait_lease_ms,
                    channel_id: &settings.channel_id,
                    label: custom
                        .and_then(|c| c.label.as_deref())
                        .unwrap_or(&settings.label),
                    try_only: r.try_only,
                    priority: custom.map_or(0, |c| c.priority),
                }
            })
            .collect();
        let result = conn.acquire(&remote, &args).await;
        drop(args);
        let replies: Vec<CallResult<AcquireReply>> = match result {
            Ok(replies) => replies.into_iter().map(Ok).collect(),
            Err(e) => buf.iter().map(|_| Err(e.clone())).collect(),
        };
        for (req, reply) in buf.drain(..).zip(replies) {
            let created = !matches!(
                reply,
                Ok(AcquireReply::NoCapacity { .. }) | Ok(AcquireReply::TooMany { .. })
            );
            if req.reply.send(reply).is_err() && created {
                // its acquire was dropped while the call was in flight
                releaser.release(&remote, req.id.to_string());
            }
        }
    }
}

/// Most releases sent in one script call.
const RELEASES_PER_CALL: usize = 256;

/// The in-place releases ([`Held::release`](super::held::Held::release)) of one semaphore
/// handle, combined: a release made while none is in flight is sent at once by its own task
/// (no hand-over to another task, so a lone release costs exactly one round trip); releases
/// made while one is in flight gather and leave together as one `release.lua` call once it
/// returned, sent by a task spawned for them, which keeps sending what gathers meanwhile.
/// N concurrent releases thus cost a few calls instead of N.
///
/// No retries here: a failed call is reported to each release it carried, whose permits
/// hand them to the background releaser (see `Held::release`).
pub(crate) struct Releases<C: Calls> {
    remote: Arc<Remote>,
    conn: C,
    state: Mutex<Combining>,
}

/// Whether a release call is in flight, and the releases waiting for it to return.
#[derive(Default)]
struct Combining {
    in_flight: bool,
    waiting: Vec<Waiting>,
}

/// A release waiting for the call in flight to return: its id, and where its answer goes.
type Waiting = (String, oneshot::Sender<CallResult<()>>);

impl<C: Calls + Sync> Releases<C> {
    pub(crate) fn new(remote: Arc<Remote>, conn: C) -> Arc<Releases<C>> {
        Arc::new(Releases {
            remote,
            conn,
            state: Mutex::new(Combining::default()),
        })
    }

    /// Removes the entry `id` (idempotent) and returns what Redis answered to the call that
    /// carried it, or `None` if that call was never made (the runtime is shutting down).
    ///
    /// Cancel safe: dropping the future may leave the release sent or not (the caller then
    /// releases again in the background); the releases waiting behind it are sent all the
    /// same.
    pub(crate) async fn release(self: &Arc<Self>, id: String) -> Option<CallResult<()>> {
        let waiting = {
            let mut st = self.state.lock().unwrap();
            if st.in_flight {
                let (tx, rx) = oneshot::channel();
                st.waiting.push((id.clone(), tx));
                Some(rx)
            } else {
                st.in_flight = true;
                None
            }
        };
        if let Some(rx) = waiting {
            return rx.await.ok();
        }
        let turn = Turn(self.clone());
        let mut conn = self.conn.clone();
        let result = conn
            .release(&self.remote, &Removal::of(&[id.as_str()]))
            .await
            .map(drop);
        drop(turn);
        Some(result)
    }

    /// Sends the waiting releases, in calls of at most [`RELEASES_PER_CALL`], until none is
    /// left.
    async fn drain(self: Arc<Self>, mut batch: Vec<Waiting>) {
        let mut conn = self.conn.clone();
        loop {
            let ids: Vec<&str> = batch.iter().map(|(id, _)| id.as_str()).collect();
            let result = conn
                .release(&self.remote, &Removal::of(&ids))
                .await
                .map(drop);
            drop(ids);
            for (_, done) in batch.drain(..) {
                let _ = done.send(result.clone());
            }
            let mut st = self.state.lock().unwrap();
            if st.waiting.is_empty() {
                st.in_flight = false;
                return;
            }
            let n = st.waiting.len().min(RELEASES_PER_CALL);
            batch = st.waiting.drain(..n).collect();
        }
    }
}

/// The turn of a release sent at once: when it ends (its call returned, or its future was
/// dropped), the releases that gathered meanwhile go to a task of their own, or nothing is
/// in flight any more.
struct Turn<C: Calls + Sync>(Arc<Releases<C>>);

impl<C: Calls + Sync> Drop for Turn<C> {
    fn drop(&mut self) {
        let mut st = self.0.state.lock().unwrap();
        if st.waiting.is_empty() {
            st.in_flight = false;
            return;
        }
        let n = st.waiting.len().min(RELEASES_PER_CALL);
        let batch: Vec<_> = st.waiting.drain(..n).collect();
        drop(st);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(self.0.clone().drain(batch))),
            // no runtime (dropped while shutting down): the waiting releases are told so
            // (their permits release in the background), and nothing is in flight
            Err(_) => {
                let mut st = self.0.state.lock().unwrap();
                st.waiting.clear();
                st.in_flight = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::engine::releaser::Job;
    use crate::protocol::keys::Keys;

    /// Answers every request `Queued`, with tickets in the order the requests were sent,
    /// after `delay`; records the ids of each call.
    #[derive(Clone)]
    struct Recorder {
        delay: Duration,
        calls: Arc<Mutex<Vec<Vec<String>>>>,
        tickets: Arc<Mutex<u64>>,
    }

    impl Calls for Recorder {
        async fn acquire(
            &mut self,
            _: &Remote,
            batch: &[AcquireArgs<'_>],
        ) -> CallResult<Vec<AcquireReply>> {
            let ids = batch.iter().map(|a| a.id.to_owned()).collect();
            self.calls.lock().unwrap().push(ids);
            let replies = batch
                .iter()
                .map(|_| {
                    let mut t = self.tickets.lock().unwrap();
                    *t += 1;
                    AcquireReply::Queued {
                        ticket: *t,
                        next_expiry_ms: None,
                    }
                })
                .collect();
            tokio::time::sleep(self.delay).await;
            Ok(replies)
        }

        async fn release(&mut self, _: &Remote, _: &Removal<'_>) -> CallResult<u64> {
            unreachable!("the batching task hands releases to the releaser")
        }
    }

    struct Task {
        tx: mpsc::UnboundedSender<Request>,
        closed: CancellationToken,
        calls: Arc<Mutex<Vec<Vec<String>>>>,
        released: mpsc::UnboundedReceiver<Job>,
    }

    fn start() -> Task {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let recorder = Recorder {
            delay: Duration::from_millis(10),
            calls: calls.clone(),
            tickets: Default::default(),
        };
        let (releaser, released) = Releaser::detached();
        let closed = CancellationToken::new();
        let remote = Arc::new(Remote::new(
            Keys::new("redsem", "b").unwrap(),
            10,
            "PUBLISH",
        ));
        let settings = RequestSettings {
            lease_ms: 1000,
            wait_lease_ms: 1000,
            channel_id: "c.0".into(),
            label: String::new(),
        };
        let tx = spawn(remote, closed.clone(), recorder, releaser, settings);
        Task {
            tx,
            closed,
            calls,
            released,
        }
    }

    fn request(task: &Task, id: &str) -> oneshot::Receiver<CallResult<AcquireReply>> {
        let (reply, rx) = oneshot::channel();
        let request = Request {
            id: id.into(),
            n: 1,
            try_only: false,
            custom: None,
            reply,
        };
        task.tx.send(request).unwrap();
        rx
    }

    fn ticket(reply: CallResult<AcquireReply>) -> u64 {
        match reply {
            Ok(AcquireReply::Queued { ticket, .. }) => ticket,
            _ => panic!("not queued"),
        }
    }

    fn calls(task: &Task) -> Vec<Vec<String>> {
        task.calls.lock().unwrap().clone()
    }

    #[tokio::test(start_paused = true)]
    async fn requests_made_during_a_call_leave_together_in_arrival_order() {
        let task = start();
        let first = request(&task, "r0");
        tokio::task::yield_now().await; // r0 leaves at once
        let rest: Vec<_> = ["r1", "r2", "r3", "r4", "r5"]
            .iter()
            .map(|id| request(&task, id))
            .collect();
        assert_eq!(ticket(first.await.unwrap()), 1);
        let mut tickets = Vec::new();
        for rx in rest {
            tickets.push(ticket(rx.await.unwrap()));
        }
        assert_eq!(tickets, [2, 3, 4, 5, 6], "tickets follow the arrival order");
        assert_eq!(
            calls(&task),
            [vec!["r0"], vec!["r1", "r2", "r3", "r4", "r5"]]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_dropped_before_it_was_sent_is_skipped() {
        let mut task = start();
        let first = request(&task, "r0");
        tokio::task::yield_now().await;
        let a = request(&task, "a");
        drop(request(&task, "dropped"));
        let b = request(&task, "b");
        first.await.unwrap().unwrap();
        assert_eq!(ticket(a.await.unwrap()), 2);
        assert_eq!(ticket(b.await.unwrap()), 3);
        assert_eq!(calls(&task), [vec!["r0"], vec!["a", "b"]]);
        assert!(task.released.try_recv().is_err(), "nothing to release");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_dropped_in_flight_is_released_once_its_call_returned() {
        let mut task = start();
        let rx = request(&task, "in-flight");
        tokio::task::yield_now().await; // sent
        drop(rx);
        assert!(
            task.released.try_recv().is_err(),
            "not before the call returned"
        );
        match task.released.recv().await {
            Some(Job::Release { id, .. }) => assert_eq!(id, "in-flight"),
            _ => panic!("no release"),
        }
        assert_eq!(calls(&task), [vec!["in-flight"]]);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_sent_once_the_handle_is_closed() {
        let task = start();
        task.closed.cancel();
        let rx = request(&task, "late");
        assert!(rx.await.is_err(), "answered Closed (sender dropped)");
        assert!(calls(&task).is_empty());
    }

    /// Records the ids of each release call, which takes `delay`.
    #[derive(Clone)]
    struct ReleaseRecorder {
        delay: Duration,
        calls: CallLog,
    }

    impl Calls for ReleaseRecorder {
        async fn acquire(
            &mut self,
            _: &Remote,
            _: &[AcquireArgs<'_>],
        ) -> CallResult<Vec<AcquireReply>> {
            unreachable!("releases only")
        }

        async fn release(&mut self, _: &Remote, r: &Removal<'_>) -> CallResult<u64> {
            let ids: Vec<String> = r.ids.iter().map(|s| s.to_string()).collect();
            self.calls.lock().unwrap().push(ids);
            tokio::time::sleep(self.delay).await;
            Ok(r.ids.len() as u64)
        }
    }

    /// The ids of each call made, in order.
    type CallLog = Arc<Mutex<Vec<Vec<String>>>>;

    fn releases() -> (Arc<Releases<ReleaseRecorder>>, CallLog) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let conn = ReleaseRecorder {
            delay: Duration::from_millis(10),
            calls: calls.clone(),
        };
        let remote = Arc::new(Remote::new(
            Keys::new("redsem", "r").unwrap(),
            10,
            "PUBLISH",
        ));
        (Releases::new(remote, conn), calls)
    }

    /// `r.release(id)` in a task of its own.
    fn spawn_release(
        r: &Arc<Releases<ReleaseRecorder>>,
        id: &str,
    ) -> tokio::task::JoinHandle<Option<CallResult<()>>> {
        let (r, id) = (r.clone(), id.to_owned());
        tokio::spawn(async move { r.release(id).await })
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_release_is_sent_at_once_by_its_own_task() {
        let (r, calls) = releases();
        let start = tokio::time::Instant::now();
        assert!(matches!(r.release("a".into()).await, Some(Ok(()))));
        assert_eq!(start.elapsed(), Duration::from_millis(10), "one call");
        assert_eq!(*calls.lock().unwrap(), [vec!["a"]]);
        assert!(matches!(r.release("b".into()).await, Some(Ok(()))));
        assert_eq!(*calls.lock().unwrap(), [vec!["a"], vec!["b"]]);
    }

    #[tokio::test(start_paused = true)]
    async fn releases_made_during_a_call_leave_together_once_it_returned() {
        let (r, calls) = releases();
        let first = spawn_release(&r, "a");
        tokio::task::yield_now().await; // "a" is in flight
        let rest: Vec<_> = ["b", "c", "d"]
            .iter()
            .map(|id| spawn_release(&r, id))
            .collect();
        assert!(matches!(first.await.unwrap(), Some(Ok(()))));
        for t in rest {
            assert!(matches!(t.await.unwrap(), Some(Ok(()))));
        }
        assert_eq!(*calls.lock().unwrap(), [vec!["a"], vec!["b", "c", "d"]]);
        // nothing in flight any more: the next one leaves at once, alone
        assert!(matches!(r.release("e".into()).await, Some(Ok(()))));
        assert_eq!(calls.lock().unwrap().last().unwrap(), &["e"]);
    }

    #[tokio::test(start_paused = true)]
    async fn releases_waiting_behind_a_dropped_release_are_sent_all_the_same() {
        let (r, calls) = releases();
        let first = spawn_release(&r, "a");
        tokio::task::yield_now().await; // "a" is in flight
        let waiting = spawn_release(&r, "b");
        tokio::task::yield_now().await; // "b" waits behind it
        first.abort();
        assert!(matches!(waiting.await.unwrap(), Some(Ok(()))));
        assert_eq!(*calls.lock().unwrap(), [vec!["a"], vec!["b"]]);
    }
}

//! Batching of concurrent acquisitions (in-place releases are combined in `combine.rs`).
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

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::releaser::Releaser;
use super::remote::{Calls, Remote};
use crate::error::CallResult;
use crate::protocol::{AcquireArgs, AcquireReply};

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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use crate::protocol::Removal;
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
}

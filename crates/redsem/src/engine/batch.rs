//! Batching of concurrent acquisitions.
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
use super::remote::Remote;
use crate::error::CallResult;
use crate::scripts::{self, AcquireArgs, AcquireReply, Conn};

/// Most acquisitions sent in one script call.
const ACQUIRES_PER_CALL: usize = 256;

/// One acquisition waiting to be sent.
pub(crate) struct Request {
    pub(crate) id: Arc<str>,
    pub(crate) n: u32,
    pub(crate) try_only: bool,
    pub(crate) reply: oneshot::Sender<CallResult<AcquireReply>>,
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
pub(crate) fn spawn(
    remote: Arc<Remote>,
    closed: CancellationToken,
    conn: Conn,
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
    mut conn: Conn,
    releaser: Releaser,
    settings: RequestSettings,
) {
    let mut buf: Vec<Request> = Vec::with_capacity(ACQUIRES_PER_CALL);
    while rx.recv_many(&mut buf, ACQUIRES_PER_CALL).await > 0 {
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
            .map(|r| AcquireArgs {
                id: &r.id,
                n: r.n,
                lease_ms: settings.lease_ms,
                wait_lease_ms: settings.wait_lease_ms,
                channel_id: &settings.channel_id,
                label: &settings.label,
                try_only: r.try_only,
            })
            .collect();
        let result = scripts::acquire(&mut conn, &remote.target(), &args).await;
        drop(args);
        let replies: Vec<CallResult<AcquireReply>> = match result {
            Ok(replies) => replies.into_iter().map(Ok).collect(),
            Err(e) => buf.iter().map(|_| Err(e.clone())).collect(),
        };
        for (req, reply) in buf.drain(..).zip(replies) {
            let created = !matches!(
                reply,
                Ok(AcquireReply::NoCapacity) | Ok(AcquireReply::TooMany { .. })
            );
            if req.reply.send(reply).is_err() && created {
                // its acquire was dropped while the call was in flight
                releaser.release(&remote, req.id.to_string());
            }
        }
    }
}

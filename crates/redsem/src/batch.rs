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

use crate::driver::{Driver, Msg};
use crate::scripts::{self, AcquireArgs, AcquireReply, Conn};
use crate::semaphore::Core;

/// Most requests sent in one script call.
const MAX_BATCH: usize = 256;

/// One acquisition waiting to be sent.
pub(crate) struct Request {
    pub(crate) id: Arc<str>,
    pub(crate) n: u32,
    pub(crate) try_only: bool,
    pub(crate) reply: oneshot::Sender<redis::RedisResult<AcquireReply>>,
}

/// What every request of one handle shares.
pub(crate) struct Fixed {
    pub(crate) lease_ms: u64,
    pub(crate) wait_lease_ms: u64,
    pub(crate) channel_suffix: String,
    pub(crate) label: String,
}

/// Starts the batching task of one semaphore handle; it ends when the sender is dropped.
pub(crate) fn spawn(
    core: Arc<Core>,
    closed: CancellationToken,
    conn: Conn,
    driver: Driver,
    fixed: Fixed,
) -> mpsc::UnboundedSender<Request> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(rx, core, closed, conn, driver, fixed));
    tx
}

async fn run(
    mut rx: mpsc::UnboundedReceiver<Request>,
    core: Arc<Core>,
    closed: CancellationToken,
    mut conn: Conn,
    driver: Driver,
    fixed: Fixed,
) {
    let mut buf: Vec<Request> = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut buf, MAX_BATCH).await > 0 {
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
                lease_ms: fixed.lease_ms,
                wait_lease_ms: fixed.wait_lease_ms,
                client_channel: &fixed.channel_suffix,
                label: &fixed.label,
                try_only: r.try_only,
            })
            .collect();
        let result = scripts::acquire(&mut conn, &core.target(), &args).await;
        drop(args);
        let replies: Vec<redis::RedisResult<AcquireReply>> = match result {
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
                driver.send(Msg::Release {
                    core: core.clone(),
                    id: req.id.to_string(),
                });
            }
        }
    }
}

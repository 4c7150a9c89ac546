//! Graceful shutdown (`Client::shutdown`): releases flushed, handles closed, held permits
//! given up, channels unsubscribed, so that a quick rerun never waits for a lease.

mod common;

use std::time::Duration;

use common::*;
use redsem::{Error, LostReason};

fn subscribed_channels(server: &Server) -> usize {
    match server.cmd(&["PUBSUB", "CHANNELS", "*"]) {
        Reply::Array(a) => a.len(),
        other => panic!("PUBSUB CHANNELS answered {other:?}"),
    }
}

/// A process that drops its permit and shuts down leaves nothing in Redis, at once: the
/// next run gets the slot without waiting for the (long) lease.
#[tokio::test]
async fn a_quick_rerun_gets_the_slot_at_once() {
    for server in servers() {
        for run in 0..2 {
            let client = client(&server).await;
            let sem = open(&client, "rerun", 1, Duration::from_secs(60)).await;
            let permit = sem
                .try_acquire()
                .await
                .unwrap_or_else(|e| panic!("{} run {run}: {e}", server.flavor()));
            drop(permit);
            client.shutdown().await;
            assert_eq!(
                entries(&server, "rerun"),
                [0, 0, 0, 0],
                "{}: released before shutdown returned",
                server.flavor()
            );
        }
    }
}

#[tokio::test]
async fn shutdown_closes_handles_gives_up_held_permits_and_unsubscribes() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "shut", 1, Duration::from_secs(60)).await;
        let other = open(&client, "shut-other", 2, Duration::from_secs(60)).await;
        let held = sem.acquire().await.unwrap();
        let guarded = {
            let p = other.acquire().await.unwrap();
            tokio::spawn(p.run(std::future::pending::<()>()))
        };
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "shut", "queue")
                == 1)
            .await
        );
        assert!(subscribed_channels(&server) >= 2);

        client.shutdown().await;

        assert!(client.is_shut_down());
        assert_eq!(
            entries(&server, "shut"),
            [0, 0, 0, 0],
            "{}",
            server.flavor()
        );
        assert_eq!(entries(&server, "shut-other"), [0, 0, 0, 0]);
        assert!(held.is_lost());
        assert_eq!(held.lost().await, LostReason::Shutdown);
        match guarded.await.unwrap() {
            Err(Error::LeaseLost {
                reason: LostReason::Shutdown,
                ..
            }) => {}
            other => panic!("the guarded work was not cancelled: {other:?}"),
        }
        match waiter.await.unwrap() {
            Err(e @ Error::Closed { .. }) => {
                assert_eq!(e.semaphore(), Some("shut"));
                assert!(e.to_string().contains("\"shut\""), "{e}");
            }
            other => panic!("the waiter was not closed: {other:?}"),
        }
        assert!(matches!(sem.acquire().await, Err(Error::Closed { .. })));
        let reopened = client.semaphore("shut", 1).open().await;
        assert!(
            matches!(reopened, Err(Error::Closed { .. })),
            "{reopened:?}"
        );
        assert!(
            eventually(Duration::from_secs(5), || subscribed_channels(&server) == 0).await,
            "{}: channels left subscribed",
            server.flavor()
        );
        drop(held);
        client.shutdown().await; // idempotent
        assert_eq!(entries(&server, "shut"), [0, 0, 0, 0]);
    }
}

/// Shutting down one client leaves the others alone.
#[tokio::test]
async fn shutdown_affects_only_its_own_client() {
    let server = Server::start(Flavor::Redis);
    let a = client(&server).await;
    let b = client(&server).await;
    let sa = open(&a, "shut-one", 2, Duration::from_secs(60)).await;
    let sb = open(&b, "shut-one", 2, Duration::from_secs(60)).await;
    let pa = sa.acquire().await.unwrap();
    let pb = sb.acquire().await.unwrap();
    a.shutdown().await;
    assert!(pa.is_lost());
    assert!(!pb.is_lost());
    assert_eq!(card(&server, "shut-one", "slots"), 1);
    let again = sb.try_acquire().await.unwrap();
    drop((pb, again));
    b.shutdown().await;
    assert_eq!(entries(&server, "shut-one"), [0, 0, 0, 0]);
}

/// After `shutdown`, every call of the client fails with `Closed` and sends nothing (the
/// operator calls too, which worked before: a program that closed its client must not go on
/// resizing or deleting through it); another client is unaffected.
#[tokio::test]
async fn after_shutdown_every_call_of_the_client_fails_closed_and_sends_nothing() {
    for server in servers() {
        let other = client(&server).await;
        let sem = open(&other, "kept", 3, Duration::from_secs(60)).await;
        let held = sem.acquire().await.unwrap();
        // (the connection of the count itself included)
        let connections = || match server.cmd(&["CLIENT", "LIST"]) {
            Reply::Bulk(s) => s.lines().count(),
            other => panic!("CLIENT LIST answered {other:?}"),
        };
        let baseline = connections();
        let client = client(&server).await;
        let handle = open(&client, "kept", 3, Duration::from_secs(60)).await;
        assert_eq!(connections(), baseline + 2, "{}", server.flavor());
        client.shutdown().await;
        // both connections are closed, while the client and a handle of it are still held
        // (before, the command connection lasted as long as they did)
        assert!(
            eventually(Duration::from_secs(5), || connections() == baseline).await,
            "{}: {} connections after shutdown, {baseline} before the client",
            server.flavor(),
            connections()
        );
        // the commands those calls would send (the other client's renewal is 20 s away)
        let sent = || {
            let others = ["ping", "scan", "function|load", "script|load"];
            script_calls(&server) + others.iter().map(|c| calls(&server, c)).sum::<u64>()
        };
        let before = sent();
        let closed = |what: &str, r: Result<(), Error>, name: &str| match r {
            Err(e @ Error::Closed { .. }) => {
                assert_eq!(e.semaphore(), (!name.is_empty()).then_some(name), "{what}");
                if name.is_empty() {
                    assert!(
                        e.to_string().contains("client was shut down"),
                        "{what}: {e}"
                    );
                }
            }
            other => panic!("{} {what}: {other:?}", server.flavor()),
        };
        closed("ping", client.ping().await, "");
        closed("list", client.list_semaphores().await.map(drop), "");
        closed("load", client.load_library().await.map(drop), "");
        closed("inspect", client.inspect("kept").await.map(drop), "kept");
        let r = client.resize_existing("kept", 1).await.map(drop);
        closed("resize", r, "kept");
        let r = client.add_permits_existing("kept", -1).await.map(drop);
        closed("add", r, "kept");
        let r = client
            .force_release_existing("kept", held.holder_id())
            .await;
        closed("release", r.map(drop), "kept");
        closed(
            "delete",
            client.delete_semaphore("kept", true).await.map(drop),
            "kept",
        );
        closed("purge", client.purge_keys("kept").await.map(drop), "kept");
        // and the calls of its handles
        closed("stats", handle.stats().await.map(drop), "kept");
        closed("resize", handle.resize(2).await.map(drop), "kept");
        closed(
            "force release",
            handle.force_release("x").await.map(drop),
            "kept",
        );
        assert_eq!(sent(), before, "{}: commands were sent", server.flavor());
        drop((client, handle));
        assert_eq!(connections(), baseline);
        assert!(!held.is_lost());
        assert_eq!(other.inspect("kept").await.unwrap().limit, 3);
        drop(held);
        other.shutdown().await;
    }
}

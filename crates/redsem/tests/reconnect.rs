//! Reconnects, with a fault-injecting proxy between the client and Redis: dropped connections
//! come back with backoff, waiters are re-checked right after the subscriber resubscribes, no
//! waiter waits longer than the fallback interval for a grant whose notification was lost,
//! and a holder's lease survives an outage shorter than the lease.

mod common;

use std::time::{Duration, Instant};

use common::*;
use redsem::{Client, LostReason};
use test_support::FaultProxy;

async fn client_at(url: &str) -> Client {
    Client::builder(url)
        .connect_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap()
}

/// A client through `proxy`, and its handle of `name` (limit 1) with `lease`, renewed every
/// 300 ms.
async fn open_through(
    proxy: &FaultProxy,
    name: &str,
    lease: Duration,
) -> (Client, redsem::Semaphore) {
    let client = client_at(&proxy.url()).await;
    let sem = client
        .semaphore(name, 1)
        .lease(lease)
        .renew_every(Duration::from_millis(300))
        .open()
        .await
        .unwrap();
    (client, sem)
}

/// A long lease and renewal interval: waiters are renewed (and so polled) only every
/// renewal interval (8 s), so prompt progress shows the notifier at work.
fn rarely_polled(c: &Client, name: &str, fallback: Duration) -> redsem::SemaphoreBuilder {
    c.semaphore(name, 1)
        .lease(Duration::from_secs(24))
        .renew_every(Duration::from_secs(8))
        .fallback_poll(fallback)
}

/// `client` (through the proxy) waits on `name` while `other` (direct) holds it.
async fn waiting(
    client: &Client,
    other: &Client,
    server: &Server,
    name: &str,
    fallback: Duration,
) -> (redsem::Permit, tokio::task::JoinHandle<redsem::Permit>) {
    let open = |c: &Client| rarely_polled(c, name, fallback).open();
    let held = open(other).await.unwrap().acquire().await.unwrap();
    let sem = open(client).await.unwrap();
    let waiter = tokio::spawn(async move { sem.acquire().await.unwrap() });
    assert!(eventually(Duration::from_secs(5), || card(server, name, "queue") == 1).await);
    (held, waiter)
}

#[tokio::test]
async fn severed_connections_come_back_and_waiters_are_rechecked_after_resubscribing() {
    for server in servers() {
        let proxy = FaultProxy::start(server.addr());
        let client = client_at(&proxy.url()).await;
        let other = client_at(&server.url()).await;
        let (held, waiter) =
            waiting(&client, &other, &server, "sever", Duration::from_secs(30)).await;
        assert_eq!(proxy.connections(), 2, "commands and subscriber");

        // cut both connections and keep them down while the holder releases: the grant's
        // notification is published while nobody listens
        proxy.refuse_new(true);
        proxy.sever_all();
        held.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiter.is_finished());
        let healed = Instant::now();
        proxy.refuse_new(false);
        let p = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter hung after the reconnect")
            .unwrap();
        let waited = healed.elapsed();
        println!(
            "{}: granted {waited:?} after the connections came back",
            server.flavor()
        );
        // re-checked right after the resubscription, not at its next renewal (8 s)
        assert!(
            waited < Duration::from_secs(4),
            "{}: {waited:?}",
            server.flavor()
        );
        assert!(
            eventually(Duration::from_secs(5), || proxy.connections() == 2).await,
            "{}: {} connections",
            server.flavor(),
            proxy.connections()
        );
        // both connections work: a new acquire (commands), and a notified wake-up (subscriber)
        // with polls too rare to explain a wake-up within 4 s
        let sem = rarely_polled(&client, "sever", Duration::from_secs(30))
            .open()
            .await
            .unwrap();
        let w = tokio::spawn(async move { sem.acquire().await.unwrap() });
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "sever", "queue")
                == 1)
            .await
        );
        let released = Instant::now();
        drop(p);
        let p2 = tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .unwrap()
            .unwrap();
        // notified, not polled: well within the renewal interval (8 s), which is when the
        // waiter would next poll
        assert!(
            released.elapsed() < Duration::from_secs(4),
            "{}: woken {:?} after the release",
            server.flavor(),
            released.elapsed()
        );
        drop(p2);
    }
}

#[tokio::test]
async fn reconnects_back_off_while_the_server_refuses() {
    for server in servers() {
        let proxy = FaultProxy::start(server.addr());
        let client = client_at(&proxy.url()).await;
        let sem = client
            .semaphore("backoff", 1)
            .lease(Duration::from_secs(20))
            .renew_every(Duration::from_millis(200))
            .open()
            .await
            .unwrap();
        let held = sem.acquire().await.unwrap();
        proxy.refuse_new(true);
        let before = proxy.attempts();
        proxy.sever_all();
        tokio::time::sleep(Duration::from_secs(4)).await;
        let attempts = proxy.attempts() - before;
        println!(
            "{}: {attempts} connection attempts in 4 s of refusal",
            server.flavor()
        );
        // it keeps trying, but with backoff: not a tight loop
        assert!(attempts >= 2, "{}: {attempts}", server.flavor());
        assert!(attempts <= 60, "{}: {attempts}", server.flavor());
        proxy.refuse_new(false);
        assert!(eventually(Duration::from_secs(10), || proxy.connections() == 2).await);
        // the holder's lease (20 s) outlived the outage
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!held.is_lost(), "{}", server.flavor());
        held.release().await.unwrap();
    }
}

/// The subscriber connection dies and cannot come back; the command connection lives.
fn cut_notifications(proxy: &FaultProxy, server: &Server) {
    proxy.refuse_new(true);
    kill_subscribers(server);
}

#[tokio::test]
async fn no_waiter_waits_longer_than_the_fallback_interval_for_a_lost_notification() {
    for server in servers() {
        let proxy = FaultProxy::start(server.addr());
        let client = client_at(&proxy.url()).await;
        let other = client_at(&server.url()).await;
        let fallback = Duration::from_millis(700);
        let (held, waiter) = waiting(&client, &other, &server, "lost", fallback).await;
        cut_notifications(&proxy, &server);
        let released = Instant::now();
        held.release().await.unwrap();
        let p = tokio::time::timeout(fallback * 6, waiter)
            .await
            .expect("the waiter hung past its fallback interval")
            .unwrap();
        let waited = released.elapsed();
        println!(
            "{}: granted {waited:?} after the release, with no subscriber (fallback {fallback:?})",
            server.flavor()
        );
        // found by the fallback poll (the subscriber is still down); a generous bound for a
        // loaded machine
        assert!(waited < fallback * 3, "{}: {waited:?}", server.flavor());
        proxy.refuse_new(false);
        drop(p);
    }
}

/// A grant whose notification is lost is found by the fallback poll also when, right after
/// it, a request of a higher priority class queued ahead of every waiter: the head of the
/// queue is then below the granted waiter's place, and only the highest ticket granted in its
/// class (the renewal's `served`) tells its client to look.
#[tokio::test]
async fn a_lost_notification_is_found_although_a_higher_class_queued_ahead() {
    for server in servers() {
        let proxy = FaultProxy::start(server.addr());
        let client = client_at(&proxy.url()).await;
        let other = client_at(&server.url()).await;
        let fallback = Duration::from_millis(700);
        let (held, waiter) = waiting(&client, &other, &server, "lost-prio", fallback).await;
        cut_notifications(&proxy, &server);
        let urgent = rarely_polled(&other, "lost-prio", fallback)
            .open()
            .await
            .unwrap();
        let released = Instant::now();
        held.release().await.unwrap();
        // granted in Redis (unnotified); now a class-5 request queues at the head
        let ahead = tokio::spawn(async move {
            urgent
                .acquire_with(redsem::AcquireOptions::new().priority(5))
                .await
                .unwrap()
        });
        assert!(
            eventually(Duration::from_secs(5), || card(
                &server,
                "lost-prio",
                "queue"
            ) == 1)
            .await
        );
        let p = tokio::time::timeout(fallback * 6, waiter)
            .await
            .expect("the waiter hung: its lost grant was not looked for")
            .unwrap();
        let waited = released.elapsed();
        assert!(waited < fallback * 4, "{}: {waited:?}", server.flavor());
        proxy.refuse_new(false);
        drop(p);
        drop(ahead.await.unwrap());
    }
}

#[tokio::test]
async fn a_holder_survives_an_outage_shorter_than_its_lease_and_not_a_longer_one() {
    for server in servers() {
        let proxy = FaultProxy::start(server.addr());
        let lease = Duration::from_secs(3);
        let (_client, sem) = open_through(&proxy, "outage", lease).await;
        let held = sem.acquire().await.unwrap();
        let lost = held.lost();

        // a stall (no disconnect notice) of half the lease
        proxy.blackhole(true);
        tokio::time::sleep(lease / 2).await;
        proxy.blackhole(false);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!held.is_lost(), "{}: lost in a stall", server.flavor());
        // the connections cut and refused for half the lease
        proxy.refuse_new(true);
        proxy.sever_all();
        tokio::time::sleep(lease / 2).await;
        proxy.refuse_new(false);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !held.is_lost(),
            "{}: lost in a short outage",
            server.flavor()
        );
        assert_eq!(card(&server, "outage", "slots"), 1);

        // an outage longer than the lease: the holder is told before the lease could have
        // expired in Redis (the margin), not after
        proxy.blackhole(true);
        let started = Instant::now();
        let reason = tokio::time::timeout(lease * 3, lost)
            .await
            .expect("the holder was never told");
        let after = started.elapsed();
        assert_eq!(reason, LostReason::Unreachable, "{}", server.flavor());
        assert!(after < lease, "{}: told after {after:?}", server.flavor());
        proxy.blackhole(false);
        drop(held);
    }
}

/// A server that answers but cannot serve now (a replica's `READONLY` here; `TRYAGAIN` while a
/// slot migrates, `CLUSTERDOWN` during a failover, `LOADING` after a restart): an acquisition
/// asks again, with backoff, until its timeout (it failed at once with `Unreachable`); a
/// `try_acquire` still fails at once (one round trip); a server that does not answer is not
/// waited for (unchanged, see the tests above).
#[tokio::test]
async fn an_acquisition_asks_again_while_the_server_cannot_serve() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "cannot-serve", 1, Duration::from_secs(5)).await;
        // a replica of a master that does not exist: it keeps its data and refuses writes
        server.cmd(&["REPLICAOF", "127.0.0.1", "1"]);
        let err = sem.try_acquire().await.unwrap_err();
        assert!(matches!(err, redsem::Error::Unreachable(_)), "{err:?}");
        let started = Instant::now();
        let waiting = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire_timeout(Duration::from_secs(20)).await })
        };
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            !waiting.is_finished(),
            "{}: gave up while refused",
            server.flavor()
        );
        server.cmd(&["REPLICAOF", "NO", "ONE"]);
        let permit = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("still waiting once the server serves again")
            .unwrap()
            .unwrap_or_else(|e| panic!("{}: {e}", server.flavor()));
        assert!(started.elapsed() >= Duration::from_millis(1500));
        assert_eq!(card(&server, "cannot-serve", "slots"), 1);
        // nothing was left of the refused attempts
        assert_eq!(card(&server, "cannot-serve", "queue"), 0);
        drop(permit);
        client.shutdown().await;
    }
}

/// A holder told that its lease is lost because Redis did not answer (a safety margin before
/// the lease could have ended there, so that the program can stop its work) does not hand its
/// slot on when Redis answers again: its entry is detached, not released, and nobody else is
/// granted the slot before the lease it had in Redis ended. Then the next waiter is.
#[tokio::test]
async fn a_holder_lost_in_an_outage_keeps_its_slot_until_its_lease_ends_in_redis() {
    for server in servers() {
        let proxy = FaultProxy::start(server.addr());
        let lease = Duration::from_secs(5); // (margin: 500 ms)
        let (_held_by, sem) = open_through(&proxy, "kept", lease).await;
        let held = sem.acquire().await.unwrap();
        let id = server.cmd(&["HGET", &key("kept", "slots"), "0"]);
        let id = id.as_str().unwrap().to_owned();
        let other = client(&server).await;
        let next = open(&other, "kept", 1, lease).await;
        let waiting = tokio::spawn(async move { next.acquire().await });
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "kept", "queue")
                == 1)
            .await
        );

        proxy.blackhole(true);
        let reason = tokio::time::timeout(lease * 3, held.lost())
            .await
            .expect("the holder was never told");
        assert_eq!(reason, LostReason::Unreachable, "{}", server.flavor());
        // the lease the entry has in Redis (nobody renewed it since)
        let session = session_of(&server, "kept", &id);
        let expiry = server.cmd(&["ZSCORE", &key("kept", "exp"), &session]);
        let expiry_ms: u64 = expiry.as_str().unwrap().parse().unwrap();
        // Redis answers again: what the lost holder sends now lands at once
        proxy.blackhole(false);
        loop {
            let now_ms = redis_time_us(&server) / 1000;
            if now_ms + 100 >= expiry_ms {
                break;
            }
            assert!(
                !waiting.is_finished(),
                "{}: the slot was granted {} ms before the lost holder's lease ended",
                server.flavor(),
                expiry_ms - now_ms
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let p = tokio::time::timeout(lease * 2, waiting)
            .await
            .expect("the next waiter is granted once the lease ended")
            .unwrap()
            .unwrap();
        drop(held);
        p.release().await.unwrap();
        assert_nothing_left(&server, "kept").await;
    }
}

/// After Redis restarted (its data lost) and answers again, the first acquisition succeeds:
/// it finds the old connection closed, and asks again, once, on the connection made anew
/// (it failed with `Unreachable: broken pipe`, though Redis was back).
#[tokio::test]
async fn the_first_acquisition_after_a_restart_asks_again_on_a_new_connection() {
    for mut server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "restarted", 1, Duration::from_secs(5)).await;
        sem.acquire().await.unwrap().release().await.unwrap();
        server.restart();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let p = tokio::time::timeout(Duration::from_secs(10), sem.acquire())
            .await
            .expect("the acquisition hung")
            .unwrap_or_else(|e| panic!("{}: {e}", server.flavor()));
        p.release().await.unwrap();
        assert_nothing_left(&server, "restarted").await;
    }
}

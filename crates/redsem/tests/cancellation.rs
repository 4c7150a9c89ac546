//! Cancel safety: a dropped acquire, a timed-out acquire, a dropped permit, a cancelled
//! release and a closed handle leave nothing behind in Redis.

mod common;

use std::time::Duration;

use common::*;
use test_support::FaultProxy;

const LEASE: Duration = Duration::from_secs(10);

#[tokio::test]
async fn dropped_acquire_leaves_nothing_in_redis() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "drop-acquire", 1, LEASE).await;
        let held = sem.acquire().await.unwrap();
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(
                &server,
                "drop-acquire",
                "queue"
            ) == 1)
            .await
        );
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        // the ticket is removed long before its 10 s lease would expire
        assert!(
            eventually(Duration::from_secs(2), || card(
                &server,
                "drop-acquire",
                "queue"
            ) == 0)
            .await
        );
        assert_eq!(sem.local_counts(), (1, 0));
        drop(held);
        assert_nothing_left(&server, "drop-acquire").await;
        assert_eq!(sem.local_counts(), (0, 0));
    }
}

#[tokio::test]
async fn timed_out_acquire_gives_up_its_place() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "timeout", 1, LEASE).await;
        let held = sem.acquire().await.unwrap();
        let started = std::time::Instant::now();
        let err = sem
            .acquire_timeout(Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(
            matches!(err, redsem::Error::Timeout { timeout, .. } if timeout == Duration::from_millis(300)),
            "{err}"
        );
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(
            eventually(Duration::from_secs(2), || card(&server, "timeout", "queue")
                == 0)
            .await
        );
        // the next acquire after the holder leaves is granted at once
        drop(held);
        let p = sem.acquire_timeout(Duration::from_secs(2)).await.unwrap();
        drop(p);
        assert_nothing_left(&server, "timeout").await;
    }
}

#[tokio::test]
async fn dropping_many_pending_acquires_at_once_releases_every_grant() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "mass-cancel", 3, LEASE).await;
        let held = sem.acquire_many(3).await.unwrap();
        let mut waiters = Vec::new();
        for _ in 0..50 {
            let sem = sem.clone();
            waiters.push(tokio::spawn(async move { sem.acquire().await }));
        }
        assert!(
            eventually(Duration::from_secs(5), || card(
                &server,
                "mass-cancel",
                "queue"
            ) == 50)
            .await
        );
        // release and cancel at the same moment: grants race with cancellations
        drop(held);
        for w in &waiters {
            w.abort();
        }
        for w in waiters {
            let _ = w.await;
        }
        assert_nothing_left(&server, "mass-cancel").await;
        let all = sem.try_acquire_many(3).await.unwrap();
        assert_eq!(all.slots(), vec![0, 1, 2]);
    }
}

#[tokio::test]
async fn dropped_permit_is_released_in_the_background() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "drop-permit", 1, LEASE).await;
        let p = sem.acquire().await.unwrap();
        assert_eq!(card(&server, "drop-permit", "slots"), 1);
        drop(p);
        assert_nothing_left(&server, "drop-permit").await;
    }
}

#[tokio::test]
async fn closing_fails_pending_and_later_acquires_and_cleans_up() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "close", 1, LEASE).await;
        let held = sem.acquire().await.unwrap();
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "close", "queue")
                == 1)
            .await
        );
        sem.close();
        assert!(sem.is_closed());
        assert!(matches!(
            waiter.await.unwrap(),
            Err(redsem::Error::Closed { .. })
        ));
        assert!(matches!(
            sem.acquire().await,
            Err(redsem::Error::Closed { .. })
        ));
        // a held permit stays valid until dropped
        assert!(!held.is_lost());
        drop(held);
        assert_nothing_left(&server, "close").await;
    }
}

#[tokio::test]
async fn local_cap_limits_this_process_share_of_the_queue() {
    for server in servers() {
        let client = client(&server).await;
        let sem = client
            .semaphore("cap", 10)
            .local_cap(2)
            .open()
            .await
            .unwrap();
        let a = sem.acquire().await.unwrap();
        let _b = sem.acquire().await.unwrap();
        // the third waits locally: nothing more reaches Redis
        let third = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(card(&server, "cap", "slots"), 2);
        assert_eq!(card(&server, "cap", "queue"), 0);
        assert!(matches!(
            sem.try_acquire().await,
            Err(redsem::Error::NoPermits { .. })
        ));
        assert!(matches!(
            sem.acquire_many(3).await,
            Err(redsem::Error::InvalidArgument(_))
        ));
        drop(a);
        let c = tokio::time::timeout(Duration::from_secs(2), third)
            .await
            .unwrap()
            .unwrap();
        drop(c);
    }
}

/// One semaphore of the cancellation sweep, and how long it may take to be clean again.
struct Sweep<'a> {
    server: &'a Server,
    sem: &'a redsem::Semaphore,
    name: &'a str,
    limit: u32,
    within: Duration,
}

impl Sweep<'_> {
    /// Waits (for at most `within`) until the semaphore has no holder, no waiter, no lease
    /// and no record left in Redis, all its slots free, and nothing held or awaited locally;
    /// panics naming `what` otherwise.
    async fn assert_clean(&self, what: &str) {
        let (server, name) = (self.server, self.name);
        let clean = || {
            entries(server, name) == [0, 0, 0, 0]
                && free_slots(server, name) == i64::from(self.limit)
                && self.sem.local_counts() == (0, 0)
        };
        assert!(
            eventually(self.within, clean).await,
            "{what}: (slots, queue, leases, records) = {:?}, free slots {}, local (holders, waiters) {:?}",
            entries(server, name),
            free_slots(server, name),
            self.sem.local_counts()
        );
    }
}

/// Cancels acquisitions and releases after 0, 1, 2 … 30 ms, through a proxy that delays
/// every chunk both ways, so that the cancellation lands at every stage of a call: before
/// it is sent, in flight, after Redis answered. After each, nothing may be left in Redis
/// or held locally for longer than one renewal interval (the lease is three).
#[tokio::test]
async fn cancelling_acquire_or_release_at_any_moment_leaves_nothing_behind() {
    const LIMIT: u32 = 2;
    let lease = Duration::from_secs(15);
    let renewal = lease / 3;
    let name = "cancel-sweep";
    for server in servers() {
        let proxy = FaultProxy::start(server.addr());
        let proxied = redsem::Client::builder(proxy.url())
            .connect_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        let sem = open(&proxied, name, LIMIT, lease).await;
        let blocker_client = client(&server).await;
        let blocker_sem = open(&blocker_client, name, LIMIT, lease).await;
        let sweep = Sweep {
            server: &server,
            sem: &sem,
            name,
            limit: LIMIT,
            within: renewal,
        };
        proxy.latency(Duration::from_millis(3));
        for ms in 0..=30 {
            let t = Duration::from_millis(ms);
            let after = |what: &str| format!("{what} cancelled after {ms} ms");

            // a held permit whose release is cancelled at t
            let permit = sem.acquire_many(LIMIT).await.unwrap();
            let _ = tokio::time::timeout(t, permit.release()).await;
            sweep.assert_clean(&after("release")).await;

            // an acquire granted at once, cancelled at t; if it won, its release too
            if let Ok(Ok(permit)) = tokio::time::timeout(t, sem.acquire()).await {
                let _ = tokio::time::timeout(t, permit.release()).await;
            }
            sweep.assert_clean(&after("acquire")).await;

            // a try_acquire cancelled at t
            if let Ok(Ok(permit)) = tokio::time::timeout(t, sem.try_acquire()).await {
                drop(permit);
            }
            sweep.assert_clean(&after("try_acquire")).await;

            // acquisitions that queue behind another holder, cancelled or timed out at t
            let blocker = blocker_sem.acquire_many(LIMIT).await.unwrap();
            let cancelled = tokio::time::timeout(t, sem.acquire()).await;
            assert!(cancelled.is_err(), "granted while all permits are held");
            let timed_out = sem.acquire_timeout(t).await;
            assert!(
                matches!(timed_out, Err(redsem::Error::Timeout { .. })),
                "{timed_out:?}"
            );
            assert!(
                eventually(renewal, || card(&server, name, "queue") == 0
                    && sem.local_counts() == (0, 0))
                .await,
                "a waiter cancelled after {ms} ms stayed in the queue"
            );
            blocker.release().await.unwrap();
            sweep.assert_clean(&after("queued acquire")).await;
        }
    }
}

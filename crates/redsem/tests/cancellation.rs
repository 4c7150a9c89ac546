//! Cancel safety: a dropped acquire, a timed-out acquire, a dropped permit and a closed
//! handle leave nothing behind in Redis.

mod common;

use std::time::Duration;

use common::*;

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
            matches!(err, redsem::Error::Timeout(d) if d == Duration::from_millis(300)),
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
        assert!(matches!(waiter.await.unwrap(), Err(redsem::Error::Closed)));
        assert!(matches!(sem.acquire().await, Err(redsem::Error::Closed)));
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
            Err(redsem::Error::NoPermits)
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

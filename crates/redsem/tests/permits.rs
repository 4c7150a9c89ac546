//! The tokio-shaped counters: `available_permits` (a snapshot of what Redis last said) and
//! `add_permits` (an atomic relative change of the shared limit).

mod common;

use std::time::Duration;

use common::*;
use redsem::Error;

#[tokio::test]
async fn available_permits_is_what_redis_last_said() {
    for server in servers() {
        let a_client = client(&server).await;
        let b_client = client(&server).await;
        let a = open(&a_client, "avail", 3, Duration::from_millis(600)).await;
        let b = open(&b_client, "avail", 3, Duration::from_millis(600)).await;
        assert_eq!(a.available_permits(), 3, "{}: at open", server.flavor());
        let two = a.acquire_many(2).await.unwrap();
        assert_eq!(a.available_permits(), 1, "from the acquire reply");
        let one = b.acquire().await.unwrap();
        assert_eq!(b.available_permits(), 0);
        // `a` learns of b's permit at its next renewal (every 200 ms), without a call of its own
        assert!(
            eventually(Duration::from_secs(5), || a.available_permits() == 0).await,
            "{}: still {}",
            server.flavor(),
            a.available_permits()
        );
        one.release().await.unwrap();
        assert_eq!(a.stats().await.unwrap().in_use, 2);
        assert_eq!(a.available_permits(), 1, "stats reads it fresh");
        drop(two);
    }
}

#[tokio::test]
async fn add_permits_is_an_atomic_relative_change() {
    for server in servers() {
        let clients = [client(&server).await, client(&server).await];
        let mut sems = Vec::new();
        for c in &clients {
            sems.push(open(c, "add", 4, Duration::from_secs(3)).await);
        }
        // 2 × 25 concurrent +1s: none is lost (two resizes could overwrite each other)
        let mut tasks = Vec::new();
        for sem in &sems {
            let sem = sem.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..25 {
                    sem.add_permits(1).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(
            sems[0].stats().await.unwrap().limit,
            54,
            "{}",
            server.flavor()
        );
        assert_eq!(sems[1].add_permits(-50).await.unwrap().limit, 4);
        assert_eq!(sems[1].limit(), 4);
        // out of range: refused, nothing changed, the message gives the limit
        let e = sems[0].add_permits(-4).await.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert!(e.to_string().contains("its limit is 4"), "{e}");
        let e = sems[0]
            .add_permits(i64::from(redsem::MAX_LIMIT))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert_eq!(sems[0].stats().await.unwrap().limit, 4);
        // growing admits a waiter at once
        let held = sems[0].acquire_many(4).await.unwrap();
        let waiter = {
            let sem = sems[1].clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "add", "queue")
                == 1)
            .await
        );
        assert_eq!(sems[0].add_permits(1).await.unwrap().limit, 5);
        let p = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("granted by the growth")
            .unwrap()
            .unwrap();
        assert_eq!(p.slots(), [4]);
        drop((held, p));
    }
}

/// `Client::add_permits_existing`: the same atomic change without a handle, which never
/// creates the semaphore.
#[tokio::test]
async fn add_permits_existing_changes_an_existing_limit_and_creates_nothing() {
    for server in servers() {
        let admin = client(&server).await;
        let e = admin.add_permits_existing("nope", 1).await.unwrap_err();
        assert!(matches!(e, Error::UnknownSemaphore { .. }), "{e:?}");
        assert_eq!(server.cmd(&["DBSIZE"]).as_int(), Some(0), "nothing created");

        let user = client(&server).await;
        let sem = open(&user, "add-ex", 2, Duration::from_secs(3)).await;
        let held = sem.acquire_many(2).await.unwrap();
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "add-ex", "queue")
                == 1)
            .await
        );
        assert_eq!(
            admin.add_permits_existing("add-ex", 1).await.unwrap().limit,
            3
        );
        let p = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("granted by the growth")
            .unwrap()
            .unwrap();
        assert_eq!(p.slots(), [2]);
        assert_eq!(
            admin
                .add_permits_existing("add-ex", -2)
                .await
                .unwrap()
                .limit,
            1
        );
        let e = admin.add_permits_existing("add-ex", -1).await.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert!(e.to_string().contains("its limit is 1"), "{e}");
        assert_eq!(admin.inspect("add-ex").await.unwrap().limit, 1);
        drop((held, p));
    }
}

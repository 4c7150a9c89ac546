//! Leases: renewal keeps long holds, a lost lease stops the work, waiters keep their place.

mod common;

use std::time::{Duration, Instant};

use common::*;

#[tokio::test]
async fn a_hold_longer_than_the_lease_succeeds_with_renewals() {
    for server in servers() {
        let client = client(&server).await;
        let sem = client
            .semaphore("long-hold", 1)
            .lease(Duration::from_millis(400))
            .open()
            .await
            .unwrap();
        let permit = sem.acquire().await.unwrap();
        let id = permit.holder_id().to_owned();
        // 4 leases long
        let out = permit
            .run(async {
                tokio::time::sleep(Duration::from_millis(1600)).await;
                42
            })
            .await
            .unwrap();
        assert_eq!(out, 42);
        let mut st = sem.stats().await.unwrap();
        assert_eq!(
            st.expired_total,
            0,
            "{}: the lease expired under a live holder",
            server.flavor()
        );
        // (released in the background once `run` returns)
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while st.holders.iter().any(|h| h.id == id) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: never released",
                server.flavor()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
            st = sem.stats().await.unwrap();
        }
    }
}

#[tokio::test]
async fn a_waiter_keeps_its_place_longer_than_the_lease() {
    for server in servers() {
        let client = client(&server).await;
        let lease = Duration::from_millis(300);
        let sem = open(&client, "long-wait", 1, lease).await;
        let held = sem.acquire().await.unwrap();
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await.unwrap().ticket() })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(
                &server,
                "long-wait",
                "queue"
            ) == 1)
            .await
        );
        let ticket_before = sem.stats().await.unwrap().waiters[0].ticket;
        tokio::time::sleep(lease * 4).await;
        drop(held);
        let ticket = waiter.await.unwrap();
        assert_eq!(
            ticket, ticket_before,
            "the waiter was re-queued: its lease expired"
        );
        assert_eq!(sem.stats().await.unwrap().expired_total, 0);
    }
}

/// A process that only waits must renew its waiters' leases at the renewal interval, not
/// only at the fallback interval (1 s by default): with a shorter lease its waiters would
/// expire, be reaped and queue again at the back (fixed in a362a1d). The test above does not
/// show it: there the holder's renewals carry the waiter's along.
#[tokio::test]
async fn a_waiter_in_a_process_that_holds_nothing_keeps_its_place_longer_than_the_lease() {
    for server in servers() {
        let lease = Duration::from_millis(300);
        let holder_client = client(&server).await;
        let held = open(&holder_client, "lone-waiter", 1, lease)
            .await
            .acquire()
            .await
            .unwrap();
        // default fallback poll (1 s): longer than the lease
        let waiter_client = client(&server).await;
        let sem = open(&waiter_client, "lone-waiter", 1, lease).await;
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await.unwrap().ticket() })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(
                &server,
                "lone-waiter",
                "queue"
            ) == 1)
            .await
        );
        let ticket_before = sem.stats().await.unwrap().waiters[0].ticket;
        tokio::time::sleep(lease * 4).await;
        drop(held);
        let ticket = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter was never granted")
            .unwrap();
        assert_eq!(
            ticket,
            ticket_before,
            "{}: the waiter was re-queued: its lease expired",
            server.flavor()
        );
        assert_eq!(sem.stats().await.unwrap().expired_total, 0);
    }
}

/// The heartbeat renews at most 512 waiters per call: with more, every chunk must be renewed,
/// or the waiters beyond the first chunk expire and queue again at the back.
#[tokio::test]
async fn more_waiters_than_one_renewal_call_carries_all_keep_their_place() {
    const WAITERS: i64 = 1200;
    for server in servers() {
        let lease = Duration::from_millis(500);
        let holder_client = client(&server).await;
        let held = open(&holder_client, "many-waiters", 1, lease)
            .await
            .acquire()
            .await
            .unwrap();
        let waiter_client = client(&server).await;
        let sem = open(&waiter_client, "many-waiters", 1, lease).await;
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..WAITERS {
            let sem = sem.clone();
            tasks.spawn(async move { sem.acquire().await.map(|p| p.ticket()) });
        }
        assert!(
            eventually(Duration::from_secs(10), || card(
                &server,
                "many-waiters",
                "queue"
            ) == WAITERS)
            .await
        );
        let tickets_before: Vec<u64> = {
            let mut t: Vec<u64> = sem
                .stats()
                .await
                .unwrap()
                .waiters
                .iter()
                .map(|w| w.ticket)
                .collect();
            t.sort_unstable();
            t
        };
        tokio::time::sleep(lease * 4).await;
        let st = sem.stats().await.unwrap();
        assert_eq!(
            st.expired_total,
            0,
            "{}: waiters expired while their process was renewing them",
            server.flavor()
        );
        let mut tickets_after: Vec<u64> = st.waiters.iter().map(|w| w.ticket).collect();
        tickets_after.sort_unstable();
        assert_eq!(
            tickets_after,
            tickets_before,
            "{}: waiters were re-queued",
            server.flavor()
        );
        // they are all still served, in ticket order
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        drop(held);
        assert!(
            eventually(Duration::from_secs(10), || card(
                &server,
                "many-waiters",
                "queue"
            ) == 0)
            .await,
            "{}: cancelled waiters left entries in Redis",
            server.flavor()
        );
    }
}

#[tokio::test]
async fn deleting_the_lease_behind_the_holder_cancels_its_work() {
    for server in servers() {
        let client = client(&server).await;
        let renew = Duration::from_millis(200);
        let sem = client
            .semaphore("deleted", 1)
            .lease(Duration::from_secs(2))
            .renew_every(renew)
            .open()
            .await
            .unwrap();
        let permit = sem.acquire().await.unwrap();
        let token = permit.cancellation_token();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let run = tokio::spawn(permit.run(async move {
            // work that would take far longer than the test: it must be cancelled
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let _ = tx.send(());
            }
        }));
        tokio::time::sleep(Duration::from_millis(100)).await;
        // an operator (or a bug) removes every entry behind the holder's back
        server.cmd(&[
            "DEL",
            "redsem:{deleted}:meta",
            "redsem:{deleted}:exp",
            "redsem:{deleted}:slots",
            "redsem:{deleted}:own",
        ]);
        let deleted_at = Instant::now();
        let result = run.await.unwrap();
        let detected = deleted_at.elapsed();
        assert!(
            matches!(
                result,
                Err(redsem::Error::LeaseLost {
                    reason: redsem::LostReason::NotHolder,
                    ..
                })
            ),
            "{result:?}"
        );
        assert!(
            detected <= renew + Duration::from_millis(300),
            "detected after {detected:?}"
        );
        assert!(token.is_cancelled());
        // the work's future was dropped: it makes no progress any more
        while rx.try_recv().is_ok() {}
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            rx.try_recv().is_err(),
            "the work kept running after the loss"
        );
        assert_nothing_left(&server, "deleted").await;
    }
}

#[tokio::test]
async fn renewal_never_recreates_an_expired_entry() {
    for server in servers() {
        let client = client(&server).await;
        let sem = client
            .semaphore("no-recreate", 1)
            .lease(Duration::from_secs(3))
            .renew_every(Duration::from_millis(100))
            .open()
            .await
            .unwrap();
        let permit = sem.acquire().await.unwrap();
        let old_generation = permit.fences()[0].generation;
        let lost = permit.lost();
        // make the lease of its session look expired in Redis (as after a pause longer
        // than the lease)
        let session = session_of(&server, "no-recreate", permit.holder_id());
        let r = server.cmd(&[
            "ZADD",
            "redsem:{no-recreate}:exp",
            "XX",
            "CH",
            "1",
            &session,
        ]);
        assert_eq!(r.as_int(), Some(1));
        let reason = tokio::time::timeout(Duration::from_secs(2), lost)
            .await
            .unwrap();
        assert_eq!(reason, redsem::LostReason::NotHolder);
        assert!(permit.is_lost());
        // the renewal reaped it instead of extending it
        assert_eq!(entries(&server, "no-recreate"), [0, 0, 0, 0]);
        assert!(matches!(
            permit.run(async {}).await,
            Err(redsem::Error::LeaseLost { .. })
        ));
        let fresh = sem.try_acquire().await.unwrap();
        assert!(fresh.fences()[0].generation > old_generation);
        assert_eq!(sem.stats().await.unwrap().expired_total, 1);
    }
}

#[tokio::test]
async fn an_unreachable_redis_makes_the_permit_lost_before_its_lease_ends() {
    for server in servers() {
        let client = client(&server).await;
        let lease = Duration::from_millis(800);
        let sem = client
            .semaphore("unreachable", 1)
            .lease(lease)
            .open()
            .await
            .unwrap();
        let permit = sem.acquire().await.unwrap();
        let acquired = Instant::now();
        let lost = permit.lost();
        server.pause();
        let reason = tokio::time::timeout(lease * 3, lost).await;
        let after = acquired.elapsed();
        server.resume();
        assert_eq!(reason.unwrap(), redsem::LostReason::Unreachable);
        assert!(
            after < lease,
            "declared lost after {after:?}, the lease is {lease:?}"
        );
        assert!(after > lease / 2, "declared lost too early: {after:?}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn is_lost_says_so_once_the_local_deadline_passed_even_if_the_heartbeat_is_starved() {
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = client
        .semaphore("starved", 1)
        .lease(Duration::from_millis(300))
        .renew_every(Duration::from_millis(100))
        .open()
        .await
        .unwrap();
    let permit = sem.acquire().await.unwrap();
    assert!(!permit.is_lost());
    // Blocking work on the only runtime thread: the heartbeat cannot renew, and the lease
    // runs out in Redis (lease 300 ms, blocked for 900 ms).
    std::thread::sleep(Duration::from_millis(900));
    assert!(
        permit.is_lost(),
        "the local deadline has passed with no confirmed renewal"
    );
    // Once the runtime is free again, the heartbeat reports the loss too.
    let reason = tokio::time::timeout(Duration::from_secs(10), permit.lost())
        .await
        .expect("the heartbeat declares the permit lost once it runs");
    assert!(
        matches!(
            reason,
            redsem::LostReason::NotHolder | redsem::LostReason::Unreachable
        ),
        "{reason:?}"
    );
    assert!(permit.is_lost());
}

//! Session leases: a client handle renews its sessions, not its entries. What a renewal costs
//! Redis does not grow with the number of waiting tasks; an entry lives as long as its
//! session, except a detached one; a closed handle ends its sessions; an entry an operator
//! removes is reported to its owner (at once, and by the next renewal if the message is lost).

mod common;

use std::time::Duration;

use common::*;

/// 2,000 tasks wait behind one holder through one handle for several renewal intervals:
/// their leases are kept alive by the handle's session, so Redis runs a few calls per
/// interval and reads no waiter's record (a renewal per waiter would read 2,000 per
/// interval).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_tasks_cost_redis_nothing_per_task() {
    for server in servers() {
        let client = client(&server).await;
        let sem = client
            .semaphore("idle-waiters", 1)
            .lease(Duration::from_millis(900))
            .renew_every(Duration::from_millis(300))
            .fallback_poll(Duration::from_millis(300))
            .open()
            .await
            .unwrap();
        let held = sem.acquire().await.unwrap();
        let waiters: Vec<_> = (0..2000)
            .map(|_| {
                let sem = sem.clone();
                // served in ticket order, which need not be the order of this list: each
                // task gives its permit back itself
                tokio::spawn(async move { sem.acquire().await.map(drop) })
            })
            .collect();
        assert!(
            eventually(Duration::from_secs(20), || card(
                &server,
                "idle-waiters",
                "queue"
            ) == 2000)
            .await
        );
        server.cmd(&["CONFIG", "RESETSTAT"]);
        // four leases: without renewals, every waiter would have been reaped
        tokio::time::sleep(Duration::from_millis(3600)).await;
        let (scripts, records_read) = (script_calls(&server), calls(&server, "hget"));
        assert!(
            scripts <= 40,
            "{}: {scripts} script calls in 12 renewal intervals",
            server.flavor()
        );
        assert!(
            records_read <= 40,
            "{}: {records_read} records read: waiters were renewed one by one",
            server.flavor()
        );
        assert_eq!(
            card(&server, "idle-waiters", "queue"),
            2000,
            "a waiter was reaped"
        );
        assert_eq!(
            server
                .cmd(&["HGET", "redsem:{idle-waiters}:cfg", "expired"])
                .as_str(),
            None
        );
        // and they are all served, in turn
        held.release().await.unwrap();
        for w in waiters {
            w.await.unwrap().unwrap();
        }
        client.flush_releases().await;
        assert_nothing_left(&server, "idle-waiters").await;
    }
}

/// A detached permit stops being renewed although its handle (and so its session) lives on:
/// it moves to a session of its own, and its slot comes back once its lease has run out,
/// while another permit of the same handle keeps being renewed.
#[tokio::test]
async fn a_detached_permit_expires_while_its_handle_renews() {
    for server in servers() {
        let client = client(&server).await;
        let sem = client
            .semaphore("detached", 2)
            .lease(Duration::from_millis(900))
            .renew_every(Duration::from_millis(200))
            .open()
            .await
            .unwrap();
        let kept = sem.acquire().await.unwrap();
        let detached = sem.acquire().await.unwrap();
        let slot = detached.slots()[0];
        detached.detach();
        let freed = tokio::time::Instant::now();
        let next = tokio::time::timeout(Duration::from_secs(10), sem.acquire())
            .await
            .expect("the detached permit's slot never came back")
            .unwrap();
        assert_eq!(next.slots(), [slot]);
        assert!(
            freed.elapsed() >= Duration::from_millis(300),
            "{}: freed after {:?}, before its lease could run out",
            server.flavor(),
            freed.elapsed()
        );
        assert!(!kept.is_lost(), "{}", server.flavor());
        let expired: u64 = server
            .cmd(&["HGET", "redsem:{detached}:cfg", "expired"])
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            expired,
            1,
            "{}: reaped on expiry, not released",
            server.flavor()
        );
        drop((kept, next));
        client.shutdown().await;
        assert_nothing_left(&server, "detached").await;
    }
}

/// A handle that closes ends its sessions: nothing of it is left in `exp`.
#[tokio::test]
async fn a_closed_handle_ends_its_sessions() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "ended", 2, Duration::from_secs(30)).await;
        let own_lease = sem
            .acquire_with(redsem::AcquireOptions::new().lease(Duration::from_secs(60)))
            .await
            .unwrap();
        let plain = sem.acquire().await.unwrap();
        assert_eq!(
            card(&server, "ended", "exp"),
            2,
            "{}: one session per lease length",
            server.flavor()
        );
        drop((own_lease, plain, sem));
        client.flush_releases().await;
        assert_eq!(card(&server, "ended", "exp"), 0, "{}", server.flavor());
        assert_nothing_left(&server, "ended").await;
    }
}

/// The one waiter in the queue of semaphore `name`.
fn queued_id(server: &Server, name: &str) -> String {
    match server.cmd(&["ZRANGE", &format!("redsem:{{{name}}}:queue"), "0", "0"]) {
        Reply::Array(a) if a.len() == 1 => a[0].as_str().unwrap().to_owned(),
        other => panic!("{other:?}"),
    }
}

/// An operator removes a queued waiter (`force_release_existing`, CLI `redsem release`): it
/// leaves the queue for good, its acquire fails with `RemovedFromQueue` at once (the message
/// on its channel), it does not queue again, and the operator is told it was a waiter.
#[tokio::test]
async fn a_waiter_removed_by_an_operator_fails_and_does_not_queue_again() {
    for server in servers() {
        let client = client(&server).await;
        let sem = client
            .semaphore("removed-waiter", 1)
            // a renewal interval far longer than the test: the message tells the waiter
            .lease(Duration::from_secs(60))
            .fallback_poll(Duration::from_secs(60))
            .open()
            .await
            .unwrap();
        let held = sem.acquire().await.unwrap();
        let waiting = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(
                &server,
                "removed-waiter",
                "queue"
            ) == 1)
            .await
        );
        let queued = queued_id(&server, "removed-waiter");
        let admin = common::client(&server).await;
        assert_eq!(
            admin
                .force_release_existing("removed-waiter", &queued)
                .await
                .unwrap(),
            redsem::ForceReleased::Waiter
        );
        let r = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the removed waiter's acquire did not end")
            .unwrap();
        assert!(
            matches!(r, Err(redsem::Error::RemovedFromQueue { ref name, .. }) if name == "removed-waiter"),
            "{}: {r:?}",
            server.flavor()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            card(&server, "removed-waiter", "queue"),
            0,
            "{}: the removed waiter queued again",
            server.flavor()
        );
        // a holder is reported as one
        assert_eq!(
            admin
                .force_release_existing("removed-waiter", held.holder_id())
                .await
                .unwrap(),
            redsem::ForceReleased::Holder
        );
        assert_eq!(
            admin
                .force_release_existing("removed-waiter", held.holder_id())
                .await
                .unwrap(),
            redsem::ForceReleased::NotFound
        );
        drop(held);
        client.shutdown().await;
        assert_nothing_left(&server, "removed-waiter").await;
    }
}

/// A waiter removed by an operator whose message never arrived (here: removed as an
/// operator's release of before the message existed does it, leaving only the tombstone in
/// the session index) learns it from the next renewal of its session, and fails the same way.
#[tokio::test]
async fn a_removed_waiter_whose_message_was_lost_learns_it_at_its_next_renewal() {
    for server in servers() {
        let client = client(&server).await;
        let sem = client
            .semaphore("removed-quietly", 1)
            .lease(Duration::from_millis(900))
            .renew_every(Duration::from_millis(200))
            .open()
            .await
            .unwrap();
        let held = sem.acquire().await.unwrap();
        let waiting = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(
                &server,
                "removed-quietly",
                "queue"
            ) == 1)
            .await
        );
        let queued = queued_id(&server, "removed-quietly");
        let session = session_of(&server, "removed-quietly", &queued);
        let key = |s: &str| format!("redsem:{{removed-quietly}}:{s}");
        server.cmd(&["ZREM", &key("queue"), &queued]);
        server.cmd(&["HDEL", &key("meta"), &queued]);
        server.cmd(&["ZREM", &key("own"), &format!("{session}|{queued}")]);
        server.cmd(&["ZADD", &key("own"), "0", &format!("{session}|!{queued}")]);
        let r = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the removed waiter's acquire did not end")
            .unwrap();
        assert!(
            matches!(r, Err(redsem::Error::RemovedFromQueue { .. })),
            "{}: {r:?}",
            server.flavor()
        );
        assert_eq!(card(&server, "removed-quietly", "queue"), 0);
        drop(held);
        client.shutdown().await;
        assert_nothing_left(&server, "removed-quietly").await;
    }
}

/// A handle renews a lease length's session only while an entry may use it: acquisitions
/// that each asked for a lease of their own leave no session renewed once released (their
/// sessions expire in Redis), where renewing every length ever used would grow each
/// renewal without bound.
#[tokio::test]
async fn a_lease_length_no_entry_uses_any_more_is_not_renewed() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "lease-lengths", 2, Duration::from_millis(900)).await;
        // keeps the heartbeat renewing (in the handle's own session)
        let plain = sem.acquire().await.unwrap();
        for i in 0..10u64 {
            let lease = Duration::from_millis(1000 + 100 * i);
            let opts = redsem::AcquireOptions::new().lease(lease);
            sem.acquire_with(opts)
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        }
        assert_eq!(
            card(&server, "lease-lengths", "exp"),
            11,
            "{}: one session per lease length used",
            server.flavor()
        );
        // past the longest of those leases, with renewals every 300 ms meanwhile
        let only_the_handles = eventually(Duration::from_secs(6), || {
            card(&server, "lease-lengths", "exp") == 1
        })
        .await;
        assert!(
            only_the_handles,
            "{}: sessions left: {}",
            server.flavor(),
            card(&server, "lease-lengths", "exp")
        );
        assert!(!plain.is_lost(), "{}", server.flavor());
        plain.release().await.unwrap();
        drop(sem);
        client.flush_releases().await;
        assert_nothing_left(&server, "lease-lengths").await;
    }
}

//! Priority classes (`AcquireOptions::priority`): higher classes first, FIFO within a class,
//! aging so that nothing starves, the multi-permit head rule kept, and without priorities
//! exactly the FIFO queue of before.

mod common;

use std::time::Duration;

use common::*;
use redsem::{AcquireOptions, Error, NoPermitsReason, Semaphore};
use tokio::sync::mpsc;

const LEASE: Duration = Duration::from_secs(10);

/// Queues one request per `(label, priority)`, in this order (each queued before the next
/// is sent, so that the tickets follow the list), behind a holder of the only permit; then
/// releases the holder and returns the labels in the order they were granted.
async fn grant_order(
    server: &Server,
    sem: &Semaphore,
    name: &str,
    requests: &[(&'static str, u8)],
    between: impl Fn(usize),
) -> Vec<&'static str> {
    let first = sem.acquire().await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for (i, &(label, priority)) in requests.iter().enumerate() {
        between(i);
        let (sem, tx) = (sem.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let permit = sem
                .acquire_with(AcquireOptions::new().priority(priority).label(label))
                .await
                .unwrap();
            tx.send(label).unwrap();
            drop(permit);
        }));
        assert!(
            eventually(Duration::from_secs(10), || card(server, name, "queue")
                == i as i64 + 1)
            .await,
            "request {label} did not queue"
        );
    }
    let st = sem.stats().await.unwrap();
    assert_eq!(st.waiters.len(), requests.len());
    drop(first);
    let mut order = Vec::new();
    for _ in requests {
        order.push(
            tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .expect("a waiter was not granted")
                .unwrap(),
        );
    }
    for t in tasks {
        t.await.unwrap();
    }
    order
}

#[tokio::test]
async fn higher_classes_are_served_first_and_fifo_within_a_class() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "prio-order", 1, LEASE).await;
        let requests = [
            ("a0", 0),
            ("b2", 2),
            ("c1", 1),
            ("d2", 2),
            ("e0", 0),
            ("f9", 9),
        ];
        let order = grant_order(&server, &sem, "prio-order", &requests, |_| {}).await;
        assert_eq!(
            order,
            ["f9", "b2", "d2", "c1", "a0", "e0"],
            "{}",
            server.flavor()
        );
        assert_nothing_left(&server, "prio-order").await;
    }
}

/// Without priorities the queue is the FIFO of before: grants in ticket order, and `stats`
/// shows every waiter in class 0, in ticket order.
#[tokio::test]
async fn without_priorities_the_queue_is_fifo() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "prio-fifo", 1, LEASE).await;
        let first = sem.acquire().await.unwrap();
        let mut waiting = Vec::new();
        for i in 0..4 {
            let sem = sem.clone();
            waiting.push(tokio::spawn(async move { sem.acquire().await.unwrap() }));
            assert!(
                eventually(Duration::from_secs(10), || card(
                    &server,
                    "prio-fifo",
                    "queue"
                ) == i + 1)
                .await
            );
        }
        let st = sem.stats().await.unwrap();
        let tickets: Vec<u64> = st.waiters.iter().map(|w| w.ticket).collect();
        assert!(tickets.windows(2).all(|w| w[0] < w[1]), "{tickets:?}");
        assert!(st.waiters.iter().all(|w| w.priority == 0));
        // the queue's scores are the tickets themselves, as before priorities existed
        let Reply::Array(scored) = server.cmd(&[
            "ZRANGE",
            "redsem:{prio-fifo}:queue",
            "0",
            "-1",
            "WITHSCORES",
        ]) else {
            panic!()
        };
        let scores: Vec<u64> = scored
            .iter()
            .skip(1)
            .step_by(2)
            .map(|s| s.as_str().unwrap().parse().unwrap())
            .collect();
        assert_eq!(scores, tickets);
        drop(first);
        for w in waiting {
            drop(w.await.unwrap());
        }
        assert_nothing_left(&server, "prio-fifo").await;
    }
}

/// Aging: a higher class overtakes only the requests that queued within 1000 tickets per
/// class before it; older ones stay ahead, so a low class is never overtaken for ever.
#[tokio::test]
async fn a_higher_class_overtakes_only_requests_of_the_last_thousand_tickets_per_class() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "prio-aging", 1, LEASE).await;
        // Between the requests, tickets are issued as by requests elsewhere that came and
        // went: "mid1" comes 1,501 tickets after "old0" (class 1 jumps at most 1,000: it
        // stays behind); "high2" 1,502 after it (class 2 jumps 2,000: it passes both);
        // "late2" 4,003 after it: behind everyone.
        let order = grant_order(
            &server,
            &sem,
            "prio-aging",
            &[("old0", 0), ("mid1", 1), ("high2", 2), ("late2", 2)],
            |i| match i {
                1 => drop(server.cmd(&["HINCRBY", "redsem:{prio-aging}:cfg", "seq", "1500"])),
                3 => drop(server.cmd(&["HINCRBY", "redsem:{prio-aging}:cfg", "seq", "2500"])),
                _ => {}
            },
        )
        .await;
        assert_eq!(
            order,
            ["high2", "old0", "mid1", "late2"],
            "{}",
            server.flavor()
        );
        // the bound is exact: a class-1 request 1,000 tickets after a class-0 one passes
        // it, one 1,001 tickets after it does not
        let order = grant_order(
            &server,
            &sem,
            "prio-aging",
            &[("old0", 0), ("edge1", 1), ("past1", 1)],
            |i| {
                if i == 1 {
                    drop(server.cmd(&["HINCRBY", "redsem:{prio-aging}:cfg", "seq", "999"]));
                }
            },
        )
        .await;
        assert_eq!(order, ["edge1", "old0", "past1"], "{}", server.flavor());
        assert_nothing_left(&server, "prio-aging").await;
    }
}

/// The head rule stays: a large request at the head blocks smaller ones of its class or
/// below; a request of a higher class that fits in the free permits is granted at once (it
/// is ahead of that head), by `try_acquire` too.
#[tokio::test]
async fn a_higher_class_that_fits_passes_a_blocked_head() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "prio-head", 3, LEASE).await;
        let two = sem.acquire_many(2).await.unwrap();
        let big = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire_many(3).await.unwrap() })
        };
        assert!(
            eventually(Duration::from_secs(10), || card(
                &server,
                "prio-head",
                "queue"
            ) == 1)
            .await
        );
        // class 0 queues behind the blocked head (FIFO), try fails with QueuedFirst
        match sem.try_acquire().await {
            Err(Error::NoPermits { reason, .. }) => {
                assert_eq!(reason, NoPermitsReason::QueuedFirst)
            }
            other => panic!("{other:?}"),
        }
        // class 1 fits in the free permit and nobody is ahead of it: granted at once
        let urgent = sem
            .acquire_with(AcquireOptions::new().priority(1).try_only(true))
            .await
            .unwrap();
        assert_eq!(card(&server, "prio-head", "queue"), 1);
        // a class-1 request that does not fit queues ahead of the big head
        let waiting = {
            let sem = sem.clone();
            tokio::spawn(async move {
                sem.acquire_with(AcquireOptions::new().priority(1))
                    .await
                    .unwrap()
            })
        };
        assert!(
            eventually(Duration::from_secs(10), || card(
                &server,
                "prio-head",
                "queue"
            ) == 2)
            .await
        );
        let st = sem.stats().await.unwrap();
        assert_eq!(
            st.waiters
                .iter()
                .map(|w| (w.permits, w.priority))
                .collect::<Vec<_>>(),
            [(1, 1), (3, 0)]
        );
        drop(urgent);
        let second = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .unwrap()
            .unwrap();
        drop((two, second));
        let big = tokio::time::timeout(Duration::from_secs(10), big)
            .await
            .unwrap()
            .unwrap();
        drop(big);
        assert_nothing_left(&server, "prio-head").await;
    }
}

#[tokio::test]
async fn a_priority_above_the_highest_class_is_refused() {
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "prio-bad", 1, LEASE).await;
    let err = sem
        .acquire_with(AcquireOptions::new().priority(redsem::MAX_PRIORITY + 1))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("priority 10 is outside 0..=9")),
        "{err}"
    );
    assert_nothing_left(&server, "prio-bad").await;
    // the highest class is fine
    drop(
        sem.acquire_with(AcquireOptions::new().priority(redsem::MAX_PRIORITY))
            .await
            .unwrap(),
    );
    assert_nothing_left(&server, "prio-bad").await;
}

/// `Stats::oldest_wait` is the longest wait among the waiters listed: a class-0 waiter that
/// a later class-5 one overtook waited longer than the head (before, the head's wait was
/// reported, and a starving lower class was hidden from `list`, `watch --alert-after` and the
/// exporter).
#[tokio::test]
async fn the_oldest_wait_is_the_longest_listed_not_the_heads() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "prio-oldest", 1, LEASE).await;
        let held = sem.acquire().await.unwrap();
        let mut tasks = Vec::new();
        for (i, priority) in [0u8, 5].into_iter().enumerate() {
            let sem = sem.clone();
            tasks.push(tokio::spawn(async move {
                sem.acquire_with(AcquireOptions::new().priority(priority))
                    .await
                    .map(drop)
            }));
            assert!(
                eventually(Duration::from_secs(10), || card(
                    &server,
                    "prio-oldest",
                    "queue"
                ) == i as i64 + 1)
                .await
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let st = sem.stats().await.unwrap();
        assert_eq!(st.waiters[0].priority, 5, "{}", server.flavor());
        let (head, older) = (st.waiters[0].waited, st.waiters[1].waited);
        assert!(
            older >= head + Duration::from_millis(200),
            "{older:?} {head:?}"
        );
        assert_eq!(st.oldest_wait(), Some(older), "{}", server.flavor());
        drop(held);
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_nothing_left(&server, "prio-oldest").await;
    }
}

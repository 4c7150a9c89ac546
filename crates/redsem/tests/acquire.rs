//! Acquiring: the limit, FIFO order, try_acquire, acquire_many, slots and fences, resize.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;

const LEASE: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_is_never_exceeded_by_concurrent_tasks() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "limit", 3, LEASE).await;
        let inside = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let (sem, inside, peak) = (sem.clone(), inside.clone(), peak.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let p = sem.acquire().await.unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    p.release().await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(peak.load(Ordering::SeqCst), 3, "{}", server.flavor());
        assert_nothing_left(&server, "limit").await;
        assert_eq!(sem.stats().await.unwrap().grants_total, 100);
    }
}

#[tokio::test]
async fn waiters_are_granted_in_ticket_order() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "fifo", 1, LEASE).await;
        let first = sem.acquire().await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for i in 0..8 {
            let (sem, tx) = (sem.clone(), tx.clone());
            tasks.push(tokio::spawn(async move {
                let p = sem.acquire().await.unwrap();
                tx.send((i, p.ticket())).unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(p);
            }));
            // wait until this waiter is queued before starting the next one
            assert!(
                eventually(Duration::from_secs(5), || card(&server, "fifo", "queue")
                    == i + 1)
                .await
            );
        }
        drop(first);
        let mut order = Vec::new();
        for _ in 0..8 {
            order.push(rx.recv().await.unwrap());
        }
        let tasks_in_order: Vec<i64> = order.iter().map(|o| o.0).collect();
        assert_eq!(
            tasks_in_order,
            (0..8).collect::<Vec<_>>(),
            "{}",
            server.flavor()
        );
        assert!(
            order.windows(2).all(|w| w[0].1 < w[1].1),
            "tickets ascend: {order:?}"
        );
        for t in tasks {
            t.await.unwrap();
        }
    }
}

#[tokio::test]
async fn try_acquire_fails_fast_when_full_or_when_others_queue() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "try", 2, LEASE).await;
        let a = sem.try_acquire().await.unwrap();
        let _b = sem.try_acquire().await.unwrap();
        assert!(matches!(
            sem.try_acquire().await,
            Err(redsem::Error::NoPermits { .. })
        ));
        // a queued waiter has priority over a later try_acquire even when a permit frees
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire_many(2).await.unwrap() })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "try", "queue")
                == 1)
            .await
        );
        drop(a);
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "try", "slots")
                == 1)
            .await
        );
        assert!(matches!(
            sem.try_acquire().await,
            Err(redsem::Error::NoPermits { .. })
        ));
        drop(_b);
        let w = waiter.await.unwrap();
        assert_eq!(w.num_permits(), 2);
        assert_eq!(w.slots(), vec![0, 1]);
        drop(w);
        assert_nothing_left(&server, "try").await;
        assert!(sem.try_acquire().await.is_ok());
    }
}

#[tokio::test]
async fn acquire_many_at_the_head_blocks_smaller_requests_behind_it() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "many", 3, LEASE).await;
        let one = sem.acquire().await.unwrap();
        let two = sem.acquire().await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let big = {
            let (sem, tx) = (sem.clone(), tx.clone());
            tokio::spawn(async move {
                let p = sem.acquire_many(3).await.unwrap();
                tx.send("big").unwrap();
                p
            })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "many", "queue")
                == 1)
            .await
        );
        let small = {
            let (sem, tx) = (sem.clone(), tx.clone());
            tokio::spawn(async move {
                let p = sem.acquire().await.unwrap();
                tx.send("small").unwrap();
                p
            })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "many", "queue")
                == 2)
            .await
        );
        // one permit is free, but the head needs three: nobody is admitted
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(rx.try_recv().is_err());
        drop(one);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            rx.try_recv().is_err(),
            "the small request must not overtake the big one"
        );
        drop(two);
        assert_eq!(rx.recv().await, Some("big"));
        let big = big.await.unwrap();
        assert_eq!(big.slots(), vec![0, 1, 2]);
        drop(big);
        assert_eq!(rx.recv().await, Some("small"));
        drop(small.await.unwrap());
        assert_nothing_left(&server, "many").await;
    }
}

#[tokio::test]
async fn slots_are_unique_among_holders_and_fences_advance_per_slot() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "slots", 4, LEASE).await;
        let held: Vec<_> = [
            sem.acquire().await.unwrap(),
            sem.acquire_many(2).await.unwrap(),
            sem.acquire().await.unwrap(),
        ]
        .into();
        let mut slots: Vec<u32> = held.iter().flat_map(|p| p.slots()).collect();
        slots.sort();
        assert_eq!(slots, vec![0, 1, 2, 3]);
        let gen_of = |p: &redsem::Permit, slot: u32| {
            p.fences()
                .iter()
                .find(|f| f.slot == slot)
                .map(|f| f.generation)
        };
        let first_gen: Vec<u64> = (0..4)
            .map(|s| held.iter().find_map(|p| gen_of(p, s)).unwrap())
            .collect();
        // a generation is at least Redis's clock in microseconds at the grant
        let before = redis_time_us(&server);
        for g in &first_gen {
            assert!(
                *g <= before && *g > before - 60_000_000,
                "{g} is not Redis TIME (µs) at the grant ({before})"
            );
        }
        let middle = held[1].slots();
        drop(held);
        assert_nothing_left(&server, "slots").await;
        // the lowest free slot is granted first; its generation is higher than before
        let again = sem.acquire().await.unwrap();
        assert_eq!(again.fences()[0].slot, 0);
        assert!(again.fences()[0].generation > first_gen[0]);
        assert!(again.fences()[0].generation >= before);
        assert_eq!(middle.len(), 2);
    }
}

#[tokio::test]
async fn resize_grows_at_once_and_shrinks_as_holders_leave() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "resize", 1, LEASE).await;
        let a = sem.acquire().await.unwrap();
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await.unwrap() })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "resize", "queue")
                == 1)
            .await
        );
        assert_eq!(sem.resize(2).await.unwrap().previous, 1);
        let b = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(b.slots(), vec![1]);
        // shrink to 1 while two hold: nobody is admitted until both are gone... then one
        assert_eq!(sem.resize(1).await.unwrap().previous, 2);
        let stats = sem.stats().await.unwrap();
        assert_eq!((stats.limit, stats.in_use, stats.available), (1, 2, 0));
        drop(b);
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "resize", "slots")
                == 1)
            .await
        );
        assert!(matches!(
            sem.try_acquire().await,
            Err(redsem::Error::NoPermits { .. })
        ));
        drop(a);
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "resize", "slots")
                == 0)
            .await
        );
        let c = sem.try_acquire().await.unwrap();
        assert_eq!(c.slots(), vec![0]);
        // a new process must now open with the new limit
        let other = client.semaphore("resize", 2).open().await;
        assert!(matches!(
            other,
            Err(redsem::Error::LimitConflict {
                stored: 1,
                requested: 2,
                ..
            })
        ));
    }
}

#[tokio::test]
async fn stats_list_holders_and_waiters_in_queue_order() {
    for server in servers() {
        let client = client(&server).await;
        let sem = client
            .semaphore("stats", 1)
            .label("worker-a")
            .open()
            .await
            .unwrap();
        let held = sem.acquire().await.unwrap();
        let w1 = {
            let s = sem.clone();
            tokio::spawn(async move { s.acquire().await.map(drop) })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "stats", "queue")
                == 1)
            .await
        );
        let w2 = {
            let s = sem.clone();
            tokio::spawn(async move { s.acquire_many(1).await.map(drop) })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "stats", "queue")
                == 2)
            .await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let st = sem.stats().await.unwrap();
        assert_eq!((st.limit, st.in_use, st.available), (1, 1, 0));
        assert_eq!(st.holders.len(), 1);
        assert_eq!(st.holders[0].id, held.holder_id());
        assert_eq!(st.holders[0].label, "worker-a");
        assert_eq!(st.holders[0].fences, held.fences().to_vec());
        assert!(st.holders[0].held >= Duration::from_millis(40));
        assert!(st.holders[0].lease_left > Duration::from_secs(8));
        assert_eq!(st.waiters.len(), 2);
        assert_eq!(st.waiters[0].position, 0);
        assert!(st.waiters[0].ticket < st.waiters[1].ticket);
        assert!(st.oldest_wait().unwrap() >= Duration::from_millis(40));
        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(json["holders"][0]["label"], "worker-a");
        drop(held);
        w1.await.unwrap().unwrap();
        w2.await.unwrap().unwrap();
    }
}

/// `stats_listing` / `inspect_listing` bound the entries listed, never the counts; 1 lists the
/// head of the queue even when the entry ahead of it is a dead waiter's (its session's lease
/// passed, not reaped yet: a snapshot leaves it out, as the next reap removes it).
#[tokio::test]
async fn a_listing_bound_limits_the_entries_not_the_counts() {
    for server in servers() {
        let (holder, a, b) = (
            client(&server).await,
            client(&server).await,
            client(&server).await,
        );
        let lease = Duration::from_secs(30);
        let sem = open(&holder, "listing", 1, lease).await;
        let held = sem.acquire().await.unwrap();
        let mut waiting = Vec::new();
        for (i, c) in [&a, &b, &b].into_iter().enumerate() {
            let s = open(c, "listing", 1, lease).await;
            waiting.push(tokio::spawn(async move { s.acquire().await.map(drop) }));
            assert!(
                eventually(Duration::from_secs(5), || card(&server, "listing", "queue")
                    == i as i64 + 1)
                .await
            );
        }
        let all = sem.stats().await.unwrap();
        assert_eq!((all.holders.len(), all.waiters.len()), (1, 3));

        let counts = sem.stats_listing(0).await.unwrap();
        assert_eq!((counts.holder_count, counts.waiter_count), (1, 3));
        assert_eq!((counts.in_use, counts.available), (1, 0));
        assert!(counts.holders.is_empty() && counts.waiters.is_empty());
        assert!(counts.oldest_wait().is_none());

        let head = holder.inspect_listing("listing", 1).await.unwrap();
        assert_eq!((head.holder_count, head.waiter_count), (1, 3));
        assert_eq!(head.holders[0].id, held.holder_id());
        assert_eq!(head.waiters.len(), 1);
        assert_eq!(head.waiters[0].id, all.waiters[0].id);
        assert!(head.oldest_wait().is_some());

        // the head's session (client `a`'s waiters) loses its lease in Redis
        let dead = session_of(&server, "listing", &all.waiters[0].id);
        server.cmd(&["ZADD", &key("listing", "exp"), "XX", "1", &dead]);
        let after = sem.stats_listing(1).await.unwrap();
        assert_eq!(after.waiter_count, 2, "{}", server.flavor());
        assert_eq!(after.waiters.len(), 1, "{}", server.flavor());
        assert_eq!(after.waiters[0].id, all.waiters[1].id);
        assert_eq!(after.waiters[0].position, 0);
        let two = sem.stats_listing(2).await.unwrap();
        let ids: Vec<_> = two.waiters.iter().map(|w| w.id.clone()).collect();
        assert_eq!(ids, [all.waiters[1].id.clone(), all.waiters[2].id.clone()]);

        // a bound past MAX_LISTED is refused before any call
        let too_many = redsem::MAX_LISTED + 1;
        assert!(matches!(
            sem.stats_listing(too_many).await,
            Err(redsem::Error::InvalidArgument(_))
        ));
        assert!(matches!(
            holder.inspect_listing("listing", too_many).await,
            Err(redsem::Error::InvalidArgument(_))
        ));
        assert_eq!(
            sem.stats_listing(redsem::MAX_LISTED)
                .await
                .unwrap()
                .waiters
                .len(),
            2
        );

        for w in waiting {
            w.abort();
        }
        drop(held);
    }
}

#[tokio::test]
async fn a_limit_raised_by_another_process_counts_at_once() {
    for server in servers() {
        let a = client(&server).await;
        let b = client(&server).await;
        let sem_a = open(&a, "grown", 4, Duration::from_secs(10)).await;
        let sem_b = open(&b, "grown", 4, Duration::from_secs(10)).await;
        assert_eq!(sem_b.resize(8).await.unwrap().previous, 4);
        // `a` last saw 4: its request for 6 goes to Redis, which knows 8
        let p = sem_a.acquire_many(6).await.unwrap();
        assert_eq!(p.slots(), [0, 1, 2, 3, 4, 5], "{}", server.flavor());
        drop(p);
        // and one above the stored limit is still refused, naming the stored limit
        match sem_a.try_acquire_many(9).await {
            Err(redsem::Error::TooManyPermits {
                requested: 9,
                limit: 8,
                ..
            }) => {}
            other => panic!("{}: {other:?}", server.flavor()),
        }
        assert_eq!(
            sem_a.limit(),
            8,
            "the refusal's reply carries the stored limit"
        );
    }
}

/// An operator shrinks the limit under queued requests: every one larger than the new limit
/// is rejected at once, wherever it waits in the queue (not only at the head); the resize
/// reports them; their acquires fail naming the limit as it is now, not the one their handle
/// saw last; requests that still fit keep their places.
#[tokio::test]
async fn a_shrink_rejects_the_larger_requests_and_says_which() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "shrunk", 3, LEASE).await;
        let full = sem.acquire_many(3).await.unwrap();
        let small = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "shrunk", "queue")
                == 1)
            .await
        );
        let big = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire_many(3).await })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "shrunk", "queue")
                == 2)
            .await
        );
        let big_id = match server.cmd(&["ZRANGE", "redsem:{shrunk}:queue", "1", "1"]) {
            Reply::Array(a) => a[0].as_str().unwrap().to_owned(),
            other => panic!("{other:?}"),
        };
        // another process resizes: this handle still believes the limit is 3
        let operator = common::client(&server).await;
        let resized = operator.resize_existing("shrunk", 2).await.unwrap();
        assert_eq!(
            (resized.previous, resized.limit),
            (3, 2),
            "{}",
            server.flavor()
        );
        assert_eq!(
            resized.rejected.len(),
            1,
            "{}: {resized:?}",
            server.flavor()
        );
        assert_eq!(resized.rejected[0].id, big_id);
        assert_eq!(resized.rejected[0].permits, 3);
        match tokio::time::timeout(Duration::from_secs(5), big)
            .await
            .unwrap()
            .unwrap()
        {
            Err(redsem::Error::TooManyPermits {
                requested: 3,
                limit: 2,
                ..
            }) => {}
            other => panic!("{}: {other:?}", server.flavor()),
        }
        // the request that fits waits on, and is served once usage is below the limit
        assert_eq!(card(&server, "shrunk", "queue"), 1, "{}", server.flavor());
        drop(full);
        let p = tokio::time::timeout(Duration::from_secs(5), small)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        drop(p);
        // a growth rejects nobody
        let grown = operator.resize_existing("shrunk", 4).await.unwrap();
        assert!(grown.rejected.is_empty());
        client.shutdown().await;
        assert_nothing_left(&server, "shrunk").await;
    }
}

/// Grants and releases of thousands of permits at once (beyond what one Lua `unpack` takes,
/// about 8,000 values): every permit of the largest limit at once, and a queued request for
/// 5,000 that a release grants; each is granted whole, and released leaves nothing.
#[tokio::test]
async fn thousands_of_permits_are_granted_and_released_in_one_request() {
    for server in servers() {
        let client = client(&server).await;
        let all = redsem::MAX_LIMIT;
        let sem = open(&client, "huge", all, LEASE).await;
        let p = sem.acquire_many(all).await.unwrap();
        assert_eq!(p.slots().len(), all as usize, "{}", server.flavor());
        assert_eq!(sem.stats().await.unwrap().in_use, all);
        p.release().await.unwrap();
        assert_nothing_left(&server, "huge").await;

        let sem = open(&client, "big", 5000, LEASE).await;
        let one = sem.acquire().await.unwrap();
        let waiting = tokio::spawn({
            let sem = sem.clone();
            async move { sem.acquire_many(5000).await }
        });
        until_queued(&sem, 1).await;
        one.release().await.unwrap();
        let p = tokio::time::timeout(Duration::from_secs(30), waiting)
            .await
            .expect("the queued request is granted once the holder released")
            .unwrap()
            .unwrap();
        assert_eq!(p.slots().len(), 5000, "{}", server.flavor());
        p.release().await.unwrap();
        assert_nothing_left(&server, "big").await;
        assert_eq!(sem.stats().await.unwrap().repairs_total, 0);
    }
}

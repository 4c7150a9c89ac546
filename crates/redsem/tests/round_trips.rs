//! Round trips per acquisition and release, counted by Redis itself (INFO commandstats):
//! constant, whatever the number of waiters.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;

/// Calls per command since the last CONFIG RESETSTAT.
fn commandstats(server: &Server) -> HashMap<String, u64> {
    command_stats(server)
        .into_iter()
        .map(|(name, (calls, _))| (name, calls))
        .collect()
}

/// Commands a client sends itself (as opposed to those run inside scripts).
fn round_trips(stats: &HashMap<String, u64>) -> u64 {
    SCRIPT_CALLS
        .iter()
        .chain(&[
            "script|load",
            "function|load",
            "subscribe",
            "unsubscribe",
            "ping",
        ])
        .filter_map(|c| stats.get(*c))
        .sum()
}

#[tokio::test]
async fn uncontended_acquire_and_release_take_one_round_trip_each() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "rt-free", 4, Duration::from_secs(30)).await;
        drop(sem.acquire().await.unwrap().release().await); // load the scripts
        server.cmd(&["CONFIG", "RESETSTAT"]);
        const N: u64 = 50;
        for _ in 0..N {
            let p = sem.acquire().await.unwrap();
            p.release().await.unwrap();
        }
        let stats = commandstats(&server);
        let trips = round_trips(&stats);
        let fcall = stats.get("fcall").copied().unwrap_or(0);
        println!(
            "{}: uncontended: {trips} round trips for {N} acquire+release ({fcall} FCALL)",
            server.flavor()
        );
        // each a call of a function of redsem's library
        assert_eq!(fcall, 2 * N, "{stats:?}");
        // the only other command sent is CONFIG/INFO of this test
        assert_eq!(trips, 2 * N, "{stats:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_round_trips_do_not_grow_with_the_number_of_waiters() {
    for server in servers() {
        let mut per_job = Vec::new();
        for waiters in [10u64, 200] {
            let client = client(&server).await;
            let name = format!("rt-{waiters}");
            let sem = open(&client, &name, 2, Duration::from_secs(30)).await;
            drop(sem.acquire().await.unwrap().release().await);
            server.cmd(&["CONFIG", "RESETSTAT"]);
            let mut tasks = Vec::new();
            for _ in 0..waiters {
                let sem = sem.clone();
                tasks.push(tokio::spawn(async move {
                    let p = sem.acquire().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    p.release().await.unwrap();
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let stats = commandstats(&server);
            let trips = round_trips(&stats) as f64 / waiters as f64;
            let publishes = stats.get("publish").copied().unwrap_or(0);
            println!(
                "{}: {waiters} waiters, limit 2: {trips:.2} round trips per acquire+release, {publishes} notifications",
                server.flavor()
            );
            // at most one notification per grant
            assert!(
                publishes <= waiters,
                "{publishes} notifications for {waiters} grants"
            );
            per_job.push(trips);
        }
        // one call per acquire, one per release, plus a small share of heartbeats
        for t in &per_job {
            assert!(*t <= 2.2, "{}: {per_job:?}", server.flavor());
        }
    }
}

/// A release that frees a full semaphore's only permit grants the head of the queue and stops
/// there: it reads that one head (one `ZRANGE`, one `HGET` of its record besides its own),
/// not the next one to learn that nothing is left for it, however long the queue.
#[tokio::test]
async fn a_granting_release_reads_one_head_whatever_the_queue() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "rt-head", 1, Duration::from_secs(30)).await;
        let holder = sem.acquire().await.unwrap();
        // (each waiter, once granted, holds until the test lets it go)
        let go = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
        let mut tasks = Vec::new();
        for _ in 0..5 {
            let (sem, go) = (sem.clone(), go.clone());
            tasks.push(tokio::spawn(async move {
                let p = sem.acquire().await.unwrap();
                go.acquire().await.unwrap().forget();
                p.release().await.unwrap();
            }));
        }
        until_queued(&sem, 5).await;
        server.cmd(&["CONFIG", "RESETSTAT"]);
        holder.release().await.unwrap();
        let stats = commandstats(&server);
        println!("{}: a granting release: {stats:?}", server.flavor());
        assert_eq!(stats.get("fcall").copied(), Some(1), "{stats:?}");
        assert_eq!(stats.get("zrange").copied(), Some(1), "{stats:?}");
        assert_eq!(stats.get("hget").copied(), Some(2), "{stats:?}");
        assert_eq!(stats.get("publish").copied(), Some(1), "{stats:?}");
        // the four others are granted in turn as each releases
        go.add_permits(5);
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .expect("every waiter is granted in turn")
                .unwrap();
        }
    }
}

//! What a semaphore costs Redis, measured by Redis itself and printed (run with
//! `--nocapture`): the script time per acquire+release (`INFO commandstats`), the time of the
//! admin paths (open, stats) with and without a long queue, and the memory of an idle
//! semaphore with the largest limit. The times are printed, not asserted (the machine is
//! shared and noisy); the memory bound is asserted.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;

/// `(script calls, their usec, commands run inside the scripts)` in `stats`.
fn script_cost(stats: &HashMap<String, (u64, u64)>) -> (u64, u64, u64) {
    let mut calls = 0;
    let mut usec = 0;
    let mut inner = 0;
    for (name, (c, u)) in stats {
        if SCRIPT_CALLS.contains(&name.as_str()) {
            calls += c;
            usec += u;
        } else if ![
            "info",
            "config|resetstat",
            "config",
            "subscribe",
            "ssubscribe",
            "ping",
            "script|load",
            "function|load",
            "hello",
            "client|setinfo",
            "client|setname",
            "eval_ro",
        ]
        .contains(&name.as_str())
        {
            inner += c;
        }
    }
    (calls, usec, inner)
}

/// One task acquires and releases, uncontended: the Redis time of each call, as functions of
/// the library and as scripts.
#[tokio::test]
async fn acquire_release_profile() {
    for server in servers() {
        profile(&server, false).await;
        profile(&server, true).await;
    }
}

/// [`acquire_release_profile`] on `server`, through functions or scripts.
async fn profile(server: &Server, scripts: bool) {
    {
        let client = redsem::Client::builder(server.url())
            .scripts_only(scripts)
            .build()
            .await
            .unwrap();
        let path = if scripts { "scripts" } else { "functions" };
        let sem = open(&client, "cost-cycle", 4, Duration::from_secs(30)).await;
        for _ in 0..200 {
            sem.acquire().await.unwrap().release().await.unwrap();
        }
        const N: u64 = 2000;
        // the median of 3 rounds of N cycles
        let mut rounds = Vec::new();
        let mut inner_calls = Vec::new();
        for _ in 0..3 {
            server.cmd(&["CONFIG", "RESETSTAT"]);
            for _ in 0..N {
                sem.acquire().await.unwrap().release().await.unwrap();
            }
            let stats = command_stats(server);
            rounds.push(script_cost(&stats));
            inner_calls = stats
                .into_iter()
                .filter(|(name, _)| !SCRIPT_CALLS.contains(&name.as_str()))
                .map(|(name, (calls, _))| (name, calls as f64 / N as f64))
                .filter(|(_, per_cycle)| *per_cycle >= 0.5)
                .collect::<Vec<_>>();
        }
        inner_calls.sort_by(|a, b| a.0.cmp(&b.0));
        rounds.sort_by_key(|r| r.1);
        let (calls, usec, inner) = rounds[1];
        println!(
            "{} ({path}): acquire+release, 1 task, {N} cycles: {:.2} calls/cycle, {:.2} µs per \
             call, {:.2} µs Redis time per cycle, {:.1} commands inside the calls per cycle \
             (rounds: {:?} µs/cycle)",
            server.flavor(),
            calls as f64 / N as f64,
            usec as f64 / calls as f64,
            usec as f64 / N as f64,
            inner as f64 / N as f64,
            rounds
                .iter()
                .map(|r| format!("{:.2}", r.1 as f64 / N as f64))
                .collect::<Vec<_>>()
        );
        println!(
            "{} ({path}): commands per cycle: {}",
            server.flavor(),
            inner_calls
                .iter()
                .map(|(name, n)| format!("{name} {n:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert_eq!(calls, 2 * N);
    }
}

/// The Redis time of `open` and `stats` with an idle semaphore, with 3,000 waiters, and with
/// a limit of 100,000.
#[tokio::test]
async fn admin_paths() {
    for server in servers() {
        let client = client(&server).await;
        // (renewals every 40 s and no fallback poll: nothing else runs a script meanwhile)
        let lease = Duration::from_secs(120);
        let open = |name: &'static str, limit: u32| {
            client
                .semaphore(name, limit)
                .lease(lease)
                .fallback_poll(Duration::from_secs(3600))
                .open()
        };
        // "queue0": nobody waits; "queue3k": one holder, 3,000 waiters; "limit100k": idle
        let q0 = open("queue0", 1).await.unwrap();
        let _held0 = q0.acquire().await.unwrap();
        let q3k = open("queue3k", 1).await.unwrap();
        let _held = q3k.acquire().await.unwrap();
        let mut waiting = Vec::new();
        for _ in 0..3000 {
            let s = q3k.clone();
            waiting.push(tokio::spawn(async move { s.acquire().await }));
        }
        assert!(
            eventually(Duration::from_secs(30), || card(
                &server, "queue3k", "queue"
            ) == 3000)
            .await
        );
        let _big = open("limit100k", 100_000).await.unwrap();
        for (name, limit) in [("queue0", 1), ("queue3k", 1), ("limit100k", 100_000)] {
            const N: u64 = 20;
            server.cmd(&["CONFIG", "RESETSTAT"]);
            let mut opened = Vec::new();
            for _ in 0..N {
                opened.push(
                    client
                        .semaphore(name, limit)
                        .lease(lease)
                        .open()
                        .await
                        .unwrap(),
                );
            }
            let (calls, open_us, _) = script_cost(&command_stats(&server));
            drop(opened);
            client.flush_releases().await; // (their sessions end: not in the next figures)
            server.cmd(&["CONFIG", "RESETSTAT"]);
            for _ in 0..N {
                client.inspect(name).await.unwrap();
            }
            let (stats_calls, stats_us, _) = script_cost(&command_stats(&server));
            println!(
                "{}: {name}: open {:.0} µs Redis script time per call ({calls} script calls \
                 for {N} opens), stats {:.0} µs per call",
                server.flavor(),
                open_us as f64 / N as f64,
                stats_us as f64 / stats_calls as f64,
            );
        }
        for w in &waiting {
            w.abort();
        }
    }
}

/// An idle semaphore of limit 100,000 holds little memory in Redis.
#[tokio::test]
async fn idle_memory() {
    const KEYS: [&str; 7] = ["cfg", "queue", "exp", "meta", "slots", "free", "own"];
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "big", 100_000, Duration::from_secs(30)).await;
        let bytes = |server: &Server| -> i64 {
            KEYS.iter()
                .map(|k| {
                    server
                        .cmd(&["MEMORY", "USAGE", &format!("redsem:{{big}}:{k}")])
                        .as_int()
                        .unwrap_or(0)
                })
                .sum()
        };
        let fresh = bytes(&server);
        // used once by 100 holders at once, then idle again
        let permits = sem.acquire_many(100).await.unwrap();
        permits.release().await.unwrap();
        let used = bytes(&server);
        println!(
            "{}: idle semaphore of limit 100,000: {fresh} bytes (MEMORY USAGE of its keys); \
             {used} bytes after 100 permits were held and released",
            server.flavor()
        );
        assert!(fresh <= 64 * 1024, "{fresh} bytes");
        assert!(used <= 64 * 1024, "{used} bytes");
    }
}

//! redsem through Sentinel (a master, a replica, three sentinels): the client finds the
//! master through the sentinels and follows failovers to the new master, its commands and its
//! subscriber alike.

use std::time::{Duration, Instant};

use redsem::{Client, Error, Semaphore};
use test_support::{Reply, Sentinels, Server, flavors};

fn trace() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

async fn client(url: &str) -> Client {
    trace();
    Client::builder(url)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap()
}

async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

fn queued(server: &Server, name: &str) -> i64 {
    server
        .cmd(&["ZCARD", &format!("redsem:{{{name}}}:queue")])
        .as_int()
        .unwrap_or(-1)
}

/// Renewal interval of [`open`]'s handles: their waiters poll no more often than this.
const RENEW: Duration = Duration::from_secs(4);

/// A wake-up faster than this came from a notification: half the renewal interval, at which
/// a waiter would poll next. Generous for a loaded machine, and still below a poll.
const NOTIFIED_WITHIN: Duration = Duration::from_secs(2);

/// A lease long enough to outlive a failover, renewed often.
async fn open(client: &Client, name: &str) -> Semaphore {
    client
        .semaphore(name, 1)
        .lease(Duration::from_secs(15))
        // progress must come from notifications, not from polling (waiters are renewed, and
        // so polled, every renewal interval)
        .renew_every(RENEW)
        .fallback_poll(Duration::from_secs(30))
        .open()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_requested_failover_is_followed_by_commands_and_notifications() {
    for flavor in flavors() {
        let set = Sentinels::start(flavor);
        let client = client(&set.url()).await;
        let sem = open(&client, "s").await;
        // works, on the master
        drop(sem.acquire().await.unwrap());
        let old = set.master();
        assert_eq!(
            set.data(old)
                .cmd(&["HGET", "redsem:{s}:cfg", "limit"])
                .as_str(),
            Some("1")
        );
        let held = sem.acquire().await.unwrap();
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        assert!(eventually(Duration::from_secs(5), || queued(set.data(old), "s") == 1).await);

        let new = set.failover();
        assert_ne!(new, old);
        // the subscriber moved to the new master
        let channel = format!("redsem:{{s}}:c:{}.0", client.id());
        assert!(
            eventually(Duration::from_secs(10), || matches!(
                set.data(new).cmd(&["PUBSUB", "NUMSUB", &channel]),
                Reply::Array(a) if a.get(1).and_then(Reply::as_int) == Some(1)
            ))
            .await,
            "{flavor}: the subscriber did not follow the master"
        );
        // the holder kept its permit through the failover (its grant had been replicated)
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(!held.is_lost(), "{flavor}");
        let released = Instant::now();
        held.release().await.unwrap();
        let p = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter hung after the failover")
            .unwrap()
            .unwrap();
        assert!(
            released.elapsed() < NOTIFIED_WITHIN,
            "{flavor}: woken {:?} after the release",
            released.elapsed()
        );
        // the new master has the semaphore's state; writes go there
        assert_eq!(
            set.data(new).cmd(&["HLEN", "redsem:{s}:slots"]).as_int(),
            Some(1)
        );
        drop(p);
        assert!(
            eventually(Duration::from_secs(5), || set
                .data(new)
                .cmd(&["HLEN", "redsem:{s}:slots"])
                .as_int()
                == Some(0))
            .await
        );
        // a client connecting now finds the new master
        let late = client_for_set(&set).await;
        let p = open(&late, "s").await.try_acquire().await.unwrap();
        drop(p);
    }
}

async fn client_for_set(set: &Sentinels) -> Client {
    client(&set.url()).await
}

#[tokio::test]
async fn a_killed_master_is_replaced_and_waiters_keep_progressing() {
    for flavor in flavors() {
        let mut set = Sentinels::start(flavor);
        let client = client(&set.url()).await;
        let sem = open(&client, "k").await;
        let held = sem.acquire().await.unwrap();
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        let old = set.master();
        assert!(eventually(Duration::from_secs(5), || queued(set.data(old), "k") == 1).await);
        // let the replica catch up, then kill the master
        assert!(
            eventually(Duration::from_secs(5), || {
                let replica = 1 - old;
                matches!(
                    set.data(replica).cmd(&["ZCARD", "redsem:{k}:queue"]),
                    Reply::Int(1)
                )
            })
            .await
        );
        let killed = Instant::now();
        let new = set.kill_master();
        println!(
            "{flavor}: the sentinels promoted a replica {:?} after the kill",
            killed.elapsed()
        );
        // commands reach the new master (the holder renews its session there)
        // (the latest session lease: the highest finite score; the marker `#` has +inf)
        let lease_end = |set: &Sentinels| match set.data(new).cmd(&[
            "ZREVRANGEBYSCORE",
            "redsem:{k}:exp",
            "(+inf",
            "-inf",
            "WITHSCORES",
            "LIMIT",
            "0",
            "1",
        ]) {
            Reply::Array(a) if a.len() == 2 => a[1].as_str().and_then(|s| s.parse::<f64>().ok()),
            _ => None,
        };
        let before = lease_end(&set).unwrap_or(0.0);
        let renewed_there = || lease_end(&set).is_some_and(|e| e > before);
        assert!(eventually(Duration::from_secs(10), renewed_there).await);
        assert!(
            !held.is_lost(),
            "{flavor}: a failover shorter than the lease cost the permit"
        );
        let released = Instant::now();
        held.release().await.unwrap();
        let p = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter hung after the failover")
            .unwrap()
            .unwrap();
        println!(
            "{flavor}: waiter granted {:?} after the release, {:?} after the kill",
            released.elapsed(),
            killed.elapsed()
        );
        assert!(released.elapsed() < NOTIFIED_WITHIN, "{flavor}");
        drop(p);
        // the old master comes back as a replica: the client stays with the new master
        set.restart(old);
        let p = tokio::time::timeout(Duration::from_secs(5), sem.acquire())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            set.data(new).cmd(&["HLEN", "redsem:{k}:slots"]).as_int(),
            Some(1)
        );
        drop(p);
    }
}

#[tokio::test]
async fn a_wrong_master_name_or_no_sentinel_is_a_clear_error() {
    let set = Sentinels::start(flavors()[0]);
    let url = set.url().replace("/mymaster", "/nosuchmaster");
    let err = Client::builder(&url)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("nosuchmaster"), "{err}");

    let port = test_support::free_port();
    let started = Instant::now();
    let err = Client::builder(format!("redis+sentinel://127.0.0.1:{port}/mymaster"))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unreachable(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// Sentinel promotes the replica without pausing the old master: the writes the old master
/// acknowledged last are lost, releases among them. A released entry that comes back that way
/// is in a session this client keeps renewing: without more, it would be held for ever by
/// nobody (no grant for anyone: with limit 1, a deadlock while the process lives). The releases
/// of the last seconds are sent again once the client follows the new master, so everything
/// released is gone from the new master soon after the churn stops. Dropped permits (the
/// background releaser) and awaited releases (the handle's combined calls) alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_lost_in_a_failover_are_sent_again() {
    for flavor in flavors() {
        let set = Sentinels::start(flavor);
        let client = client(&set.url()).await;
        let sem = client
            .semaphore("churn", 1)
            .lease(Duration::from_secs(5))
            .open()
            .await
            .unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tasks: Vec<_> = (0..2)
            .map(|i| {
                let (sem, stop) = (sem.clone(), stop.clone());
                tokio::spawn(async move {
                    let options = redsem::AcquireOptions::new().timeout(Duration::from_secs(5));
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        if let Ok(p) = sem.acquire_with(options.clone()).await {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            if i == 0 {
                                drop(p);
                            } else {
                                let _ = p.release().await;
                            }
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let new = set.failover();
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(15), t)
                .await
                .expect("a task hung")
                .unwrap();
        }
        let data = set.data(new);
        let left = || {
            let held = data.cmd(&["HLEN", "redsem:{churn}:slots"]).as_int();
            (held, queued(data, "churn"))
        };
        assert!(
            eventually(Duration::from_secs(15), || left() == (Some(0), 0)).await,
            "{flavor}: still held or queued after every release (slots, queue): {:?}",
            left()
        );
        // the semaphore works: a new acquisition is granted at once
        drop(sem.try_acquire().await.unwrap());
    }
}

//! redsem on a Redis Cluster (3 masters + 3 replicas): the core behaviours, many semaphores
//! spread over the shards at once, and failovers (manual, and a killed master).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redsem::{Client, LostReason, Semaphore};
use test_support::{Cluster, Reply, flavors};

fn trace() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

async fn client(cluster: &Cluster) -> Client {
    trace();
    Client::builder(cluster.url())
        .connect_timeout(Duration::from_secs(3))
        .response_timeout(Duration::from_secs(3))
        .build()
        .await
        .unwrap()
}

fn key(name: &str, suffix: &str) -> String {
    format!("redsem:{{{name}}}:{suffix}")
}

fn card(cluster: &Cluster, name: &str, suffix: &str) -> i64 {
    let k = key(name, suffix);
    let cmd = match suffix {
        "queue" | "exp" | "free" => "ZCARD",
        _ => "HLEN",
    };
    cluster.cmd_for_key(&k, &[cmd, &k]).as_int().unwrap_or(-1)
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

/// Waits until `name` has `n` queued waiters (as the cluster sees it).
async fn queued(cluster: &Cluster, name: &str, n: i64) {
    assert!(
        eventually(Duration::from_secs(10), || card(cluster, name, "queue")
            == n)
        .await,
        "{name}: expected {n} queued, found {}",
        card(cluster, name, "queue")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_semaphores_spread_over_the_shards_keep_their_limits_at_once() {
    for flavor in flavors() {
        let cluster = Cluster::start(flavor);
        let client = client(&cluster).await;
        // a one-server URL naming a node is refused, with the URL to use (it would reach that
        // node alone: a third of the semaphores, and MOVED errors for the rest)
        let one = cluster.node(0).url();
        match Client::connect(&one).await {
            Err(redsem::Error::InvalidArgument(text)) => assert!(
                text.contains("is a node of a Redis Cluster") && text.contains("redis+cluster://"),
                "{flavor}: {text}"
            ),
            other => panic!("{flavor}: {one} as one server: {other:?}"),
        }
        // 12 semaphores; their hash tags put them on different masters
        let names: Vec<String> = (0..12).map(|i| format!("spread-{i}")).collect();
        let masters: std::collections::HashSet<usize> = names
            .iter()
            .map(|n| cluster.master_for_key(&key(n, "cfg")))
            .collect();
        assert_eq!(masters.len(), 3, "{flavor}: names on every master");
        let mut tasks = Vec::new();
        for name in &names {
            let sem = client
                .semaphore(name.as_str(), 2)
                .lease(Duration::from_secs(5))
                .open()
                .await
                .unwrap();
            let inside = Arc::new(AtomicUsize::new(0));
            let peak = Arc::new(AtomicUsize::new(0));
            for _ in 0..5 {
                let (sem, inside, peak) = (sem.clone(), inside.clone(), peak.clone());
                tasks.push(tokio::spawn(async move {
                    for _ in 0..4 {
                        let p = sem.acquire().await.unwrap();
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        p.release().await.unwrap();
                    }
                    peak.load(Ordering::SeqCst)
                }));
            }
        }
        for t in tasks {
            assert!(t.await.unwrap() <= 2, "{flavor}: a limit was exceeded");
        }
        for name in &names {
            // every key of a semaphore lives on the master of its hash tag
            let k = key(name, "cfg");
            assert_eq!(
                cluster.cmd_for_key(&k, &["HGET", &k, "grants"]).as_str(),
                Some("20"),
                "{flavor}: {name}"
            );
            assert_eq!(card(&cluster, name, "slots"), 0);
        }
        // operators see every semaphore, whatever master it lives on
        let listed = client.list_semaphores().await.unwrap();
        assert_eq!(listed.len(), names.len(), "{flavor}: {listed:?}");
        let st = client.inspect("spread-7").await.unwrap();
        assert_eq!(st.grants_total, 20);
        assert_eq!(
            client
                .resize_existing("spread-7", 3)
                .await
                .unwrap()
                .previous,
            2
        );
    }
}

#[tokio::test]
async fn fifo_crash_recovery_and_targeted_wake_up_on_a_cluster() {
    for flavor in flavors() {
        let cluster = Cluster::start(flavor);
        let client = client(&cluster).await;
        // a long fallback poll: progress below comes from SPUBLISH notifications
        let open = |name: &'static str, lease: Duration| {
            client
                .semaphore(name, 1)
                .lease(lease)
                .fallback_poll(Duration::from_secs(30))
                .open()
        };
        let sem = open("fifo", Duration::from_secs(5)).await.unwrap();
        let first = sem.acquire().await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..5 {
            let (sem, tx) = (sem.clone(), tx.clone());
            tokio::spawn(async move {
                let p = sem.acquire().await.unwrap();
                tx.send(i).unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(p);
            });
            queued(&cluster, "fifo", i + 1).await;
        }
        let released = Instant::now();
        drop(first);
        let mut order = Vec::new();
        for _ in 0..5 {
            order.push(
                tokio::time::timeout(Duration::from_secs(5), rx.recv())
                    .await
                    .expect("a waiter was not woken by its notification")
                    .unwrap(),
            );
        }
        assert_eq!(order, vec![0, 1, 2, 3, 4], "{flavor}");
        assert!(
            released.elapsed() < Duration::from_secs(3),
            "{flavor}: 5 grants took {:?}",
            released.elapsed()
        );

        // crash recovery: a holder that stops renewing (a crashed process) frees its slot
        // one lease later, and the waiter gets it then
        let lease = Duration::from_millis(800);
        let crash = open("crash", lease).await.unwrap();
        crash.acquire().await.unwrap().detach();
        let start = Instant::now();
        let p = tokio::time::timeout(Duration::from_secs(10), crash.acquire())
            .await
            .expect("the crashed holder's slot never came back")
            .unwrap();
        let waited = start.elapsed();
        assert!(
            waited >= lease / 2 && waited < lease * 4,
            "{flavor}: {waited:?}"
        );
        drop(p);

        // targeted: a waiter of another client is woken, this client's channel stays quiet
        let other = client_of(&cluster).await;
        let sem_b = other
            .semaphore("fifo", 1)
            .fallback_poll(Duration::from_secs(30))
            .open()
            .await
            .unwrap();
        let held = sem.acquire().await.unwrap();
        let waiter = tokio::spawn(async move { sem_b.acquire().await.unwrap() });
        queued(&cluster, "fifo", 1).await;
        let released = Instant::now();
        drop(held);
        let p = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(released.elapsed() < Duration::from_secs(2));
        drop(p);
    }
}

/// One client renews semaphores on every master, two of them in one hash slot (their
/// renewals share `renew_many` calls; the other slots' calls go at once): over three leases
/// every holder keeps its permit, every waiter its place, and no entry expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_on_many_slots_are_renewed_by_one_client() {
    for flavor in flavors() {
        let cluster = Cluster::start(flavor);
        let client = client(&cluster).await;
        let mut names: Vec<String> = (0..9).map(|i| format!("renewed-{i}")).collect();
        let mut slots = std::collections::HashMap::new();
        let (a, b) = (0..)
            .find_map(|i| {
                let name = format!("pair-{i}");
                let slot = redis::cluster_routing::Slot::for_key(key(&name, "cfg"));
                slots.insert(slot, name.clone()).map(|other| (other, name))
            })
            .unwrap();
        assert_eq!(
            cluster.slot_of(&key(&a, "cfg")),
            cluster.slot_of(&key(&b, "cfg"))
        );
        names.extend([a, b]);
        let mut held = Vec::new();
        let mut waiters = Vec::new();
        for name in &names {
            let sem = client
                .semaphore(name.as_str(), 1)
                .lease(Duration::from_millis(900))
                .renew_every(Duration::from_millis(300))
                .fallback_poll(Duration::from_millis(300))
                .open()
                .await
                .unwrap();
            held.push(sem.acquire().await.unwrap());
            let sem = sem.clone();
            waiters.push(tokio::spawn(async move { sem.acquire().await.map(drop) }));
        }
        for name in &names {
            queued(&cluster, name, 1).await;
        }
        tokio::time::sleep(Duration::from_millis(2700)).await;
        for (name, permit) in names.iter().zip(&held) {
            assert!(!permit.is_lost(), "{flavor}: {name} lost");
            assert_eq!(
                card(&cluster, name, "queue"),
                1,
                "{flavor}: {name}'s waiter left"
            );
            let k = key(name, "cfg");
            let expired = cluster.cmd_for_key(&k, &["HGET", &k, "expired"]);
            assert!(
                matches!(expired.as_str(), None | Some("0")),
                "{flavor}: {name}: entries expired"
            );
        }
        for w in waiters {
            w.abort();
        }
    }
}

async fn client_of(cluster: &Cluster) -> Client {
    client(cluster).await
}

/// Opens `name` with a long lease (a failover must not cost a lease) and short renewals.
async fn open_for_failover(client: &Client, name: &str, fallback: Duration) -> Semaphore {
    client
        .semaphore(name, 2)
        .lease(Duration::from_secs(12))
        // waiters are renewed (and so polled) every renewal interval: long enough that a
        // prompt wake-up shows a notification
        .renew_every(Duration::from_secs(3))
        .fallback_poll(fallback)
        .open()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_manual_failover_keeps_holders_and_wakes_waiters_from_the_new_master() {
    for flavor in flavors() {
        let cluster = Cluster::start(flavor);
        let client = client(&cluster).await;
        let sem = open_for_failover(&client, "manual", Duration::from_secs(30)).await;
        let a = sem.acquire().await.unwrap();
        let b = sem.acquire().await.unwrap();
        let lost_a = a.lost();
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        queued(&cluster, "manual", 1).await;
        let master = cluster.master_for_key(&key("manual", "cfg"));
        let new_master = cluster.failover(master);
        assert_eq!(cluster.master_for_key(&key("manual", "cfg")), new_master);
        // the subscription followed the channel's shard (the old master sent SUNSUBSCRIBE
        // when it lost the slot; the notifier subscribed again, on the new master or on its
        // replica, which receives the shard's messages too): a release is notified at once,
        // although the fallback poll is 30 s
        let channel = format!("redsem:{{manual}}:c:{}.0", client.id());
        let subscribed_in_shard = || {
            [master, new_master].iter().any(|&i| {
                matches!(cluster.node(i).cmd(&["PUBSUB", "SHARDNUMSUB", &channel]),
                    Reply::Array(a) if a.get(1).and_then(Reply::as_int) == Some(1))
            })
        };
        assert!(
            eventually(Duration::from_secs(10), subscribed_in_shard).await,
            "{flavor}: not re-subscribed in the channel's shard"
        );
        let released = Instant::now();
        drop(b);
        let p = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter hung after the failover")
            .unwrap()
            .unwrap();
        assert!(
            released.elapsed() < Duration::from_millis(1500),
            "{flavor}: woken after {:?}",
            released.elapsed()
        );
        // the holder from before the failover still holds (the replica had its grant)
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!a.is_lost(), "{flavor}");
        tokio::select! {
            r = lost_a => panic!("{flavor}: lost {r:?}"),
            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        drop(p);
        drop(a);
        assert!(
            eventually(Duration::from_secs(5), || card(&cluster, "manual", "slots")
                == 0)
            .await
        );
    }
}

#[tokio::test]
async fn a_killed_master_loses_unreplicated_grants_and_their_holders_are_told() {
    for flavor in flavors() {
        let mut cluster = Cluster::start(flavor);
        let client = client(&cluster).await;
        let sem = open_for_failover(&client, "killed", Duration::from_millis(500)).await;
        let other = open_for_failover(&client, "elsewhere", Duration::from_millis(500)).await;
        let master = cluster.master_for_key(&key("killed", "cfg"));
        let replica = cluster.replica_of(master).unwrap();

        // replicated: holder `a` and waiter `c`
        let a = sem.acquire().await.unwrap();
        let _a2 = sem.acquire().await.unwrap();
        let c = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        queued(&cluster, "killed", 1).await;
        // a semaphore on another shard: a holder, and a waiter
        let other_held = other.acquire().await.unwrap();
        let _other_held2 = other.acquire().await.unwrap();
        let other_waiter = {
            let other = other.clone();
            tokio::spawn(async move { other.acquire().await })
        };
        queued(&cluster, "elsewhere", 1).await;
        assert!(
            eventually(Duration::from_secs(5), || master_offset_caught_up(
                &cluster, master, replica
            ))
            .await
        );
        // not replicated: the replica is frozen and cut off (its link closed, so that not even
        // the kernel buffers what follows) while `a2` is released and `b` granted
        cluster.node(replica).pause();
        assert!(
            cluster
                .node(master)
                .cmd(&["CLIENT", "KILL", "TYPE", "replica"])
                .as_int()
                >= Some(1)
        );
        drop(_a2);
        let b = tokio::time::timeout(Duration::from_secs(5), c)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let lost_b = b.lost();
        let d = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        queued(&cluster, "killed", 1).await;
        cluster.kill(master);
        cluster.node(replica).resume();
        let started = Instant::now();
        // the waiters of the other semaphore keep progressing through the failover
        drop(other_held);
        let p = tokio::time::timeout(Duration::from_secs(20), other_waiter)
            .await
            .expect("a waiter of another semaphore hung")
            .unwrap()
            .unwrap();
        drop(p);
        // the promoted replica never saw `b`: its holder is told, well within its lease
        let reason = tokio::time::timeout(Duration::from_secs(30), lost_b)
            .await
            .expect("the holder of a lost grant was never told");
        assert_eq!(reason, LostReason::NotHolder, "{flavor}");
        println!(
            "{flavor}: lost grant detected {:?} after the kill",
            started.elapsed()
        );
        // `a` survived, and the waiter `d` (whose ticket was lost too) re-queued by itself
        // and is granted when `a` leaves
        assert!(!a.is_lost(), "{flavor}");
        drop(a);
        let p = tokio::time::timeout(Duration::from_secs(20), d)
            .await
            .expect("a waiter hung after the failover")
            .unwrap()
            .unwrap();
        assert_eq!(cluster.master_for_key(&key("killed", "cfg")), replica);
        drop(p);
        drop(b);
        // new acquisitions work on the new master
        let e = tokio::time::timeout(Duration::from_secs(5), sem.acquire())
            .await
            .unwrap()
            .unwrap();
        drop(e);
        assert!(
            matches!(sem.stats().await, Ok(s) if s.limit == 2),
            "{flavor}"
        );
        // both handles' shard channels are subscribed on their slots' masters again, the
        // killed one's and the other's: grants keep coming as notifications, not polls
        let subscribed = |name: &str, n: u32| {
            let channel = format!("redsem:{{{name}}}:c:{}.{n}", client.id());
            let node = cluster.node(cluster.master_for_key(&channel));
            match node.cmd(&["PUBSUB", "SHARDNUMSUB", &channel]) {
                Reply::Array(a) => a.get(1).and_then(Reply::as_int) == Some(1),
                _ => false,
            }
        };
        let both = || subscribed("killed", 0) && subscribed("elsewhere", 1);
        assert!(
            eventually(Duration::from_secs(20), both).await,
            "{flavor}: subscriptions lost after the failover (killed: {}, elsewhere: {})",
            subscribed("killed", 0),
            subscribed("elsewhere", 1)
        );
    }
}

/// Whether the replica's replication offset reached the master's.
fn master_offset_caught_up(cluster: &Cluster, master: usize, replica: usize) -> bool {
    let offset = |i: usize, field: &str| -> Option<i64> {
        let info = cluster.node(i).cmd(&["INFO", "replication"]);
        info.as_str()?
            .lines()
            .find_map(|l| l.strip_prefix(field))?
            .trim()
            .parse()
            .ok()
    };
    matches!(
        (offset(master, "master_repl_offset:"), offset(replica, "master_repl_offset:")),
        (Some(m), Some(r)) if m == r
    )
}

/// A shard subscription the server drops with the subscriber's connection to one master
/// (`CLIENT KILL`, nothing published meanwhile) is made again: a waiter is then woken by the
/// grant's notification, not by a renewal.
#[tokio::test]
async fn a_shard_subscription_dropped_with_its_connection_is_made_again() {
    for flavor in flavors() {
        let cluster = Cluster::start(flavor);
        let client = client(&cluster).await;
        let name = "dropped";
        let sem = client
            .semaphore(name, 1)
            .lease(Duration::from_secs(60))
            // waiters are checked at each renewal: far apart, so a prompt wake-up shows a
            // notification
            .renew_every(Duration::from_secs(20))
            .fallback_poll(Duration::from_secs(60))
            .open()
            .await
            .unwrap();
        let held = sem.acquire().await.unwrap();
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        queued(&cluster, name, 1).await;
        let channel = format!("redsem:{{{name}}}:c:{}.0", client.id());
        let master = cluster.node(cluster.master_for_key(&channel));
        let subscribed = || match master.cmd(&["PUBSUB", "SHARDNUMSUB", &channel]) {
            Reply::Array(a) => a.get(1).and_then(Reply::as_int) == Some(1),
            _ => false,
        };
        assert!(subscribed(), "{flavor}: not subscribed at first");
        // the server drops the subscriber's connection to this master (and so its
        // subscription); the client hears of it only if it looks
        assert!(
            master.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]).as_int() >= Some(1),
            "{flavor}: no subscriber connection to kill"
        );
        assert!(!subscribed(), "{flavor}");
        assert!(
            eventually(Duration::from_secs(20), subscribed).await,
            "{flavor}: the dropped subscription was never made again"
        );
        let released = Instant::now();
        drop(held);
        let p = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap_or_else(|_| panic!("{flavor}: the waiter was not woken by a notification"))
            .unwrap()
            .unwrap();
        println!("{flavor}: woken {:?} after the release", released.elapsed());
        drop(p);
    }
}

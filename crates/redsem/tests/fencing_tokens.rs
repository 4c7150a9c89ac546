//! Fencing tokens only go up: across many grants, after `FLUSHALL`, after a restart without
//! persistence and after a failover to a replica that missed the last grants; and a
//! `FencedStore` keeps refusing the holders of before a data loss.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use redsem::fencing::FencedStore;

const LEASE: Duration = Duration::from_secs(5);

/// The generation of each grant of `sem`'s only slot, `n` times in a row.
async fn generations(sem: &redsem::Semaphore, n: usize) -> Vec<u64> {
    let mut out = vec![];
    for _ in 0..n {
        let p = sem.acquire().await.unwrap();
        assert_eq!(p.fences()[0].slot, 0);
        out.push(p.fences()[0].generation);
        p.release().await.unwrap();
    }
    out
}

fn strictly_increasing(v: &[u64]) -> bool {
    v.windows(2).all(|w| w[0] < w[1])
}

/// Acquires until Redis answers again after a restart (the client reconnects by itself).
async fn acquire_after_restart(sem: &redsem::Semaphore) -> redsem::Permit {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match sem.acquire_timeout(Duration::from_secs(2)).await {
            Ok(p) => return p,
            Err(e) => {
                assert!(Instant::now() < deadline, "no grant after the restart: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test]
async fn the_token_after_flushall_is_above_every_earlier_one() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "flushed", 1, LEASE).await;
        let before = generations(&sem, 5).await;
        assert!(strictly_increasing(&before), "{before:?}");
        server.cmd(&["FLUSHALL"]);
        let after = generations(&sem, 3).await;
        assert!(
            after[0] > before[4],
            "{}: {after:?} after {before:?}",
            server.flavor()
        );
        assert!(strictly_increasing(&after));
    }
}

#[tokio::test]
async fn tokens_keep_rising_across_a_restart_without_persistence() {
    for mut server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "restarted", 1, LEASE).await;
        let before = generations(&sem, 3).await;
        server.restart();
        let p = acquire_after_restart(&sem).await;
        assert!(
            p.fences()[0].generation > before[2],
            "{}: {} after {before:?}",
            server.flavor(),
            p.fences()[0]
        );
    }
}

/// A replica cut off while the master kept granting is promoted: its copy of the fence hash
/// is behind, yet the tokens it grants are above every token the master issued.
#[tokio::test]
async fn a_failover_to_a_lagging_replica_still_issues_higher_tokens() {
    for flavor in flavors() {
        let mut master = Server::start(flavor);
        let replica = Server::start_with(
            flavor,
            ServerOptions {
                extra_args: vec![
                    "--replicaof".into(),
                    "127.0.0.1".into(),
                    master.port().to_string(),
                ],
                ..Default::default()
            },
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while !matches!(replica.cmd(&["INFO", "replication"]),
            Reply::Bulk(t) if t.contains("master_link_status:up"))
        {
            assert!(Instant::now() < deadline, "the replica did not sync");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let on_master = client(&master).await;
        let sem = open(&on_master, "failover", 1, LEASE).await;
        let replicated = generations(&sem, 2).await;
        // wait until the replica has them, then freeze it; the master goes on granting
        let deadline = Instant::now() + Duration::from_secs(10);
        while replica
            .cmd(&["HGET", "redsem:{failover}:cfg", "gen"])
            .as_str()
            .and_then(|g| g.parse::<u64>().ok())
            != Some(replicated[1])
        {
            assert!(Instant::now() < deadline, "the replica did not catch up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // the replica stops following (as a partitioned replica that a failover promotes);
        // the master goes on granting: grants the promoted replica will never have
        assert_eq!(
            replica.cmd(&["REPLICAOF", "NO", "ONE"]).as_str(),
            Some("OK")
        );
        let lost = generations(&sem, 5).await;
        drop(sem);
        drop(on_master);
        master.kill();
        let stale: u64 = replica
            .cmd(&["HGET", "redsem:{failover}:cfg", "gen"])
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            stale < lost[4],
            "the promoted replica missed the last grants"
        );
        let on_replica = client(&replica).await;
        let sem = open(&on_replica, "failover", 1, LEASE).await;
        let next = generations(&sem, 1).await;
        assert!(
            next[0] > lost[4],
            "{flavor}: {next:?} after the master's {lost:?}"
        );
    }
}

/// The store lives apart from the semaphore (here: another server) and survives the data
/// loss. A holder from before the loss may write first after it; the new holders' tokens are
/// above its token anyway, so they are accepted, and from then on it is refused.
#[tokio::test]
async fn a_fenced_store_keeps_refusing_stale_holders_across_a_data_loss() {
    for server in servers() {
        let store_server = Server::start(server.flavor());
        let client = client(&server).await;
        let store_client = common::client(&store_server).await;
        let store = FencedStore::new(&store_client, "orders:{fenced}:fences");
        let sem = client
            .semaphore("lossy", 1)
            .lease(Duration::from_secs(30))
            .open()
            .await
            .unwrap();
        for _ in 0..3 {
            let p = sem.acquire().await.unwrap();
            assert!(
                store
                    .write(p.fences()[0], "orders:{fenced}:v", b"x")
                    .await
                    .unwrap()
            );
            p.release().await.unwrap();
        }
        // the last holder before the loss, paused: it does not learn of the loss in time
        let old = sem.acquire().await.unwrap();
        let old_fence = old.fences()[0];
        old.detach();
        server.cmd(&["FLUSHALL"]);
        // it writes first after the loss: nothing newer has been seen, accepted
        assert!(
            store
                .write(old_fence, "orders:{fenced}:v", b"old")
                .await
                .unwrap()
        );
        // the new holder's token is above it: accepted, not refused as it was in protocol 1
        let new = sem.acquire().await.unwrap();
        assert!(new.fences()[0].generation > old_fence.generation);
        assert!(
            store
                .write(new.fences()[0], "orders:{fenced}:v", b"new")
                .await
                .unwrap()
        );
        // and the stale holder is refused from then on
        assert!(
            !store
                .write(old_fence, "orders:{fenced}:v", b"old-2")
                .await
                .unwrap()
        );
        assert!(!store.check(old_fence).await.unwrap());
        assert_eq!(
            store_server.cmd(&["GET", "orders:{fenced}:v"]).as_str(),
            Some("new"),
            "{}",
            server.flavor()
        );
    }
}

/// Concurrent grants over several slots: no two carry the same token, and each slot's
/// generations rise in grant order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_unique_per_slot_and_rise_in_grant_order() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "unique", 3, LEASE).await;
        let mut tasks = vec![];
        for _ in 0..6 {
            let sem = sem.clone();
            tasks.push(tokio::spawn(async move {
                let mut seen = vec![];
                for _ in 0..25 {
                    let p = sem.acquire_many(1 + (seen.len() % 2) as u32).await.unwrap();
                    seen.extend(p.fences().iter().map(|f| (f.slot, f.generation)));
                    p.release().await.unwrap();
                }
                seen
            }));
        }
        let mut per_slot: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for t in tasks {
            for (slot, g) in t.await.unwrap() {
                per_slot.entry(slot).or_default().push(g);
            }
        }
        // no token granted twice for a slot; the semaphore's last generation is the highest
        // ever granted
        let mut highest = 0;
        for (slot, gens) in &mut per_slot {
            let n = gens.len();
            gens.sort_unstable();
            gens.dedup();
            assert_eq!(gens.len(), n, "slot {slot}: a token was granted twice");
            highest = highest.max(*gens.last().unwrap());
        }
        let stored: u64 = server
            .cmd(&["HGET", "redsem:{unique}:cfg", "gen"])
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(stored, highest);
        assert_eq!(per_slot.len(), 3);
    }
}

/// The bound that does hold for several grants in one script call (a pump after a resize or
/// a large release, a batch of acquisitions): they take consecutive generations from
/// `max(previous + 1, T)`, `T` the call's Redis TIME in µs, so the generation runs ahead of
/// the clock the call read by up to the number of grants minus one — not "never, with one
/// script call per grant". Checked with the grant time each record stores (`a`, the call's
/// TIME in ms): every generation of the call is in `[T, T + k - 1]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_grants_in_one_call_run_ahead_of_its_clock_by_at_most_their_number() {
    // more than the microseconds of a millisecond: the last generation is then past the
    // millisecond of the call's clock whatever its microseconds were
    const K: usize = 1500;
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "burst", 1, LEASE).await;
        let first = sem.acquire().await.unwrap();
        let waiters: Vec<_> = (0..K)
            .map(|_| {
                let sem = sem.clone();
                tokio::spawn(async move { sem.acquire().await.unwrap() })
            })
            .collect();
        assert!(
            eventually(Duration::from_secs(60), || card(&server, "burst", "queue")
                == K as i64)
            .await
        );
        // one resize.lua call grants all of them (its pump)
        let operator = common::client(&server).await;
        operator
            .resize_existing("burst", K as u32 + 1)
            .await
            .unwrap();
        let mut permits = vec![];
        for w in waiters {
            permits.push(w.await.unwrap());
        }
        let records = match server.cmd(&["HVALS", "redsem:{burst}:meta"]) {
            Reply::Array(a) => a,
            other => panic!("{other:?}"),
        };
        let mut granted: Vec<(u64, u64)> = records
            .iter()
            .map(|r| {
                let r = r.as_str().unwrap();
                let f = record_field(r, "f");
                let g: u64 = f.split(',').next().unwrap().parse().unwrap();
                (g, record_field(r, "a").parse().unwrap())
            })
            .filter(|(g, _)| *g != first.fences()[0].generation)
            .collect();
        granted.sort();
        assert_eq!(granted.len(), K, "{}", server.flavor());
        let gens: Vec<u64> = granted.iter().map(|g| g.0).collect();
        assert!(
            gens.windows(2).all(|w| w[1] == w[0] + 1),
            "{}: one call's grants take consecutive generations: {gens:?}",
            server.flavor()
        );
        let call_ms = granted[0].1;
        assert!(
            granted.iter().all(|g| g.1 == call_ms),
            "one call, one clock"
        );
        let (lo, hi) = (gens[0], gens[K - 1]);
        // T is in [call_ms * 1000, call_ms * 1000 + 999]; the first generation is T (the
        // previous one, the first holder's, is older than the call's clock)
        assert!(
            lo >= call_ms * 1000 && lo <= call_ms * 1000 + 999,
            "{lo} vs {call_ms}"
        );
        assert_eq!(hi - lo, K as u64 - 1);
        assert!(
            hi < call_ms * 1000 + 1000 + K as u64 - 1,
            "the bound: T + k - 1"
        );
        assert!(
            hi > call_ms * 1000 + 999,
            "{}: the last generation ({hi}) is ahead of the call's clock ({call_ms} ms)",
            server.flavor()
        );
        drop((first, permits));
    }
}

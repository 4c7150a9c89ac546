//! The snapshotter (`src/snapshot.rs`) against a real server: the lease it records for an
//! entry is the one the library's scripts gave it.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use redsem::internals::Keys;
use redsem_chaos::config::{Config, PREFIX, SemSpec};
use test_support::{Reply, Server};
use tokio_util::sync::CancellationToken;

const NAME: &str = "snap-detached";
const LEASE: Duration = Duration::from_secs(3);

fn config() -> Config {
    Config {
        seed: 1,
        seconds: 1,
        workers: 1,
        tasks: 1,
        lease_ms: LEASE.as_millis() as u64,
        renew_ms: 200,
        fallback_ms: 250,
        slack_ms: 50,
        snapshot_ms: 30,
        fault_gap_ms: (100, 500),
        faults: Vec::new(),
        sems: vec![SemSpec {
            name: NAME.into(),
            limit: 2,
            max_n: 1,
            weight: 1,
        }],
        flavor: "redis".into(),
        stall_ms: 20,
        scripts_only: false,
    }
}

/// Runs the snapshotter on `url` for a moment; returns the expiry (Redis ms; `-1`: none)
/// that its last snapshot recorded for entry `id`, `None` if it recorded no such entry.
async fn snapshot_expiry(url: &str, id: &str) -> Option<i64> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("snapshots.log");
    let stop = CancellationToken::new();
    let task = {
        let (url, path, stop) = (url.to_owned(), path.clone(), stop.clone());
        tokio::spawn(async move { redsem_chaos::snapshot::run(url, config(), &path, stop).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    task.await.unwrap();
    last_expiry(&path, id)
}

/// The expiry of entry `id` in the last `S` line of the snapshot log at `path`.
fn last_expiry(path: &Path, id: &str) -> Option<i64> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut numbers: HashMap<&str, &str> = HashMap::new();
    let mut last = None;
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f[0] {
            "I" => {
                numbers.insert(f[2], f[1]);
            }
            "S" => last = Some(f[6]),
            _ => {}
        }
    }
    let n = numbers.get(id)?;
    last?.split(';').find_map(|e| {
        let f: Vec<&str> = e.split(':').collect();
        (f[0] == *n).then(|| f[1].parse().unwrap())
    })
}

/// The sessions in `exp` (not its marker `#`) and their expiries.
fn sessions(server: &Server, keys: &Keys) -> HashMap<String, i64> {
    let Reply::Array(items) =
        server.cmd(&["ZRANGEBYSCORE", &keys.exp, "-inf", "(+inf", "WITHSCORES"])
    else {
        panic!("ZRANGEBYSCORE");
    };
    items
        .chunks(2)
        .map(|p| {
            let score: f64 = p[1].as_str().unwrap().parse().unwrap();
            (p[0].as_str().unwrap().to_owned(), score as i64)
        })
        .collect()
}

/// The session of entry `id` in the index (`own`).
fn session_in_index(server: &Server, keys: &Keys, id: &str) -> Option<String> {
    let Reply::Array(items) = server.cmd(&["ZRANGE", &keys.own, "0", "-1"]) else {
        panic!("ZRANGE");
    };
    items.iter().find_map(|m| {
        let (sid, entry) = m.as_str()?.split_once('|')?;
        (entry == id).then(|| sid.to_owned())
    })
}

/// A holder detached with `Permit::detach` moves to a session of its own, which nobody
/// renews: the snapshot must read its lease there, as the library's scripts do (`sess_of`),
/// not in its client's session — neither while that session lives on with a later expiry,
/// nor once the client is gone and the index (`own`) was lost, when only the record says
/// where the lease is (before: `-1`, an entry without a lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_holder_s_lease_is_read_in_its_own_session() {
    for flavor in test_support::flavors() {
        let server = tokio::task::spawn_blocking(move || Server::start(flavor))
            .await
            .unwrap();
        let keys = Keys::new(PREFIX, NAME).unwrap();
        let client = redsem::Client::builder(server.url())
            .prefix(PREFIX)
            .build()
            .await
            .unwrap();
        let sem = client
            .semaphore(NAME, 2)
            .lease(LEASE)
            .renew_every(Duration::from_millis(100))
            .open()
            .await
            .unwrap();
        // one permit stays in the client's session, which its renewals keep moving
        let kept = sem.acquire().await.unwrap();
        let detached = sem.acquire().await.unwrap();
        let id = detached.holder_id().to_owned();
        let client_session = session_in_index(&server, &keys, &id).unwrap();
        detached.detach();
        let mut own_session = None;
        for _ in 0..200 {
            own_session = session_in_index(&server, &keys, &id).filter(|s| *s != client_session);
            if own_session.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let own_session = own_session.expect("the permit was never detached in Redis");
        let expiry = sessions(&server, &keys)[&own_session];
        // the client's session is renewed past the detached lease
        for _ in 0..200 {
            if sessions(&server, &keys)[&client_session] > expiry {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(sessions(&server, &keys)[&client_session] > expiry);
        assert_eq!(
            snapshot_expiry(&server.url(), &id).await,
            Some(expiry),
            "{flavor}: the snapshot read another lease than the detached holder's"
        );

        // the client goes (its session ends), then the index is lost: only the record
        // (its `o`) names the detached session
        drop(kept);
        drop(sem);
        client.shutdown().await;
        assert!(!sessions(&server, &keys).contains_key(&client_session));
        server.cmd(&["DEL", &keys.own]);
        assert_eq!(
            snapshot_expiry(&server.url(), &id).await,
            Some(expiry),
            "{flavor}: without the index, the snapshot missed the detached holder's lease"
        );
    }
}

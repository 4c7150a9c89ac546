//! Python and Rust processes share one semaphore through the open protocol
//! (docs/PROTOCOL.md): the Python side is the installed `redsem` package (clients/python),
//! driven by `interop/python/worker.py`; the Rust side is this test process. The limit is
//! never exceeded (checked from the holders' own timestamps), tickets are granted in one FIFO
//! order across both languages, and a killed Python holder's slot comes back within a lease.
//!
//! Python with the package is `$REDSEM_PYTHON`, else `.cache/interop-venv`, which
//! `scripts/install-deps.sh interop-python` makes (or brings up to date with the package's
//! sources; run here once per test process). Without it the tests are skipped with a
//! message, unless `REDSEM_REQUIRE_INTEROP=1` (set by `scripts/test.sh`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use serde_json::Value;

/// One permit as its holder saw it: who, which ticket, and when (Unix seconds).
#[derive(Clone, Debug)]
struct Hold {
    who: String,
    ticket: u64,
    start: f64,
    end: f64,
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn root() -> PathBuf {
    test_support::workspace_root()
}

/// A Python interpreter that can `import redsem`, or `None` (with the reason printed).
fn python() -> Option<PathBuf> {
    static PYTHON: OnceLock<Option<PathBuf>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let found = find_python();
            if found.is_none() {
                if std::env::var("REDSEM_REQUIRE_INTEROP").is_ok_and(|v| v == "1") {
                    panic!(
                        "REDSEM_REQUIRE_INTEROP=1 but no Python with the redsem package: run scripts/install-deps.sh"
                    );
                }
                eprintln!(
                    "interop: SKIPPED: no Python with the redsem package (set REDSEM_PYTHON, or run scripts/install-deps.sh)"
                );
            }
            found
        })
        .clone()
}

fn has_redsem(python: &Path) -> bool {
    std::process::Command::new(python)
        .args(["-c", "import redsem"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn find_python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("REDSEM_PYTHON").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(
            has_redsem(&p),
            "REDSEM_PYTHON={} cannot import redsem",
            p.display()
        );
        return Some(p);
    }
    // Installs the package into the venv, or re-installs it if its sources changed (a no-op
    // otherwise; serialized with a lock file, as test processes run this concurrently).
    let installed = std::process::Command::new("bash")
        .arg(root().join("scripts/install-deps.sh"))
        .arg("interop-python")
        .status()
        .is_ok_and(|s| s.success());
    let python = root().join(".cache/interop-venv/bin/python");
    (installed && has_redsem(&python)).then_some(python)
}

/// Starts `interop/python/worker.py` with these arguments.
fn python_worker(
    python: &Path,
    server: &Server,
    name: &str,
    args: &[&str],
) -> tokio::process::Child {
    tokio::process::Command::new(python)
        .arg(root().join("interop/python/worker.py"))
        .args(["--url", &server.url(), "--name", name])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Waits for a worker and parses its JSON lines.
async fn finish(child: tokio::process::Child) -> Vec<Hold> {
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("python worker hung")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python worker failed ({}): {}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["lost"], false, "{line}");
            Hold {
                who: v["label"].as_str().unwrap().to_owned(),
                ticket: v["ticket"].as_u64().unwrap(),
                start: v["start"].as_f64().unwrap(),
                end: v["end"].as_f64().unwrap(),
            }
        })
        .collect()
}

/// The most holders at once, from their intervals (an end before a start at equal times).
fn peak(holds: &[Hold]) -> usize {
    let mut edges: Vec<(f64, i32)> = holds
        .iter()
        .flat_map(|h| [(h.start, 1), (h.end, -1)])
        .collect();
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut max) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        max = max.max(now);
    }
    max as usize
}

/// A Rust holder: acquire, hold for `hold`, release; recorded like the Python ones.
async fn rust_hold(sem: redsem::Semaphore, who: String, hold: Duration) -> Hold {
    let permit = sem.acquire().await.unwrap();
    let start = now();
    tokio::time::sleep(hold).await;
    assert!(!permit.is_lost());
    let end = now();
    let ticket = permit.ticket();
    permit.release().await.unwrap();
    Hold {
        who,
        ticket,
        start,
        end,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_rust_processes_never_exceed_the_shared_limit() {
    let Some(python) = python() else { return };
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "shared", 3, Duration::from_secs(2)).await;
        let workers: Vec<_> = ["py-a", "py-b"]
            .iter()
            .map(|label| {
                python_worker(
                    &python,
                    &server,
                    "shared",
                    &[
                        "--limit",
                        "3",
                        "--lease-ms",
                        "2000",
                        "--threads",
                        "3",
                        "--count",
                        "6",
                    ]
                    .into_iter()
                    .chain(["--hold-ms", "8", "--label", label])
                    .collect::<Vec<_>>(),
                )
            })
            .collect();
        let mut tasks = Vec::new();
        for t in 0..6 {
            let sem = sem.clone();
            tasks.push(tokio::spawn(async move {
                let mut holds = Vec::new();
                for _ in 0..6 {
                    holds.push(
                        rust_hold(sem.clone(), format!("rs-{t}"), Duration::from_millis(8)).await,
                    );
                }
                holds
            }));
        }
        let mut holds = Vec::new();
        for t in tasks {
            holds.extend(t.await.unwrap());
        }
        for w in workers {
            holds.extend(finish(w).await);
        }
        assert_eq!(holds.len(), 72);
        let python_holds = holds.iter().filter(|h| h.who.starts_with("py")).count();
        assert_eq!(python_holds, 36);
        assert!(
            peak(&holds) <= 3,
            "limit exceeded on {}: {}",
            server.flavor(),
            peak(&holds)
        );
        // one ticket sequence for both languages
        let mut tickets: Vec<u64> = holds.iter().map(|h| h.ticket).collect();
        tickets.sort();
        assert_eq!(tickets, (1..=72).collect::<Vec<_>>(), "{}", server.flavor());
        assert_eq!(sem.stats().await.unwrap().grants_total, 72);
        assert_nothing_left(&server, "shared").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_both_languages_are_granted_in_ticket_order() {
    let Some(python) = python() else { return };
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "fifo", 1, Duration::from_secs(5)).await;
    let first = sem.acquire().await.unwrap();
    let mut order = Vec::new();
    let mut workers = Vec::new();
    let rust_holds = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let who = if i % 2 == 0 {
            format!("py-{i}")
        } else {
            format!("rs-{i}")
        };
        if i % 2 == 0 {
            workers.push(python_worker(
                &python,
                &server,
                "fifo",
                &[
                    "--limit",
                    "1",
                    "--count",
                    "1",
                    "--hold-ms",
                    "30",
                    "--label",
                    &who,
                ],
            ));
        } else {
            let (sem, who, holds) = (sem.clone(), who.clone(), rust_holds.clone());
            tasks.push(tokio::spawn(async move {
                let hold = rust_hold(sem, who, Duration::from_millis(30)).await;
                holds.lock().unwrap().push(hold);
            }));
        }
        // this waiter is queued before the next one starts
        assert!(
            eventually(Duration::from_secs(15), || card(&server, "fifo", "queue")
                == i + 1)
            .await,
            "waiter {who} did not queue"
        );
        order.push(who);
    }
    first.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let mut holds = rust_holds.lock().unwrap().clone();
    for w in workers {
        holds.extend(finish(w).await);
    }
    holds.sort_by(|a, b| a.start.total_cmp(&b.start));
    let granted: Vec<&str> = holds.iter().map(|h| h.who.as_str()).collect();
    assert_eq!(
        granted, order,
        "granted in the order they queued: {holds:#?}"
    );
    assert!(
        holds.windows(2).all(|w| w[0].ticket < w[1].ticket),
        "{holds:#?}"
    );
    assert!(
        holds.windows(2).all(|w| w[0].end <= w[1].start),
        "one at a time: {holds:#?}"
    );
    assert_nothing_left(&server, "fifo").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_holder_renews_past_its_lease_while_rust_waits() {
    let Some(python) = python() else { return };
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "long", 1, Duration::from_millis(500)).await;
    let worker = python_worker(
        &python,
        &server,
        "long",
        &[
            "--limit",
            "1",
            "--lease-ms",
            "500",
            "--hold-ms",
            "1500",
            "--label",
            "py",
        ],
    );
    assert!(
        eventually(Duration::from_secs(15), || card(&server, "long", "slots")
            == 1)
        .await
    );
    let rust = rust_hold(sem.clone(), "rs".into(), Duration::from_millis(10)).await;
    let python_hold = finish(worker).await.remove(0);
    assert!(python_hold.end - python_hold.start >= 1.4);
    assert!(
        rust.start >= python_hold.end,
        "Rust was granted only after Python released: {rust:?} {python_hold:?}"
    );
    let stats = sem.stats().await.unwrap();
    assert_eq!(
        stats.expired_total, 0,
        "Python's heartbeat kept its lease: nothing expired"
    );
    assert_eq!(stats.grants_total, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_python_holders_slot_is_back_within_one_lease() {
    let Some(python) = python() else { return };
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let lease = Duration::from_secs(1);
    let sem = open(&client, "killed", 1, lease).await;
    let mut worker = python_worker(
        &python,
        &server,
        "killed",
        &["--limit", "1", "--lease-ms", "1000", "--hold-ms", "600000"],
    );
    assert!(
        eventually(Duration::from_secs(15), || card(&server, "killed", "slots")
            == 1)
        .await,
        "the Python worker did not acquire"
    );
    let python_generation: u64 = server
        .cmd(&["HGET", "redsem:{killed}:cfg", "gen"])
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    worker.kill().await.unwrap(); // SIGKILL: no release, no more renewals
    let killed = std::time::Instant::now();
    let permit = tokio::time::timeout(Duration::from_secs(30), sem.acquire())
        .await
        .expect("the killed holder's slot never came back")
        .unwrap();
    let waited = killed.elapsed();
    assert!(permit.fences()[0].generation > python_generation);
    permit.release().await.unwrap();
    // its lease ran out (at most one lease after its last renewal, before the kill) and the
    // Rust waiter took the slot over; generous bound: three leases
    assert!(waited <= 3 * lease, "granted {waited:?} after the kill");
    assert_eq!(
        sem.stats().await.unwrap().expired_total,
        1,
        "the Python holder was reaped, not released"
    );
}

#[tokio::test]
async fn a_semaphore_of_another_protocol_version_is_refused_by_both() {
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "future", 2, Duration::from_secs(5)).await;
    // A newer client created it (simulated): every script refuses to touch it.
    server.cmd(&["HSET", "redsem:{future}:cfg", "ver", "5"]);
    let err = sem.acquire().await.unwrap_err();
    assert!(
        matches!(&err, redsem::Error::ProtocolMismatch { name, .. } if name == "future"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "semaphore \"future\": semaphore uses redsem protocol version 5, this client speaks version 4: \
         use a client that speaks it"
    );
    assert_eq!(card(&server, "future", "queue"), 0, "nothing was written");
    let Some(python) = python() else { return };
    let out = python_worker(&python, &server, "future", &["--limit", "2"])
        .wait_with_output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("protocol version 5"));
}

//! Behaviour across real OS processes: this test executable re-runs itself as a child (the
//! ignored `child_process` entry point below) and the parent kills or stops the children.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Parameters passed to a child through the environment.
struct ChildSpec<'a> {
    url: &'a str,
    name: &'a str,
    limit: u32,
    tasks: u32,
    jobs: u32,
    hold_ms: u64,
    lease_ms: u64,
}

fn spawn_child(spec: &ChildSpec<'_>) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("REDSEM_CHILD", "1")
        .env("REDSEM_CHILD_URL", spec.url)
        .env("REDSEM_CHILD_NAME", spec.name)
        .env("REDSEM_CHILD_LIMIT", spec.limit.to_string())
        .env("REDSEM_CHILD_TASKS", spec.tasks.to_string())
        .env("REDSEM_CHILD_JOBS", spec.jobs.to_string())
        .env("REDSEM_CHILD_HOLD_MS", spec.hold_ms.to_string())
        .env("REDSEM_CHILD_LEASE_MS", spec.lease_ms.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Lines the child printed that start with `EVENT `, each split in words.
fn events(child: Child) -> Vec<Vec<String>> {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "child failed: {:?}", out.status);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        // libtest may print "test child_process ... " on the same line as the first event
        .filter_map(|l| l.find("EVENT ").map(|i| &l[i + 6..]))
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// Reads the child's stdout until it prints `EVENT acquired`; returns the generation of the
/// fence of its first slot.
fn wait_acquired(child: &mut Child) -> u64 {
    let stdout = child.stdout.as_mut().unwrap();
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "child exited before acquiring"
        );
        if let Some(i) = line.find("EVENT acquired ") {
            let words: Vec<&str> = line[i..].split_whitespace().collect();
            return words[3].parse().unwrap();
        }
    }
}

fn signal(child: &Child, sig: i32) {
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

/// Entry point of the child processes (run only by the tests below, through `--ignored`).
/// Runs TASKS tasks sharing JOBS jobs; each job acquires, prints
/// `EVENT acquired <acq_ns> <generation of its first slot>` then holds HOLD_MS, then prints `EVENT job <acq_ns> <rel_ns> <ticket>`.
#[test]
#[ignore = "entry point of the child processes of this file's tests"]
fn child_process() {
    if std::env::var("REDSEM_CHILD").is_err() {
        return;
    }
    let var = |k: &str| std::env::var(format!("REDSEM_CHILD_{k}")).unwrap();
    let num = |k: &str| var(k).parse::<u64>().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = redsem::Client::connect(&var("URL")).await.unwrap();
        let sem = client
            .semaphore(var("NAME"), num("LIMIT") as u32)
            .lease(Duration::from_millis(num("LEASE_MS")))
            .open()
            .await
            .unwrap();
        let remaining = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(num("JOBS") as i64));
        let mut tasks = Vec::new();
        for _ in 0..num("TASKS") {
            let (sem, remaining) = (sem.clone(), remaining.clone());
            let hold = Duration::from_millis(num("HOLD_MS"));
            tasks.push(tokio::spawn(async move {
                while remaining.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) > 0 {
                    let p = sem.acquire().await.unwrap();
                    let acq = now_ns();
                    println!("EVENT acquired {acq} {}", p.fences()[0].generation);
                    tokio::time::sleep(hold).await;
                    let rel = now_ns();
                    let ticket = p.ticket();
                    p.release().await.unwrap();
                    println!("EVENT job {acq} {rel} {ticket}");
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}

#[test]
fn sigkill_of_every_holder_frees_the_slots_within_one_lease() {
    for server in servers() {
        let lease = Duration::from_millis(1000);
        let url = server.url();
        let spec = ChildSpec {
            url: &url,
            name: "crash",
            limit: 2,
            tasks: 1,
            jobs: 1,
            hold_ms: 3_600_000,
            lease_ms: lease.as_millis() as u64,
        };
        let mut holders: Vec<Child> = (0..2).map(|_| spawn_child(&spec)).collect();
        for h in &mut holders {
            wait_acquired(h);
        }
        std::thread::sleep(Duration::from_millis(100));
        let killed_at = Instant::now();
        for h in &mut holders {
            signal(h, libc::SIGKILL);
            h.wait().unwrap();
        }
        let rt = tokio::runtime::Runtime::new().unwrap();
        let waited = rt.block_on(async {
            let client = client(&server).await;
            let sem = open(&client, "crash", 2, lease).await;
            let p = sem.acquire_timeout(lease * 5).await.unwrap();
            let waited = killed_at.elapsed();
            // the other crashed holder's lease ends within moments of the first
            let deadline = Instant::now() + lease;
            while sem.stats().await.unwrap().expired_total < 2 {
                assert!(
                    Instant::now() < deadline,
                    "the second crashed holder was not reaped"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            drop(p);
            waited
        });
        println!(
            "{}: slot recovered {waited:?} after the kill (lease {lease:?})",
            server.flavor()
        );
        // the lease, plus one more for the reap and a loaded machine (a slot freed only by
        // the acquire timeout would take five)
        assert!(
            waited <= lease * 2,
            "{}: recovered after {waited:?}",
            server.flavor()
        );
        // both counted in Redis once a writing call reaped them (`stats` is read-only: it
        // counted the second as expired without reaping it); opening reaps
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let client = client(&server).await;
            drop(open(&client, "crash", 2, lease).await);
        });
        assert_eq!(
            server
                .cmd(&["HGET", "redsem:{crash}:cfg", "expired"])
                .as_str(),
            Some("2")
        );
    }
}

#[test]
fn three_processes_never_exceed_the_limit_and_are_served_in_ticket_order() {
    for server in servers() {
        let url = server.url();
        let spec = ChildSpec {
            url: &url,
            name: "three",
            limit: 5,
            tasks: 10,
            jobs: 40,
            hold_ms: 10,
            lease_ms: 5000,
        };
        let children: Vec<Child> = (0..3).map(|_| spawn_child(&spec)).collect();
        let mut jobs: Vec<(u128, u128, u64)> = Vec::new();
        for c in children {
            for e in events(c) {
                if e[0] == "job" {
                    jobs.push((
                        e[1].parse().unwrap(),
                        e[2].parse().unwrap(),
                        e[3].parse().unwrap(),
                    ));
                }
            }
        }
        assert_eq!(jobs.len(), 120, "every job ran");
        // peak overlap of [acq, rel] across processes, from the holders' own timestamps
        let mut edges: Vec<(u128, i32)> = jobs.iter().flat_map(|j| [(j.0, 1), (j.1, -1)]).collect();
        edges.sort_by_key(|&(t, d)| (t, d)); // a release at the same instant counts first
        let (mut now, mut peak) = (0, 0);
        for (_, d) in edges {
            now += d;
            peak = peak.max(now);
        }
        assert!(peak <= 5, "{}: {peak} holders at once", server.flavor());
        assert_eq!(peak, 5, "{}: the limit was never reached", server.flavor());
        // FIFO: sorted by ticket, no acquisition happens clearly before an earlier ticket's
        // (tolerance for the time a notified process takes to be scheduled on 2 busy cores)
        jobs.sort_by_key(|j| j.2);
        let tolerance = 50_000_000u128;
        let mut latest = 0u128;
        for j in &jobs {
            assert!(
                j.0 + tolerance >= latest,
                "{}: ticket {} acquired {} ms before an earlier ticket",
                server.flavor(),
                j.2,
                (latest - j.0) / 1_000_000
            );
            latest = latest.max(j.0);
        }
        let tickets: std::collections::HashSet<u64> = jobs.iter().map(|j| j.2).collect();
        assert_eq!(tickets.len(), 120, "tickets are unique");
    }
}

#[test]
fn a_killed_waiter_leaves_the_queue_within_one_lease() {
    for server in servers() {
        let lease = Duration::from_millis(800);
        let rt = tokio::runtime::Runtime::new().unwrap();
        let client = rt.block_on(client(&server));
        let sem = rt.block_on(open(&client, "dead-waiter", 1, lease));
        let held = rt.block_on(sem.acquire()).unwrap();
        let url = server.url();
        let spec = ChildSpec {
            url: &url,
            name: "dead-waiter",
            limit: 1,
            tasks: 1,
            jobs: 1,
            hold_ms: 10,
            lease_ms: lease.as_millis() as u64,
        };
        let mut waiter = spawn_child(&spec);
        let deadline = Instant::now() + Duration::from_secs(10);
        while card(&server, "dead-waiter", "queue") != 1 {
            assert!(Instant::now() < deadline, "the child never queued");
            std::thread::sleep(Duration::from_millis(10));
        }
        signal(&waiter, libc::SIGKILL);
        waiter.wait().unwrap();
        let killed = Instant::now();
        // nobody else calls Redis meanwhile except this process's heartbeat, which reaps it
        while card(&server, "dead-waiter", "queue") != 0 {
            assert!(
                killed.elapsed() < lease * 3,
                "the dead waiter is still queued"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        println!(
            "{}: dead waiter left the queue {:?} after the kill",
            server.flavor(),
            killed.elapsed()
        );
        drop(held);
        rt.block_on(assert_nothing_left(&server, "dead-waiter"));
    }
}

#[test]
fn a_holder_paused_past_its_lease_loses_its_slot_to_the_next_in_line() {
    for server in servers() {
        let lease = Duration::from_millis(600);
        let url = server.url();
        let spec = ChildSpec {
            url: &url,
            name: "paused",
            limit: 1,
            tasks: 1,
            jobs: 1,
            hold_ms: 1500,
            lease_ms: lease.as_millis() as u64,
        };
        let mut holder = spawn_child(&spec);
        let paused_generation = wait_acquired(&mut holder);
        signal(&holder, libc::SIGSTOP);
        let stopped = Instant::now();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let fence = rt.block_on(async {
            let client = client(&server).await;
            let sem = open(&client, "paused", 1, lease).await;
            let p = sem.acquire_timeout(lease * 5).await.unwrap();
            // the lease, plus two more for the waiter's start, the reap and a loaded machine
            // (a slot freed only by the acquire timeout would take five)
            let waited = stopped.elapsed();
            assert!(
                waited <= lease * 3,
                "{}: granted after {waited:?}",
                server.flavor()
            );
            p.fences()[0]
        });
        assert!(
            fence.generation > paused_generation,
            "the slot went to the next holder with a higher fence: {} after {paused_generation}",
            fence.generation
        );
        signal(&holder, libc::SIGCONT);
        // the resumed holder's renewal finds its lease gone; its release must not fail
        let _ = holder.wait().unwrap();
    }
}

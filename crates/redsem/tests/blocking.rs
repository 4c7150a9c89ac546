//! The blocking API (feature `blocking`): plain threads, no async runtime of the caller's.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use redsem::blocking::Client;
use redsem::{Error, LostReason};

fn connect(server: &Server) -> Client {
    Client::builder(server.url())
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// The same settings, through an async builder.
fn connect_from_async_builder(server: &Server) -> Client {
    Client::from_builder(
        redsem::Client::builder(server.url())
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2)),
    )
    .unwrap()
}

/// Polls `cond` every 10 ms until it holds or `within` passes.
fn wait_until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

#[test]
fn a_permit_is_exclusive_across_two_blocking_clients() {
    let server = Server::start(Flavor::Redis);
    let (a, b) = (connect(&server), connect_from_async_builder(&server));
    let sa = a
        .semaphore("blk-excl", 1)
        .lease(Duration::from_secs(3))
        .open()
        .unwrap();
    let sb = b
        .semaphore("blk-excl", 1)
        .lease(Duration::from_secs(3))
        .open()
        .unwrap();
    let held = sa.acquire().unwrap();
    assert_eq!(held.slots(), [0]);
    match sb.try_acquire() {
        Err(Error::NoPermits { .. }) => {}
        other => panic!("{other:?}"),
    }
    drop(held); // released in the background, on a's runtime thread
    let next = sb.acquire_timeout(Duration::from_secs(5)).unwrap();
    next.release().unwrap();
    a.shutdown();
    b.shutdown();
    assert_eq!(entries(&server, "blk-excl"), [0, 0, 0, 0]);
}

#[test]
fn acquire_timeout_gives_up_and_leaves_the_queue() {
    let server = Server::start(Flavor::Redis);
    let client = connect(&server);
    let sem = client.semaphore("blk-timeout", 1).open().unwrap();
    let _held = sem.acquire().unwrap();
    let started = Instant::now();
    match sem.acquire_timeout(Duration::from_millis(300)) {
        Err(Error::Timeout { timeout, .. }) => assert_eq!(timeout, Duration::from_millis(300)),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(wait_until(Duration::from_secs(5), || card(
        &server,
        "blk-timeout",
        "queue"
    ) == 0));
}

#[test]
fn run_returns_the_value_and_releases() {
    let server = Server::start(Flavor::Redis);
    let client = connect(&server);
    let sem = client.semaphore("blk-run", 1).open().unwrap();
    assert_eq!(sem.run(|| 6 * 7).unwrap(), 42);
    client.shutdown();
    assert_eq!(entries(&server, "blk-run"), [0, 0, 0, 0]);
}

#[test]
fn run_reports_a_permit_lost_while_the_work_ran() {
    let server = Server::start(Flavor::Redis);
    let client = connect(&server);
    let sem = client
        .semaphore("blk-lost", 1)
        .lease(Duration::from_millis(600))
        .open()
        .unwrap();
    let permit = sem.acquire().unwrap();
    let token = permit.cancellation_token();
    assert!(sem.force_release(permit.holder_id()).unwrap());
    let out = permit.run(|| wait_until(Duration::from_secs(5), || token.is_cancelled()));
    match out {
        Err(Error::LeaseLost {
            reason: LostReason::NotHolder,
            name,
            ..
        }) => assert_eq!(name, "blk-lost"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn threads_sharing_a_blocking_semaphore_never_exceed_the_limit() {
    let server = Server::start(Flavor::Redis);
    let client = connect(&server);
    let sem = client.semaphore("blk-threads", 2).open().unwrap();
    let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let (sem, now, peak) = (sem.clone(), now.clone(), peak.clone());
            std::thread::spawn(move || {
                for _ in 0..5 {
                    let permit = sem.acquire_timeout(Duration::from_secs(30)).unwrap();
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(10));
                    now.fetch_sub(1, Ordering::SeqCst);
                    permit.release().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(peak.load(Ordering::SeqCst) <= 2);
    assert_eq!(sem.stats().unwrap().grants_total, 30);
}

#[test]
#[should_panic(expected = "Cannot start a runtime from within a runtime")]
fn a_blocking_call_inside_an_async_runtime_panics() {
    let server = Server::start(Flavor::Redis);
    let client = connect(&server);
    let sem = client.semaphore("blk-async", 1).open().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async { sem.try_acquire().map(drop) }).unwrap();
}

#[test]
fn dropping_a_permit_releases_it_for_another_client() {
    let server = Server::start(Flavor::Redis);
    let (a, b) = (connect(&server), connect(&server));
    // A lease far longer than the wait below: the slot must come back by release, not expiry.
    let lease = Duration::from_secs(60);
    let sa = a.semaphore("blk-drop", 1).lease(lease).open().unwrap();
    let sb = b.semaphore("blk-drop", 1).lease(lease).open().unwrap();
    let held = sa.acquire().unwrap();
    assert_eq!(held.semaphore(), "blk-drop");
    assert_eq!(sa.local_counts(), (1, 0));
    drop(held);
    let next = sb.acquire_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(next.slots(), [0]);
    assert_eq!(sa.local_counts(), (0, 0));
}

#[test]
fn a_permit_outliving_its_client_is_released_when_dropped() {
    let server = Server::start(Flavor::Redis);
    let (a, b) = (connect(&server), connect(&server));
    let lease = Duration::from_secs(60);
    let sb = b.semaphore("blk-orphan", 1).lease(lease).open().unwrap();
    let permit = {
        let sa = a.semaphore("blk-orphan", 1).lease(lease).open().unwrap();
        sa.acquire().unwrap()
    };
    drop(a);
    // The last handle on a's runtime: its release must be done before the runtime stops.
    drop(permit);
    let next = sb.acquire_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(next.slots(), [0]);
}

#[test]
fn dropping_the_last_handle_without_shutdown_leaves_nothing_in_redis() {
    let server = Server::start(Flavor::Redis);
    let client = connect(&server);
    let sem = client
        .semaphore("blk-exit", 2)
        .lease(Duration::from_secs(60))
        .open()
        .unwrap();
    let permit = sem.acquire_many(2).unwrap();
    assert_eq!(entries(&server, "blk-exit")[0], 2);
    drop(permit);
    drop(sem);
    drop(client);
    // No waiting here: the drop returned only once the release was done.
    assert_eq!(entries(&server, "blk-exit"), [0, 0, 0, 0]);
}

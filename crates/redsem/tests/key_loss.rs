//! Lost keys (eviction, a `DEL`, a partial restore) never raise the limit.
//!
//! Each of the seven keys of a semaphore, and each pair of them, is deleted in each state:
//! idle, full, with waiters queued, and with an `acquire_many` head. Then new acquisitions
//! are tried. What is asserted, in every case: the permits that processes believe they hold
//! (not lost) never exceed the limit and never share a slot once every holder had time to
//! learn of the loss (one renewal interval); and the semaphore works afterwards (nothing
//! leaks: the whole limit can be taken again). When a single key is lost, the stronger
//! property holds at every moment: the scripts repair the keys from what survives before
//! they grant, so the believers never exceed the limit, not even for one renewal interval.
//! The outcome of each loss is documented in docs/PROTOCOL.md, "Lost keys".

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;

const KEYS: [&str; 7] = ["cfg", "queue", "exp", "meta", "slots", "free", "own"];
const LIMIT: u32 = 3;
const RENEW: Duration = Duration::from_millis(150);

#[derive(Clone, Copy, Debug)]
enum State {
    Idle,
    Full,
    Queued,
    ManyAtHead,
}

/// What processes believe they hold: the permits not known lost.
fn believed(held: &[redsem::Permit]) -> Vec<&redsem::Permit> {
    held.iter().filter(|p| !p.is_lost()).collect()
}

/// Believers ≤ limit, and their slots distinct.
fn assert_within_limit(held: &[redsem::Permit], what: &str) {
    let live = believed(held);
    let permits: u32 = live.iter().map(|p| p.num_permits()).sum();
    assert!(permits <= LIMIT, "{what}: {permits} permits believed held");
    let slots: Vec<u32> = live.iter().flat_map(|p| p.slots()).collect();
    let distinct: BTreeSet<u32> = slots.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        slots.len(),
        "{what}: a slot is held twice: {slots:?}"
    );
}

async fn scenario(server: &Server, state: State, lost: &[&str], strict: bool) {
    let t0 = Instant::now();
    let name = format!("loss-{state:?}-{}", lost.join("-")).to_lowercase();
    let what = format!("{} {state:?} losing {lost:?}", server.flavor());
    let client = client(server).await;
    let sem = client
        .semaphore(name.as_str(), LIMIT)
        .lease(Duration::from_millis(900))
        .renew_every(RENEW)
        .fallback_poll(Duration::from_millis(100))
        .open()
        .await
        .unwrap();
    let mut held: Vec<redsem::Permit> = vec![];
    let mut waiters = vec![];
    match state {
        State::Idle => {}
        State::Full => {
            for _ in 0..LIMIT {
                held.push(sem.acquire().await.unwrap());
            }
        }
        State::Queued | State::ManyAtHead => {
            let n = if matches!(state, State::Queued) { 3 } else { 2 };
            for _ in 0..n {
                held.push(sem.acquire().await.unwrap());
            }
            let first = if matches!(state, State::ManyAtHead) {
                3
            } else {
                1
            };
            for want in [first, 1] {
                let sem = sem.clone();
                waiters.push(tokio::spawn(async move {
                    sem.acquire_many_timeout(want, Duration::from_secs(20))
                        .await
                }));
                let queued = waiters.len() as i64;
                assert!(
                    eventually(Duration::from_secs(5), || card(server, &name, "queue")
                        == queued)
                    .await
                );
            }
        }
    }
    for key in lost {
        server.cmd(&["DEL", &format!("redsem:{{{name}}}:{key}")]);
    }
    // new acquisitions right after the loss, and a few more over two renewal intervals
    let started = Instant::now();
    while started.elapsed() < RENEW * 2 {
        if let Ok(p) = sem.try_acquire().await {
            held.push(p);
        }
        if strict {
            assert_within_limit(&held, &what);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // every holder has had a renewal since the loss: the believers are within the limit
    tokio::time::sleep(RENEW * 3).await;
    assert_within_limit(&held, &what);
    let redis_held = card(server, &name, "slots");
    assert!(
        redis_held <= LIMIT as i64,
        "{what}: {redis_held} slots mapped"
    );

    // nothing leaks: once everything is given back, the whole limit can be taken again
    // (the waiters may have been granted meanwhile, in any order: a waiter that lost its
    // ticket queues again at the back)
    drop(held);
    for w in &waiters {
        w.abort();
    }
    for w in waiters {
        let _ = w.await;
    }
    let all = tokio::time::timeout(Duration::from_secs(15), sem.acquire_many(LIMIT))
        .await
        .unwrap_or_else(|_| panic!("{what}: the full limit never came back"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut slots = all.slots();
    slots.sort();
    assert_eq!(slots, [0, 1, 2], "{what}");
    all.release().await.unwrap();
    let st = sem.stats().await.unwrap();
    assert_eq!(st.in_use, 0, "{what}");
    if t0.elapsed() > Duration::from_secs(3) {
        println!("{what}: {:?}", t0.elapsed());
    }
}

const STATES: [State; 4] = [State::Idle, State::Full, State::Queued, State::ManyAtHead];

// The scenarios of one state run concurrently (each on its own semaphore).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_any_one_key_never_raises_the_limit() {
    for server in servers() {
        for state in STATES {
            let singles: Vec<[&str; 1]> = KEYS.iter().map(|k| [*k]).collect();
            let runs = singles
                .iter()
                .map(|key| scenario(&server, state, key, true));
            futures_util::future::join_all(runs).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_any_two_keys_never_raises_the_limit_once_holders_had_a_renewal() {
    let pairs: Vec<[&str; 2]> = KEYS
        .iter()
        .enumerate()
        .flat_map(|(i, a)| KEYS[i + 1..].iter().map(move |b| [*a, *b]))
        .collect();
    for server in servers() {
        for state in STATES {
            let runs = pairs
                .iter()
                .map(|pair| scenario(&server, state, pair, false));
            futures_util::future::join_all(runs).await;
        }
    }
}

/// The reproduction of the issue: two holders at limit 3, the free slot listed in `free`
/// (slot 0, given back below the high-water mark), `free` deleted (what eviction does), four
/// more try: exactly one gets in, with the forgotten slot, and stats count the repair.
#[tokio::test]
async fn an_evicted_free_set_is_repaired_before_any_grant() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "ev", 3, Duration::from_secs(10)).await;
        let first = sem.acquire().await.unwrap();
        let a = sem.acquire().await.unwrap();
        let b = sem.acquire().await.unwrap();
        first.release().await.unwrap();
        assert_eq!(card(&server, "ev", "free"), 1, "slot 0 is listed free");
        server.cmd(&["DEL", "redsem:{ev}:free"]);
        let mut more = vec![];
        for _ in 0..4 {
            if let Ok(p) = sem.try_acquire().await {
                more.push(p);
            }
        }
        assert_eq!(more.len(), 1, "{}", server.flavor());
        let mut slots: Vec<u32> = [&a, &b, &more[0]].iter().flat_map(|p| p.slots()).collect();
        slots.sort();
        assert_eq!(slots, [0, 1, 2]);
        let st = sem.stats().await.unwrap();
        assert_eq!((st.in_use, st.available), (3, 0));
        assert!(st.repairs_total >= 1, "the repair is reported");
    }
}

/// Redis loses a grant while the entry waited there — a failover to a replica that missed
/// it, a restore of an older copy — and later grants the same id afresh, with a new fence.
/// The permit of the lost grant must not take the new grant for its own: its slots and
/// fences are not what Redis holds for it. Its next renewal declares it lost, and the
/// fresh grant is given back.
#[tokio::test]
async fn a_permit_whose_grant_was_lost_does_not_adopt_a_fresh_grant() {
    for server in servers() {
        let name = "regranted";
        let client = client(&server).await;
        let sem = client
            .semaphore(name, 1)
            .lease(Duration::from_secs(3))
            .renew_every(RENEW)
            .open()
            .await
            .unwrap();
        let first = sem.acquire().await.unwrap();
        let waiting = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await.unwrap() })
        };
        assert!(eventually(Duration::from_secs(5), || card(&server, name, "queue") == 1).await);
        // the replica's copy: `first` holds, the waiter is queued
        let copy = |from: &str, to: &str| {
            for k in KEYS {
                let (a, b) = (format!("{from}{k}"), format!("{to}{k}"));
                server.cmd(&["DEL", &b]);
                server.cmd(&["COPY", &a, &b]);
            }
        };
        let live = format!("redsem:{{{name}}}:");
        let saved = format!("redsem:{{{name}}}:saved-");
        copy(&live, &saved);
        let first_id = first.holder_id().to_owned();
        first.release().await.unwrap();
        let second = waiting.await.unwrap();
        let old_fence = second.fences()[0];
        // the failover: the copy comes back; `first` no longer renews its entry there, and an
        // operator removes it, so the waiter is granted again, with a new fence
        copy(&saved, &live);
        assert!(sem.force_release(&first_id).await.unwrap());
        let lost = tokio::time::timeout(Duration::from_secs(5), second.lost())
            .await
            .unwrap_or_else(|_| panic!("{}: the permit adopted the fresh grant", server.flavor()));
        assert_eq!(lost, redsem::LostReason::NotHolder);
        assert_eq!(old_fence.slot, 0);
        // the fresh grant was given back: the slot is free for the next acquisition
        drop(second);
        let next = sem.acquire_timeout(Duration::from_secs(5)).await.unwrap();
        assert!(next.fences()[0].generation > old_fence.generation);
    }
}

/// A script of the crate, as a client sends it.
fn script(body: &str) -> String {
    redsem::internals::script_source(body)
}

/// Runs `body` on the semaphore `name` as a client would (the seven keys, the common header
/// with `limit`, then `args`).
fn raw(server: &Server, name: &str, limit: u32, body: &str, args: &[&str]) -> Reply {
    let text = script(body);
    let keys: Vec<String> = KEYS
        .iter()
        .map(|k| format!("redsem:{{{name}}}:{k}"))
        .collect();
    let base = format!("redsem:{{{name}}}:c:");
    let limit = limit.to_string();
    let mut cmd: Vec<&str> = vec!["EVAL", &text, "7"];
    cmd.extend(keys.iter().map(String::as_str));
    cmd.extend([limit.as_str(), base.as_str(), "PUBLISH"]);
    cmd.extend_from_slice(args);
    server.cmd(&cmd)
}

/// What a client that crashed while holding leaves: an entry `id` of the handle `suffix`
/// holding one permit, with a lease of `lease_ms`, that nobody renews or releases.
fn crashed_holder(server: &Server, name: &str, limit: u32, suffix: &str, id: &str, lease_ms: u32) {
    let lease = lease_ms.to_string();
    let r = raw(
        server,
        name,
        limit,
        include_str!("../src/protocol/lua/acquire.lua"),
        &["1", id, "1", &lease, &lease, suffix, "crashed", "try", "0"],
    );
    assert!(granted(&r), "not granted: {r:?}");
}

/// Whether an `acquire.lua` reply for one request says granted: the permits free, then code 1.
fn granted(r: &Reply) -> bool {
    r.as_array().and_then(|a| a.get(1)).and_then(Reply::as_int) == Some(1)
}

fn has_record(server: &Server, name: &str, id: &str) -> bool {
    server
        .cmd(&["HEXISTS", &format!("redsem:{{{name}}}:meta"), id])
        .as_int()
        == Some(1)
}

/// The reproduction: a holder is killed, then `exp` is lost, while another handle
/// keeps acquiring and releasing (and never opens a handle or asks for stats). The killed
/// holder's entry must expire one lease after the loss: the first script after it finds the
/// lease set's marker gone and gives every session of the index a lease again.
#[tokio::test]
async fn a_crashed_holder_expires_after_its_lease_when_exp_is_lost() {
    for server in servers() {
        let name = "exp-lost-crashed";
        let client = client(&server).await;
        let sem = client
            .semaphore(name, 2)
            .lease(Duration::from_secs(3))
            .open()
            .await
            .unwrap();
        crashed_holder(&server, name, 2, "dead.0", "dead.0-1", 1000);
        server.cmd(&["DEL", &format!("redsem:{{{name}}}:exp")]);
        let lost = Instant::now();
        let mut acquisitions = 0;
        while has_record(&server, name, "dead.0-1") && lost.elapsed() < Duration::from_secs(6) {
            sem.acquire().await.unwrap().release().await.unwrap();
            acquisitions += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            !has_record(&server, name, "dead.0-1"),
            "{}: the crashed holder's entry lived on for {:?} ({acquisitions} acquisitions) after `exp` was lost",
            server.flavor(),
            lost.elapsed()
        );
        // both slots are free again
        let both = sem.try_acquire_many(2).await.unwrap();
        drop(both);
    }
}

/// A crashed holder, then `own` (the index a snapshot finds dead sessions' entries through)
/// lost, and nobody acquiring: once the holder's lease has passed, a snapshot (read-only,
/// it repairs nothing) no longer counts or lists it, as the next script will reap it; the
/// exporter and `stats` do not report a dead holder as in use for ever.
#[tokio::test]
async fn a_snapshot_leaves_out_a_crashed_holder_once_its_lease_passed_though_own_is_lost() {
    for server in servers() {
        let name = "own-lost-crashed";
        let client = client(&server).await;
        crashed_holder(&server, name, 2, "dead.0", "dead.0-1", 600);
        server.cmd(&["DEL", &format!("redsem:{{{name}}}:own")]);
        let s = client.inspect(name).await.unwrap();
        assert_eq!((s.in_use, s.holder_count), (1, 1), "{}", server.flavor());
        tokio::time::sleep(Duration::from_millis(900)).await;
        let s = client.inspect(name).await.unwrap();
        assert_eq!(
            (s.in_use, s.holder_count, s.holders.len()),
            (0, 0, 0),
            "{}: {s:?}",
            server.flavor()
        );
        assert_eq!(s.expired_total, 1, "{}", server.flavor());
        // and the next script does what the snapshot said: the slot is free
        let sem = client.semaphore(name, 2).open().await.unwrap();
        drop(sem.try_acquire_many(2).await.unwrap());
        assert!(
            !has_record(&server, name, "dead.0-1"),
            "{}",
            server.flavor()
        );
    }
}

/// The reproduction: A holds (limit 1), B waits, `queue` is lost, A releases, and C
/// tries. B must be granted (the release finds the queue shorter than its count and puts
/// every waiter back at its ticket), and C must not get in before it.
#[tokio::test]
async fn fifo_holds_after_the_queue_is_lost() {
    for server in servers() {
        let name = "queue-lost-fifo";
        let handle = |c: redsem::Client| async move {
            c.semaphore(name, 1)
                .lease(Duration::from_secs(30))
                .renew_every(Duration::from_secs(10))
                .fallback_poll(Duration::from_secs(30))
                .open()
                .await
                .unwrap()
        };
        let (a, b, c) = (
            handle(client(&server).await).await,
            handle(client(&server).await).await,
            handle(client(&server).await).await,
        );
        let held = a.acquire().await.unwrap();
        let waiting = tokio::spawn(async move { b.acquire().await.unwrap() });
        assert!(eventually(Duration::from_secs(5), || card(&server, name, "queue") == 1).await);
        server.cmd(&["DEL", &format!("redsem:{{{name}}}:queue")]);
        held.release().await.unwrap();
        let granted = tokio::time::timeout(Duration::from_secs(3), waiting)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{}: the waiter was not granted the slot its predecessor released",
                    server.flavor()
                )
            })
            .unwrap();
        assert_eq!(granted.ticket(), 2);
        match c.try_acquire().await {
            Err(redsem::Error::NoPermits { .. }) => {}
            other => panic!("{}: a newcomer got in: {other:?}", server.flavor()),
        }
    }
}

/// The reproduction: A holds, B waits with ticket 2, `cfg` and `queue` are lost,
/// C queues. C's ticket must come after B's (the re-created configuration continues above
/// every ticket of the records), and B is granted first.
#[tokio::test]
async fn tickets_continue_above_live_ones_after_cfg_and_queue_are_lost() {
    for server in servers() {
        let name = "cfg-queue-lost";
        let client = client(&server).await;
        let sem = client
            .semaphore(name, 1)
            .lease(Duration::from_secs(30))
            .renew_every(Duration::from_secs(10))
            .fallback_poll(Duration::from_secs(30))
            .open()
            .await
            .unwrap();
        let held = sem.acquire().await.unwrap();
        let b = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await.unwrap() })
        };
        assert!(eventually(Duration::from_secs(5), || card(&server, name, "queue") == 1).await);
        for key in ["cfg", "queue"] {
            server.cmd(&["DEL", &format!("redsem:{{{name}}}:{key}")]);
        }
        let c = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await.unwrap() })
        };
        assert!(eventually(Duration::from_secs(5), || card(&server, name, "queue") == 2).await);
        held.release().await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(3), b)
            .await
            .unwrap_or_else(|_| panic!("{}: B was not served first", server.flavor()))
            .unwrap();
        assert_eq!(first.ticket(), 2);
        assert!(!c.is_finished(), "{}: C was granted too", server.flavor());
        first.release().await.unwrap();
        let second = tokio::time::timeout(Duration::from_secs(3), c)
            .await
            .unwrap()
            .unwrap();
        assert!(second.ticket() > 2, "C's ticket {}", second.ticket());
    }
}

/// Suspected in the issue, confirmed: with `own` lost, a closing handle ends its session
/// although an entry of it still exists (one its client does not know of, e.g. an acquire
/// that failed on the client while Redis ran it), and that entry, without a lease, is never
/// reaped. The release finds the index's marker gone and rebuilds it first: the session is
/// not ended, and its entry expires with its lease.
#[tokio::test]
async fn ending_a_session_after_own_is_lost_keeps_its_entries_leases() {
    for server in servers() {
        let name = "own-lost-close";
        let client = client(&server).await;
        let sem = client
            .semaphore(name, 2)
            .lease(Duration::from_secs(3))
            .open()
            .await
            .unwrap();
        crashed_holder(&server, name, 2, "gone.0", "gone.0-1", 1000);
        server.cmd(&["DEL", &format!("redsem:{{{name}}}:own")]);
        // its client closes the handle: ends the session, releasing nothing it knows of
        raw(
            &server,
            name,
            2,
            include_str!("../src/protocol/lua/release.lua"),
            &["0", "1", "0", "gone.0~1000"],
        );
        let lost = Instant::now();
        while has_record(&server, name, "gone.0-1") && lost.elapsed() < Duration::from_secs(5) {
            sem.acquire().await.unwrap().release().await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            !has_record(&server, name, "gone.0-1"),
            "{}: the entry of the ended session was never reaped",
            server.flavor()
        );
    }
}

/// Found by the chaos run: a lost configuration took with it the highest ticket granted in
/// each priority class (`s0`..`s9`), which is how a client whose grant notice was lost too
/// learns, at its next renewal, that a waiter of its was granted (a waiter queued behind a
/// higher class is not below the head of the queue). The re-created configuration takes them
/// from the holders' records.
#[tokio::test]
async fn a_lost_configuration_keeps_the_highest_ticket_granted_in_each_class() {
    for server in servers() {
        let name = "cfg-lost-served";
        let lease = "30000";
        let cfg = format!("redsem:{{{name}}}:cfg");
        let acquire = include_str!("../src/protocol/lua/acquire.lua");
        for (id, class) in [("h.0-1", "0"), ("h.0-2", "2"), ("h.0-3", "0")] {
            let r = raw(
                &server,
                name,
                3,
                acquire,
                &["1", id, "1", lease, lease, "h.0", "x", "try", class],
            );
            assert!(granted(&r), "{r:?}");
        }
        let served = |field: &str| {
            server
                .cmd(&["HGET", &cfg, field])
                .as_str()
                .map(str::to_owned)
        };
        assert_eq!(served("s0").as_deref(), Some("3"));
        assert_eq!(served("s2").as_deref(), Some("2"));
        server.cmd(&["DEL", &cfg]);
        // any writing call re-creates the configuration (a try that is not granted here)
        let r = raw(
            &server,
            name,
            3,
            acquire,
            &["1", "h.0-4", "1", lease, lease, "h.0", "x", "try", "0"],
        );
        assert!(!granted(&r), "{r:?}");
        assert_eq!(served("s0").as_deref(), Some("3"), "{}", server.flavor());
        assert_eq!(served("s2").as_deref(), Some("2"), "{}", server.flavor());
    }
}

/// No key is lost here, so no repair may be reported: the last holder leaves while a request
/// for two permits waits, once by a release and once by its lease running out (reaped by the
/// waiter's client's renewal), in both cases after the other holder's slot (0) was given back
/// below the high-water mark. A script that counted the slots held after freeing the last one
/// took the empty slot map for a lost one, rebuilt it and counted a repair, which `stats` and
/// `redsem stats` then report to operators as key loss.
#[tokio::test]
async fn freeing_the_last_slot_is_not_taken_for_a_lost_slot_map() {
    for server in servers() {
        let client = client(&server).await;
        for reaped in [false, true] {
            let name = format!("last-slot-{reaped}");
            let sem = client
                .semaphore(name.as_str(), 2)
                .lease(Duration::from_millis(600))
                .renew_every(Duration::from_millis(150))
                .open()
                .await
                .unwrap();
            let a = sem.acquire().await.unwrap();
            let b = sem.acquire().await.unwrap();
            assert_eq!((a.slots(), b.slots()), (vec![0], vec![1]));
            let waiter = tokio::spawn({
                let sem = sem.clone();
                async move { sem.acquire_many(2).await }
            });
            until_queued(&sem, 1).await;
            a.release().await.unwrap();
            assert_eq!(card(&server, &name, "free"), 1, "slot 0 is listed free");
            if reaped {
                b.detach(); // (its lease runs out; the waiter's renewals reap it)
            } else {
                b.release().await.unwrap();
            }
            let both = tokio::time::timeout(Duration::from_secs(10), waiter)
                .await
                .expect("the waiter is granted")
                .unwrap()
                .unwrap();
            assert_eq!(both.slots(), vec![0, 1]);
            let st = sem.stats().await.unwrap();
            assert_eq!(
                (st.repairs_total, st.in_use),
                (0, 2),
                "{} (reaped: {reaped})",
                server.flavor()
            );
            both.release().await.unwrap();
        }
    }
}

/// The configuration is lost while every permit is held and a request for the whole limit
/// waits, and a replica that opens the semaphore with a smaller limit re-creates it. That
/// waiter can never be granted: it is rejected, at the latest when a permit is free (while none
/// is, nobody can be granted anyway, and the scripts do not read the queue to find out), not
/// left waiting forever.
#[tokio::test]
async fn a_waiter_above_a_smaller_recreated_limit_is_rejected_once_a_permit_is_free() {
    // (a lease long enough that no renewal re-creates the configuration with the old limit
    // before the second replica opens it)
    let lease = Duration::from_secs(60);
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "small", 3, lease).await;
        let holder = sem.acquire_many(3).await.unwrap();
        let waiter = tokio::spawn({
            let sem = sem.clone();
            async move { sem.acquire_many(3).await.map(|p| p.num_permits()) }
        });
        until_queued(&sem, 1).await;
        server.cmd(&["DEL", "redsem:{small}:cfg"]);
        let other = common::client(&server).await;
        let smaller = open(&other, "small", 2, lease).await;
        holder.release().await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("rejected, not left waiting")
            .unwrap();
        assert!(
            matches!(
                r,
                Err(redsem::Error::TooManyPermits {
                    requested: 3,
                    limit: 2,
                    ..
                })
            ),
            "{}: {r:?}",
            server.flavor()
        );
        // and the semaphore works at its new limit
        let a = smaller.acquire_many(2).await.unwrap();
        assert_eq!(smaller.stats().await.unwrap().in_use, 2);
        a.release().await.unwrap();
    }
}

/// Every key lost (a `FLUSHALL`) while a waiter is queued, the semaphore re-created at once,
/// and its client queueing again (another task acquiring): the waiter's session lives on, and
/// the tickets start again from 1, below the waiter's, so neither the session nor the served
/// tickets, nor the head of the queue while someone waits ahead, tell it that its entry is
/// gone. The highest ticket issued does: it queues again at its next renewal, and is granted
/// in turn (it waited until new tickets passed its own, or the queue emptied).
#[tokio::test]
async fn a_waiter_queued_before_a_flushall_queues_again_though_its_session_lives_on() {
    for server in servers() {
        let lease = Duration::from_secs(2);
        let holder_client = client(&server).await;
        let holders = open(&holder_client, "flushed", 1, lease).await;
        let waiter_client = client(&server).await;
        let sem = open(&waiter_client, "flushed", 1, lease).await;
        // tickets well above those of the re-created semaphore
        for _ in 0..20 {
            sem.acquire().await.unwrap().release().await.unwrap();
        }
        let held = holders.acquire().await.unwrap();
        let waiting = tokio::spawn({
            let sem = sem.clone();
            async move { sem.acquire().await }
        });
        until_queued(&sem, 1).await;

        server.cmd(&["FLUSHALL"]);
        // another process takes the re-created semaphore's slot (ticket 1), and the waiter's
        // client queues again behind it (ticket 2): the waiters' session is back
        let other_client = client(&server).await;
        let other = open(&other_client, "flushed", 1, lease).await;
        let taken = other.acquire().await.unwrap();
        let again = tokio::spawn({
            let sem = sem.clone();
            async move { sem.acquire().await }
        });
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "flushed", "queue")
                == 1)
            .await
        );
        // while someone waits ahead of it with a lower ticket (so neither the head of the queue
        // nor the served tickets put it in doubt), the first waiter learns its entry is gone
        // and queues again behind (it stayed out of the queue for good)
        assert!(
            eventually(Duration::from_secs(10), || card(
                &server, "flushed", "queue"
            ) == 2)
            .await,
            "{}: the waiter queued before the FLUSHALL did not queue again",
            server.flavor()
        );
        drop(taken);
        again.await.unwrap().unwrap().release().await.unwrap();
        let p = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the waiter queued before the FLUSHALL was never granted")
            .unwrap()
            .unwrap();
        assert!(
            p.ticket() < 20,
            "a ticket of the re-created semaphore: {}",
            p.ticket()
        );
        drop(p);
        drop(held);
        assert_nothing_left(&server, "flushed").await;
    }
}

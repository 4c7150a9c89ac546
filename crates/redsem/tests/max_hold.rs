//! The maximum hold time of an acquisition (`AcquireOptions::max_hold`): the permit is lost
//! with `LostReason::MaxHold` at the grant + max hold, Redis stops renewing its entry then
//! (the entry is detached: its slot frees within one lease even if the program keeps the
//! permit), dropping the lost permit frees the slot at once, bad values are refused, and a
//! permit without one is not affected.
//!
//! Time bounds are generous (a shared, noisy machine): only the order of events and bounds
//! far from the expected times are asserted.

mod common;

use std::time::Duration;

use common::*;
use redsem::{AcquireOptions, Error, LostReason};
use tokio::time::Instant;

const SECOND: Duration = Duration::from_secs(1);

fn max_hold(d: Duration) -> AcquireOptions {
    AcquireOptions::new().max_hold(d)
}

#[tokio::test]
async fn a_permit_is_lost_at_its_maximum_hold_time() {
    let server = Server::start(Flavor::Redis);
    let user = client(&server).await;
    let sem = open(&user, "mh-lost", 2, Duration::from_secs(3)).await;
    let started = Instant::now();
    let permit = sem.acquire_with(max_hold(SECOND)).await.unwrap();
    assert!(!permit.is_lost());
    assert_eq!(permit.lost_reason(), None);
    let reason = tokio::time::timeout(Duration::from_secs(15), permit.lost())
        .await
        .expect("the permit is lost soon after its maximum hold time");
    let at = started.elapsed();
    assert_eq!(reason, LostReason::MaxHold);
    assert!(
        at >= SECOND,
        "lost after {at:?}, before its maximum hold time"
    );
    assert!(permit.is_lost());
    assert_eq!(permit.lost_reason(), Some(LostReason::MaxHold));
    assert!(permit.cancellation_token().is_cancelled());
    assert_eq!(permit.lease_left(), Duration::ZERO);
    let e = permit.lost().await;
    assert_eq!(e, LostReason::MaxHold, "lost() keeps resolving");
    assert!(
        LostReason::MaxHold
            .to_string()
            .contains("maximum hold time"),
        "{}",
        LostReason::MaxHold
    );
    drop(permit);

    // `run` stops the guarded work as for any other loss
    let permit = sem.acquire_with(max_hold(SECOND)).await.unwrap();
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(15),
        permit.run(tokio::time::sleep(Duration::from_secs(60))),
    )
    .await
    .expect("run returns soon after the maximum hold time");
    match r {
        Err(Error::LeaseLost { reason, .. }) => assert_eq!(reason, LostReason::MaxHold),
        other => panic!("run was not stopped by the maximum hold time: {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(15));
    // both lost permits were released when dropped
    assert_nothing_left(&server, "mh-lost").await;
}

/// While the program keeps the lost permit, Redis no longer renews its entry: it moved to a
/// session nobody renews, and another client gets the slot within one lease.
#[tokio::test]
async fn redis_stops_renewing_the_entry_at_the_maximum_hold_time() {
    let server = Server::start(Flavor::Redis);
    let name = "mh-detached";
    let lease = Duration::from_secs(3);
    let holder_client = client(&server).await;
    let holder_sem = open(&holder_client, name, 1, lease).await;
    let other_client = client(&server).await;
    let other_sem = open(&other_client, name, 1, lease).await;

    let started = Instant::now();
    let kept = holder_sem.acquire_with(max_hold(SECOND)).await.unwrap();
    let id = kept.holder_id().to_owned();
    assert!(!session_of(&server, name, &id).starts_with("d."));
    let waiter = tokio::spawn(async move {
        let p = other_sem
            .acquire_timeout(Duration::from_secs(30))
            .await
            .unwrap();
        (p, Instant::now(), other_sem)
    });
    let reason = tokio::time::timeout(Duration::from_secs(15), kept.lost())
        .await
        .expect("lost at its maximum hold time");
    assert_eq!(reason, LostReason::MaxHold);
    // detached in Redis (in the background, one call): its own session, renewed by nobody
    assert!(
        eventually(Duration::from_secs(5), || session_of(&server, name, &id)
            .starts_with("d."))
        .await,
        "the entry was not detached: {}",
        session_of(&server, name, &id)
    );
    let (granted, at, _other_sem) = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the other client got the slot while the lost permit was kept")
        .unwrap();
    let after = at - started;
    assert!(after >= SECOND, "granted after {after:?}: before max hold");
    // max hold + one lease, and much room for a slow machine
    assert!(
        after < SECOND + lease + Duration::from_secs(10),
        "granted only after {after:?}"
    );
    assert!(
        kept.is_lost(),
        "the lost permit is still kept by the program"
    );
    // dropping the lost permit now changes nothing for the new holder
    drop(kept);
    holder_client.flush_releases().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!granted.is_lost());
    assert_eq!(entries(&server, name)[0], 1, "one holder: the new one");
    granted.release().await.unwrap();
    assert_nothing_left(&server, name).await;
}

/// Dropping (or `run` ending with) a permit lost to its maximum hold time frees its slot at
/// once: a waiter is granted long before the lease (30 s) could have expired.
#[tokio::test]
async fn a_lost_permit_frees_its_slot_at_once_when_dropped() {
    let server = Server::start(Flavor::Redis);
    let lease = Duration::from_secs(30);
    for how in ["drop", "run"] {
        let name = format!("mh-drop-{how}");
        let holder_client = client(&server).await;
        let holder_sem = open(&holder_client, &name, 1, lease).await;
        let other_client = client(&server).await;
        let other_sem = open(&other_client, &name, 1, lease).await;

        let permit = holder_sem.acquire_with(max_hold(SECOND)).await.unwrap();
        let waiter = tokio::spawn(async move {
            let p = other_sem.acquire_timeout(lease).await;
            (p, Instant::now(), other_sem)
        });
        let freed_at = match how {
            "drop" => {
                let reason = tokio::time::timeout(Duration::from_secs(15), permit.lost())
                    .await
                    .expect("lost at its maximum hold time");
                assert_eq!(reason, LostReason::MaxHold);
                // the detachment reaches Redis before the release (same order either way)
                tokio::time::sleep(Duration::from_millis(300)).await;
                assert!(!waiter.is_finished(), "{how}: granted before the drop");
                let at = Instant::now();
                drop(permit);
                at
            }
            _ => {
                let r = tokio::time::timeout(
                    Duration::from_secs(15),
                    permit.run(tokio::time::sleep(Duration::from_secs(60))),
                )
                .await
                .expect("run returns at its maximum hold time");
                assert!(
                    matches!(
                        r,
                        Err(Error::LeaseLost {
                            reason: LostReason::MaxHold,
                            ..
                        })
                    ),
                    "{r:?}"
                );
                Instant::now()
            }
        };
        let (granted, at, _other_sem) = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .unwrap_or_else(|_| panic!("{how}: the waiter was not granted"))
            .unwrap();
        let granted = granted.unwrap_or_else(|e| panic!("{how}: {e}"));
        let took = at.saturating_duration_since(freed_at);
        assert!(
            took < Duration::from_secs(10),
            "{how}: the slot freed only after {took:?} (the lease is {lease:?})"
        );
        granted.release().await.unwrap();
        assert_nothing_left(&server, &name).await;
    }
}

#[tokio::test]
async fn a_bad_maximum_hold_time_is_refused_and_nothing_is_left() {
    let server = Server::start(Flavor::Redis);
    let user = client(&server).await;
    let sem = open(&user, "mh-bad", 1, Duration::from_secs(3)).await;
    for (d, words) in [
        (Duration::ZERO, "zero"),
        (redsem::MAX_DURATION + SECOND, "365 days"),
    ] {
        for try_only in [false, true] {
            let e = sem
                .acquire_with(max_hold(d).try_only(try_only))
                .await
                .unwrap_err();
            match &e {
                Error::InvalidArgument(why) => {
                    assert!(why.contains("max_hold"), "{why}");
                    assert!(why.contains(words), "{why}");
                }
                other => panic!("{d:?}: not refused: {other:?}"),
            }
        }
    }
    assert_eq!(max_hold(SECOND).get_max_hold(), Some(SECOND), "the getter");
    assert_eq!(AcquireOptions::new().get_max_hold(), None);
    assert_nothing_left(&server, "mh-bad").await;
    // the slot was never taken
    sem.try_acquire().await.unwrap().release().await.unwrap();
}

/// A permit without a maximum hold time keeps renewing past the other's and past its own
/// lease; the one with it is lost alone.
#[tokio::test]
async fn a_permit_without_a_maximum_hold_time_is_not_affected() {
    let server = Server::start(Flavor::Redis);
    let name = "mh-plain";
    let user = client(&server).await;
    let sem = open(&user, name, 2, SECOND).await;
    let plain = sem.acquire().await.unwrap();
    let bounded = sem.acquire_with(max_hold(SECOND)).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(15), bounded.lost())
        .await
        .expect("the bounded permit is lost");
    assert_eq!(reason, LostReason::MaxHold);
    drop(bounded);
    // several leases and maximum hold times later
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!plain.is_lost(), "{:?}", plain.lost_reason());
    assert_eq!(plain.lost_reason(), None);
    assert!(!session_of(&server, name, plain.holder_id()).starts_with("d."));
    let other = client(&server).await;
    let other_sem = open(&other, name, 2, SECOND).await;
    let second = other_sem.try_acquire().await.unwrap();
    let e = other_sem.try_acquire().await.unwrap_err();
    assert!(matches!(e, Error::NoPermits { .. }), "{e:?}");
    second.release().await.unwrap();
    plain.release().await.unwrap();
    assert_nothing_left(&server, name).await;
}

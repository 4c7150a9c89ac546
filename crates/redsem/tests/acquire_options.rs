//! Options per acquisition (`Semaphore::acquire_with`): permits, lease, label, timeout and
//! try-only, each stored per entry in Redis.

mod common;

use std::time::Duration;

use common::*;
use redsem::{AcquireOptions, Error};

#[tokio::test]
async fn an_acquisition_sets_its_own_lease_and_label() {
    for server in servers() {
        let client = client(&server).await;
        let sem = client
            .semaphore("opts-lease", 2)
            .lease(Duration::from_secs(3))
            .label("handle-label")
            .open()
            .await
            .unwrap();
        let long = sem
            .acquire_with(
                AcquireOptions::new()
                    .lease(Duration::from_secs(60))
                    .label("request 7f3a"),
            )
            .await
            .unwrap();
        let plain = sem.acquire().await.unwrap();
        assert_eq!(long.lease(), Duration::from_secs(60));
        assert_eq!(plain.lease(), Duration::from_secs(3));
        let st = sem.stats().await.unwrap();
        let of = |id: &str| st.holders.iter().find(|h| h.id == id).unwrap().clone();
        let (l, p) = (of(long.holder_id()), of(plain.holder_id()));
        assert_eq!(l.label, "request 7f3a");
        assert_eq!(p.label, "handle-label");
        assert!(
            l.lease_left > Duration::from_secs(50),
            "{}: the holder's own lease is stored: {:?}",
            server.flavor(),
            l.lease_left
        );
        assert!(p.lease_left <= Duration::from_secs(3), "{:?}", p.lease_left);
        drop((long, plain));
        assert_nothing_left(&server, "opts-lease").await;
    }
}

/// A queued request waits under the handle's lease and holds under its own once granted:
/// renewals after the grant extend it by the acquisition's lease.
#[tokio::test]
async fn a_waiter_holds_under_its_own_lease_once_granted() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "opts-waiter", 1, Duration::from_millis(900)).await;
        let first = sem.acquire().await.unwrap();
        let waiting = {
            let sem = sem.clone();
            tokio::spawn(async move {
                sem.acquire_with(
                    AcquireOptions::new()
                        .lease(Duration::from_secs(60))
                        .label("waiter"),
                )
                .await
                .unwrap()
            })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(
                &server,
                "opts-waiter",
                "queue"
            ) == 1)
            .await
        );
        let st = sem.stats().await.unwrap();
        assert_eq!(st.waiters[0].label, "waiter");
        drop(first);
        let second = waiting.await.unwrap();
        assert_eq!(second.lease(), Duration::from_secs(60));
        // two renewals (every 300 ms): Redis now extends it by 60 s, and the local deadline
        // counts with 60 s too
        let id = second.holder_id().to_owned();
        assert!(
            eventually(Duration::from_secs(10), || {
                second.lease_left() > Duration::from_secs(30)
            })
            .await,
            "{}: local lease left {:?}",
            server.flavor(),
            second.lease_left()
        );
        let st = sem.stats().await.unwrap();
        let h = st.holders.iter().find(|h| h.id == id).unwrap();
        assert!(h.lease_left > Duration::from_secs(50), "{:?}", h.lease_left);
        drop(second);
        assert_nothing_left(&server, "opts-waiter").await;
    }
}

#[tokio::test]
async fn timeout_try_only_and_permits_are_options_too() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "opts-modes", 2, Duration::from_secs(3)).await;
        let both = sem
            .acquire_with(AcquireOptions::new().permits(2))
            .await
            .unwrap();
        assert_eq!(both.num_permits(), 2);
        let e = sem
            .acquire_with(AcquireOptions::new().timeout(Duration::from_millis(200)))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
        let e = sem
            .acquire_with(AcquireOptions::new().try_only(true))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::NoPermits { .. }), "{e:?}");
        let e = sem
            .acquire_with(AcquireOptions::new().permits(3).try_only(true))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::TooManyPermits { .. }), "{e:?}");
        both.release().await.unwrap();
        let p = sem
            .acquire_with(AcquireOptions::new().permits(2).try_only(true))
            .await
            .unwrap();
        assert_eq!(p.slots(), [0, 1]);
        drop(p);
        assert_nothing_left(&server, "opts-modes").await;
    }
}

#[tokio::test]
async fn bad_options_are_refused_before_anything_is_sent() {
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    // lease 3 s: renewed every second
    let sem = open(&client, "opts-bad", 1, Duration::from_secs(3)).await;
    let bad = [
        AcquireOptions::new().permits(0),
        AcquireOptions::new().lease(Duration::from_millis(2999)),
        AcquireOptions::new().lease(Duration::from_secs(400 * 24 * 3600)),
        AcquireOptions::new().label("x".repeat(201)),
        AcquireOptions::new().label("tab\there"),
        AcquireOptions::new().timeout(Duration::from_secs(400 * 24 * 3600)),
        AcquireOptions::new()
            .try_only(true)
            .timeout(Duration::from_secs(1)),
    ];
    for opts in bad {
        let e = sem.acquire_with(opts.clone()).await.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{opts:?}: {e:?}");
        assert!(!e.to_string().is_empty());
    }
    let e = sem
        .acquire_with(AcquireOptions::new().lease(Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("renew_every"),
        "says what to change: {e}"
    );
    assert_eq!(card(&server, "opts-bad", "meta"), 0);
    // a lease of exactly three renewal intervals is accepted
    let p = sem
        .acquire_with(AcquireOptions::new().lease(Duration::from_secs(3)))
        .await
        .unwrap();
    drop(p);
    assert_nothing_left(&server, "opts-bad").await;
}

/// `NoPermits` says why: none free, free but others queued first (FIFO), or the local cap.
#[tokio::test]
async fn no_permits_says_why() {
    use redsem::NoPermitsReason;
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "opts-why", 2, Duration::from_secs(3)).await;
    let one = sem.acquire().await.unwrap();
    let reason = |e: Error| match e {
        Error::NoPermits { reason, name, .. } => {
            assert_eq!(name, "opts-why");
            reason
        }
        other => panic!("{other:?}"),
    };
    let e = sem.try_acquire_many(2).await.unwrap_err();
    assert!(e.to_string().contains("\"opts-why\""), "{e}");
    assert_eq!(reason(e), NoPermitsReason::NoneFree);
    // one permit is free, but a request for two is queued ahead
    let queued = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire_many(2).await.map(drop) })
    };
    assert!(
        eventually(Duration::from_secs(5), || card(
            &server, "opts-why", "queue"
        ) == 1)
        .await
    );
    assert_eq!(
        reason(sem.try_acquire().await.unwrap_err()),
        NoPermitsReason::QueuedFirst
    );
    drop(one);
    queued.await.unwrap().unwrap();
    let capped = client
        .semaphore("opts-why", 2)
        .lease(Duration::from_secs(3))
        .local_cap(1)
        .open()
        .await
        .unwrap();
    let _held = capped.acquire().await.unwrap();
    assert_eq!(
        reason(capped.try_acquire().await.unwrap_err()),
        NoPermitsReason::LocalCap
    );
}

/// A zero timeout means "only if free now", as try-only does: granted whenever a permit is
/// free and nobody is queued (not a race between the round trip and the clock), a timeout at
/// once otherwise, and never queued.
#[tokio::test]
async fn a_zero_timeout_takes_a_free_permit_and_never_queues() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "zero-timeout", 2, Duration::from_secs(5)).await;
        for i in 0..20 {
            let p = sem
                .acquire_timeout(Duration::ZERO)
                .await
                .unwrap_or_else(|e| {
                    panic!("{}: call {i} on a free semaphore: {e}", server.flavor())
                });
            p.release().await.unwrap();
        }
        let _a = sem.acquire().await.unwrap();
        let _b = sem.acquire().await.unwrap();
        let err = sem
            .acquire_many_timeout(1, Duration::ZERO)
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::Timeout { timeout, .. } if timeout.is_zero()),
            "{err:?}"
        );
        assert_eq!(card(&server, "zero-timeout", "queue"), 0, "never queued");
    }
}

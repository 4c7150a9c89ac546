//! Lease control on a held permit: `Permit::lease_left`, `Permit::lease`,
//! `Permit::set_lease` (Redisson's `updateLeaseTime`).

mod common;

use std::time::Duration;

use common::*;
use redsem::{Error, LostReason};

fn lease_left_in_redis(st: &redsem::Stats, id: &str) -> Duration {
    st.holders.iter().find(|h| h.id == id).unwrap().lease_left
}

#[tokio::test]
async fn lease_left_is_under_one_lease_and_zero_once_lost() {
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "lease-left", 1, Duration::from_secs(3)).await;
    let permit = sem.acquire().await.unwrap();
    let left = permit.lease_left();
    assert!(left <= Duration::from_secs(3), "{left:?}");
    assert!(left > Duration::from_secs(1), "{left:?}");
    sem.force_release(permit.holder_id()).await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || permit.is_lost()).await,
        "the heartbeat finds it gone"
    );
    assert_eq!(permit.lease_left(), Duration::ZERO);
}

#[tokio::test]
async fn set_lease_longer_extends_it_in_redis_and_keeps_a_detached_slot() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "lease-longer", 1, Duration::from_millis(600)).await;
        let mut permit = sem.acquire().await.unwrap();
        permit.set_lease(Duration::from_secs(30)).await.unwrap();
        assert_eq!(permit.lease(), Duration::from_secs(30));
        let st = sem.stats().await.unwrap();
        assert!(
            lease_left_in_redis(&st, permit.holder_id()) > Duration::from_secs(25),
            "{}",
            server.flavor()
        );
        // locally, the longer lease counts once renewals after the change are confirmed
        assert!(
            eventually(Duration::from_secs(5), || permit.lease_left()
                > Duration::from_secs(10))
            .await,
            "{:?}",
            permit.lease_left()
        );
        // a holder that stops renewing keeps its slot for the new lease, not the old one
        permit.detach();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let e = sem.try_acquire().await.unwrap_err();
        assert!(matches!(e, Error::NoPermits { .. }), "{e:?}");
        assert_eq!(sem.stats().await.unwrap().expired_total, 0);
    }
}

#[tokio::test]
async fn set_lease_shorter_counts_at_once_and_frees_a_crashed_slot_sooner() {
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = client
        .semaphore("lease-shorter", 1)
        .lease(Duration::from_secs(60))
        .renew_every(Duration::from_millis(200))
        .open()
        .await
        .unwrap();
    let mut permit = sem.acquire().await.unwrap();
    assert!(permit.lease_left() > Duration::from_secs(50));
    permit.set_lease(Duration::from_millis(900)).await.unwrap();
    assert!(
        permit.lease_left() <= Duration::from_millis(900),
        "{:?}",
        permit.lease_left()
    );
    // renewed every 200 ms under the shorter lease: still held after several leases
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(!permit.is_lost());
    let st = sem.stats().await.unwrap();
    assert!(lease_left_in_redis(&st, permit.holder_id()) <= Duration::from_millis(900));
    // stops renewing: the slot frees within the short lease
    permit.detach();
    let freed = tokio::time::Instant::now();
    let p = sem.acquire_timeout(Duration::from_secs(10)).await.unwrap();
    assert!(freed.elapsed() < Duration::from_secs(10));
    drop(p);
}

#[tokio::test]
async fn set_lease_refuses_a_lost_permit_or_a_lease_too_short() {
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "lease-refused", 1, Duration::from_secs(3)).await;
    let mut permit = sem.acquire().await.unwrap();
    let e = permit
        .set_lease(Duration::from_millis(2000))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert_eq!(permit.lease(), Duration::from_secs(3), "unchanged");
    sem.force_release(permit.holder_id()).await.unwrap();
    // before the heartbeat noticed: the script finds it gone and the permit is lost
    let e = permit.set_lease(Duration::from_secs(9)).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::LeaseLost {
                reason: LostReason::NotHolder,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(permit.is_lost());
    let e = permit.set_lease(Duration::from_secs(9)).await.unwrap_err();
    assert!(matches!(e, Error::LeaseLost { .. }), "{e:?}");
    drop(permit);
    assert_nothing_left(&server, "lease-refused").await;
}

//! A Redis clock stepped forward: leases expire early in real time. A holder cut off from
//! Redis must still learn that its permit is lost before Redis can grant its slot to anyone
//! else, for a step up to the documented bound: the safety margin (lease / 10, at most 1 s)
//! plus the time since its trusted renewal (at least one renewal interval while renewals
//! succeed). Beyond it, the overlap that only fencing protects against is back, and this test
//! shows it too, so that it cannot pass by accident.
//!
//! The server's clock is stepped with `libfaketime` (`test_support::FakeClock`), which works
//! with Valkey 9 only: Redis 7.0.15 hangs under it.

mod common;

use std::time::Duration;

use common::*;
use redsem::LostReason;
use test_support::{FakeClock, FaultProxy, Flavor, ServerOptions};
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);
// margin: lease / 10 = 300 ms; bound while renewals succeed: 1 s + 300 ms

/// How the cut-off holder and Redis fared after a step of `step_ms`: when the holder
/// declared its permit lost, and when another process got its slot (both from the cut).
async fn cut_off_holder_after_a_step(step_ms: i64) -> Option<(Duration, Duration)> {
    let clock = FakeClock::new()?;
    if test_support::server_binary(Flavor::Valkey).is_none() {
        eprintln!("clock_step: no valkey-server, skipping (run scripts/install-deps.sh)");
        return None;
    }
    let server = Server::start_with(
        Flavor::Valkey,
        ServerOptions {
            env: clock.env(),
            ..ServerOptions::default()
        },
    );
    let name = format!("clock-{step_ms}");
    let proxy = FaultProxy::start(server.addr());
    let holder_client = redsem::Client::builder(proxy.url())
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let holder_sem = holder_client
        .semaphore(&name, 1)
        .lease(LEASE)
        .renew_every(RENEW)
        .open()
        .await
        .unwrap();
    let other_client = client(&server).await;
    let other = other_client
        .semaphore(&name, 1)
        .lease(LEASE)
        .renew_every(RENEW)
        .open()
        .await
        .unwrap();
    let held = holder_sem.acquire().await.unwrap();
    // a few renewals: the deadline counts from one about an interval older than the last
    tokio::time::sleep(RENEW * 2 + Duration::from_millis(300)).await;
    assert!(!held.is_lost());
    // cut off, and Redis's clock jumps forward
    proxy.blackhole(true);
    let cut = Instant::now();
    clock.set_offset_ms(step_ms);
    let lost = {
        let lost = held.lost();
        tokio::spawn(async move {
            let reason = lost.await;
            (Instant::now(), reason)
        })
    };
    // another process tries for the slot every 10 ms: it gets it once Redis reaped the lease
    let taken = loop {
        match other.try_acquire().await {
            Ok(p) => break (Instant::now(), p),
            Err(redsem::Error::NoPermits { .. }) => {}
            Err(e) => panic!("{e}"),
        }
        assert!(cut.elapsed() < LEASE * 3, "the lease never ended in Redis");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (lost_at, reason) = tokio::time::timeout(LEASE * 2, lost)
        .await
        .expect("the cut-off holder never declared its permit lost")
        .unwrap();
    assert_eq!(reason, LostReason::Unreachable);
    let (taken_at, permit) = taken;
    drop(permit);
    proxy.heal();
    Some((lost_at - cut, taken_at - cut))
}

#[tokio::test]
async fn a_step_within_the_bound_never_lets_redis_regrant_before_the_holder_knows() {
    // 250 ms: within the margin alone, whatever the timing of the last renewal
    let Some((lost, taken)) = cut_off_holder_after_a_step(250).await else {
        return;
    };
    println!("step 250 ms: holder lost after {lost:?}, slot taken after {taken:?}");
    assert!(
        lost < taken,
        "Redis granted the slot {taken:?} after the cut, before the holder knew ({lost:?})"
    );
}

#[tokio::test]
async fn a_step_beyond_the_bound_lets_redis_regrant_first_which_only_fencing_covers() {
    // 2.5 s: far beyond renewal interval + margin (1.3 s)
    let Some((lost, taken)) = cut_off_holder_after_a_step(2500).await else {
        return;
    };
    println!("step 2.5 s: holder lost after {lost:?}, slot taken after {taken:?}");
    assert!(
        taken < lost,
        "the holder learnt first ({lost:?}) although the step exceeded the bound (slot taken after {taken:?})"
    );
}

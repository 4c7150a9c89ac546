//! An acquire that fails on the client (its reply did not come within the response timeout)
//! while Redis runs it later leaves nothing behind: the release the failed acquire sends
//! travels the same connection behind it, so Redis removes the entry it created, and the
//! handle's session (renewed on, for its other permits) carries no leftover entry.
//! (Issue 23 suspected a leak here; this is the check that refutes it for a connection that
//! stays up. See the report for the case of a connection replaced in between.)

mod common;

use std::time::Duration;

use common::*;
use test_support::FaultProxy;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_redis_runs_after_the_client_gave_up_leaves_nothing() {
    for server in servers() {
        // limit 2: the late acquire is granted at once (it would hold a slot); limit 1: it
        // queues (it would hold a place in the queue)
        for limit in [2u32, 1] {
            let name = format!("late-{limit}");
            let proxy = FaultProxy::start(server.addr());
            let client = redsem::Client::builder(proxy.url())
                .connect_timeout(Duration::from_secs(2))
                .response_timeout(Duration::from_millis(500))
                .build()
                .await
                .unwrap();
            let sem = client
                .semaphore(&name, limit)
                .lease(Duration::from_secs(3))
                .renew_every(Duration::from_millis(500))
                .open()
                .await
                .unwrap();
            // a permit this handle keeps: its session is renewed throughout
            let keep = sem.acquire().await.unwrap();
            // the request reaches Redis 1.5 s after it was sent; the client gives up after
            // 0.5 s
            proxy.latency(Duration::from_millis(1500));
            let started = std::time::Instant::now();
            let err = sem.acquire().await.unwrap_err();
            assert!(
                matches!(err, redsem::Error::Unreachable(_)),
                "{} {name}: {err:?}",
                server.flavor()
            );
            assert!(
                started.elapsed() < Duration::from_millis(1400),
                "gave up before Redis ran it"
            );
            proxy.heal();
            // Redis ran it (after the client had given up: it took ticket 2), then the release
            // sent behind it
            let seq = || server.cmd(&["HGET", &format!("redsem:{{{name}}}:cfg"), "seq"]);
            let ran = eventually(Duration::from_secs(5), || seq().as_str() == Some("2")).await;
            assert!(
                ran,
                "{} {name}: Redis did not run the late acquire: {:?}",
                server.flavor(),
                seq()
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
            // ... and several leases later, while the handle renews its session for `keep`
            for _ in 0..3 {
                assert_eq!(
                    entries(&server, &name),
                    [1, 0, 1, 1],
                    "{} {name}: (slots, queue, indexed, records) beyond the kept permit",
                    server.flavor()
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            assert!(
                !keep.is_lost(),
                "{} {name}: the kept permit's renewals failed",
                server.flavor()
            );
            drop(keep);
            client.shutdown().await;
            assert_nothing_left(&server, &name).await;
        }
    }
}

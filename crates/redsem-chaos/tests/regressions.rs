//! Library bugs the chaos checker found, each reproduced deterministically.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redsem_chaos::proxy::{Class, ClientProxy};
use test_support::Server;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Found by `redsem-chaos` (seeds 2 and 3, `limit-believed` and `fencing` violations): a
/// process whose command connection is stuck (black-holed) while its subscriber connection
/// works is granted a permit by notification. A grant keeps the waiter's lease, whose last
/// confirmed renewal is old. The heartbeat was blocked in a renewal sent before the grant,
/// with a timeout computed for the holders it knew then (none: up to the response timeout),
/// so the new holder's local deadline passed unnoticed: it believed it held the permit after
/// Redis had expired it and granted the slot to another process.
///
/// The permit must be reported lost before its lease ends in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_notified_while_the_command_connection_is_stuck_is_lost_before_its_lease_ends() {
    for flavor in test_support::flavors() {
        let server = tokio::task::spawn_blocking(move || Server::start(flavor))
            .await
            .unwrap();
        let proxy = ClientProxy::start(server.addr()).await.unwrap();
        let lease = Duration::from_millis(600);
        let name = "stuck-renewal";

        let holder_client = redsem::Client::connect(&server.url()).await.unwrap();
        let holder_sem = holder_client
            .semaphore(name, 1)
            .lease(lease)
            .open()
            .await
            .unwrap();
        let held = holder_sem.acquire().await.unwrap();

        // the waiter's process goes through the proxy; the default response timeout (5 s)
        // is far longer than the lease
        let waiter_client = redsem::Client::connect(&proxy.url()).await.unwrap();
        let waiter_sem = waiter_client
            .semaphore(name, 1)
            .lease(lease)
            .open()
            .await
            .unwrap();
        let waiting = tokio::spawn(async move { waiter_sem.acquire().await });
        let queue_key = format!("redsem:{{{name}}}:queue");
        for _ in 0..500 {
            if server.cmd(&["ZCARD", &queue_key]).as_int() == Some(1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(server.cmd(&["ZCARD", &queue_key]).as_int(), Some(1));

        // from now on the waiter's renewals hang; its notifications still arrive
        proxy.blackhole(Class::Cmd, true);
        // the waiter's lease in Redis still has at least lease − renewal interval to run
        tokio::time::sleep(Duration::from_millis(300)).await;
        held.release().await.unwrap();
        let permit = tokio::time::timeout(Duration::from_secs(3), waiting)
            .await
            .expect("the grant was not notified")
            .unwrap()
            .unwrap();
        let expiry_ms: i64 = server
            .cmd(&[
                "ZSCORE",
                &format!("redsem:{{{name}}}:exp"),
                permit.holder_id(),
            ])
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("the granted entry has a lease");

        let reason = tokio::time::timeout(Duration::from_secs(3), permit.lost())
            .await
            .expect("the permit was never reported lost");
        let lost_at = now_ms();
        proxy.blackhole(Class::Cmd, false);
        assert_eq!(reason, redsem::LostReason::Unreachable);
        assert!(
            lost_at < expiry_ms,
            "{flavor}: the permit was reported lost {} ms after its lease ended in Redis",
            lost_at - expiry_ms
        );
        drop(permit);
    }
}

//! Library bugs the chaos checker found, each reproduced deterministically.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redsem::internals::Keys;
use redsem_chaos::config::PREFIX;
use redsem_chaos::proxy::{Class, ClientProxy};
use test_support::Server;

/// The lease expiry (ms) in Redis of entry `id` of semaphore `name`: its session's, found
/// through the session index.
const LEASE_OF: &str = "for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do \
  local bar = string.find(m, '|', 1, true) \
  if bar and string.sub(m, bar + 1) == ARGV[1] then \
    return redis.call('ZSCORE', KEYS[2], string.sub(m, 1, bar - 1)) end end return false";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Waits until the waiter is queued in Redis and its process has been told so: the reply of
/// its acquire call has passed the proxy (a PING on the same command connection, sent after
/// Redis ran the call, is answered after it). Black-holing the connection before that would
/// hold up the reply itself, and acquire waits for its reply before anything else (seen on
/// a loaded machine: the grant's notification arrived, the acquire still waited).
async fn queued_and_told(server: &Server, keys: &Keys, waiter: &redsem::Client) {
    for _ in 0..500 {
        if server.cmd(&["ZCARD", &keys.queue]).as_int() == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(server.cmd(&["ZCARD", &keys.queue]).as_int(), Some(1));
    waiter.ping().await.unwrap();
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
        // long enough that the grant below comes well before the waiter's lease could end,
        // as the client counts it (from the confirmation before the last), even on a loaded
        // machine (600 ms was flaky on CI, 2 s beside a chaos run); the loss must still come
        // before it
        let lease = Duration::from_millis(4000);
        let name = "stuck-renewal";
        let keys = Keys::new(PREFIX, name).unwrap();

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
        queued_and_told(&server, &keys, &waiter_client).await;

        // from now on the waiter's renewals hang; its notifications still arrive
        proxy.blackhole(Class::Cmd, true);
        // granted well before the waiter's lease could end (the renewal before its last is at
        // most two renewal intervals, 2.7 s, old: at least 1.3 s of it are left)
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.release().await.unwrap();
        let permit = tokio::time::timeout(Duration::from_secs(3), waiting)
            .await
            .expect("the grant was not notified")
            .unwrap()
            .unwrap();
        let expiry_ms: i64 = server
            .cmd(&[
                "EVAL",
                LEASE_OF,
                "2",
                &keys.own,
                &keys.exp,
                permit.holder_id(),
            ])
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("the granted entry has a lease");

        let reason = tokio::time::timeout(Duration::from_secs(10), permit.lost())
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

/// Found by `redsem-chaos` (a `fencing` violation: a write rejected although the checker saw
/// no reason for its holder to be stale): a grant that reaches the waiter after the lease it
/// keeps could have run out — the notification or the reply held up, here by black-holed
/// connections — was handed out by `acquire` as a valid permit, although Redis had expired it
/// (and could have granted the slot again); the caller could act on it before the heartbeat
/// declared it lost. Such a grant must be given back, and the acquire queue again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_arrives_after_its_lease_could_have_ended_is_not_handed_out() {
    for flavor in test_support::flavors() {
        let server = tokio::task::spawn_blocking(move || Server::start(flavor))
            .await
            .unwrap();
        let proxy = ClientProxy::start(server.addr()).await.unwrap();
        let lease = Duration::from_millis(600);
        let name = "late-grant";
        let keys = Keys::new(PREFIX, name).unwrap();

        let holder_client = redsem::Client::connect(&server.url()).await.unwrap();
        let holder_sem = holder_client
            .semaphore(name, 1)
            .lease(lease)
            .open()
            .await
            .unwrap();
        let held = holder_sem.acquire().await.unwrap();

        let waiter_client = redsem::Client::connect(&proxy.url()).await.unwrap();
        let waiter_sem = waiter_client
            .semaphore(name, 1)
            .lease(lease)
            .open()
            .await
            .unwrap();
        let url = server.url();
        let (exp_key, own_key) = (keys.exp.clone(), keys.own.clone());
        let waiting = tokio::spawn(async move {
            let permit = waiter_sem.acquire().await.unwrap();
            let returned_at = now_ms();
            // the lease in Redis when acquire returned, read on a direct connection
            let mut direct = redis::Client::open(url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let expiry: Option<f64> = redis::cmd("EVAL")
                .arg(LEASE_OF)
                .arg(2)
                .arg(&own_key)
                .arg(&exp_key)
                .arg(permit.holder_id())
                .query_async(&mut direct)
                .await
                .unwrap();
            (permit, returned_at, expiry.map(|e| e as i64))
        });
        queued_and_told(&server, &keys, &waiter_client).await;

        // the waiter's process hears nothing for longer than the lease: it is granted the
        // permit meanwhile, and the lease it keeps runs out in Redis
        proxy.blackhole(Class::Cmd, true);
        proxy.blackhole(Class::Pubsub, true);
        held.release().await.unwrap();
        tokio::time::sleep(lease + Duration::from_millis(400)).await;
        // the notification arrives first (no script of the waiter has run since: nothing
        // reaped the expired entry yet)
        proxy.blackhole(Class::Pubsub, false);
        tokio::time::sleep(Duration::from_millis(200)).await;
        proxy.blackhole(Class::Cmd, false);
        let (permit, returned_at, expiry) = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the acquire never returned")
            .unwrap();
        match expiry {
            Some(e) => assert!(
                e > returned_at,
                "{flavor}: acquire returned a permit whose lease had ended in Redis {} ms before",
                returned_at - e
            ),
            None => panic!("{flavor}: acquire returned a permit that Redis no longer had"),
        }
        drop(permit);
    }
}

//! Many semaphores through one client: their renewals share calls (the client's renewer and
//! `renew_many.lua`), so what a renewal interval costs Redis in calls does not grow with the
//! number of semaphores; and one semaphore whose renewal fails (a foreign key type, another
//! protocol version, an ACL refusal) fails alone.

mod common;

use std::time::Duration;

use common::*;
use redsem::{LostReason, Permit, Semaphore};

const LEASE: Duration = Duration::from_millis(900);
const RENEW: Duration = Duration::from_millis(300);

/// Opens `names` through `client`, renewed every [`RENEW`], and takes a permit of each.
async fn hold_all(client: &redsem::Client, names: &[String]) -> Vec<(Semaphore, Permit)> {
    let mut out = Vec::new();
    for name in names {
        let sem = client
            .semaphore(name.as_str(), 1)
            .lease(LEASE)
            .renew_every(RENEW)
            .fallback_poll(RENEW)
            .open()
            .await
            .unwrap();
        let permit = sem.acquire().await.unwrap();
        out.push((sem, permit));
    }
    out
}

/// The lease expiry in Redis of the session of `permit`'s holder, minus Redis's time now, ms.
fn lease_left_in_redis(server: &Server, permit: &Permit) -> i64 {
    let name = permit.semaphore();
    let session = session_of(server, name, permit.holder_id());
    let exp = format!("redsem:{{{name}}}:exp");
    let until: i64 = server
        .cmd(&["ZSCORE", &exp, &session])
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    until - (redis_time_us(server) / 1000) as i64
}

/// 200 semaphores, each with a holder and a waiter, through one client, for ten renewal
/// intervals: a few script calls per interval (one handle per call would make 200), every
/// holder keeps its permit and every waiter its place, and no entry expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_renewals_of_200_semaphores_share_a_few_calls_per_interval() {
    for server in servers() {
        let client = client(&server).await;
        let names: Vec<String> = (0..200).map(|i| format!("many-{i}")).collect();
        let held = hold_all(&client, &names).await;
        let waiters: Vec<_> = held
            .iter()
            .map(|(sem, _)| {
                let sem = sem.clone();
                tokio::spawn(async move { sem.acquire().await.map(drop) })
            })
            .collect();
        assert!(
            eventually(Duration::from_secs(10), || names
                .iter()
                .all(|n| card(&server, n, "queue") == 1))
            .await,
            "{}: not every waiter queued",
            server.flavor()
        );
        tokio::time::sleep(RENEW).await;
        let before = script_calls(&server);
        let intervals = 10;
        tokio::time::sleep(RENEW * intervals).await;
        let made = script_calls(&server) - before;
        // the renewals fall due on at most 6 lines of the client's 50 ms grid per interval,
        // a few calls each
        assert!(
            made <= 20 * u64::from(intervals),
            "{}: {made} script calls in {intervals} renewal intervals for 200 semaphores",
            server.flavor()
        );
        for (sem, permit) in &held {
            assert!(
                !permit.is_lost(),
                "{}: {} lost",
                server.flavor(),
                sem.name()
            );
            assert!(lease_left_in_redis(&server, permit) > 0);
        }
        for name in &names {
            assert_eq!(card(&server, name, "queue"), 1, "{name}: its waiter left");
            assert_eq!(card(&server, name, "slots"), 1, "{name}: its holder left");
            let expired = server.cmd(&["HGET", &format!("redsem:{{{name}}}:cfg"), "expired"]);
            assert!(
                matches!(expired.as_str(), None | Some("0")),
                "{name}: entries expired"
            );
        }
        eprintln!(
            "{}: {made} script calls in {intervals} renewal intervals for 200 semaphores",
            server.flavor()
        );
        for w in waiters {
            w.abort();
        }
        drop(held);
        client.shutdown().await;
    }
}

/// Among semaphores renewed together, one whose key holds a foreign type and one written by
/// another protocol version fail their own renewals only: the first's permit is lost at once
/// as overwritten, the second's when its deadline passes (the renewals failed), and they
/// wrote nothing; the others are renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_whose_renewal_fails_fails_alone() {
    for server in servers() {
        let client = client(&server).await;
        let mut names: Vec<String> = (0..10).map(|i| format!("fine-{i}")).collect();
        names.push("foreign-type".into());
        names.push("other-version".into());
        let held = hold_all(&client, &names).await;
        // the session lease key of one holds a string; the other was written by protocol 99
        server.cmd(&["DEL", "redsem:{foreign-type}:exp"]);
        server.cmd(&["SET", "redsem:{foreign-type}:exp", "not a sorted set"]);
        server.cmd(&["HSET", "redsem:{other-version}:cfg", "ver", "99"]);
        // (the release of the other-version permit may change the rest of its keys)
        let cfg = |name: &str| server.cmd(&["HGETALL", &format!("redsem:{{{name}}}:cfg")]);
        let own =
            |name: &str| server.cmd(&["ZRANGE", &format!("redsem:{{{name}}}:own"), "0", "-1"]);
        let untouched = (
            cfg("foreign-type"),
            cfg("other-version"),
            own("other-version"),
        );
        let before = script_calls(&server);
        tokio::time::sleep(LEASE * 3).await;
        let made = script_calls(&server) - before;
        for (sem, permit) in &held {
            let failing = sem.name() == "foreign-type" || sem.name() == "other-version";
            let reason = match sem.name() {
                "foreign-type" => Some(LostReason::Overwritten),
                "other-version" => Some(LostReason::Unreachable),
                _ => None,
            };
            assert_eq!(
                permit.lost_reason(),
                reason,
                "{}: {}",
                server.flavor(),
                sem.name()
            );
            if !failing {
                assert!(lease_left_in_redis(&server, permit) > 0, "{}", sem.name());
            }
        }
        assert_eq!(
            (
                cfg("foreign-type"),
                cfg("other-version"),
                own("other-version")
            ),
            untouched,
            "{}: a failing renewal wrote",
            server.flavor()
        );
        // shared: one call per handle would make 12 per interval (and more with the retries)
        assert!(
            made < 12 * 9,
            "{}: {made} script calls in 9 renewal intervals for 12 semaphores",
            server.flavor()
        );
        // (no shutdown: it would wait for the releases other-version refuses)
        drop((held, client));
    }
}

/// A Redis user that may no longer touch one semaphore's keys: that semaphore's permit is
/// given up as refused (Redis refuses a call naming keys it may not touch, so the renewals
/// that shared it are sent again one by one), the others keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_semaphore_is_given_up_and_the_others_are_renewed() {
    for server in servers() {
        server.cmd(&[
            "ACL",
            "SETUSER",
            "app",
            "on",
            ">pw",
            "~redsem:*",
            "&redsem:*",
            "+@all",
        ]);
        let url = server.url().replace("redis://", "redis://app:pw@");
        let client = redsem::Client::builder(url)
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap();
        let mut names: Vec<String> = (0..6).map(|i| format!("ok-{i}")).collect();
        names.push("refused".into());
        let held = hold_all(&client, &names).await;
        server.cmd(&["ACL", "SETUSER", "app", "resetkeys", "~redsem:{ok-*"]);
        let refused = &held.last().unwrap().1;
        let reason = tokio::time::timeout(LEASE * 2, refused.lost())
            .await
            .expect("the refused semaphore's permit was not given up");
        assert_eq!(reason, LostReason::Refused, "{}", server.flavor());
        tokio::time::sleep(LEASE * 2).await;
        for (sem, permit) in &held[..6] {
            assert!(
                !permit.is_lost(),
                "{}: {} lost",
                server.flavor(),
                sem.name()
            );
            assert!(lease_left_in_redis(&server, permit) > 0, "{}", sem.name());
        }
        // a command the renewal runs refused inside the script: every renewal is refused
        server.cmd(&["ACL", "SETUSER", "app", "-zrangebylex"]);
        for (sem, permit) in &held[..6] {
            let reason = tokio::time::timeout(LEASE * 2, permit.lost())
                .await
                .unwrap_or_else(|_| panic!("{}: {} not given up", server.flavor(), sem.name()));
            assert_eq!(reason, LostReason::Refused, "{}", server.flavor());
        }
        // (no shutdown: it would wait for the releases the user may no longer make)
        drop((held, client));
    }
}

//! A Redis whose `maxmemory-policy` can evict the semaphore's keys is refused at `open`,
//! unless the user accepts the risk (`allow_evicting_policy`).

mod common;

use std::time::Duration;

use common::*;
use redsem::Error;

fn with_policy(flavor: Flavor, policy: &str) -> Server {
    Server::start_with(
        flavor,
        ServerOptions {
            extra_args: vec!["--maxmemory-policy".into(), policy.into()],
            ..Default::default()
        },
    )
}

#[tokio::test]
async fn an_allkeys_policy_is_refused_with_its_name_and_nothing_is_written() {
    for flavor in flavors() {
        for policy in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
            let server = with_policy(flavor, policy);
            let client = client(&server).await;
            let err = client.semaphore("ev", 3).open().await.unwrap_err();
            match &err {
                Error::EvictingPolicy {
                    name, policy: p, ..
                } => {
                    assert_eq!((name.as_str(), p.as_str()), ("ev", policy));
                }
                other => panic!("{flavor} {policy}: {other:?}"),
            }
            let text = err.to_string();
            assert!(text.contains("maxmemory-policy"), "{text}");
            assert!(
                text.contains(policy) && text.contains("noeviction"),
                "{text}"
            );
            assert_eq!(server.cmd(&["DBSIZE"]).as_int(), Some(0), "nothing written");
            // the explicit override
            let sem = client
                .semaphore("ev", 3)
                .allow_evicting_policy(true)
                .open()
                .await
                .unwrap();
            drop(sem.acquire().await.unwrap());
        }
    }
}

#[tokio::test]
async fn a_volatile_policy_is_refused_only_while_a_key_carries_a_ttl() {
    for flavor in flavors() {
        let server = with_policy(flavor, "volatile-lru");
        let client = client(&server).await;
        // redsem's keys carry no TTL: nothing to evict
        let sem = open(&client, "vol", 2, Duration::from_secs(5)).await;
        drop(sem);
        server.cmd(&["PEXPIRE", "redsem:{vol}:cfg", "600000"]);
        let err = client.semaphore("vol", 2).open().await.unwrap_err();
        match &err {
            Error::EvictingPolicy { policy, detail, .. } => {
                assert_eq!(policy, "volatile-lru");
                assert!(detail.contains("redsem:{vol}:cfg"), "{detail}");
            }
            other => panic!("{flavor}: {other:?}"),
        }
        server.cmd(&["PERSIST", "redsem:{vol}:cfg"]);
        client.semaphore("vol", 2).open().await.unwrap();
    }
}

#[tokio::test]
async fn noeviction_and_the_default_policy_are_accepted() {
    for flavor in flavors() {
        let server = with_policy(flavor, "noeviction");
        let client = client(&server).await;
        client.semaphore("ok", 1).open().await.unwrap();
    }
}

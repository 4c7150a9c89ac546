//! Opening a semaphore whose stored limit differs from the code's, or that does not exist:
//! each [`LimitPolicy`], as a rolling deploy meets them.

mod common;

use std::time::Duration;

use common::*;
use redsem::{Error, LimitPolicy};

const LEASE: Duration = Duration::from_secs(5);

async fn open_with(
    client: &redsem::Client,
    name: &str,
    limit: u32,
    policy: LimitPolicy,
) -> Result<redsem::Semaphore, Error> {
    client
        .semaphore(name, limit)
        .limit_policy(policy)
        .open()
        .await
}

fn stored_limit(server: &Server, name: &str) -> Option<i64> {
    let v = server.cmd(&["HGET", &format!("redsem:{{{name}}}:cfg"), "limit"]);
    v.as_str().map(|s| s.parse().unwrap())
}

#[tokio::test]
async fn require_is_the_default_and_refuses_another_limit() {
    for server in servers() {
        let client = client(&server).await;
        let _a = open(&client, "req", 3, LEASE).await;
        for builder in [
            client.semaphore("req", 4),
            client
                .semaphore("req", 4)
                .limit_policy(LimitPolicy::Require),
        ] {
            let r = builder.open().await;
            assert!(
                matches!(
                    r,
                    Err(Error::LimitConflict {
                        requested: 4,
                        stored: 3,
                        ..
                    })
                ),
                "{r:?}"
            );
        }
        assert_eq!(stored_limit(&server, "req"), Some(3));
    }
}

#[tokio::test]
async fn create_or_adopt_creates_with_the_code_limit_or_uses_the_stored_one() {
    for server in servers() {
        let client = client(&server).await;
        let first = open_with(&client, "coa", 3, LimitPolicy::CreateOrAdopt)
            .await
            .unwrap();
        assert_eq!(first.limit(), 3);
        assert_eq!(stored_limit(&server, "coa"), Some(3));
        // a replica of the next version, with limit 5, opens and uses 3
        let newer = open_with(&client, "coa", 5, LimitPolicy::CreateOrAdopt)
            .await
            .unwrap();
        assert_eq!(newer.limit(), 3);
        assert_eq!(stored_limit(&server, "coa"), Some(3));
        // and grants against the stored limit, not its own
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(newer.try_acquire().await.unwrap());
        }
        let r = newer.try_acquire().await;
        assert!(matches!(r, Err(Error::NoPermits { .. })), "{r:?}");
        // an operator's change reaches the adopting handle at a renewal
        first.resize(5).await.unwrap();
        assert!(eventually(Duration::from_secs(10), || newer.limit() == 5).await);
        held.push(newer.try_acquire().await.unwrap());
    }
}

#[tokio::test]
async fn adopt_uses_the_stored_limit_and_never_creates() {
    for server in servers() {
        let client = client(&server).await;
        let r = open_with(&client, "adopt", 7, LimitPolicy::Adopt).await;
        assert!(matches!(r, Err(Error::UnknownSemaphore { .. })), "{r:?}");
        assert_eq!(
            server.cmd(&["DBSIZE"]).as_int(),
            Some(0),
            "nothing may be written"
        );
        let _a = open(&client, "adopt", 2, LEASE).await;
        let sem = open_with(&client, "adopt", 7, LimitPolicy::Adopt)
            .await
            .unwrap();
        assert_eq!(sem.limit(), 2);
        assert_eq!(stored_limit(&server, "adopt"), Some(2));
    }
}

#[tokio::test]
async fn resize_sets_the_stored_limit_to_the_code_one() {
    for server in servers() {
        let client = client(&server).await;
        let old = open(&client, "rs", 2, LEASE).await;
        let _a = old.acquire().await.unwrap();
        let _b = old.acquire().await.unwrap();
        // a waiter of the old version, queued while both permits are held
        let waiting = {
            let old = old.clone();
            tokio::spawn(async move { old.acquire().await })
        };
        assert!(eventually(Duration::from_secs(5), || card(&server, "rs", "queue") == 1).await);
        let new = open_with(&client, "rs", 3, LimitPolicy::Resize)
            .await
            .unwrap();
        assert_eq!(new.limit(), 3);
        assert_eq!(stored_limit(&server, "rs"), Some(3));
        // the grown limit admits the waiter at once
        let granted = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the resize admits the queued waiter")
            .unwrap()
            .unwrap();
        assert_eq!(granted.num_permits(), 1);
        // an absent semaphore is created with the code's limit
        let fresh = open_with(&client, "rs-new", 4, LimitPolicy::Resize)
            .await
            .unwrap();
        assert_eq!(
            (fresh.limit(), stored_limit(&server, "rs-new")),
            (4, Some(4))
        );
    }
}

#[tokio::test]
async fn concurrent_openers_that_adopt_never_fail_and_agree() {
    for server in servers() {
        let client = client(&server).await;
        let opens = (1..=20u32).map(|limit| {
            client
                .semaphore("crowd", limit)
                .limit_policy(LimitPolicy::CreateOrAdopt)
                .open()
        });
        let sems = futures_util::future::join_all(opens).await;
        let stored = stored_limit(&server, "crowd").unwrap() as u32;
        for sem in sems {
            assert_eq!(sem.unwrap().limit(), stored);
        }
    }
}

//! Fencing tokens checked at a protected resource stored in Redis.

mod common;

use std::time::Duration;

use common::*;
use redsem::fencing::FencedStore;

#[tokio::test]
async fn a_stale_holder_is_rejected_once_the_next_holder_of_its_slot_wrote() {
    for server in servers() {
        let client = client(&server).await;
        let sem = client
            .semaphore("fenced", 1)
            .lease(Duration::from_millis(300))
            .open()
            .await
            .unwrap();
        let store = FencedStore::new(&client, "resource:{fenced}:fences");
        let old = sem.acquire().await.unwrap();
        let old_fence = old.fences()[0];
        assert!(
            store
                .write(old_fence, "resource:{fenced}:value", b"old-1")
                .await
                .unwrap()
        );
        // the old holder's lease disappears (as after a long pause); a new holder gets the slot
        let new = sem.force_release(old.holder_id()).await.unwrap();
        assert!(new);
        let next = sem.acquire().await.unwrap();
        let new_fence = next.fences()[0];
        assert_eq!(new_fence.slot, old_fence.slot);
        assert!(new_fence.generation > old_fence.generation);
        assert!(
            store
                .write(new_fence, "resource:{fenced}:value", b"new")
                .await
                .unwrap()
        );
        // the stale holder still believes it holds the slot: its write is refused
        assert!(
            !store
                .write(old_fence, "resource:{fenced}:value", b"old-2")
                .await
                .unwrap()
        );
        assert!(!store.check(old_fence).await.unwrap());
        assert!(store.check(new_fence).await.unwrap());
        assert_eq!(
            server.cmd(&["GET", "resource:{fenced}:value"]).as_str(),
            Some("new")
        );
        drop(old);
    }
}

#[tokio::test]
async fn force_release_advances_the_fence_and_the_holder_learns_it_lost() {
    for server in servers() {
        let client = client(&server).await;
        let sem = client
            .semaphore("evict", 2)
            .renew_every(Duration::from_millis(100))
            .lease(Duration::from_secs(5))
            .open()
            .await
            .unwrap();
        let p = sem.acquire().await.unwrap();
        let fence = p.fences()[0];
        let lost = p.lost();
        assert!(sem.force_release(p.holder_id()).await.unwrap());
        assert!(
            !sem.force_release(p.holder_id()).await.unwrap(),
            "already gone"
        );
        let stored: u64 = server
            .cmd(&["HGET", "redsem:{evict}:fence", &fence.slot.to_string()])
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(stored, fence.generation + 1);
        let reason = tokio::time::timeout(Duration::from_secs(2), lost)
            .await
            .unwrap();
        assert_eq!(reason, redsem::LostReason::NotHolder);
    }
}

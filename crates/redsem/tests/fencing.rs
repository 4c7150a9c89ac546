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

/// What `force_release` promises, as documented in `fencing.rs` and PROTOCOL.md: the evicted
/// holder learns it at its next renewal; a fenced resource refuses it once the slot's next
/// holder (whose token is higher) has used it — not before, since only the semaphore knows
/// of the eviction until then.
#[tokio::test]
async fn force_release_evicts_at_the_next_renewal_and_the_next_holder_fences_the_evicted_out() {
    for server in servers() {
        let client = client(&server).await;
        let sem = client
            .semaphore("evict", 1)
            .renew_every(Duration::from_millis(100))
            .lease(Duration::from_secs(5))
            .open()
            .await
            .unwrap();
        let store = FencedStore::new(&client, "resource:{evict}:fences");
        let p = sem.acquire().await.unwrap();
        let fence = p.fences()[0];
        let lost = p.lost();
        assert!(sem.force_release(p.holder_id()).await.unwrap());
        assert!(
            !sem.force_release(p.holder_id()).await.unwrap(),
            "already gone"
        );
        // nobody newer has used the resource yet: the evicted holder's write still passes
        assert!(
            store
                .write(fence, "resource:{evict}:v", b"evicted")
                .await
                .unwrap()
        );
        let reason = tokio::time::timeout(Duration::from_secs(2), lost)
            .await
            .expect("told at its next renewal");
        assert_eq!(reason, redsem::LostReason::NotHolder);
        // the slot's next holder carries a higher token; once it wrote, the evicted is out
        let next = sem.acquire().await.unwrap();
        assert_eq!(next.fences()[0].slot, fence.slot);
        assert!(next.fences()[0].generation > fence.generation);
        assert!(
            store
                .write(next.fences()[0], "resource:{evict}:v", b"next")
                .await
                .unwrap()
        );
        assert!(
            !store
                .write(fence, "resource:{evict}:v", b"late")
                .await
                .unwrap()
        );
        assert_eq!(
            server.cmd(&["GET", "resource:{evict}:v"]).as_str(),
            Some("next")
        );
    }
}

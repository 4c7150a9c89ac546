//! Deleting a semaphore (`Client::delete_semaphore`): refused while in use unless forced,
//! every key removed, fences never going back across a delete and a re-create.

mod common;

use std::time::Duration;

use common::*;
use redsem::{Error, LostReason};

fn keys_of(server: &Server, name: &str) -> usize {
    match server.cmd(&["KEYS", &format!("redsem:{{{name}}}:*")]) {
        Reply::Array(a) => a.len(),
        other => panic!("KEYS answered {other:?}"),
    }
}

#[tokio::test]
async fn deleting_an_unused_semaphore_removes_every_key() {
    for server in servers() {
        let user = client(&server).await;
        let sem = open(&user, "del-unused", 3, Duration::from_secs(3)).await;
        sem.acquire().await.unwrap().release().await.unwrap();
        drop(sem);
        user.shutdown().await;
        assert!(keys_of(&server, "del-unused") >= 3);
        let admin = client(&server).await;
        assert_eq!(
            admin.delete_semaphore("del-unused", false).await.unwrap(),
            0
        );
        assert_eq!(keys_of(&server, "del-unused"), 0, "{}", server.flavor());
        let e = admin
            .delete_semaphore("del-unused", false)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::UnknownSemaphore { .. }), "{e:?}");
        // it can be re-created with another limit
        let again = open(&admin, "del-unused", 5, Duration::from_secs(3)).await;
        assert_eq!(again.limit(), 5);
    }
}

#[tokio::test]
async fn delete_is_refused_while_held_or_queued_and_forced_evicts() {
    for server in servers() {
        let user = client(&server).await;
        let sem = open(&user, "del-busy", 1, Duration::from_millis(900)).await;
        let held = sem.acquire().await.unwrap();
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(
                &server, "del-busy", "queue"
            ) == 1)
            .await
        );
        let admin = client(&server).await;
        match admin.delete_semaphore("del-busy", false).await {
            Err(e @ Error::InUse { .. }) => {
                let Error::InUse {
                    holders, waiters, ..
                } = &e
                else {
                    unreachable!()
                };
                assert_eq!((*holders, *waiters), (1, 1));
                assert!(e.to_string().contains("--force"), "{e}");
            }
            other => panic!("{}: not refused: {other:?}", server.flavor()),
        }
        assert_eq!(card(&server, "del-busy", "meta"), 2, "nothing touched");
        assert_eq!(admin.delete_semaphore("del-busy", true).await.unwrap(), 2);
        // the holder learns it at its next renewal (every 300 ms)
        let lost = tokio::time::timeout(Duration::from_secs(5), held.lost())
            .await
            .expect("the holder learnt of the forced delete");
        assert_eq!(lost, LostReason::Deleted);
        // the waiter queued again (re-creating the semaphore, as after a data loss) and is
        // granted the slot the holder lost
        let p = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter was granted")
            .unwrap()
            .unwrap();
        drop((held, p));
    }
}

#[tokio::test]
async fn fences_never_go_back_across_a_delete_and_a_recreate() {
    let server = Server::start(Flavor::Redis);
    let admin = client(&server).await;
    let mut last = 0;
    for round in 0..3 {
        let user = client(&server).await;
        let sem = open(&user, "del-fence", 1, Duration::from_secs(3)).await;
        let p = sem.acquire().await.unwrap();
        let g = p.fences()[0].generation;
        assert!(g > last, "round {round}: generation {g} after {last}");
        last = g;
        p.release().await.unwrap();
        user.shutdown().await;
        drop(sem);
        admin.delete_semaphore("del-fence", false).await.unwrap();
        assert_eq!(
            keys_of(&server, "del-fence"),
            0,
            "{:?}",
            server.cmd(&["KEYS", "*"])
        );
    }
}

/// The reproduction: `delete --force` while held. The holder's renewal and its
/// release must not re-create the semaphore (delete.lua leaves a tombstone they find), and
/// the holder learns that its permit is gone because the semaphore was deleted.
#[tokio::test]
async fn a_forced_delete_is_not_undone_by_the_evicted_holders_renewal_and_release() {
    for server in servers() {
        let name = "del-held";
        let user = client(&server).await;
        let sem = user
            .semaphore(name, 2)
            .lease(Duration::from_millis(900))
            .open()
            .await
            .unwrap();
        let held = sem.acquire().await.unwrap();
        let admin = client(&server).await;
        assert_eq!(admin.delete_semaphore(name, true).await.unwrap(), 1);
        let lost = tokio::time::timeout(Duration::from_secs(5), held.lost())
            .await
            .expect("the holder learnt of the forced delete");
        assert_eq!(lost, LostReason::Deleted, "{}", server.flavor());
        let _ = held.release().await; // (the lost permit is released all the same)
        // a few more renewal intervals of the handle (it still has its sessions)
        tokio::time::sleep(Duration::from_millis(1000)).await;
        user.shutdown().await;
        let cfg = format!("redsem:{{{name}}}:cfg");
        assert_eq!(
            server.cmd(&["EXISTS", &cfg]).as_int(),
            Some(0),
            "{}: the semaphore was re-created: {:?}",
            server.flavor(),
            server.cmd(&["KEYS", "*"])
        );
        assert!(admin.list_semaphores().await.unwrap().is_empty());
        // a deliberate use re-creates it, without the tombstone
        let again = open(&admin, name, 3, Duration::from_secs(3)).await;
        assert_eq!(again.limit(), 3);
        let own = format!("redsem:{{{name}}}:own");
        assert_eq!(server.cmd(&["PTTL", &own]).as_int(), Some(-1));
        drop(again.acquire().await.unwrap());
    }
}

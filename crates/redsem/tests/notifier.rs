//! Notifications are an optimisation, not a dependency: lost messages, a killed subscriber
//! connection and a restarted Redis delay waiters by at most the fallback interval.

mod common;

use std::time::{Duration, Instant};

use common::*;

#[tokio::test]
async fn a_grant_whose_notification_was_lost_is_found_by_the_fallback_poll() {
    for server in servers() {
        let client = client(&server).await;
        let fallback = Duration::from_millis(300);
        let sem = client
            .semaphore("lost-msg", 1)
            .fallback_poll(fallback)
            .open()
            .await
            .unwrap();
        let held = sem.acquire().await.unwrap();
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await.unwrap() })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(
                &server, "lost-msg", "queue"
            ) == 1)
            .await
        );
        // point the waiter's notification channel nowhere: its grant message will be lost
        let id = sem.stats().await.unwrap().waiters[0].id.clone();
        let record = server
            .cmd(&["HGET", "redsem:{lost-msg}:meta", &id])
            .as_str()
            .unwrap()
            .to_owned();
        // (its channel id, the record's fourth field: docs/PROTOCOL.md, "Records")
        let suffix = format!("|{}.0|", client.id());
        assert_eq!(record_field(&record, "c"), format!("{}.0", client.id()));
        let rerouted = record.replacen(&suffix, "|nowhere|", 1);
        server.cmd(&["HSET", "redsem:{lost-msg}:meta", &id, &rerouted]);
        let released = Instant::now();
        held.release().await.unwrap();
        let p = tokio::time::timeout(fallback * 10, waiter)
            .await
            .unwrap()
            .unwrap();
        let waited = released.elapsed();
        println!(
            "{}: granted {waited:?} after a release whose notification was lost",
            server.flavor()
        );
        assert!(waited < fallback * 3, "waited {waited:?}");
        drop(p);
    }
}

#[tokio::test]
async fn waiters_keep_being_notified_after_the_subscriber_connection_is_killed() {
    for server in servers() {
        let client = client(&server).await;
        // a long fallback: progress below relies on notifications, not on polling
        let sem = client
            .semaphore("resub", 1)
            .fallback_poll(Duration::from_secs(30))
            .open()
            .await
            .unwrap();
        kill_subscribers(&server);
        // wait for the resubscription
        assert!(
            eventually(Duration::from_secs(5), || {
                server
                    .cmd(&[
                        "PUBSUB",
                        "NUMSUB",
                        &format!("redsem:{{resub}}:c:{}.0", client.id()),
                    ])
                    .as_array()
                    .and_then(|a| a.get(1).and_then(Reply::as_int))
                    == Some(1)
            })
            .await,
            "not re-subscribed"
        );
        let held = sem.acquire().await.unwrap();
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await.unwrap() })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "resub", "queue")
                == 1)
            .await
        );
        let released = Instant::now();
        drop(held);
        let p = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(
            released.elapsed() < Duration::from_secs(1),
            "waited {:?}",
            released.elapsed()
        );
        drop(p);
    }
}

#[tokio::test]
async fn a_redis_restart_with_data_loss_requeues_waiters_and_loses_holders() {
    for mut server in servers() {
        let client = client(&server).await;
        let sem = client
            .semaphore("restart", 1)
            .lease(Duration::from_secs(2))
            .renew_every(Duration::from_millis(200))
            .fallback_poll(Duration::from_millis(200))
            .open()
            .await
            .unwrap();
        let held = sem.acquire().await.unwrap();
        let lost = held.lost();
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        assert!(
            eventually(Duration::from_secs(5), || card(&server, "restart", "queue")
                == 1)
            .await
        );
        server.restart(); // same port, empty data set
        // the holder learns that its slot is gone; the waiter queues again and gets it
        let reason = tokio::time::timeout(Duration::from_secs(5), lost)
            .await
            .unwrap();
        assert!(matches!(
            reason,
            redsem::LostReason::NotHolder | redsem::LostReason::Unreachable
        ));
        let p = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(
            p.fences()[0].generation > held.fences()[0].generation,
            "fences go on rising across the data loss"
        );
        assert_eq!(
            server
                .cmd(&["HGET", "redsem:{restart}:cfg", "limit"])
                .as_str(),
            Some("1")
        );
        drop(held);
        drop(p);
        assert_nothing_left(&server, "restart").await;
    }
}

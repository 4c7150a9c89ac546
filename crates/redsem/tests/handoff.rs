//! Hand-off by id: `Permit::export`, `Semaphore::adopt`, `Semaphore::release_handoff`
//! (a scheduler acquires, a worker renews and releases).

mod common;

use std::time::Duration;

use common::*;
use redsem::{Error, HandoffToken, LostReason};

/// The members of the semaphore's `exp` key (its sessions), without the `#` marker.
fn sessions(server: &Server, name: &str) -> Vec<String> {
    let key = format!("redsem:{{{name}}}:exp");
    match server.cmd(&["ZRANGEBYSCORE", &key, "-inf", "(+inf"]) {
        Reply::Array(m) => m.iter().map(|m| m.as_str().unwrap().to_owned()).collect(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_adopted_permit_keeps_its_slots_and_outlives_its_exporter_and_several_leases() {
    let server = Server::start(Flavor::Redis);
    let lease = Duration::from_millis(600);
    let scheduler = client(&server).await;
    let worker = client(&server).await;
    let sem_s = open(&scheduler, "handoff-keep", 3, lease).await;
    let sem_w = open(&worker, "handoff-keep", 3, lease).await;
    let permit = sem_s.acquire_many(2).await.unwrap();
    let (id, ticket, fences) = (
        permit.holder_id().to_owned(),
        permit.ticket(),
        permit.fences().to_vec(),
    );
    let token = permit.export().await.unwrap();
    let text = token.to_string();
    assert!(text.starts_with("redsem-handoff-1:"), "{text}");
    // detached: in a session of its own, which nobody renews
    assert_eq!(
        session_of(&server, "handoff-keep", &id),
        format!("d.{id}~600")
    );
    // the exporter's client goes away meanwhile: it must not take the permit with it
    scheduler.shutdown().await;

    let token: HandoffToken = text.parse().unwrap();
    let adopted = sem_w.adopt(&token).await.unwrap();
    assert_eq!(adopted.holder_id(), id);
    assert_eq!(adopted.ticket(), ticket);
    assert_eq!(adopted.fences(), &fences[..]);
    assert_eq!(adopted.num_permits(), 2);
    assert_eq!(adopted.lease(), lease);
    assert!(adopted.lease_left() > Duration::ZERO);
    // in the adopter's session now, and the detached session is gone
    let sid = session_of(&server, "handoff-keep", &id);
    assert!(!sid.starts_with("d."), "{sid}");
    assert!(
        sessions(&server, "handoff-keep")
            .iter()
            .all(|s| !s.starts_with("d.")),
        "{:?}",
        sessions(&server, "handoff-keep")
    );

    // held past several leases: the adopter renews it
    tokio::time::sleep(lease * 5).await;
    assert!(!adopted.is_lost(), "{:?}", adopted.lost_reason());
    let st = sem_w.stats().await.unwrap();
    assert_eq!(st.expired_total, 0);
    assert_eq!(st.holders.len(), 1);
    assert_eq!(st.holders[0].id, id);
    assert_eq!(st.holders[0].fences, fences);
    let e = sem_w.try_acquire_many(2).await.unwrap_err();
    assert!(matches!(e, Error::NoPermits { .. }), "{e:?}");

    adopted.release().await.unwrap();
    assert_nothing_left(&server, "handoff-keep").await;
}

#[tokio::test]
async fn a_token_nobody_adopts_frees_its_slot_within_about_one_lease() {
    let server = Server::start(Flavor::Redis);
    let lease = Duration::from_secs(1);
    let a = client(&server).await;
    let b = client(&server).await;
    let sem_a = open(&a, "handoff-orphan", 1, lease).await;
    let sem_b = open(&b, "handoff-orphan", 1, lease).await;
    let token = sem_a.acquire().await.unwrap().export().await.unwrap();
    // still held right after the export
    let e = sem_b.try_acquire().await.unwrap_err();
    assert!(matches!(e, Error::NoPermits { .. }), "{e:?}");
    let started = tokio::time::Instant::now();
    let next = sem_b
        .acquire_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        started.elapsed() < lease * 4,
        "granted after {:?}",
        started.elapsed()
    );
    assert_eq!(sem_b.stats().await.unwrap().expired_total, 1);
    // the expired token can no longer be adopted
    let e = sem_b.adopt(&token).await.unwrap_err();
    assert!(
        matches!(&e, Error::HandoffGone { holder_id, .. } if holder_id == token.holder_id()),
        "{e:?}"
    );
    drop(next);
}

#[tokio::test]
async fn adopting_an_expired_token_fails_with_handoff_gone() {
    let server = Server::start(Flavor::Redis);
    let lease = Duration::from_millis(600);
    let a = client(&server).await;
    let sem = open(&a, "handoff-expired", 2, lease).await;
    let token = sem.acquire().await.unwrap().export().await.unwrap();
    tokio::time::sleep(lease * 3).await;
    let e = sem.adopt(&token).await.unwrap_err();
    assert!(matches!(e, Error::HandoffGone { .. }), "{e:?}");
    assert!(e.to_string().contains("acquire a new permit"), "{e}");
    assert!(!sem.release_handoff(&token).await.unwrap());
    assert_nothing_left(&server, "handoff-expired").await;
}

#[tokio::test]
async fn release_by_token_frees_the_slot_at_once() {
    let server = Server::start(Flavor::Redis);
    // a long lease: only the release can free the slot in time
    let lease = Duration::from_secs(60);
    let a = client(&server).await;
    let b = client(&server).await;
    let sem_a = open(&a, "handoff-release", 1, lease).await;
    let sem_b = open(&b, "handoff-release", 1, lease).await;
    let token = sem_a.acquire().await.unwrap().export().await.unwrap();
    let waiter = tokio::spawn(async move {
        sem_b
            .acquire_timeout(Duration::from_secs(20))
            .await
            .map(|p| p.holder_id().to_owned())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished());
    // released through another client, from the token's text alone
    let c = client(&server).await;
    let sem_c = open(&c, "handoff-release", 1, lease).await;
    let parsed: HandoffToken = token.to_string().parse().unwrap();
    assert!(sem_c.release_handoff(&parsed).await.unwrap());
    let granted = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is granted well before the lease")
        .unwrap()
        .unwrap();
    assert_ne!(granted, token.holder_id());
    // idempotent
    assert!(!sem_c.release_handoff(&parsed).await.unwrap());
    assert_eq!(sem_c.stats().await.unwrap().expired_total, 0);
}

#[tokio::test]
async fn a_token_of_another_semaphore_is_refused() {
    let server = Server::start(Flavor::Redis);
    let lease = Duration::from_secs(5);
    let a = client(&server).await;
    let one = open(&a, "handoff-one", 1, lease).await;
    let other = open(&a, "handoff-other", 1, lease).await;
    let token = one.acquire().await.unwrap().export().await.unwrap();
    let e = other.adopt(&token).await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("handoff-one"), "{e}");
    let e = other.release_handoff(&token).await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    // nothing changed: the right semaphore still adopts it (here, the exporting handle)
    let permit = one.adopt(&token).await.unwrap();
    assert_eq!(permit.holder_id(), token.holder_id());
    // twice in one handle: refused (the two permits would release each other's entry)
    let e = one.adopt(&token).await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(!permit.is_lost());
    let e = "redsem-handoff-1:garbage"
        .parse::<HandoffToken>()
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
}

#[tokio::test]
async fn adopted_twice_the_last_adopter_holds_and_the_first_loses_it() {
    let server = Server::start(Flavor::Redis);
    let lease = Duration::from_millis(900);
    let (a, b, c) = (
        client(&server).await,
        client(&server).await,
        client(&server).await,
    );
    let sem_a = open(&a, "handoff-twice", 1, lease).await;
    let sem_b = open(&b, "handoff-twice", 1, lease).await;
    let sem_c = open(&c, "handoff-twice", 1, lease).await;
    let token = sem_a.acquire().await.unwrap().export().await.unwrap();
    let first = sem_b.adopt(&token).await.unwrap();
    let second = sem_c.adopt(&token).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(5), first.lost())
        .await
        .expect("the first adopter learns it at its next renewal");
    assert_eq!(reason, LostReason::HandedOff);
    assert_eq!(first.lost_reason(), Some(LostReason::HandedOff));
    // the last adopter keeps it, past several leases
    tokio::time::sleep(lease * 3).await;
    assert!(!second.is_lost(), "{:?}", second.lost_reason());
    let st = sem_c.stats().await.unwrap();
    assert_eq!(st.holders.len(), 1);
    assert_eq!(st.expired_total, 0);
    // the loser's drop (and its release) leaves the winner's permit alone
    first.release().await.unwrap();
    tokio::time::sleep(lease).await;
    assert!(!second.is_lost(), "{:?}", second.lost_reason());
    assert_eq!(sem_c.stats().await.unwrap().holders.len(), 1);
    second.release().await.unwrap();
    assert_nothing_left(&server, "handoff-twice").await;
}

#[tokio::test]
async fn set_lease_on_a_permit_adopted_elsewhere_reports_the_hand_off() {
    let server = Server::start(Flavor::Redis);
    // renewals far apart: set_lease runs before the first adopter's next renewal
    let lease = Duration::from_secs(30);
    let (a, b, c) = (
        client(&server).await,
        client(&server).await,
        client(&server).await,
    );
    let sem_a = open(&a, "handoff-set-lease", 1, lease).await;
    let sem_b = open(&b, "handoff-set-lease", 1, lease).await;
    let sem_c = open(&c, "handoff-set-lease", 1, lease).await;
    let token = sem_a.acquire().await.unwrap().export().await.unwrap();
    let mut first = sem_b.adopt(&token).await.unwrap();
    let second = sem_c.adopt(&token).await.unwrap();
    let e = first.set_lease(Duration::from_secs(40)).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::LeaseLost {
                reason: LostReason::HandedOff,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(first.lost_reason(), Some(LostReason::HandedOff));
    drop(first);
    // the entry is still the second adopter's, in its session, with its lease
    tokio::time::sleep(Duration::from_millis(300)).await;
    let st = sem_c.stats().await.unwrap();
    assert_eq!(st.holders.len(), 1, "{:?}", st.holders);
    assert!(st.holders[0].lease_left > Duration::from_secs(25));
    assert!(!second.is_lost());
    second.release().await.unwrap();
    assert_nothing_left(&server, "handoff-set-lease").await;
}

#[tokio::test]
async fn a_token_whose_grant_differs_is_refused_and_the_entry_is_not_kept() {
    let server = Server::start(Flavor::Redis);
    let lease = Duration::from_secs(1);
    let (a, b) = (client(&server).await, client(&server).await);
    let sem_a = open(&a, "handoff-mismatch", 2, lease).await;
    let sem_b = open(&b, "handoff-mismatch", 2, lease).await;
    // the adopter's handle keeps renewing its session (same lease) for a permit of its own:
    // an entry left in that session would never expire
    let own = sem_b.acquire().await.unwrap();
    let token = sem_a.acquire().await.unwrap().export().await.unwrap();
    // the same holder id with another ticket: not the grant Redis has (the script call moved
    // the entry before the adopter could compare: it must give it up again)
    let t = token.ticket();
    let forged: HandoffToken = token
        .to_string()
        .replacen(&format!(":{t}:"), &format!(":{}:", t + 1000), 1)
        .parse()
        .unwrap();
    let e = sem_b.adopt(&forged).await.unwrap_err();
    assert!(matches!(e, Error::HandoffGone { .. }), "{e:?}");
    let started = tokio::time::Instant::now();
    let next = sem_a
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("the token's slot frees within about a lease");
    assert!(started.elapsed() < lease * 5, "{:?}", started.elapsed());
    assert!(!own.is_lost());
    drop(next);
    drop(own);
    assert_nothing_left(&server, "handoff-mismatch").await;
}

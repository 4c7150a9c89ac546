//! Bad input and hostile environments get a clear, typed error, and leave nothing behind.

mod common;

use std::time::{Duration, Instant};

use common::*;
use redsem::Error;

fn dbsize(server: &Server) -> i64 {
    server.cmd(&["DBSIZE"]).as_int().unwrap()
}

#[tokio::test]
async fn invalid_arguments_are_rejected_before_touching_redis() {
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let open = |name: &str, limit: u32| client.semaphore(name, limit);
    let cases: Vec<(&str, redsem::SemaphoreBuilder)> = vec![
        ("limit 0", open("x", 0)),
        ("limit too large", open("x", redsem::MAX_LIMIT + 1)),
        ("empty name", open("", 1)),
        ("long name", open(&"n".repeat(redsem::MAX_NAME_LEN + 1), 1)),
        ("brace in name", open("a{b}", 1)),
        (
            "lease shorter than twice the renewal",
            open("x", 1)
                .lease(Duration::from_secs(1))
                .renew_every(Duration::from_millis(600)),
        ),
        (
            "renewal above a third of the lease",
            open("x", 1)
                .lease(Duration::from_secs(3))
                .renew_every(Duration::from_millis(1001)),
        ),
        ("zero renewal", open("x", 1).renew_every(Duration::ZERO)),
        ("tiny lease", open("x", 1).lease(Duration::from_millis(5))),
        (
            // even with renewals fast enough for it
            "lease below MIN_LEASE",
            open("x", 1)
                .lease(redsem::MIN_LEASE - Duration::from_millis(1))
                .renew_every(Duration::from_millis(10)),
        ),
        ("zero local cap", open("x", 1).local_cap(0)),
        ("long label", open("x", 1).label("l".repeat(201))),
        ("newline in label", open("x", 1).label("two\nlines")),
        ("escape in label", open("x", 1).label("red \x1b[31m")),
        // durations that cannot be represented: a panic or a wrap-around before
        ("huge lease", open("x", 1).lease(Duration::MAX)),
        (
            "lease above MAX_DURATION",
            open("x", 1).lease(redsem::MAX_DURATION + Duration::from_millis(1)),
        ),
        (
            "huge fallback poll",
            open("x", 1).fallback_poll(Duration::MAX),
        ),
    ];
    for (what, builder) in cases {
        match builder.open().await {
            Err(Error::InvalidArgument(msg)) => assert!(!msg.is_empty(), "{what}"),
            other => panic!("{what}: expected InvalidArgument, got {other:?}"),
        }
    }
    assert_eq!(dbsize(&server), 0, "a rejected open wrote to Redis");

    let sem = open("ok", 2).open().await.unwrap();
    let before = dbsize(&server);
    assert!(matches!(
        sem.acquire_many(0).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        sem.acquire_many(3).await,
        Err(Error::TooManyPermits {
            requested: 3,
            limit: 2,
            ..
        })
    ));
    assert!(matches!(
        sem.try_acquire_many(3).await,
        Err(Error::TooManyPermits { .. })
    ));
    assert!(matches!(
        sem.resize(0).await,
        Err(Error::InvalidArgument(_))
    ));
    for timeout in [Duration::MAX, redsem::MAX_DURATION + Duration::from_secs(1)] {
        let r = sem.acquire_timeout(timeout).await;
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
        let r = sem.acquire_many_timeout(2, timeout).await;
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    }
    assert_eq!(dbsize(&server), before);
    assert_eq!(entries(&server, "ok"), [0, 0, 0, 0]);

    // the shortest lease is accepted, for the handle and for one acquisition, not below it
    let short = client
        .semaphore("short-lease", 1)
        .lease(redsem::MIN_LEASE)
        .open()
        .await
        .unwrap();
    let p = short.acquire().await.unwrap();
    p.release().await.unwrap();
    let below = redsem::AcquireOptions::new().lease(redsem::MIN_LEASE - Duration::from_millis(1));
    let r = sem.acquire_with(below).await;
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("MIN_LEASE")),
        "{r:?}"
    );

    // the bound itself is accepted: the longest lease is one that Redis and the clocks carry
    let long = client
        .semaphore("long-lease", 1)
        .lease(redsem::MAX_DURATION)
        .open()
        .await
        .unwrap();
    let p = long.acquire_timeout(redsem::MAX_DURATION).await.unwrap();
    assert!(!p.is_lost());
    p.release().await.unwrap();

    let bad_url = redsem::Client::connect("http://127.0.0.1:1/").await;
    assert!(
        matches!(bad_url, Err(Error::InvalidArgument(_))),
        "{bad_url:?}"
    );
    let bad_prefix = redsem::Client::builder(server.url())
        .prefix("")
        .build()
        .await;
    assert!(matches!(bad_prefix, Err(Error::InvalidArgument(_))));
    for builder in [
        redsem::Client::builder(server.url()).connect_timeout(Duration::MAX),
        redsem::Client::builder(server.url()).response_timeout(Duration::MAX),
        redsem::Client::builder(server.url()).synced_replicas(1, Duration::MAX),
    ] {
        let r = builder.build().await;
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    }
}

#[tokio::test]
async fn opening_with_another_limit_is_a_limit_conflict() {
    for server in servers() {
        let client = client(&server).await;
        let _a = open(&client, "shared", 3, Duration::from_secs(5)).await;
        match client.semaphore("shared", 4).open().await {
            Err(
                e @ Error::LimitConflict {
                    requested: 4,
                    stored: 3,
                    ..
                },
            ) => {
                assert!(e.to_string().contains("limit 3"), "{e}");
            }
            other => panic!("expected LimitConflict, got {other:?}"),
        }
        // the same limit is fine
        let _b = open(&client, "shared", 3, Duration::from_secs(5)).await;
    }
}

#[tokio::test]
async fn a_key_holding_another_type_is_a_wrong_type_error() {
    for server in servers() {
        server.cmd(&["SET", "redsem:{taken}:queue", "not a sorted set"]);
        let client = client(&server).await;
        let err = client.semaphore("taken", 2).open().await.unwrap_err();
        assert!(
            matches!(&err, Error::WrongType { name, .. } if name == "taken"),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("another name or key prefix"),
            "{err}"
        );
        // nothing was created beside the foreign key
        assert_eq!(dbsize(&server), 1, "{}", server.flavor());

        // a key replaced behind an open semaphore's back: the next call says so
        let sem = open(&client, "later", 1, Duration::from_secs(5)).await;
        server.cmd(&["DEL", "redsem:{later}:meta"]);
        server.cmd(&["SET", "redsem:{later}:meta", "x"]);
        let err = sem.acquire().await.unwrap_err();
        assert!(matches!(err, Error::WrongType { .. }), "{err:?}");
    }
}

const KEYS: [&str; 7] = ["cfg", "queue", "exp", "meta", "slots", "free", "own"];

/// A snapshot (`stats`, read-only) of a semaphore one of whose keys holds another type fails
/// with `WrongType`, as the next acquire does, whichever key it is (before, `own` and `free`,
/// which a snapshot does not always read, went unnoticed: `stats` and `list` showed a
/// healthy semaphore that nobody could acquire).
#[tokio::test]
async fn a_snapshot_reports_any_key_overwritten_with_another_type() {
    for server in servers() {
        let client = client(&server).await;
        for key in &KEYS[1..] {
            let name = format!("snap-{key}");
            let sem = open(&client, &name, 2, Duration::from_secs(5)).await;
            drop(sem.acquire().await.unwrap());
            let full = format!("redsem:{{{name}}}:{key}");
            server.cmd(&["DEL", &full]);
            server.cmd(&["SET", &full, "another program's"]);
            let err = sem.stats().await.unwrap_err();
            assert!(
                matches!(&err, Error::WrongType { .. }),
                "{} {key}: {err:?}",
                server.flavor()
            );
            let err = client.inspect(&name).await.unwrap_err();
            assert!(matches!(&err, Error::WrongType { .. }), "{key}: {err:?}");
        }
    }
}

/// Another program's hash at a semaphore's configuration key is "not a redsem semaphore": not
/// misread as protocol version 1 (`limit banana`), not adopted (other fields), and not
/// deleted by a forced delete; only `purge_keys` removes it. A configuration of protocol 1
/// (a numeric limit, no `ver`) is still reported as that version.
#[tokio::test]
async fn a_foreign_hash_at_cfg_is_not_a_semaphore_and_is_left_alone() {
    for server in servers() {
        let client = client(&server).await;
        let cases: [(&str, &[&str]); 3] = [
            ("banana", &["limit", "banana"]),
            ("other-fields", &["owner", "billing", "color", "blue"]),
            ("bad-ver", &["limit", "3", "ver", "x"]),
        ];
        for (name, fields) in cases {
            let key = format!("redsem:{{{name}}}:cfg");
            let mut cmd = vec!["HSET", key.as_str()];
            cmd.extend_from_slice(fields);
            server.cmd(&cmd);
            let before = format!("{:?}", server.cmd(&["HGETALL", &key]));
            let not_ours = |r: Result<(), Error>, what: &str| match r {
                Err(Error::NotASemaphore { detail, .. }) => {
                    assert!(detail.contains(&key), "{name} {what}: {detail}")
                }
                other => panic!("{} {name} {what}: {other:?}", server.flavor()),
            };
            not_ours(client.semaphore(name, 2).open().await.map(drop), "open");
            not_ours(client.inspect(name).await.map(drop), "inspect");
            not_ours(client.resize_existing(name, 4).await.map(drop), "limit");
            not_ours(
                client.delete_semaphore(name, false).await.map(drop),
                "delete",
            );
            not_ours(
                client.delete_semaphore(name, true).await.map(drop),
                "delete --force",
            );
            assert_eq!(
                before,
                format!("{:?}", server.cmd(&["HGETALL", &key])),
                "{} {name}: the foreign hash was changed",
                server.flavor()
            );
            assert_eq!(
                dbsize_of(&server, name),
                1,
                "{name}: nothing was created beside it"
            );
            client.purge_keys(name).await.unwrap();
            assert_eq!(server.cmd(&["EXISTS", &key]).as_int(), Some(0));
        }
        // protocol 1 wrote a numeric limit and no version: still told apart
        server.cmd(&["HSET", "redsem:{v1}:cfg", "limit", "3"]);
        match client.semaphore("v1", 3).open().await {
            Err(Error::ProtocolMismatch { detail, .. }) => {
                assert!(detail.contains("version 1"), "{detail}")
            }
            other => panic!("{}: {other:?}", server.flavor()),
        }
    }
}

/// Keys of the semaphore `name` in the database.
fn dbsize_of(server: &Server, name: &str) -> usize {
    match server.cmd(&["KEYS", &format!("redsem:{{{name}}}:*")]) {
        Reply::Array(a) => a.len(),
        other => panic!("{other:?}"),
    }
}

/// A key replaced by a foreign type behind an open semaphore's back fails the next script
/// before it writes anything: no slot popped, no ticket taken, no entry left half-made, no
/// slot freed. Every key, with an acquisition and with a release.
#[tokio::test]
async fn a_script_that_fails_on_a_foreign_key_writes_nothing() {
    for server in servers() {
        let client = client(&server).await;
        for suffix in KEYS {
            let name = format!("partial-{suffix}");
            let sem = open(&client, &name, 3, Duration::from_secs(5)).await;
            // holders, so that the grant below would touch every key
            let held = sem.acquire().await.unwrap();
            let second = sem.acquire().await.unwrap();
            let key = format!("redsem:{{{name}}}:{suffix}");
            server.cmd(&["DEL", &key]);
            server.cmd(&["SET", &key, "written by another program"]);
            let dump = |k: &str| -> String {
                let k = format!("redsem:{{{name}}}:{k}");
                format!("{:?}", server.cmd(&["DUMP", &k]))
            };
            let dump_all = || -> Vec<String> { KEYS.iter().map(|k| dump(k)).collect() };
            let before = dump_all();
            let err = sem.try_acquire().await.unwrap_err();
            assert!(
                matches!(err, Error::WrongType { .. }),
                "{} {suffix}: {err:?}",
                server.flavor()
            );
            assert_eq!(
                before,
                dump_all(),
                "{} {suffix}: the failed acquire wrote",
                server.flavor()
            );
            second.detach();
            match client.force_release_existing(&name, held.holder_id()).await {
                Err(Error::WrongType { .. }) => assert_eq!(
                    before,
                    dump_all(),
                    "{} {suffix}: the failed release wrote",
                    server.flavor()
                ),
                // a release does not touch the session leases: it may succeed, and leaves
                // the foreign key as it was
                Ok(_) if suffix == "exp" => assert_eq!(dump(suffix), before[2]),
                other => panic!("{} {suffix}: {other:?}", server.flavor()),
            }
            held.detach();
            // a forced delete does not remove another program's data...
            let before = dump_all();
            let err = client.delete_semaphore(&name, true).await.unwrap_err();
            assert!(
                matches!(err, Error::NotASemaphore { .. }),
                "{} {suffix}: {err:?}",
                server.flavor()
            );
            assert_eq!(
                before,
                dump_all(),
                "{} {suffix}: the refused delete deleted",
                server.flavor()
            );
            // ...the operator's explicit way out does, whatever the keys hold
            client.purge_keys(&name).await.unwrap();
            // (`own` then holds only the tombstone of a delete that evicted entries)
            if suffix == "own" {
                assert_eq!(server.cmd(&["ZCARD", &key]).as_int(), Some(1), "{suffix}");
                assert!(server.cmd(&["ZSCORE", &key, "!deleted"]).as_str().is_some());
            } else {
                assert_eq!(server.cmd(&["EXISTS", &key]).as_int(), Some(0), "{suffix}");
            }
        }
    }
}

#[tokio::test]
async fn unreachable_redis_fails_within_the_connect_timeout() {
    let port = test_support::free_port();
    let started = Instant::now();
    let err = redsem::Client::builder(format!("redis://127.0.0.1:{port}/"))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unreachable(_)), "{err:?}");
    assert!(err.is_retryable());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

/// A server that accepts connections and never answers: the whole connect (command and
/// subscriber connections, the client's retries included) gives up after one connect
/// timeout, as documented. Paused time: the clock jumps from timer to timer, so the bound is
/// exact whatever the load of the machine.
#[tokio::test(start_paused = true)]
async fn a_server_that_never_answers_fails_after_one_connect_timeout() {
    // listening (the kernel completes the handshakes) but never accepting nor answering
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let timeout = Duration::from_secs(3);
    let started = tokio::time::Instant::now();
    let err = redsem::Client::builder(format!("redis://{}/", silent.local_addr().unwrap()))
        .connect_timeout(timeout)
        .build()
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, Error::Unreachable(_)), "{err:?}");
    assert!(
        took <= timeout,
        "gave up after {took:?} with a connect timeout of {timeout:?}"
    );
}

#[tokio::test]
async fn wrong_password_is_an_auth_error() {
    let server = Server::start_with(
        Flavor::Redis,
        ServerOptions {
            password: Some("right".into()),
            ..Default::default()
        },
    );
    let url = server.url().replace("redis://", "redis://:wrong@");
    let err = redsem::Client::connect(&url).await.unwrap_err();
    assert!(matches!(err, Error::Auth(_)), "{err:?}");
}

#[tokio::test]
async fn a_user_without_script_permission_gets_a_clear_error() {
    for flavor in flavors() {
        let server = Server::start_with(
            flavor,
            ServerOptions {
                acl_users: vec![
                    // everything but scripts
                    "user noscript on >pw ~redsem:* &redsem:* +@all -@scripting".into(),
                    // scripts, but not the keys of this semaphore
                    "user nokeys on >pw ~other:* &redsem:* +@all".into(),
                ],
                ..Default::default()
            },
        );
        let url = server.url().replace("redis://", "redis://noscript:pw@");
        let client = redsem::Client::connect(&url).await.unwrap();
        let err = client.semaphore("acl", 1).open().await.unwrap_err();
        assert!(matches!(err, Error::NoPermission(_)), "{flavor}: {err:?}");
        assert!(err.to_string().contains("ACL"), "{err}");

        let url = server.url().replace("redis://", "redis://nokeys:pw@");
        let client = redsem::Client::connect(&url).await.unwrap();
        let err = client.semaphore("acl", 1).open().await.unwrap_err();
        assert!(matches!(err, Error::NoPermission(_)), "{flavor}: {err:?}");
        assert_eq!(server.cmd(&["DBSIZE"]).as_int(), Some(0));
    }
}

#[tokio::test(flavor = "current_thread")]
async fn no_background_task_outlives_the_client() {
    let server = Server::start(Flavor::Redis);
    let metrics = tokio::runtime::Handle::current().metrics();
    {
        let client = client(&server).await;
        let sem = open(&client, "tasks", 1, Duration::from_secs(5)).await;
        let held = sem.acquire().await.unwrap();
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire_timeout(Duration::from_millis(200)).await })
        };
        assert!(matches!(waiter.await.unwrap(), Err(Error::Timeout { .. })));
        drop(held);
        assert!(client.semaphore("tasks", 9).open().await.is_err());
        assert!(metrics.num_alive_tasks() > 0);
    }
    assert!(
        eventually(Duration::from_secs(5), || metrics.num_alive_tasks() == 0).await,
        "{} tasks still alive",
        metrics.num_alive_tasks()
    );
    assert_nothing_left(&server, "tasks").await;
}

/// A key overwritten with another program's data while a permit is held: the holder's next
/// renewal finds it and gives the permit up at once as `Overwritten` (not `Unreachable` when
/// its lease runs out: the semaphore's record of its holders can no longer be trusted), and
/// a waiter of the same handle fails with the error its acquisition finds. Every key a
/// renewal reads (all but `free`, which only a grant or a release touches: a holder whose
/// renewals still succeed keeps its permit), and another program's hash at `cfg`.
#[tokio::test]
async fn a_holder_whose_key_is_overwritten_loses_its_permit_at_once() {
    for server in servers() {
        let client = client(&server).await;
        let read = KEYS.iter().filter(|s| **s != "free");
        let cases = read.map(|s| (*s, false)).chain([("cfg", true)]);
        for (suffix, hash) in cases {
            let name = format!("overwritten-{suffix}-{hash}");
            let key = format!("redsem:{{{name}}}:{suffix}");
            let case = format!("{} {key} (hash: {hash})", server.flavor());
            // a lease far longer than the wait below: only the renewal's finding can end it
            let sem = client
                .semaphore(&name, 1)
                .lease(Duration::from_secs(60))
                .renew_every(Duration::from_millis(300))
                .open()
                .await
                .unwrap();
            let permit = sem.acquire().await.unwrap();
            let waiter = tokio::spawn({
                let sem = sem.clone();
                async move { sem.acquire().await.map(drop) }
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            server.cmd(&["DEL", &key]);
            if hash {
                server.cmd(&["HSET", &key, "owner", "billing"]);
            } else {
                server.cmd(&["SET", &key, "written by another program"]);
            }
            let started = Instant::now();
            let reason = tokio::time::timeout(Duration::from_secs(20), permit.lost())
                .await
                .unwrap_or_else(|_| panic!("{case}: still held after 20 s"));
            assert_eq!(reason, redsem::LostReason::Overwritten, "{case}");
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "{case}: lost after {:?}",
                started.elapsed()
            );
            let err = tokio::time::timeout(Duration::from_secs(20), waiter)
                .await
                .unwrap_or_else(|_| panic!("{case}: the waiter still waits"))
                .unwrap()
                .unwrap_err();
            if hash {
                assert!(
                    matches!(err, Error::NotASemaphore { .. }),
                    "{case}: {err:?}"
                );
            } else {
                assert!(matches!(err, Error::WrongType { .. }), "{case}: {err:?}");
            }
            // nothing to release (it would be refused): it succeeds without a word to Redis
            permit.release().await.unwrap();
            client.purge_keys(&name).await.unwrap();
        }
    }
}

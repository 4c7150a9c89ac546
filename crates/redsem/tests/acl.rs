//! The minimal ACL rule for a redsem user (docs/security.md): the library works as exactly
//! that user, every permission in it is needed, and a user lacking one gets
//! `Error::NoPermission` naming what is missing.

use std::time::Duration;

use redsem::{Client, Error};
use test_support::{Cluster, ClusterOptions, Server, ServerOptions, flavors};

/// The rule, as documented (docs/security.md, README "Security"); the test below checks that
/// the documentation shows exactly this.
const RULE: &str = "resetkeys ~redsem:* resetchannels &redsem:* -@all \
+fcall +fcall_ro +function|load +ping +subscribe +unsubscribe +ssubscribe +sunsubscribe \
+time +exists +del +hget +hmget +hset +hdel +hlen +hexists +hgetall +hscan +info +pttl +pexpire \
+zadd +zrem +zcard +zrange +zrangebyscore +zremrangebyscore +zrangebylex +zscore +zpopmin \
+publish +spublish +scan +select +cluster|slots +role +wait";

/// The read-only rule for monitoring (docs/security.md): read access to the keys (`%R~`),
/// read-only functions (`FCALL_RO`) and the read commands they call, and nothing that writes.
const MONITOR_RULE: &str = "resetkeys %R~redsem:* resetchannels -@all \
+fcall_ro +ping +scan +select +time +exists +hmget +hlen +hscan \
+zcard +zrange +zrangebyscore +zrangebylex +zscore +cluster|slots";

/// The rule of the user that installs redsem's Functions library (docs/security.md), for
/// applications whose rule is [`RULE`] without `+function|load`.
const LOADER_RULE: &str = "resetkeys resetchannels -@all +function|load +ping";

/// The rule of applications that may not load the library themselves.
fn strict_rule() -> String {
    rule_without(RULE, "function|load")
}

/// Commands of the rule that only a cluster, Sentinel, synced mode, a dropped handle or the
/// repair of a lost key (`hgetall`) use: the standalone scenario below cannot show that each
/// is needed.
const NOT_IN_SCENARIO: &[&str] = &[
    "hgetall",
    "ssubscribe",
    "sunsubscribe",
    "spublish",
    "cluster|slots",
    "role",
    "wait",
    "unsubscribe",
];

fn commands() -> Vec<&'static str> {
    RULE.split_whitespace()
        .filter_map(|t| t.strip_prefix('+'))
        .collect()
}

/// The rule without `+cmd`.
fn without(cmd: &str) -> String {
    rule_without(RULE, cmd)
}

/// `rule` without `+cmd`.
fn rule_without(rule: &str, cmd: &str) -> String {
    let drop = format!("+{cmd}");
    rule.split_whitespace()
        .filter(|t| *t != drop)
        .collect::<Vec<_>>()
        .join(" ")
}

fn user_line(name: &str, rule: &str) -> String {
    format!("user {name} on >pw {rule}")
}

fn url(server: &Server, user: &str) -> String {
    server
        .url()
        .replace("redis://", &format!("redis://{user}:pw@"))
}

/// [`url`] on database 1: the client then sends SELECT on every connection.
fn url_db1(server: &Server, user: &str) -> String {
    format!("{}1", url(server, user))
}

async fn connect(url: &str) -> Result<Client, Error> {
    Client::builder(url)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .await
}

/// Everything the library does on one server, as `url`'s user; the first error.
async fn scenario(url: &str, name: &str) -> Result<(), Error> {
    let client = connect(url).await?;
    client.ping().await?;
    let sem = client
        .semaphore(name, 2)
        .lease(Duration::from_millis(900))
        .renew_every(Duration::from_millis(100))
        .open()
        .await?;
    let a = sem.acquire().await?;
    let b = sem.try_acquire().await?;
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await; // queued and renewed
    a.release().await?;
    let c = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .map_err(|_| Error::InvalidArgument("the waiter was not granted within 5 s".into()))?
        .unwrap()?;
    let st = sem.stats().await?;
    assert_eq!(st.in_use, 2);
    sem.resize(3).await?;
    sem.resize(1).await?;
    assert!(sem.force_release(c.holder_id()).await?);
    client.inspect(name).await?;
    // (the scenarios of other users may have left theirs)
    assert!(client.list_semaphores().await?.contains(&name.to_owned()));
    client.resize_existing(name, 2).await?;
    client.force_release_existing(name, b.holder_id()).await?;
    drop((b, c, sem)); // the handle ends its session
    client.flush_releases().await;
    // a forced delete while held leaves a tombstone that expires (PEXPIRE)
    let sem = client.semaphore(name, 2).open().await?;
    let held = sem.acquire().await?;
    client.delete_semaphore(name, true).await?;
    drop((held, sem));
    client.flush_releases().await;
    Ok(())
}

#[tokio::test]
async fn the_library_works_as_exactly_the_documented_user() {
    for flavor in flavors() {
        let server = Server::start_with(
            flavor,
            ServerOptions {
                acl_users: vec![user_line("app", RULE)],
                password: Some("admin".into()),
                ..Default::default()
            },
        );
        scenario(&url(&server, "app"), "acl-ok")
            .await
            .unwrap_or_else(|e| panic!("{flavor}: {e}"));
        // a database other than 0
        scenario(&url_db1(&server, "app"), "acl-db1")
            .await
            .unwrap_or_else(|e| panic!("{flavor}, database 1: {e}"));
        assert_eq!(
            server.cmd(&["EXISTS", "redsem:{acl-db1}:cfg"]).as_int(),
            Some(0),
            "{flavor}: not in database 0"
        );
        // synced mode's WAIT (no replica here: it fails for lack of replicas, not of rights)
        let client = Client::builder(url(&server, "app"))
            .synced_replicas(1, Duration::from_millis(50))
            .build()
            .await
            .unwrap();
        let sem = client.semaphore("acl-synced", 1).open().await.unwrap();
        let err = sem.acquire().await.unwrap_err();
        assert!(
            matches!(err, Error::NotReplicated { acked: 0, .. }),
            "{err:?}"
        );
    }
}

#[tokio::test]
async fn every_permission_of_the_rule_is_needed_and_its_absence_is_named() {
    for flavor in flavors() {
        let scenario_commands: Vec<&str> = commands()
            .into_iter()
            .filter(|c| !NOT_IN_SCENARIO.contains(c))
            .collect();
        let users: Vec<String> = scenario_commands
            .iter()
            .enumerate()
            .map(|(i, c)| user_line(&format!("no{i}"), &without(c)))
            .collect();
        let server = Server::start_with(
            flavor,
            ServerOptions {
                acl_users: users,
                password: Some("admin".into()),
                ..Default::default()
            },
        );
        for (i, cmd) in scenario_commands.iter().enumerate() {
            // a library loaded by an earlier user would hide a missing `function|load`
            server.cmd(&["FUNCTION", "FLUSH", "SYNC"]);
            let name = format!("acl-{i}");
            // on database 1, where the client needs SELECT
            let err = match scenario(&url_db1(&server, &format!("no{i}")), &name).await {
                Ok(()) => panic!("{flavor}: a user without {cmd} could do everything"),
                Err(e) => e,
            };
            let text = err.to_string();
            println!("{flavor}: without {cmd}: {text}");
            assert!(
                matches!(err, Error::NoPermission(_)),
                "{flavor}: without {cmd}: {err:?}"
            );
            let named = cmd.to_ascii_uppercase();
            assert!(
                text.to_ascii_uppercase().contains(&named),
                "{flavor}: the error does not name {cmd}: {text}"
            );
            server.cmd(&["FLUSHALL"]);
        }
    }
}

#[tokio::test]
async fn a_user_without_the_key_or_channel_patterns_is_told_which() {
    for flavor in flavors() {
        let server = Server::start_with(
            flavor,
            ServerOptions {
                acl_users: vec![
                    user_line("nokeys", &RULE.replace("~redsem:*", "~other:*")),
                    user_line("nochannels", &RULE.replace("&redsem:*", "&other:*")),
                ],
                ..Default::default()
            },
        );
        let err = scenario(&url(&server, "nokeys"), "k").await.unwrap_err();
        assert!(matches!(err, Error::NoPermission(_)), "{err:?}");
        assert!(err.to_string().contains("redsem:{k}:*"), "{flavor}: {err}");
        let err = scenario(&url(&server, "nochannels"), "c")
            .await
            .unwrap_err();
        assert!(matches!(err, Error::NoPermission(_)), "{err:?}");
        assert!(err.to_string().contains("redsem:{c}:c:"), "{flavor}: {err}");
        println!("{flavor}: {err}");
    }
}

#[tokio::test]
async fn the_rule_works_on_a_cluster_too() {
    let flavor = flavors()[0];
    let cluster = Cluster::start_with(
        flavor,
        ClusterOptions {
            server: ServerOptions {
                acl_users: vec![user_line("app", RULE)],
                password: Some("admin".into()),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let url = cluster
        .url()
        .replace("redis+cluster://", "redis+cluster://app:pw@");
    let client = connect(&url).await.unwrap();
    let sem = client.semaphore("acl-cluster", 1).open().await.unwrap();
    let held = sem.acquire().await.unwrap();
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(held);
    let p = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    drop(p);
    assert_eq!(client.list_semaphores().await.unwrap(), vec!["acl-cluster"]);
}

/// What a monitor does (the CLI's stats, list, watch and exporter): list the semaphores and
/// take snapshots of them; the first error.
async fn monitor(url: &str, name: &str) -> Result<redsem::Stats, Error> {
    let client = connect(url).await?;
    client.ping().await?;
    assert!(client.list_semaphores().await?.contains(&name.to_owned()));
    client.inspect(name).await
}

/// A user allowed only to read the semaphores' keys takes snapshots (stats, list, watch, the
/// exporter) of a semaphore in use, expired entries left out as a reap would (without
/// writing: the keys are read-only to it); it cannot change anything, and every permission of
/// its rule is needed.
#[tokio::test]
async fn a_read_only_user_monitors_and_cannot_write() {
    for flavor in flavors() {
        let monitor_commands: Vec<&str> = MONITOR_RULE
            .split_whitespace()
            .filter_map(|t| t.strip_prefix('+'))
            // (a cluster's, and another database's: not in this scenario)
            .filter(|c| !["cluster|slots", "select"].contains(c))
            .collect();
        let mut users = vec![user_line("app", RULE), user_line("monitor", MONITOR_RULE)];
        for (i, c) in monitor_commands.iter().enumerate() {
            users.push(user_line(&format!("m{i}"), &rule_without(MONITOR_RULE, c)));
        }
        let server = Server::start_with(
            flavor,
            ServerOptions {
                acl_users: users,
                password: Some("admin".into()),
                ..Default::default()
            },
        );
        // in use by the application: a holder, two waiters, and a crashed holder whose
        // session has expired but was not reaped yet
        let app = connect(&url(&server, "app")).await.unwrap();
        let sem = app
            .semaphore("watched", 2)
            .lease(Duration::from_secs(30))
            .open()
            .await
            .unwrap();
        let held = sem.acquire().await.unwrap();
        let crashed = sem
            .acquire_with(redsem::AcquireOptions::new().lease(Duration::from_secs(40)))
            .await
            .unwrap();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let sem = sem.clone();
                tokio::spawn(async move { sem.acquire().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let crashed_id = crashed.holder_id().to_owned();
        std::mem::forget(crashed); // (its handle renews its session: expire it by hand)
        let session = server
            .cmd(&["ZRANGE", "redsem:{watched}:own", "0", "-1"])
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m.as_str())
            .find_map(|m| m.strip_suffix(&format!("|{crashed_id}")).map(str::to_owned))
            .unwrap();
        server.cmd(&["ZADD", "redsem:{watched}:exp", "1", &session]);

        let st = monitor(&url(&server, "monitor"), "watched")
            .await
            .unwrap_or_else(|e| panic!("{flavor}: {e}"));
        assert_eq!(
            (st.limit, st.in_use),
            (2, 1),
            "{flavor}: the expired holder left out"
        );
        assert_eq!((st.holder_count, st.waiter_count), (1, 2), "{flavor}");
        assert_eq!(st.holders.len(), 1);
        assert_eq!(st.holders[0].id, held.holder_id());
        assert_eq!(st.waiters.len(), 2);
        // (and it wrote nothing: its keys are read-only to it, `%R~`)
        // it may not change anything
        let client = connect(&url(&server, "monitor")).await.unwrap();
        for err in [
            client.resize_existing("watched", 3).await.unwrap_err(),
            client
                .force_release_existing("watched", held.holder_id())
                .await
                .unwrap_err(),
            client.semaphore("watched", 2).open().await.unwrap_err(),
        ] {
            assert!(matches!(err, Error::NoPermission(_)), "{flavor}: {err:?}");
        }
        // every permission of its rule is needed, and its absence named
        for (i, cmd) in monitor_commands.iter().enumerate() {
            let err = match monitor(&url(&server, &format!("m{i}")), "watched").await {
                Ok(_) => panic!("{flavor}: a monitor without {cmd} could do everything"),
                Err(e) => e,
            };
            assert!(
                matches!(err, Error::NoPermission(_)),
                "{flavor}: without {cmd}: {err:?}"
            );
            assert!(
                err.to_string()
                    .to_ascii_uppercase()
                    .contains(&cmd.to_ascii_uppercase()),
                "{flavor}: the error does not name {cmd}: {err}"
            );
        }
        drop((held, waiters));
    }
}

#[test]
fn the_documentation_shows_exactly_this_rule() {
    let root = test_support::workspace_root();
    let docs: Vec<String> = ["docs/security.md", "README.md"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(root.join(p)).ok())
        .collect();
    for line in [
        format!("ACL SETUSER redsem-app on >CHANGE-ME {RULE}"),
        format!("ACL SETUSER redsem-monitor on >CHANGE-ME {MONITOR_RULE}"),
        format!("ACL SETUSER redsem-loader on >CHANGE-ME {LOADER_RULE}"),
    ] {
        assert!(
            docs.iter().any(|d| d.contains(&line)),
            "neither docs/security.md nor README.md shows the rule:\n{line}"
        );
    }
}

/// Applications that may not load code: their rule lacks `+function|load`, and a separate
/// user installs the library (`Client::load_library`, the CLI's `load-library`). Until it
/// is installed, they fail with an error that says so; then they call its functions.
#[tokio::test]
async fn a_loader_installs_the_library_for_applications_that_may_not() {
    for flavor in flavors() {
        let server = Server::start_with(
            flavor,
            ServerOptions {
                acl_users: vec![
                    user_line("app", &strict_rule()),
                    user_line("loader", LOADER_RULE),
                ],
                password: Some("admin".into()),
                ..Default::default()
            },
        );
        let err = scenario(&url(&server, "app"), "acl-strict")
            .await
            .unwrap_err();
        assert!(matches!(err, Error::NoPermission(_)), "{flavor}: {err:?}");
        let text = err.to_string();
        assert!(
            text.contains("FUNCTION LOAD") && text.contains("load-library"),
            "{flavor}: {text}"
        );
        let loader = connect(&url(&server, "loader")).await.unwrap();
        let library = loader
            .load_library()
            .await
            .unwrap_or_else(|e| panic!("{flavor}: {e}"));
        assert!(library.starts_with("redsem_"), "{library}");
        server.cmd(&["CONFIG", "RESETSTAT"]);
        scenario(&url(&server, "app"), "acl-strict-2")
            .await
            .unwrap_or_else(|e| panic!("{flavor}: {e}"));
        let info = server.cmd(&["INFO", "commandstats"]);
        let info = info.as_str().unwrap_or_default();
        assert!(info.contains("cmdstat_fcall:"), "{flavor}: {info}");
        // (none run: the EVALSHA of the first client, whose background releases go on
        // after its failure, are refused)
        assert!(
            !info.contains("cmdstat_evalsha:calls=") || info.contains("cmdstat_evalsha:calls=0,"),
            "{flavor}: {info}"
        );
        // the applications' user may not load it
        let app = connect(&url(&server, "app")).await.unwrap();
        let err = app.load_library().await.unwrap_err();
        assert!(matches!(err, Error::NoPermission(_)), "{flavor}: {err:?}");
    }
}

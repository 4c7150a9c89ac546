//! The CLI runs as a user with exactly the documented ACL rule (docs/security.md), and a user
//! lacking a permission gets an error that names it.

mod common;

use std::time::Duration;

use common::*;

/// The rule of docs/security.md (crates/redsem/tests/acl.rs checks that the documentation
/// shows it, and that every permission in it is needed).
const RULE: &str = "resetkeys ~redsem:* resetchannels &redsem:* -@all \
+fcall +fcall_ro +function|load +ping +subscribe +unsubscribe +ssubscribe +sunsubscribe \
+time +exists +del +hget +hmget +hset +hdel +hlen +hexists +hgetall +hscan +info +pttl +pexpire \
+zadd +zrem +zcard +zrange +zrangebyscore +zremrangebyscore +zrangebylex +zscore +zpopmin \
+publish +spublish +scan +select +cluster|slots +role +wait";

/// The read-only rule of docs/security.md, for monitoring.
const MONITOR_RULE: &str = "resetkeys %R~redsem:* resetchannels -@all \
+fcall_ro +ping +scan +select +time +exists +hmget +hlen +hscan \
+zcard +zrange +zrangebyscore +zrangebylex +zscore +cluster|slots";

fn without(cmd: &str) -> String {
    let drop = format!("+{cmd}");
    RULE.split_whitespace()
        .filter(|t| *t != drop)
        .collect::<Vec<_>>()
        .join(" ")
}

fn server() -> Server {
    Server::start_with(
        Flavor::Redis,
        ServerOptions {
            acl_users: vec![
                format!("user app on >pw {RULE}"),
                format!("user monitor on >pw {MONITOR_RULE}"),
                format!("user nopop on >pw {}", without("zpopmin")),
                format!("user noscan on >pw {}", without("scan")),
                format!("user noselect on >pw {}", without("select")),
                format!("user strict on >pw {}", without("function|load")),
                "user loader on >pw resetkeys resetchannels -@all +function|load +ping".into(),
            ],
            password: Some("admin".into()),
            ..Default::default()
        },
    )
}

fn as_user(server: &Server, user: &str) -> std::process::Command {
    redsem_at(
        &server
            .url()
            .replace("redis://", &format!("redis://{user}:pw@")),
    )
}

#[test]
fn every_subcommand_works_as_the_documented_user() {
    let server = server();
    let out =
        run(as_user(&server, "app")
            .args(["run", "acl", "--limit", "2", "--", "sh", "-c", "exit 0"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    for args in [
        vec!["stats", "acl"],
        vec!["stats", "acl", "--json"],
        vec!["list"],
        vec!["limit", "acl", "3"],
        vec!["watch", "acl", "--interval", "100ms", "--iterations", "1"],
    ] {
        let out = run(as_user(&server, "app").args(&args));
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
    }
    let out = run(as_user(&server, "app").args(["release", "acl", "--holder", "nobody"]));
    assert_eq!(code(&out), 125, "an unknown holder: {}", stderr(&out));
    assert_eq!(
        server.cmd(&["HGET", "redsem:{acl}:cfg", "limit"]).as_str(),
        Some("3")
    );
}

/// A user that may only read the keys monitors: `stats`, `list`, `watch` and the exporter
/// work as it, and a change (`limit`) is refused.
#[test]
fn monitoring_works_as_the_read_only_user() {
    let server = server();
    let holder = Background::spawn(
        as_user(&server, "app").args(["run", "mon", "--limit", "1", "--", "sleep", "30"]),
    );
    wait_until(Duration::from_secs(10), "the holder", || {
        let out = run(as_user(&server, "app").args(["stats", "mon", "--json"]));
        code(&out) == 0 && stdout(&out).contains("\"in_use\": 1")
    });
    for args in [
        vec!["stats", "mon"],
        vec!["stats", "mon", "--json"],
        vec!["list"],
        vec!["watch", "mon", "--interval", "100ms", "--iterations", "1"],
    ] {
        let out = run(as_user(&server, "monitor").args(&args));
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        assert!(stdout(&out).contains("mon"), "{args:?}: {}", stdout(&out));
    }
    let out = run(as_user(&server, "monitor").args(["stats", "mon", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        (v["in_use"].as_u64(), v["holder_count"].as_u64()),
        (Some(1), Some(1))
    );
    let (exporter, addr) = spawn_exporter_with(&mut as_user(&server, "monitor"));
    let metrics = http_get(&addr, "/metrics");
    assert!(metrics.contains("redsem_exporter_up 1"), "{metrics}");
    assert!(
        metrics.contains("redsem_semaphore_permits_in_use{semaphore=\"mon\"} 1"),
        "{metrics}"
    );
    drop(exporter);
    let out = run(as_user(&server, "monitor").args(["limit", "mon", "2"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(
        stderr(&out).to_lowercase().contains("permission"),
        "{}",
        stderr(&out)
    );
    drop(holder);
}

/// On a database other than 0 (`redis://user:pw@host/1`: the client sends SELECT), as the
/// documented user: `run` and the operator commands work there, and not in database 0.
#[test]
fn the_documented_user_works_on_another_database() {
    let server = server();
    let db1 = |user: &str| {
        let url = server
            .url()
            .replace("redis://", &format!("redis://{user}:pw@"));
        redsem_at(&format!("{url}1"))
    };
    let out = run(db1("app").args(["run", "db1", "--limit", "2", "--", "sh", "-c", "exit 0"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    for args in [
        vec!["stats", "db1"],
        vec!["list"],
        vec!["limit", "db1", "+1"],
        vec!["watch", "db1", "--interval", "100ms", "--iterations", "1"],
    ] {
        let out = run(db1("app").args(&args));
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
    }
    assert!(stdout(&run(db1("app").args(["list"]))).contains("db1"));
    assert_eq!(
        server.cmd(&["EXISTS", "redsem:{db1}:cfg"]).as_int(),
        Some(0),
        "not in database 0"
    );
    let out = run(db1("noselect").args(["list"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(stderr(&out).contains("'select'"), "{}", stderr(&out));
}

#[test]
fn a_missing_permission_is_named_on_stderr() {
    let server = server();
    let out = run(as_user(&server, "nopop").args(["run", "p", "--limit", "1", "--", "true"]));
    assert_ne!(code(&out), 0);
    let err = stderr(&out);
    assert!(err.contains("ZPOPMIN"), "{err}");
    assert!(err.to_lowercase().contains("permission"), "{err}");

    let out = run(as_user(&server, "noscan").args(["list"]));
    assert_eq!(code(&out), 125);
    let err = stderr(&out);
    assert!(err.contains("scan"), "{err}");
}

/// Applications that may not load code: `load-library`, run as the loader of
/// docs/security.md, installs the library they then call; before that they fail saying so.
#[test]
fn load_library_installs_the_library_for_a_strict_application() {
    let server = server();
    let out = run(as_user(&server, "strict").args(["run", "strict", "--limit", "1", "--", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(stderr(&out).contains("load-library"), "{}", stderr(&out));
    let out = run(as_user(&server, "loader").args(["load-library"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("loaded redsem's Functions library redsem_"),
        "{}",
        stdout(&out)
    );
    let out = run(as_user(&server, "strict").args(["run", "strict", "--limit", "1", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // and one that asks for the scripts gets them where they are allowed
    let out = run(as_user(&server, "strict").args(["--scripts-only", "stats", "strict"]));
    assert_eq!(
        code(&out),
        125,
        "EVALSHA_RO is not in the rule: {}",
        stderr(&out)
    );
}

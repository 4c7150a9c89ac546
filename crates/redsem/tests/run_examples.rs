//! The examples that need only Redis run, against a private server, and say what they
//! should. (`cargo test` builds every example; `fragile_http` needs the `tower` feature.)

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "build the examples first: {}",
        path.display()
    );
    path
}

/// Runs the example against `server`; returns its standard output.
fn run(name: &str, server: &Server) -> String {
    let out = Command::new(example(name))
        .env("REDIS_URL", server.url())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "example {name} failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn gpu_pool_uses_each_device_once_at_a_time() {
    let server = Server::start(Flavor::Redis);
    let out = run("gpu_pool", &server);
    assert_eq!(out.matches("running on cuda:").count(), 6, "{out}");
    assert!(out.contains("devices used: [0, 1]"), "{out}");
}

#[test]
fn fenced_write_rejects_the_stale_writer() {
    let server = Server::start(Flavor::Redis);
    let out = run("fenced_write", &server);
    assert!(
        out.contains("wakes up and writes balance=999: rejected"),
        "{out}"
    );
    assert_eq!(
        server.cmd(&["GET", "{example-ledger}:balance"]).as_str(),
        Some("70")
    );
}

#[test]
fn long_job_outlives_its_lease() {
    let server = Server::start(Flavor::Redis);
    let out = run("long_job", &server);
    assert!(out.contains("step 6/6"), "{out}");
    assert!(out.contains("renewed in the background"), "{out}");
    assert_eq!(
        server
            .cmd(&["HGET", "redsem:{example-nightly-export}:cfg", "expired"])
            .as_str(),
        None,
        "the lease never expired: {out}"
    );
}

#[cfg(feature = "tower")]
#[test]
fn fragile_http_never_overloads_the_api() {
    let server = Server::start(Flavor::Redis);
    let out = run("fragile_http", &server);
    assert_eq!(out.matches("12/12 calls succeeded").count(), 2, "{out}");
    assert!(out.contains(", 0 overloads"), "{out}");
}

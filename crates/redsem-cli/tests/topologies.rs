//! The CLI on a Redis Cluster and through Sentinel: the same URL schemes as the library.

mod common;

use common::*;
use test_support::{Cluster, Sentinels};

#[test]
fn run_list_and_stats_on_a_cluster() {
    let cluster = Cluster::start(Flavor::Redis);
    let url = cluster.url();
    // semaphores whose hash tags put them on different masters
    for name in ["c-1", "c-2", "c-3", "c-4", "c-5"] {
        let out = run(redsem_at(&url).args(["run", name, "--limit", "2", "--", "true"]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
    let out = run(redsem_at(&url).args(["list", "--json"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let listed: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(5), "{listed}");
    let out = run(redsem_at(&url).args(["limit", "c-3", "4"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(redsem_at(&url).args(["stats", "c-3", "--json"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let stats: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(stats["limit"], 4, "{stats}");
}

#[test]
fn run_through_sentinel_before_and_after_a_failover() {
    let set = Sentinels::start(Flavor::Redis);
    let url = set.url();
    let out = run(redsem_at(&url).args(["run", "s", "--limit", "1", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let new = set.failover();
    let out = run(redsem_at(&url).args(["run", "s", "--limit", "1", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        set.data(new)
            .cmd(&["HGET", "redsem:{s}:cfg", "grants"])
            .as_str(),
        Some("2")
    );
}

#[test]
fn tls_files_by_flag_and_by_environment() {
    let certs = test_support::TlsCerts::generate();
    let server = test_support::TlsServer::start(Flavor::Redis, &certs, true);
    let url = server.tls_url();
    let out = run(redsem_at(&url)
        .arg("--tls-ca")
        .arg(&certs.ca)
        .arg("--tls-cert")
        .arg(&certs.client_cert)
        .arg("--tls-key")
        .arg(&certs.client_key)
        .args(["run", "tls", "--limit", "1", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(redsem_at(&url)
        .env("REDSEM_TLS_CA", &certs.ca)
        .env("REDSEM_TLS_CERT", &certs.client_cert)
        .env("REDSEM_TLS_KEY", &certs.client_key)
        .args(["stats", "tls", "--json"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        server.cmd(&["HGET", "redsem:{tls}:cfg", "grants"]).as_str(),
        Some("1")
    );
    // without the client certificate the server refuses, and the message says so
    let out = run(redsem_at(&url)
        .env("REDSEM_TLS_CA", &certs.ca)
        .args(["list"]));
    assert_ne!(code(&out), 0);
    assert!(stderr(&out).contains("Certificate"), "{}", stderr(&out));
}

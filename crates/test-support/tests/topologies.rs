//! The cluster, sentinel and TLS helpers do what they say.

use std::process::Command;

use test_support::{Cluster, Flavor, Reply, Sentinels, TlsCerts, TlsServer, flavors};

#[test]
fn a_cluster_forms_fails_over_and_survives_a_killed_master() {
    for flavor in flavors() {
        let mut cluster = Cluster::start(flavor);
        assert_eq!(cluster.len(), 6);
        assert_eq!(cluster.masters().len(), 3, "{flavor}");
        let key = "redsem:{t}:cfg";
        assert!(cluster.cmd_for_key(key, &["SET", key, "1"]).is_ok());
        let m = cluster.master_for_key(key);
        let r = cluster.replica_of(m).expect("a replica");
        assert_eq!(cluster.failover(m), r, "{flavor}");
        assert_eq!(cluster.master_for_key(key), r);
        // the data followed (it was replicated before the manual failover)
        assert_eq!(cluster.cmd_for_key(key, &["GET", key]).as_str(), Some("1"));
        // and back, by killing the new master
        let again = cluster.kill_master(r);
        assert_eq!(again, m, "{flavor}");
        assert_eq!(cluster.master_for_key(key), m);
        cluster.restart(r);
        assert_eq!(cluster.replica_of(m), Some(r));
    }
}

#[test]
fn sentinels_fail_over_on_request_and_when_the_master_dies() {
    for flavor in flavors() {
        let mut set = Sentinels::start(flavor);
        assert!(set.url().starts_with("redis+sentinel://127.0.0.1:"));
        assert_eq!(set.master(), 0);
        let new = set.failover();
        assert_eq!(new, 1, "{flavor}");
        let again = set.kill_master();
        assert_eq!(again, 0, "{flavor}");
        set.restart(1);
        assert!(
            matches!(set.data(1).cmd(&["ROLE"]), Reply::Array(a) if a[0].as_str() == Some("slave"))
        );
    }
}

#[test]
fn a_tls_server_accepts_a_client_certificate_from_its_ca_only() {
    let certs = TlsCerts::generate();
    let server = TlsServer::start(Flavor::Redis, &certs, true);
    let cli = |cert: &std::path::Path, key: &std::path::Path| {
        Command::new("redis-cli")
            .args(["-p", &server.tls_port().to_string(), "--tls", "--cacert"])
            .arg(&certs.ca)
            .arg("--cert")
            .arg(cert)
            .arg("--key")
            .arg(key)
            .arg("PING")
            .output()
            .unwrap()
    };
    let ok = cli(&certs.client_cert, &certs.client_key);
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "PONG", "{ok:?}");
    let bad = cli(&certs.other_client_cert, &certs.other_client_key);
    assert_ne!(
        String::from_utf8_lossy(&bad.stdout).trim(),
        "PONG",
        "{bad:?}"
    );
    assert_eq!(server.cmd(&["PING"]).as_str(), Some("PONG"));
}

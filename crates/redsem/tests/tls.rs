//! `rediss://` with a private CA and client certificates (generated with rcgen), against a
//! TLS-enabled redis-server. Needs the crate feature `tls` (CI runs with --all-features).
#![cfg(feature = "tls")]

use std::time::{Duration, Instant};

use redsem::{Client, Error};
use test_support::{Flavor, TlsCerts, TlsServer};

fn builder(url: &str) -> redsem::ClientBuilder {
    Client::builder(url)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
}

/// Acquire, queue a waiter, release: the waiter is woken (the subscriber is on TLS too).
async fn exercise(client: &Client, name: &str) {
    let sem = client
        .semaphore(name, 1)
        .fallback_poll(Duration::from_secs(30))
        .open()
        .await
        .unwrap();
    let held = sem.acquire().await.unwrap();
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let p = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    // notified (the fallback poll is 30 s)
    assert!(released.elapsed() < Duration::from_secs(2));
    drop(p);
    client.ping().await.unwrap();
}

#[tokio::test]
async fn a_private_ca_and_a_client_certificate_from_files() {
    // Valkey's wheel build has no TLS: Redis only
    let certs = TlsCerts::generate();
    let server = TlsServer::start(Flavor::Redis, &certs, true);
    let client = builder(&server.tls_url())
        .tls_ca(&certs.ca)
        .tls_cert(&certs.client_cert)
        .tls_key(&certs.client_key)
        .build()
        .await
        .unwrap();
    exercise(&client, "tls-files").await;
    // it really went through the TLS port: the plain port sees the semaphore's keys too
    assert_eq!(
        server
            .cmd(&["HGET", "redsem:{tls-files}:cfg", "grants"])
            .as_str(),
        Some("2")
    );
}

#[tokio::test]
async fn pem_contents_work_like_files_and_client_certificates_may_be_optional() {
    let certs = TlsCerts::generate();
    let read = |p: &std::path::Path| std::fs::read(p).unwrap();
    let server = TlsServer::start(Flavor::Redis, &certs, true);
    let client = builder(&server.tls_url())
        .tls_ca_pem(read(&certs.ca))
        .tls_cert_pem(read(&certs.client_cert))
        .tls_key_pem(read(&certs.client_key))
        .build()
        .await
        .unwrap();
    exercise(&client, "tls-pem").await;

    // a server that does not ask for client certificates: the CA alone is enough
    let optional = TlsServer::start(Flavor::Redis, &certs, false);
    let client = builder(&optional.tls_url())
        .tls_ca(&certs.ca)
        .build()
        .await
        .unwrap();
    exercise(&client, "tls-ca-only").await;
}

#[tokio::test]
async fn untrusted_or_missing_certificates_are_refused() {
    let certs = TlsCerts::generate();
    let server = TlsServer::start(Flavor::Redis, &certs, true);
    let url = server.tls_url();

    // the server's certificate is signed by a CA the client does not trust
    let err = builder(&url)
        .tls_ca(&certs.other_ca)
        .tls_cert(&certs.client_cert)
        .tls_key(&certs.client_key)
        .build()
        .await
        .unwrap_err();
    println!("untrusted server: {err}");
    assert!(err.to_string().contains("certificate"), "{err}");

    // no client certificate, or one the server's CA did not sign
    for (cert, key) in [
        (None, None),
        (
            Some(&certs.other_client_cert),
            Some(&certs.other_client_key),
        ),
    ] {
        let mut b = builder(&url).tls_ca(&certs.ca);
        if let (Some(c), Some(k)) = (cert, key) {
            b = b.tls_cert(c).tls_key(k);
        }
        let started = Instant::now();
        let err = b.build().await.unwrap_err();
        println!("refused client certificate: {err}");
        let text = err.to_string();
        assert!(text.contains("Certificate") || text.contains("CA"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
    // nothing was created
    assert_eq!(server.cmd(&["DBSIZE"]).as_int(), Some(0));
}

#[tokio::test]
async fn tls_options_are_checked_before_connecting() {
    let certs = TlsCerts::generate();
    let cases = [
        // TLS files with a plain URL
        builder("redis://127.0.0.1:1/").tls_ca(&certs.ca),
        // a certificate without its key
        builder("rediss://127.0.0.1:1/")
            .tls_ca(&certs.ca)
            .tls_cert(&certs.client_cert),
        // a file that does not exist
        builder("rediss://127.0.0.1:1/").tls_ca("/nonexistent/ca.pem"),
    ];
    for b in cases {
        let err = b.build().await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        println!("{err}");
    }
}

#[tokio::test]
async fn a_cluster_over_tls() {
    let certs = std::sync::Arc::new(TlsCerts::generate());
    let cluster = test_support::Cluster::start_with(
        Flavor::Redis,
        test_support::ClusterOptions {
            tls: Some(certs.clone()),
            ..Default::default()
        },
    );
    let client = builder(&cluster.tls_url())
        .tls_ca(&certs.ca)
        .tls_cert(&certs.client_cert)
        .tls_key(&certs.client_key)
        .build()
        .await
        .unwrap();
    // semaphores on every shard, woken through sharded pub/sub over TLS
    for name in ["tls-a", "tls-b", "tls-c", "tls-d"] {
        exercise(&client, name).await;
    }
    assert_eq!(client.list_semaphores().await.unwrap().len(), 4);
}

#[tokio::test]
async fn sentinel_over_tls_follows_a_failover() {
    let certs = std::sync::Arc::new(TlsCerts::generate());
    let set = test_support::Sentinels::start_with(
        Flavor::Redis,
        test_support::SentinelOptions {
            tls: Some(certs.clone()),
            ..Default::default()
        },
    );
    let client = builder(&set.tls_url())
        .tls_ca(&certs.ca)
        .tls_cert(&certs.client_cert)
        .tls_key(&certs.client_key)
        .build()
        .await
        .unwrap();
    exercise(&client, "tls-sentinel").await;
    let old = set.master();
    let new = set.failover();
    assert_ne!(old, new);
    // the client follows the new master (over TLS), commands and notifications alike
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout(Duration::from_secs(5), exercise_once(&client)).await {
            Ok(Ok(())) => break,
            other => assert!(Instant::now() < deadline, "{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        set.data(new)
            .cmd(&["HGET", "redsem:{tls-sentinel}:cfg", "limit"])
            .as_str(),
        Some("1")
    );
}

async fn exercise_once(client: &Client) -> Result<(), Error> {
    let sem = client.semaphore("tls-sentinel", 1).open().await?;
    sem.acquire().await?.release().await
}

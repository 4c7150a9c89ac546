//! A connection that cannot work says why, and what to change in the URL: a server that is
//! not Redis, TLS on a plaintext port and the reverse, a password missing or wrong (and
//! `?password=` honoured), a cluster or Sentinel URL on a single server. Real endpoints: a
//! TCP listener that answers like an HTTP server, private Redis / Valkey servers.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use common::*;
use redsem::{Client, Error};

async fn connect(url: &str) -> Result<Client, Error> {
    Client::builder(url)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .await
}

/// A listener that answers every connection like an HTTP server that got a bad request.
fn http_listener() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf);
                let _ = conn.write_all(
                    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            });
        }
    });
    port
}

#[tokio::test]
async fn an_endpoint_that_is_not_redis_is_named_so() {
    let port = http_listener();
    for url in [
        format!("redis://127.0.0.1:{port}/"),
        format!("redis+cluster://127.0.0.1:{port}"),
        format!("redis+sentinel://127.0.0.1:{port}/mymaster"),
    ] {
        let err = connect(&url).await.unwrap_err();
        println!("{url}: {err}");
        assert!(matches!(err, Error::InvalidArgument(_)), "{url}: {err:?}");
        let text = err.to_string();
        assert!(text.contains("is not a Redis server"), "{url}: {text}");
        assert!(text.contains("HTTP/1.1 400 Bad Request"), "{url}: {text}");
        assert!(!text.contains("Parse error"), "{url}: {text}");
    }
}

#[cfg(feature = "tls")]
#[tokio::test]
async fn tls_on_a_plaintext_port_and_plaintext_on_a_tls_port() {
    // Valkey's wheel build has no TLS: Redis only
    let certs = test_support::TlsCerts::generate();
    let server = test_support::TlsServer::start(Flavor::Redis, &certs, false);

    let url = format!("rediss://127.0.0.1:{}/", server.port());
    let err = connect(&url).await.unwrap_err();
    println!("{url}: {err}");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("speaks plaintext Redis, not TLS: use redis://"),
        "{err}"
    );

    let url = format!("redis://127.0.0.1:{}/", server.tls_port());
    let err = connect(&url).await.unwrap_err();
    println!("{url}: {err}");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(
        err.to_string().contains("expects TLS: use rediss://"),
        "{err}"
    );

    // and the right forms work
    connect(&format!("redis://127.0.0.1:{}/", server.port()))
        .await
        .unwrap();
    Client::builder(server.tls_url())
        .tls_ca(&certs.ca)
        .build()
        .await
        .unwrap();
}

/// A refusal no retry can change fails at once, as what it is, whatever the connect timeout:
/// a wrong password is an `Auth` error (not `Unreachable`, which a caller would retry), a
/// database number out of range a `Backend` error that says so; neither waits for retries.
#[tokio::test]
async fn a_refusal_fails_at_once_as_what_it_is_even_with_a_short_connect_timeout() {
    for flavor in flavors() {
        let server = Server::start_with(
            flavor,
            ServerOptions {
                password: Some("right".into()),
                ..Default::default()
            },
        );
        let port = server.port();
        let quick = |url: String| async move {
            let started = std::time::Instant::now();
            let r = Client::builder(&url)
                .connect_timeout(Duration::from_millis(500))
                .build()
                .await;
            (r, started.elapsed())
        };
        let (r, took) = quick(format!("redis://:wrong@127.0.0.1:{port}/")).await;
        let err = r.unwrap_err();
        println!("{flavor}: {err} ({took:?})");
        assert!(matches!(err, Error::Auth(_)), "{flavor}: {err:?}");
        assert!(!err.is_retryable(), "{flavor}: {err:?}");
        let (r, took) = quick(format!("redis://:right@127.0.0.1:{port}/99")).await;
        let err = r.unwrap_err();
        println!("{flavor}: {err} ({took:?})");
        assert!(matches!(err, Error::Backend(_)), "{flavor}: {err:?}");
        assert!(err.to_string().contains("DB index"), "{flavor}: {err}");
    }
}

#[tokio::test]
async fn a_password_protected_server_says_where_the_password_goes() {
    for flavor in flavors() {
        let server = Server::start_with(
            flavor,
            ServerOptions {
                password: Some("right".into()),
                acl_users: vec!["user app on >apppw ~* &* +@all".into()],
                ..Default::default()
            },
        );
        let port = server.port();

        // no password: NOAUTH, in words
        let err = connect(&server.url()).await.unwrap_err();
        println!("{flavor}: {err}");
        assert!(matches!(err, Error::Auth(_)), "{flavor}: {err:?}");
        let text = err.to_string();
        assert!(text.contains("the server needs a password"), "{text}");
        assert!(text.contains("redis://user:password@host:port/"), "{text}");

        // a wrong one
        let err = connect(&format!("redis://:wrong@127.0.0.1:{port}/"))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Auth(_)), "{flavor}: {err:?}");
        assert!(
            err.to_string().contains("password in the URL is wrong"),
            "{err}"
        );

        // ?password= (and ?username=) are honoured
        let client = connect(&format!("redis://127.0.0.1:{port}/?password=right"))
            .await
            .unwrap();
        client.ping().await.unwrap();
        let client = connect(&format!(
            "redis://127.0.0.1:{port}/?username=app&password=apppw"
        ))
        .await
        .unwrap();
        client.semaphore("pw", 1).open().await.unwrap();

        // ... but not given twice, nor misspelt
        for url in [
            format!("redis://:right@127.0.0.1:{port}/?password=right"),
            format!("redis://127.0.0.1:{port}/?pasword=right"),
        ] {
            let err = connect(&url).await.unwrap_err();
            println!("{err}");
            assert!(matches!(err, Error::InvalidArgument(_)), "{url}: {err:?}");
            assert!(!err.to_string().contains("right"), "password shown: {err}");
        }
    }
}

#[tokio::test]
async fn a_cluster_or_sentinel_url_on_a_single_server() {
    for flavor in flavors() {
        let server = Server::start(flavor);
        let port = server.port();

        let err = connect(&format!("redis+cluster://127.0.0.1:{port}"))
            .await
            .unwrap_err();
        println!("{flavor}: {err}");
        assert!(
            matches!(err, Error::InvalidArgument(_)),
            "{flavor}: {err:?}"
        );
        let text = err.to_string();
        assert!(text.contains("not a Redis Cluster node"), "{text}");
        assert!(
            text.contains(&format!("use redis://127.0.0.1:{port}/")),
            "{text}"
        );

        let err = connect(&format!("redis+sentinel://127.0.0.1:{port}/mymaster"))
            .await
            .unwrap_err();
        println!("{flavor}: {err}");
        assert!(
            matches!(err, Error::InvalidArgument(_)),
            "{flavor}: {err:?}"
        );
        let text = err.to_string();
        assert!(text.contains("is not a Sentinel"), "{text}");
        assert!(
            text.contains(&format!("use redis://127.0.0.1:{port}/")),
            "{text}"
        );
    }
}

/// Nothing listening at any sentinel, or at any seed node of a cluster: the error says so, lists
/// the addresses and what to check (it was the bare "Connection refused (os error 111)"), and
/// stays `Unreachable` (retryable: they may be starting).
#[tokio::test]
async fn no_sentinel_or_seed_node_listening_is_named_so() {
    // ports nobody listens on: bound, then closed
    let closed = || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (a, b) = (closed(), closed());
    let cases = [
        (
            format!("redis+sentinel://127.0.0.1:{a},127.0.0.1:{b}/mymaster"),
            "no sentinel accepts connections",
        ),
        (
            format!("redis+cluster://127.0.0.1:{a},127.0.0.1:{b}"),
            "no seed node of the cluster accepts connections",
        ),
    ];
    for (url, says) in cases {
        let err = connect(&url).await.unwrap_err();
        assert!(matches!(err, Error::Unreachable(_)), "{url}: {err:?}");
        let text = err.to_string();
        assert!(text.contains(says), "{url}: {text}");
        assert!(text.contains(&format!("127.0.0.1:{a}")), "{url}: {text}");
    }
}

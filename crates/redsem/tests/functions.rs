//! The protocol as a Redis Functions library (docs/PROTOCOL.md, "The Functions library"):
//! loaded once per server by the first call that finds it missing, called with `FCALL`, and
//! the same code run as scripts where the library cannot be used, by clients that share the
//! semaphores of the others.

mod common;

use std::time::Duration;

use common::*;

/// The names of the redsem libraries loaded on `server`.
fn libraries(server: &Server) -> Vec<String> {
    let Reply::Array(libs) = server.cmd(&["FUNCTION", "LIST"]) else {
        panic!("FUNCTION LIST");
    };
    libs.iter()
        .filter_map(|lib| match lib {
            Reply::Array(fields) => fields
                .chunks(2)
                .find(|kv| kv[0].as_str() == Some("library_name"))
                .and_then(|kv| kv[1].as_str().map(str::to_owned)),
            _ => None,
        })
        .filter(|n| n.starts_with("redsem_"))
        .collect()
}

async fn scripts_client(server: &Server) -> redsem::Client {
    redsem::Client::builder(server.url())
        .scripts_only(true)
        .build()
        .await
        .unwrap()
}

/// Calls run the library's functions; the library is loaded once per server, whatever the
/// number of clients and calls.
#[tokio::test]
async fn the_library_is_loaded_once_and_its_functions_called() {
    for server in servers() {
        assert!(libraries(&server).is_empty());
        server.cmd(&["CONFIG", "RESETSTAT"]);
        for _ in 0..3 {
            let client = client(&server).await;
            let sem = open(&client, "fn-once", 2, Duration::from_secs(10)).await;
            for _ in 0..10 {
                sem.acquire().await.unwrap().release().await.unwrap();
            }
            sem.stats().await.unwrap();
        }
        let f = server.flavor();
        assert_eq!(libraries(&server).len(), 1, "{f}");
        assert_eq!(calls(&server, "function|load"), 1, "{f}");
        assert!(calls(&server, "fcall") >= 63, "{f}"); // open, acquire and release
        assert!(calls(&server, "fcall_ro") >= 3, "{f}"); // stats
        assert_eq!(
            calls(&server, "evalsha") + calls(&server, "evalsha_ro"),
            0,
            "{f}"
        );
    }
}

/// A server that lost its functions (a restart without persistence, `FUNCTION FLUSH`, a
/// failover to a replica that had not received them) gets the library again at the next
/// call, which then succeeds: holders keep their permits.
#[tokio::test]
async fn a_lost_library_is_loaded_again_by_the_next_call() {
    for server in servers() {
        let client = client(&server).await;
        let sem = open(&client, "fn-lost", 1, Duration::from_secs(10)).await;
        let held = sem.acquire().await.unwrap();
        server.cmd(&["FUNCTION", "FLUSH", "SYNC"]);
        assert!(libraries(&server).is_empty());
        // (a try: the first call after the loss, and it answers as before)
        let err = sem.try_acquire().await.unwrap_err();
        assert!(matches!(err, redsem::Error::NoPermits { .. }), "{err:?}");
        assert_eq!(libraries(&server).len(), 1, "{}", server.flavor());
        assert!(!held.is_lost());
        held.release().await.unwrap();
        sem.acquire().await.unwrap().release().await.unwrap();
        assert_eq!(sem.stats().await.unwrap().in_use, 0);
    }
}

/// Clients that run the scripts and clients that call the functions share one semaphore:
/// the same keys, the same code. The limit holds across both, and a waiter of one is served
/// by a release of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_the_library_and_of_the_scripts_share_a_semaphore() {
    for server in servers() {
        server.cmd(&["CONFIG", "RESETSTAT"]);
        let functions = client(&server).await;
        let scripts = scripts_client(&server).await;
        let a = open(&functions, "fn-mixed", 2, Duration::from_secs(10)).await;
        let b = open(&scripts, "fn-mixed", 2, Duration::from_secs(10)).await;
        let held = [a.acquire().await.unwrap(), b.acquire().await.unwrap()];
        assert!(a.try_acquire().await.is_err() && b.try_acquire().await.is_err());
        let waiting = {
            let b = b.clone();
            tokio::spawn(async move { b.acquire().await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished());
        let [first, second] = held;
        first.release().await.unwrap();
        let granted = tokio::time::timeout(Duration::from_secs(3), waiting)
            .await
            .expect("the scripts' waiter is served by the functions' release")
            .unwrap();
        assert_eq!(a.stats().await.unwrap().in_use, 2);
        drop((granted, second));
        let f = server.flavor();
        assert!(calls(&server, "fcall") > 0, "{f}");
        assert!(calls(&server, "evalsha") > 0, "{f}");
    }
}

/// Where the server has no Functions (here: `FUNCTION` renamed away, as on Redis before 7.0
/// or a service that blocks it), a client runs the scripts by itself and works.
#[tokio::test]
async fn a_server_without_functions_gets_the_scripts() {
    for flavor in flavors() {
        let server = Server::start_with(
            flavor,
            ServerOptions {
                extra_args: vec![
                    "--rename-command".into(),
                    "FUNCTION".into(),
                    "FUNCTION_HIDDEN_BY_TEST".into(),
                ],
                ..Default::default()
            },
        );
        let client = client(&server).await;
        let sem = open(&client, "fn-none", 1, Duration::from_secs(10)).await;
        for _ in 0..5 {
            sem.acquire().await.unwrap().release().await.unwrap();
        }
        assert!(sem.stats().await.unwrap().in_use == 0);
        assert!(calls(&server, "evalsha") >= 10, "{flavor}");
        assert!(calls(&server, "evalsha_ro") >= 1, "{flavor}");
    }
}

/// The library's name and functions carry a hash of its text: another version's library
/// (here a stand-in with the same layout of names) lives beside this one, and neither
/// replaces nor disturbs the other.
#[tokio::test]
async fn libraries_of_two_versions_live_side_by_side() {
    for server in servers() {
        let other = "#!lua name=redsem_000000000000\n\
            redis.register_function('redsem_000000000000_acquire', function() return 'old' end)";
        server.cmd(&["FUNCTION", "LOAD", other]);
        let client = client(&server).await;
        let sem = open(&client, "fn-versions", 1, Duration::from_secs(10)).await;
        sem.acquire().await.unwrap().release().await.unwrap();
        let mut libs = libraries(&server);
        libs.sort();
        assert_eq!(libs.len(), 2, "{libs:?}");
        assert_eq!(libs[0], "redsem_000000000000");
        assert_eq!(
            server
                .cmd(&["FCALL", "redsem_000000000000_acquire", "0"])
                .as_str(),
            Some("old")
        );
        // the loader's call names this version's library
        assert_eq!(client.load_library().await.unwrap(), libs[1]);
    }
}

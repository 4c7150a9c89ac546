//! A client of a fragile HTTP API, limited across processes (feature `tower`).
//!
//! The API falls over (answers 503) when more than 3 calls run at once. Two worker
//! processes call it concurrently; each wraps its HTTP client in
//! [`redsem::tower::ConcurrencyLimitLayer`] over one shared semaphore of limit 3, so together
//! they never send a fourth concurrent call, and callers are served in FIFO order.
//!
//! This process plays the API (a tiny axum server) and starts the workers (itself, with the
//! argument `worker`). Run with a Redis at REDIS_URL (default redis://127.0.0.1:6379/):
//! `cargo run -p redsem --features tower --example fragile_http`
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use http_body_util::Empty;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use redsem::tower::{BoxError, ConcurrencyLimitLayer};
use tower::{ServiceBuilder, ServiceExt};

/// What the API survives.
const API_LIMIT: usize = 3;
const WORKERS: usize = 2;
const CALLS_PER_WORKER: usize = 12;

#[derive(Clone, Default)]
struct Api {
    inside: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    overloads: Arc<AtomicUsize>,
}

async fn report(State(api): State<Api>) -> (StatusCode, &'static str) {
    let now = api.inside.fetch_add(1, Ordering::SeqCst) + 1;
    api.peak.fetch_max(now, Ordering::SeqCst);
    let reply = if now > API_LIMIT {
        api.overloads.fetch_add(1, Ordering::SeqCst);
        (StatusCode::SERVICE_UNAVAILABLE, "overloaded")
    } else {
        tokio::time::sleep(Duration::from_millis(40)).await; // slow, as fragile APIs are
        (StatusCode::OK, "report")
    };
    api.inside.fetch_sub(1, Ordering::SeqCst);
    reply
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        return worker(&url, &args[2], &args[3]).await;
    }

    // The fragile API.
    let api = Api::default();
    let app = axum::Router::new()
        .route("/report", get(report))
        .with_state(api.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    // The workers: separate processes sharing one semaphore through Redis.
    let mut children = Vec::new();
    for w in 0..WORKERS {
        children.push(
            tokio::process::Command::new(std::env::current_exe()?)
                .args(["worker", &w.to_string(), &format!("http://{addr}/report")])
                .env("REDIS_URL", &url)
                .spawn()?,
        );
    }
    for mut child in children {
        let status = child.wait().await?;
        assert!(status.success(), "a worker failed: {status}");
    }
    let (peak, overloads) = (
        api.peak.load(Ordering::SeqCst),
        api.overloads.load(Ordering::SeqCst),
    );
    println!("api: at most {peak} calls at once, {overloads} overloads");
    assert!(peak <= API_LIMIT && overloads == 0);
    Ok(())
}

async fn worker(redis_url: &str, name: &str, api_url: &str) -> Result<(), BoxError> {
    let client = redsem::Client::connect(redis_url).await?;
    let sem = client
        .semaphore("example-fragile-api", API_LIMIT as u32)
        .lease(Duration::from_secs(5))
        .open()
        .await?;
    // The HTTP client, behind the limit shared with every other worker.
    let http = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::new(sem).acquire_timeout(Duration::from_secs(30)))
        .service(HttpClient::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>());
    let mut calls = Vec::new();
    for _ in 0..CALLS_PER_WORKER {
        let request = Request::get(api_url).body(Empty::new())?;
        calls.push(tokio::spawn(http.clone().oneshot(request)));
    }
    let mut ok = 0;
    for call in calls {
        if call.await??.status() == StatusCode::OK {
            ok += 1;
        }
    }
    println!("worker {name}: {ok}/{CALLS_PER_WORKER} calls succeeded");
    client.shutdown().await; // every release done before the worker exits
    Ok(())
}

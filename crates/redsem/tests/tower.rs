//! The tower middleware (feature `tower`): a real axum server on both sides of one semaphore,
//! and a client-side stack around hyper's client.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::error_handling::HandleErrorLayer;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::{Router, extract::State};
use common::*;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use redsem::tower::{BoxError, ConcurrencyLimitLayer};
use tower::{ServiceBuilder, ServiceExt};

/// Requests in flight at the "fragile" resource, and the most seen at once.
#[derive(Clone, Default)]
struct Gauge {
    inside: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    done: Arc<AtomicUsize>,
}

impl Gauge {
    async fn hold(&self, d: Duration) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(d).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
        self.done.fetch_add(1, Ordering::SeqCst);
    }
}

/// Serves `app` on a loopback port.
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// One replica: `/work` holds the resource for `hold`, behind the distributed limit.
fn replica(sem: redsem::Semaphore, gauge: Gauge, hold: Duration) -> Router {
    Router::new()
        .route(
            "/work",
            get(move |State(g): State<Gauge>| async move {
                g.hold(hold).await;
                "done"
            }),
        )
        .with_state(gauge)
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|err: BoxError| async move {
                    let status = match err.downcast_ref::<redsem::Error>() {
                        Some(redsem::Error::Timeout { .. } | redsem::Error::NoPermits { .. }) => {
                            StatusCode::TOO_MANY_REQUESTS
                        }
                        _ => StatusCode::SERVICE_UNAVAILABLE,
                    };
                    (status, err.to_string())
                }))
                .layer(ConcurrencyLimitLayer::new(sem)),
        )
}

fn http_client() -> HttpClient<HttpConnector, Empty<Bytes>> {
    HttpClient::builder(TokioExecutor::new()).build_http()
}

async fn get_text(
    http: &HttpClient<HttpConnector, Empty<Bytes>>,
    url: String,
) -> (StatusCode, String) {
    let res = http.get(url.parse().unwrap()).await.unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_replicas_never_exceed_the_shared_limit() {
    let server = Server::start(Flavor::Redis);
    let gauge = Gauge::default();
    let mut addrs = Vec::new();
    let mut sems = Vec::new();
    // Two replicas, each with its own client (own connections, own channel), one semaphore.
    for _ in 0..2 {
        let client = client(&server).await;
        let sem = open(&client, "api", 2, Duration::from_secs(5)).await;
        addrs.push(
            serve(replica(
                sem.clone(),
                gauge.clone(),
                Duration::from_millis(40),
            ))
            .await,
        );
        sems.push(sem);
    }
    let http = http_client();
    let mut calls = Vec::new();
    for i in 0..16 {
        let url = format!("http://{}/work", addrs[i % 2]);
        let http = http.clone();
        calls.push(tokio::spawn(async move { get_text(&http, url).await }));
    }
    for c in calls {
        let (status, body) = c.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert_eq!(gauge.done.load(Ordering::SeqCst), 16);
    assert_eq!(
        gauge.peak.load(Ordering::SeqCst),
        2,
        "the limit of 2 is shared by both replicas, and reached"
    );
    // A permit is given back as its response completes, in the background: the client may
    // read the response first, so the release is waited for (up to 5 s) before the count.
    assert_nothing_left(&server, "api").await;
    let stats = sems[0].stats().await.unwrap();
    assert_eq!(stats.grants_total, 16);
    assert_eq!(stats.in_use, 0, "every permit released with its response");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_slot_fails_the_request_with_a_clear_error() {
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "lossy", 1, Duration::from_millis(600)).await;
    let finished = Arc::new(AtomicBool::new(false));
    let app = {
        let finished = finished.clone();
        Router::new()
            .route(
                "/slow",
                get(move || async move {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    finished.store(true, Ordering::SeqCst);
                    "finished"
                }),
            )
            .layer(
                ServiceBuilder::new()
                    .layer(HandleErrorLayer::new(|err: BoxError| async move {
                        let lost = matches!(
                            err.downcast_ref::<redsem::Error>(),
                            Some(redsem::Error::LeaseLost { .. })
                        );
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("lost={lost}: {err}"),
                        )
                    }))
                    .layer(ConcurrencyLimitLayer::new(sem.clone())),
            )
    };
    let addr = serve(app).await;
    let request =
        tokio::spawn(async move { get_text(&http_client(), format!("http://{addr}/slow")).await });
    // The request holds the slot; an operator evicts its holder.
    assert!(
        eventually(Duration::from_secs(5), || card(&server, "lossy", "slots")
            == 1)
        .await
    );
    let holder = sem.stats().await.unwrap().holders[0].id.clone();
    assert!(sem.force_release(&holder).await.unwrap());
    let started = tokio::time::Instant::now();
    let (status, body) = request.await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body.starts_with("lost=true: semaphore \"lossy\": the slot was lost"),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the loss is noticed within a renewal interval, not when the handler ends"
    );
    assert!(
        !finished.load(Ordering::SeqCst),
        "the handler was cancelled"
    );
}

/// A "fragile" HTTP API that counts how many calls it serves at once.
async fn fragile_api(gauge: Gauge) -> SocketAddr {
    let app = Router::new()
        .route(
            "/call",
            get(|State(g): State<Gauge>| async move {
                g.hold(Duration::from_millis(30)).await;
                "ok"
            }),
        )
        .route(
            "/hang",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        )
        .with_state(gauge);
    serve(app).await
}

fn request(url: String) -> Request<Empty<Bytes>> {
    Request::get(url).body(Empty::new()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stack_limits_calls_to_an_api() {
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "outgoing", 2, Duration::from_secs(5)).await;
    let gauge = Gauge::default();
    let api = fragile_api(gauge.clone()).await;
    let stack = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::new(sem.clone()))
        .service(http_client());
    let mut calls = Vec::new();
    for _ in 0..12 {
        let stack = stack.clone();
        let url = format!("http://{api}/call");
        calls.push(tokio::spawn(async move {
            let res = stack.oneshot(request(url)).await.unwrap();
            res.status()
        }));
    }
    for c in calls {
        assert_eq!(c.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(gauge.peak.load(Ordering::SeqCst), 2);
    assert_eq!(sem.stats().await.unwrap().grants_total, 12);

    // Readiness takes no permit: a readied, idle service holds nothing in Redis (once the
    // releases of the calls' permits, dropped in the background, are done).
    client.flush_releases().await;
    let mut idle = stack.clone();
    idle.ready().await.unwrap();
    assert_eq!(card(&server, "outgoing", "slots"), 0);
    drop(idle);

    // The inner service's errors pass through, boxed, and are not redsem errors.
    let closed = test_support::free_port();
    let err = stack
        .clone()
        .oneshot(request(format!("http://127.0.0.1:{closed}/call")))
        .await
        .unwrap_err();
    assert!(err.downcast_ref::<redsem::Error>().is_none(), "{err}");
    assert_nothing_left(&server, "outgoing").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_timeout_and_dropped_futures_leave_nothing_behind() {
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "bounded", 1, Duration::from_secs(5)).await;
    let api = fragile_api(Gauge::default()).await;
    let patient = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::new(sem.clone()).acquire_timeout(Duration::from_millis(200)))
        .service(http_client());
    let shedding = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::new(sem.clone()).acquire_timeout(Duration::ZERO))
        .service(http_client());

    let held = sem.acquire().await.unwrap();
    let err = patient
        .clone()
        .oneshot(request(format!("http://{api}/call")))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<redsem::Error>(),
            Some(redsem::Error::Timeout { .. })
        ),
        "{err}"
    );
    let err = shedding
        .clone()
        .oneshot(request(format!("http://{api}/call")))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<redsem::Error>(),
            Some(redsem::Error::NoPermits { .. })
        ),
        "{err}"
    );
    assert!(
        eventually(Duration::from_secs(5), || card(&server, "bounded", "queue")
            == 0)
        .await,
        "the timed-out request left the queue"
    );
    held.release().await.unwrap();

    // A response future dropped mid-request (a caller that gives up) releases its permit.
    let call = patient
        .clone()
        .oneshot(request(format!("http://{api}/hang")));
    let call = tokio::spawn(call);
    assert!(
        eventually(Duration::from_secs(5), || card(&server, "bounded", "slots")
            == 1)
        .await
    );
    call.abort();
    assert_nothing_left(&server, "bounded").await;
    // ...and the next request gets the permit.
    let res = shedding
        .oneshot(request(format!("http://{api}/call")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn weighted_requests_take_several_permits() {
    let server = Server::start(Flavor::Redis);
    let client = client(&server).await;
    let sem = open(&client, "weighted", 3, Duration::from_secs(5)).await;
    let seen = Arc::new(AtomicUsize::new(0));
    let svc = {
        let seen = seen.clone();
        tower::service_fn(move |_: ()| {
            let seen = seen.clone();
            async move {
                seen.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Infallible>(())
            }
        })
    };
    let heavy = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::new(sem.clone()).permits_per_request(3))
        .service(svc.clone());
    heavy.clone().oneshot(()).await.unwrap();
    let too_heavy = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::new(sem.clone()).permits_per_request(4))
        .service(svc);
    let err = too_heavy.oneshot(()).await.unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<redsem::Error>(),
            Some(redsem::Error::TooManyPermits {
                requested: 4,
                limit: 3,
                ..
            })
        ),
        "{err}"
    );
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    assert_nothing_left(&server, "weighted").await;
}

//! A [tower] middleware that limits in-flight requests across every replica (feature `tower`).
//!
//! [`ConcurrencyLimitLayer`] wraps any [`Service`] (an axum router, a hyper or reqwest client
//! stack, a tonic channel) so that each request holds a permit of one shared [`Semaphore`]
//! while it runs: with a limit of 8, at most 8 requests are in flight *among all the
//! processes* that use the semaphore, and they are admitted in FIFO order.
//!
//! - The permit is acquired in [`call`](Service::call), not in
//!   [`poll_ready`](Service::poll_ready): a service that is readied but never called (a
//!   load balancer probing several, a server waiting for its next connection) holds no lease
//!   in Redis. `poll_ready` only asks the inner service.
//! - The permit is released when the response future completes, fails, or is dropped
//!   (a client that gives up, a timeout layer outside this one).
//! - If the permit's lease is lost while the request runs (Redis unreachable past the lease,
//!   an operator's force-release), the inner future is dropped and the response future fails
//!   with [`Error::LeaseLost`]: the request does not go on unprotected.
//! - An optional acquire timeout bounds the wait; `Duration::ZERO` means "only if a permit is
//!   free now" ([`Semaphore::try_acquire_many`]), a load-shedding mode.
//!
//! The service's error type is [`BoxError`]. Errors of this layer are a boxed [`Error`]
//! ([`Error::Timeout`], [`Error::NoPermits`], [`Error::LeaseLost`], [`Error::Unreachable`],
//! ...); errors of the inner service are passed through, boxed. Tell them apart with
//! `err.downcast_ref::<redsem::Error>()`.
//!
//! # Differences from `tower::limit::ConcurrencyLimit`
//!
//! tower's in-process limit reserves its permit in `poll_ready` (backpressure): callers
//! wait before they call. Reserving a *distributed* permit that way would hold a Redis lease
//! while the service sits idle, starving the other replicas, so this layer waits inside the
//! response future instead. It therefore never makes `poll_ready` return `Pending`;
//! combine it with an acquire timeout (or `tower::load_shed` around a zero timeout) to bound
//! how long requests queue.
//!
//! For HTTP servers: the permit covers the handler until the response *head* is produced. A
//! streaming body is sent after the permit is released.
//!
//! # Example: an axum server limited across replicas
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use axum::{Router, error_handling::HandleErrorLayer, http::StatusCode, routing::get};
//! use redsem::tower::{BoxError, ConcurrencyLimitLayer};
//! use tower::ServiceBuilder;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = redsem::Client::connect("redis://127.0.0.1:6379/").await?;
//! let sem = client.semaphore("report-renderer", 4).open().await?;
//!
//! let app = Router::new().route("/render", get(|| async { "rendered" })).layer(
//!     ServiceBuilder::new()
//!         // axum needs infallible services: turn this layer's errors into responses
//!         .layer(HandleErrorLayer::new(|err: BoxError| async move {
//!             match err.downcast_ref::<redsem::Error>() {
//!                 Some(redsem::Error::Timeout { .. }) => {
//!                     (StatusCode::SERVICE_UNAVAILABLE, "busy, retry later".to_owned())
//!                 }
//!                 _ => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
//!             }
//!         }))
//!         .layer(ConcurrencyLimitLayer::new(sem).acquire_timeout(Duration::from_secs(2))),
//! );
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:3000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Example: a client stack
//!
//! ```no_run
//! use redsem::tower::ConcurrencyLimitLayer;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # async fn example(sem: redsem::Semaphore) -> Result<(), redsem::tower::BoxError> {
//! // Any `Service` works; here a stand-in for an HTTP client call.
//! let fragile_api = tower::service_fn(|order: u64| async move {
//!     Ok::<_, std::convert::Infallible>(format!("order {order} shipped"))
//! });
//! let client = ServiceBuilder::new()
//!     .layer(ConcurrencyLimitLayer::new(sem))
//!     .service(fragile_api);
//! let reply = client.oneshot(42).await?;
//! # Ok(())
//! # }
//! ```
//!
//! [tower]: https://docs.rs/tower

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

pub use tower_layer::Layer;
pub use tower_service::Service;

use crate::error::Error;
use crate::permit::Permit;
use crate::semaphore::Semaphore;

/// The error type of [`ConcurrencyLimit`], as in tower: a boxed error that is either a
/// [`redsem::Error`](Error) from the limit or the inner service's error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Applies [`ConcurrencyLimit`] to a service: every request holds permits of one shared
/// [`Semaphore`] while it runs. See the [module documentation](self).
#[derive(Clone, Debug)]
#[must_use]
pub struct ConcurrencyLimitLayer {
    semaphore: Semaphore,
    permits: u32,
    acquire_timeout: Option<Duration>,
}

impl ConcurrencyLimitLayer {
    /// One permit of `semaphore` per request, waiting as long as it takes.
    pub fn new(semaphore: Semaphore) -> ConcurrencyLimitLayer {
        ConcurrencyLimitLayer {
            semaphore,
            permits: 1,
            acquire_timeout: None,
        }
    }

    /// Permits each request holds (default 1), e.g. to weigh expensive endpoints more.
    /// A request whose weight exceeds the semaphore's limit fails with
    /// [`Error::TooManyPermits`]; 0 fails with [`Error::InvalidArgument`].
    pub fn permits_per_request(mut self, permits: u32) -> Self {
        self.permits = permits;
        self
    }

    /// Gives up waiting for a permit after `timeout`: the request fails with
    /// [`Error::Timeout`] and leaves the queue. `Duration::ZERO` takes a permit only if one is
    /// free now and nobody queues, and fails at once with [`Error::NoPermits`] otherwise.
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = Some(timeout);
        self
    }
}

impl<S> Layer<S> for ConcurrencyLimitLayer {
    type Service = ConcurrencyLimit<S>;

    fn layer(&self, inner: S) -> ConcurrencyLimit<S> {
        ConcurrencyLimit {
            inner,
            config: self.clone(),
        }
    }
}

/// A service that holds permits of a shared [`Semaphore`] while each request runs. Made by
/// [`ConcurrencyLimitLayer`] or [`ConcurrencyLimit::new`].
///
/// Cloning is cheap when the inner service's clone is; clones share the semaphore (and so
/// its limit), like every replica does.
#[derive(Clone, Debug)]
pub struct ConcurrencyLimit<S> {
    inner: S,
    config: ConcurrencyLimitLayer,
}

impl<S> ConcurrencyLimit<S> {
    /// Wraps `inner` with one permit of `semaphore` per request and no acquire timeout.
    pub fn new(inner: S, semaphore: Semaphore) -> ConcurrencyLimit<S> {
        ConcurrencyLimitLayer::new(semaphore).layer(inner)
    }

    /// The semaphore that limits this service.
    pub fn semaphore(&self) -> &Semaphore {
        &self.config.semaphore
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req> Service<Req> for ConcurrencyLimit<S>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // No permit here: a readied but idle service must not hold a lease in Redis.
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> ResponseFuture<S::Response> {
        // The readied service goes with this request; `self` keeps a clone that must be
        // readied again (tower's clone-and-swap idiom).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let ConcurrencyLimitLayer {
            semaphore,
            permits,
            acquire_timeout,
        } = self.config.clone();
        ResponseFuture {
            inner: Box::pin(async move {
                let permit: Result<Permit, Error> = match acquire_timeout {
                    None => semaphore.acquire_many(permits).await,
                    Some(t) if t.is_zero() => semaphore.try_acquire_many(permits).await,
                    Some(t) => semaphore.acquire_many_timeout(permits, t).await,
                };
                let permit = permit?;
                match permit.run(inner.call(req)).await {
                    Ok(Ok(response)) => Ok(response),
                    Ok(Err(e)) => Err(e.into()),
                    Err(lost) => Err(lost.into()),
                }
            }),
        }
    }
}

/// The response future of [`ConcurrencyLimit`]: acquires the permit, runs the inner
/// service's future under it, releases it. Dropping it gives up the place in the queue, or
/// releases the permit. `Send + 'static`.
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<T> {
    inner: Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send + 'static>>,
}

impl<T> Future for ResponseFuture<T> {
    type Output = Result<T, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<T> fmt::Debug for ResponseFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

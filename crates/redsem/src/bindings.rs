//! What the language bindings (Python, Node.js) share beyond the public API. Not a public
//! API: no stability promise.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// A future started, for a binding's runtime task.
pub type Started<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Polls `fut` once, here and now, and returns what is left of it to spawn.
///
/// A binding's call (`acquire`, `release`, ...) becomes a task on a multi-thread runtime,
/// which first polls it whenever a worker picks it up: two calls made one after the other by
/// one thread (an event loop) could then take effect in either order, and the second
/// `acquire` of a process could queue ahead of the first. An acquisition takes its place
/// at its first poll (as `tokio::sync::Semaphore`'s do), so the bindings poll each call once
/// as it is made, in the caller's order, and spawn the rest. The caller must be inside its
/// runtime's context (`Runtime::enter`): the first poll may start timers.
///
/// Sound for any future: one that returns `Pending` has registered the waker of each poll,
/// and the spawned task polls it again at once, with its own waker, before anything can be
/// missed. Costs one box (the spawn would make one anyway) and a poll.
pub fn start_now<F>(fut: F) -> Started<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    let mut fut: Started<F::Output> = Box::pin(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => Box::pin(std::future::ready(out)),
        Poll::Pending => fut,
    }
}

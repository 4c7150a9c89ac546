//! Compile-time checks of the public API's auto traits: every future the crate returns is
//! `Send` (so it can run on a multi-threaded runtime and inside `tokio::spawn`), the futures
//! that own their inputs are also `'static`, and every public type is `Send + Sync`.
//!
//! Nothing here needs a server: if this file compiles, the checks passed.
#![allow(dead_code, clippy::let_underscore_future)]

use std::future::Future;

use redsem::fencing::FencedStore;
use redsem::{
    BackendError, Client, ClientBuilder, Error, Fence, HolderInfo, LostReason, Permit, Semaphore,
    SemaphoreBuilder, Stats, WaiterInfo,
};

fn send<T: Send>(t: T) -> T {
    t
}
fn send_static<T: Send + 'static>(t: T) -> T {
    t
}
fn send_sync<T: Send + Sync>() {}
fn send_sync_static<T: Send + Sync + 'static>() {}

/// Futures that borrow a handle are `Send`.
fn borrowing_futures_are_send(
    client: &Client,
    sem: &Semaphore,
    permit: &Permit,
    store: &FencedStore,
) {
    let fence = permit.fences()[0];
    let _ = send(client.ping());
    let _ = send(client.list_semaphores());
    let _ = send(client.inspect("name"));
    let _ = send(client.resize_existing("name", 3));
    let _ = send(client.add_permits_existing("name", 1));
    let _ = send(client.force_release_existing("name", "holder"));
    let _ = send(client.flush_releases());
    let _ = send(sem.acquire());
    let _ = send(sem.acquire_many(2));
    let _ = send(sem.acquire_timeout(std::time::Duration::from_secs(1)));
    let _ = send(sem.acquire_many_timeout(2, std::time::Duration::from_secs(1)));
    let _ = send(sem.try_acquire());
    let _ = send(sem.try_acquire_many(2));
    let _ = send(sem.run(async { 1 }));
    let _ = send(sem.stats());
    let _ = send(sem.resize(4));
    let _ = send(sem.force_release("holder"));
    let _ = send(store.check(fence));
    let _ = send(store.write(fence, "key", b"value"));
}

/// Futures that own their inputs are `Send + 'static`: they can be spawned as they are.
fn owning_futures_are_send_and_static(
    client: Client,
    sem: Semaphore,
    p1: Permit,
    p2: Permit,
    p3: Permit,
) {
    let _ = send_static(Client::connect("redis://127.0.0.1:6379/"));
    let _ = send_static(Client::builder("redis://127.0.0.1:6379/").build());
    let _ = send_static(client.semaphore("name", 3).open());
    let _ = send_static(p1.lost());
    let _ = send_static(p1.run(async { 1 }));
    let _ = send_static(p2.release());
    let _ = send_static(p3.cancellation_token().cancelled_owned());
    // The usual way to acquire in a spawned task: move a clone of the handle in.
    let _ = send_static(async move { sem.acquire().await?.run(async { 1 }).await });
}

/// `Permit::run` and `Semaphore::run` keep the work's own auto traits.
fn run_is_send_when_the_work_is<F: Future + Send + 'static>(
    sem: Semaphore,
    permit: Permit,
    work: F,
    work2: F,
) where
    F::Output: Send,
{
    let _ = send_static(permit.run(work));
    let _ = send_static(async move { sem.run(work2).await });
}

#[cfg(feature = "tower")]
fn tower_types_are_send() {
    use redsem::tower::{ConcurrencyLimit, ConcurrencyLimitLayer, ResponseFuture};
    send_sync_static::<ConcurrencyLimitLayer>();
    send_sync_static::<ConcurrencyLimit<tower::util::BoxCloneSyncService<(), (), Error>>>();
    send_static::<Option<ResponseFuture<String>>>(None);
}

#[test]
fn public_types_are_send_and_sync() {
    send_sync_static::<Client>();
    send_sync_static::<ClientBuilder>();
    send_sync_static::<SemaphoreBuilder>();
    send_sync_static::<Semaphore>();
    send_sync_static::<Permit>();
    send_sync_static::<FencedStore>();
    send_sync_static::<Fence>();
    send_sync_static::<Stats>();
    send_sync_static::<HolderInfo>();
    send_sync_static::<WaiterInfo>();
    send_sync_static::<LostReason>();
    send_sync_static::<Error>();
    send_sync_static::<BackendError>();
    // errors box into the usual `Box<dyn Error + Send + Sync>`
    let _: Box<dyn std::error::Error + Send + Sync> =
        Box::new(Error::InvalidArgument(String::new()));
    send_sync::<&Semaphore>();
}

//! A blocking API for programs that do not use async Rust (crate feature `blocking`).
//!
//! A thin wrapper over the async API, in the manner of `reqwest::blocking`: a
//! [`blocking::Client`](Client) owns a small Tokio runtime (one worker thread, named
//! `redsem-blocking`) on which the background work runs — renewals, notifications,
//! releases — and each blocking call waits on it for the async call it wraps. The
//! semantics, guarantees and costs are those of the async methods of the same names; this
//! module only adds the thread and the waiting.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! fn main() -> Result<(), redsem::Error> {
//!     let client = redsem::blocking::Client::connect("redis://127.0.0.1:6379/")?;
//!     // At most 4 jobs at once, across every process that opens "nightly-export".
//!     let sem = client
//!         .semaphore("nightly-export", 4)
//!         .lease(Duration::from_secs(10))
//!         .open()?;
//!     let permit = sem.acquire_timeout(Duration::from_secs(60))?;
//!     println!("running on slot {}", permit.slots()[0]);
//!     // ... the work; check permit.is_lost() between steps ...
//!     drop(permit); // released in the background
//!     client.shutdown(); // every release done before the process exits
//!     Ok(())
//! }
//! ```
//!
//! # Costs
//! Per [`Client`] (and its clones): one OS thread running a Tokio runtime, besides what a
//! [`redsem::Client`](crate::Client) costs. Each blocking call hands its future to that
//! runtime and parks the calling thread until it completes; several threads may wait at
//! once. Dropping the last handle on a runtime — the last clone of the [`Client`], of a
//! [`Semaphore`] or of a [`Permit`] opened from it — performs the releases still queued (one
//! round trip; at most [`DROP_FLUSH_LIMIT`] if Redis does not answer, after which they expire
//! with their leases), then stops the thread.
//!
//! # Panics
//! Every blocking call panics when made from inside an async runtime (as `reqwest::blocking`
//! does), and so does dropping the last handle on a blocking client's runtime there (the
//! last clone of the [`Client`], or of a [`Semaphore`] or [`Permit`] opened from it, which
//! keep its runtime alive): use the async API in async code. Creating the [`Client`] panics
//! if the operating system refuses to start its thread.
//!
//! # Cancellation
//! A blocking call cannot be cancelled; bound acquisitions with the `_timeout` methods or
//! [`AcquireOptions::timeout`](crate::AcquireOptions::timeout). Work guarded by a permit runs
//! on the calling thread and is not interrupted when the permit is lost: check
//! [`Permit::is_lost`] (cheap, no I/O) between steps, or watch
//! [`Permit::cancellation_token`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

use crate::admin::{ForceReleased, Resized};
use crate::error::Error;
use crate::options::AcquireOptions;
use crate::permit::Fence;
use crate::stats::Stats;

/// How long dropping the last handle on a blocking client's runtime waits for the releases
/// still queued (those of dropped permits and abandoned acquires) before stopping the
/// runtime. With Redis answering, the wait is one round trip; the entries of releases not
/// done in time expire with their leases.
pub const DROP_FLUSH_LIMIT: Duration = Duration::from_secs(5);

/// The async client and the runtime it runs on, shared by a blocking client and everything
/// opened from it.
type Rt = Arc<Shared>;

#[derive(Debug)]
struct Shared {
    /// Dropped before the runtime (field order).
    client: crate::Client,
    rt: Runtime,
}

impl Shared {
    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }
}

impl Drop for Shared {
    /// The last handle is gone: perform the queued releases before the runtime (and the
    /// releaser task on it) stops, or a permit that outlived its client would hold its slot
    /// until its lease expired. Inside an async runtime blocking is not allowed: the runtime's
    /// own drop panics there, as documented, and this skips the wait rather than panic twice.
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            return;
        }
        let client = &self.client;
        let _ = self.rt.block_on(async {
            tokio::time::timeout(DROP_FLUSH_LIMIT, client.flush_releases()).await
        });
    }
}

/// A blocking [`redsem::Client`](crate::Client): the same connections and background tasks,
/// on a runtime thread of its own. Cloning is cheap and shares both; the clones may be used
/// from several threads at once.
///
/// # Panics
/// Its blocking methods panic when called from inside an async runtime, and so does dropping
/// the last handle on its runtime there (see [the module docs](self#panics)).
#[derive(Clone, Debug)]
pub struct Client {
    rt: Rt,
}

impl Client {
    /// Connects with default settings; see [`redsem::Client::connect`](crate::Client::connect)
    /// for the URLs. Starts the client's runtime thread.
    ///
    /// # Errors
    /// As [`redsem::Client::connect`](crate::Client::connect).
    ///
    /// # Panics
    /// Inside an async runtime, or if the operating system refuses to start the thread.
    pub fn connect(url: &str) -> Result<Client, Error> {
        Client::builder(url).build()
    }

    /// Starts a builder for finer control (key prefix, timeouts, TLS, synced mode); nothing
    /// is started until [`ClientBuilder::build`].
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            inner: crate::Client::builder(url),
        }
    }

    /// Connects with the settings of an async [`redsem::ClientBuilder`](crate::ClientBuilder):
    /// `Client::from_builder(redsem::Client::builder(url).prefix("app"))`. Starts the
    /// client's runtime thread.
    ///
    /// # Errors
    /// As [`redsem::ClientBuilder::build`](crate::ClientBuilder::build).
    ///
    /// # Panics
    /// Inside an async runtime, or if the operating system refuses to start the thread.
    pub fn from_builder(builder: crate::ClientBuilder) -> Result<Client, Error> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("redsem-blocking")
            .enable_all()
            .build()
            .expect("the redsem-blocking runtime thread could not be started");
        let client = rt.block_on(builder.build())?;
        Ok(Client {
            rt: Arc::new(Shared { client, rt }),
        })
    }

    /// The async client inside, for code that mixes both. Its futures must run on a runtime
    /// of the caller's; the background tasks stay on this client's thread.
    pub fn as_async(&self) -> &crate::Client {
        &self.rt.client
    }

    /// The key prefix of this client's semaphores. No I/O.
    pub fn prefix(&self) -> &str {
        self.rt.client.prefix()
    }

    /// This client's unique id; see [`redsem::Client::id`](crate::Client::id). No I/O.
    pub fn id(&self) -> &str {
        self.rt.client.id()
    }

    /// [`redsem::Client::ping`](crate::Client::ping), blocking: one round trip.
    ///
    /// # Errors
    /// As the async method.
    pub fn ping(&self) -> Result<(), Error> {
        self.rt.block_on(self.rt.client.ping())
    }

    /// Starts opening the semaphore `name` with `limit` permits shared by every replica
    /// (see [`redsem::Client::semaphore`](crate::Client::semaphore)). Nothing is sent until
    /// [`SemaphoreBuilder::open`].
    pub fn semaphore(&self, name: impl Into<String>, limit: u32) -> SemaphoreBuilder {
        SemaphoreBuilder {
            inner: self.rt.client.semaphore(name, limit),
            rt: self.rt.clone(),
        }
    }

    /// [`redsem::Client::list_semaphores`](crate::Client::list_semaphores), blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn list_semaphores(&self) -> Result<Vec<String>, Error> {
        self.rt.block_on(self.rt.client.list_semaphores())
    }

    /// [`redsem::Client::inspect`](crate::Client::inspect), blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn inspect(&self, name: &str) -> Result<Stats, Error> {
        self.rt.block_on(self.rt.client.inspect(name))
    }

    /// [`redsem::Client::resize_existing`](crate::Client::resize_existing), blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn resize_existing(&self, name: &str, new_limit: u32) -> Result<Resized, Error> {
        self.rt
            .block_on(self.rt.client.resize_existing(name, new_limit))
    }

    /// [`redsem::Client::add_permits_existing`](crate::Client::add_permits_existing),
    /// blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn add_permits_existing(&self, name: &str, delta: i64) -> Result<Resized, Error> {
        self.rt
            .block_on(self.rt.client.add_permits_existing(name, delta))
    }

    /// [`redsem::Client::force_release_existing`](crate::Client::force_release_existing),
    /// blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn force_release_existing(
        &self,
        name: &str,
        holder_id: &str,
    ) -> Result<ForceReleased, Error> {
        self.rt
            .block_on(self.rt.client.force_release_existing(name, holder_id))
    }

    /// [`redsem::Client::delete_semaphore`](crate::Client::delete_semaphore), blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn delete_semaphore(&self, name: &str, force: bool) -> Result<u32, Error> {
        self.rt
            .block_on(self.rt.client.delete_semaphore(name, force))
    }

    /// [`redsem::Client::purge_keys`](crate::Client::purge_keys), blocking: **deletes
    /// another program's data too**.
    ///
    /// # Errors
    /// As the async method.
    pub fn purge_keys(&self, name: &str) -> Result<u32, Error> {
        self.rt.block_on(self.rt.client.purge_keys(name))
    }

    /// [`redsem::Client::flush_releases`](crate::Client::flush_releases), blocking: waits
    /// until the releases of dropped permits and abandoned acquires are done. Unbounded if
    /// Redis keeps failing (each release is retried a few times).
    pub fn flush_releases(&self) {
        self.rt.block_on(self.rt.client.flush_releases());
    }

    /// [`redsem::Client::shutdown`](crate::Client::shutdown), blocking: every release done,
    /// background tasks stopped. Call it before the process exits; the runtime thread itself
    /// stops when the last handle on it is dropped.
    pub fn shutdown(&self) {
        self.rt.block_on(self.rt.client.shutdown());
    }

    /// Whether [`shutdown`](Self::shutdown) was called. No I/O.
    pub fn is_shut_down(&self) -> bool {
        self.rt.client.is_shut_down()
    }
}

/// Configures and connects a blocking [`Client`]; the settings of
/// [`redsem::ClientBuilder`](crate::ClientBuilder), whose docs give the defaults.
#[derive(Clone, Debug)]
#[must_use = "a ClientBuilder does nothing until .build()"]
pub struct ClientBuilder {
    inner: crate::ClientBuilder,
}

impl ClientBuilder {
    /// See [`redsem::ClientBuilder::prefix`](crate::ClientBuilder::prefix).
    pub fn prefix(self, prefix: impl Into<String>) -> Self {
        self.map(|b| b.prefix(prefix))
    }

    /// See [`redsem::ClientBuilder::connect_timeout`](crate::ClientBuilder::connect_timeout).
    pub fn connect_timeout(self, d: Duration) -> Self {
        self.map(|b| b.connect_timeout(d))
    }

    /// See [`redsem::ClientBuilder::response_timeout`](crate::ClientBuilder::response_timeout).
    pub fn response_timeout(self, d: Duration) -> Self {
        self.map(|b| b.response_timeout(d))
    }

    /// See [`redsem::ClientBuilder::tls_ca`](crate::ClientBuilder::tls_ca).
    pub fn tls_ca(self, path: impl Into<PathBuf>) -> Self {
        self.map(|b| b.tls_ca(path))
    }

    /// See [`redsem::ClientBuilder::tls_cert`](crate::ClientBuilder::tls_cert).
    pub fn tls_cert(self, path: impl Into<PathBuf>) -> Self {
        self.map(|b| b.tls_cert(path))
    }

    /// See [`redsem::ClientBuilder::tls_key`](crate::ClientBuilder::tls_key).
    pub fn tls_key(self, path: impl Into<PathBuf>) -> Self {
        self.map(|b| b.tls_key(path))
    }

    /// See [`redsem::ClientBuilder::tls_ca_pem`](crate::ClientBuilder::tls_ca_pem).
    pub fn tls_ca_pem(self, pem: impl Into<Vec<u8>>) -> Self {
        self.map(|b| b.tls_ca_pem(pem))
    }

    /// See [`redsem::ClientBuilder::tls_cert_pem`](crate::ClientBuilder::tls_cert_pem).
    pub fn tls_cert_pem(self, pem: impl Into<Vec<u8>>) -> Self {
        self.map(|b| b.tls_cert_pem(pem))
    }

    /// See [`redsem::ClientBuilder::tls_key_pem`](crate::ClientBuilder::tls_key_pem).
    pub fn tls_key_pem(self, pem: impl Into<Vec<u8>>) -> Self {
        self.map(|b| b.tls_key_pem(pem))
    }

    /// See [`redsem::ClientBuilder::synced_replicas`](crate::ClientBuilder::synced_replicas).
    pub fn synced_replicas(self, replicas: u32, timeout: Duration) -> Self {
        self.map(|b| b.synced_replicas(replicas, timeout))
    }

    fn map(self, f: impl FnOnce(crate::ClientBuilder) -> crate::ClientBuilder) -> Self {
        ClientBuilder {
            inner: f(self.inner),
        }
    }

    /// Starts the client's runtime thread, connects and starts the background tasks on it;
    /// see [`redsem::ClientBuilder::build`](crate::ClientBuilder::build).
    ///
    /// # Errors
    /// As the async method.
    ///
    /// # Panics
    /// Inside an async runtime, or if the operating system refuses to start the thread.
    pub fn build(self) -> Result<Client, Error> {
        Client::from_builder(self.inner)
    }
}

/// Opens a blocking [`Semaphore`]; the settings of
/// [`redsem::SemaphoreBuilder`](crate::SemaphoreBuilder).
#[derive(Debug)]
#[must_use = "a SemaphoreBuilder does nothing until .open()"]
pub struct SemaphoreBuilder {
    inner: crate::SemaphoreBuilder,
    rt: Rt,
}

impl SemaphoreBuilder {
    /// See [`redsem::SemaphoreBuilder::lease`](crate::SemaphoreBuilder::lease).
    pub fn lease(self, lease: Duration) -> Self {
        self.map(|b| b.lease(lease))
    }

    /// See [`redsem::SemaphoreBuilder::renew_every`](crate::SemaphoreBuilder::renew_every).
    pub fn renew_every(self, every: Duration) -> Self {
        self.map(|b| b.renew_every(every))
    }

    /// See [`redsem::SemaphoreBuilder::fallback_poll`](crate::SemaphoreBuilder::fallback_poll).
    pub fn fallback_poll(self, every: Duration) -> Self {
        self.map(|b| b.fallback_poll(every))
    }

    /// See [`redsem::SemaphoreBuilder::local_cap`](crate::SemaphoreBuilder::local_cap).
    pub fn local_cap(self, permits: u32) -> Self {
        self.map(|b| b.local_cap(permits))
    }

    /// See [`redsem::SemaphoreBuilder::label`](crate::SemaphoreBuilder::label).
    pub fn label(self, label: impl Into<String>) -> Self {
        self.map(|b| b.label(label))
    }

    /// See [`redsem::SemaphoreBuilder::allow_evicting_policy`](crate::SemaphoreBuilder::allow_evicting_policy).
    pub fn allow_evicting_policy(self, allow: bool) -> Self {
        self.map(|b| b.allow_evicting_policy(allow))
    }

    fn map(self, f: impl FnOnce(crate::SemaphoreBuilder) -> crate::SemaphoreBuilder) -> Self {
        SemaphoreBuilder {
            inner: f(self.inner),
            rt: self.rt,
        }
    }

    /// [`redsem::SemaphoreBuilder::open`](crate::SemaphoreBuilder::open), blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn open(self) -> Result<Semaphore, Error> {
        let inner = self.rt.block_on(self.inner.open())?;
        Ok(Semaphore { inner, rt: self.rt })
    }
}

/// A blocking [`redsem::Semaphore`](crate::Semaphore). Cloning is cheap; clones share one
/// handle, and may be used from several threads at once. It keeps its client's runtime
/// thread alive.
///
/// # Panics
/// Its blocking methods panic when called from inside an async runtime (see
/// [the module docs](self#panics)).
#[derive(Clone, Debug)]
pub struct Semaphore {
    inner: crate::Semaphore,
    rt: Rt,
}

impl Semaphore {
    /// The async handle inside.
    pub fn as_async(&self) -> &crate::Semaphore {
        &self.inner
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The limit as last seen in Redis; see [`redsem::Semaphore::limit`](crate::Semaphore::limit).
    pub fn limit(&self) -> u32 {
        self.inner.limit()
    }

    /// Permits free as last seen in Redis, no I/O; see
    /// [`redsem::Semaphore::available_permits`](crate::Semaphore::available_permits).
    pub fn available_permits(&self) -> u32 {
        self.inner.available_permits()
    }

    fn wrap(&self, permit: Result<crate::Permit, Error>) -> Result<Permit, Error> {
        permit.map(|inner| Permit {
            inner,
            rt: self.rt.clone(),
        })
    }

    /// Waits for one permit, in FIFO order; see
    /// [`redsem::Semaphore::acquire`](crate::Semaphore::acquire). Blocks without a time
    /// limit: prefer [`acquire_timeout`](Self::acquire_timeout).
    ///
    /// # Errors
    /// As the async method.
    pub fn acquire(&self) -> Result<Permit, Error> {
        self.wrap(self.rt.block_on(self.inner.acquire()))
    }

    /// Waits for `n` permits at once; see
    /// [`redsem::Semaphore::acquire_many`](crate::Semaphore::acquire_many).
    ///
    /// # Errors
    /// As the async method.
    pub fn acquire_many(&self, n: u32) -> Result<Permit, Error> {
        self.wrap(self.rt.block_on(self.inner.acquire_many(n)))
    }

    /// Waits at most `timeout` for one permit; see
    /// [`redsem::Semaphore::acquire_timeout`](crate::Semaphore::acquire_timeout).
    ///
    /// # Errors
    /// As the async method ([`Error::Timeout`] when it runs out).
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<Permit, Error> {
        self.wrap(self.rt.block_on(self.inner.acquire_timeout(timeout)))
    }

    /// Waits at most `timeout` for `n` permits; see
    /// [`redsem::Semaphore::acquire_many_timeout`](crate::Semaphore::acquire_many_timeout).
    ///
    /// # Errors
    /// As the async method.
    pub fn acquire_many_timeout(&self, n: u32, timeout: Duration) -> Result<Permit, Error> {
        self.wrap(
            self.rt
                .block_on(self.inner.acquire_many_timeout(n, timeout)),
        )
    }

    /// Takes one permit only if free now and nobody is queued; see
    /// [`redsem::Semaphore::try_acquire`](crate::Semaphore::try_acquire).
    ///
    /// # Errors
    /// As the async method ([`Error::NoPermits`] says why not).
    pub fn try_acquire(&self) -> Result<Permit, Error> {
        self.wrap(self.rt.block_on(self.inner.try_acquire()))
    }

    /// Takes `n` permits only if free now and nobody is queued; see
    /// [`redsem::Semaphore::try_acquire_many`](crate::Semaphore::try_acquire_many).
    ///
    /// # Errors
    /// As the async method.
    pub fn try_acquire_many(&self, n: u32) -> Result<Permit, Error> {
        self.wrap(self.rt.block_on(self.inner.try_acquire_many(n)))
    }

    /// The general form; see [`redsem::Semaphore::acquire_with`](crate::Semaphore::acquire_with).
    ///
    /// # Errors
    /// As the async method.
    pub fn acquire_with(&self, options: AcquireOptions) -> Result<Permit, Error> {
        self.wrap(self.rt.block_on(self.inner.acquire_with(options)))
    }

    /// Acquires one permit, runs `work` on this thread while holding it, and releases it.
    /// Returns `work`'s value, or [`Error::LeaseLost`] if the permit was lost by the time
    /// `work` returned (the value is then dropped). Unlike the async
    /// [`redsem::Semaphore::run`](crate::Semaphore::run), a blocking closure cannot be
    /// cancelled: long work should check [`Permit::is_lost`] between its steps, or watch
    /// [`Permit::cancellation_token`] (use [`acquire`](Self::acquire) and
    /// [`Permit::run`] for that). Waits without a time limit, as `acquire`.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), and [`Error::LeaseLost`].
    pub fn run<T>(&self, work: impl FnOnce() -> T) -> Result<T, Error> {
        self.acquire()?.run(work)
    }

    /// [`redsem::Semaphore::stats`](crate::Semaphore::stats), blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn stats(&self) -> Result<Stats, Error> {
        self.rt.block_on(self.inner.stats())
    }

    /// [`redsem::Semaphore::resize`](crate::Semaphore::resize), blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn resize(&self, new_limit: u32) -> Result<Resized, Error> {
        self.rt.block_on(self.inner.resize(new_limit))
    }

    /// [`redsem::Semaphore::add_permits`](crate::Semaphore::add_permits), blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn add_permits(&self, delta: i64) -> Result<Resized, Error> {
        self.rt.block_on(self.inner.add_permits(delta))
    }

    /// [`redsem::Semaphore::force_release`](crate::Semaphore::force_release), blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn force_release(&self, holder_id: &str) -> Result<bool, Error> {
        self.rt.block_on(self.inner.force_release(holder_id))
    }

    /// [`redsem::Semaphore::close`](crate::Semaphore::close): pending and later acquires
    /// (from any thread) fail with [`Error::Closed`]. No I/O.
    pub fn close(&self) {
        self.inner.close();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// `(holders, waiters)` entries this process has through this handle and its clones; no
    /// I/O. See [`redsem::Semaphore::local_counts`](crate::Semaphore::local_counts).
    pub fn local_counts(&self) -> (usize, usize) {
        self.inner.local_counts()
    }
}

/// A blocking [`redsem::Permit`](crate::Permit): renewed in the background (on its
/// client's runtime thread, which it keeps alive) while it lives, released when dropped.
///
/// Dropping it does no I/O on the calling thread: the release is handed to the runtime
/// thread, and [`release`](Self::release) waits for it instead. When the permit is the last
/// handle on that runtime (its [`Client`] and [`Semaphore`] already dropped), dropping it
/// waits for the release, at most [`DROP_FLUSH_LIMIT`], before the thread stops.
///
/// # Panics
/// [`release`](Self::release) and [`set_lease`](Self::set_lease) panic when called from
/// inside an async runtime, and so does dropping the permit there when it is the last handle
/// on its runtime (see [the module docs](self#panics)).
#[derive(Debug)]
#[must_use = "dropping a Permit releases it at once"]
pub struct Permit {
    inner: crate::Permit,
    /// Keeps the runtime (and the renewals on it) alive as long as the permit.
    rt: Rt,
}

impl Permit {
    /// The async permit inside.
    pub fn as_async(&self) -> &crate::Permit {
        &self.inner
    }

    /// The name of the semaphore this permit belongs to.
    pub fn semaphore(&self) -> &str {
        self.inner.semaphore()
    }

    /// Why the lease is lost, `None` while it is not; cheap, no I/O. See
    /// [`redsem::Permit::lost_reason`](crate::Permit::lost_reason).
    pub fn lost_reason(&self) -> Option<crate::LostReason> {
        self.inner.lost_reason()
    }

    /// The holder id in Redis.
    pub fn holder_id(&self) -> &str {
        self.inner.holder_id()
    }

    /// The ticket this permit was granted under.
    pub fn ticket(&self) -> u64 {
        self.inner.ticket()
    }

    /// How many permits this holds.
    pub fn num_permits(&self) -> u32 {
        self.inner.num_permits()
    }

    /// The slot numbers held, in `0..limit`.
    pub fn slots(&self) -> Vec<u32> {
        self.inner.slots()
    }

    /// The fencing token of each slot held.
    pub fn fences(&self) -> &[Fence] {
        self.inner.fences()
    }

    /// Whether the lease is lost or could have run out; cheap, no I/O. See
    /// [`redsem::Permit::is_lost`](crate::Permit::is_lost).
    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// A token cancelled when the lease is lost.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.inner.cancellation_token()
    }

    /// Time left before the lease could run out without a further renewal; see
    /// [`redsem::Permit::lease_left`](crate::Permit::lease_left).
    pub fn lease_left(&self) -> Duration {
        self.inner.lease_left()
    }

    /// The length of this permit's lease.
    pub fn lease(&self) -> Duration {
        self.inner.lease()
    }

    /// [`redsem::Permit::set_lease`](crate::Permit::set_lease), blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn set_lease(&mut self, lease: Duration) -> Result<(), Error> {
        let rt = self.rt.clone();
        rt.block_on(self.inner.set_lease(lease))
    }

    /// Runs `work` on this thread while holding the permit, then releases it (in the
    /// background, as drop). Returns `work`'s value, or [`Error::LeaseLost`] when the permit
    /// was lost by the time `work` returned (the value is then dropped). The work itself
    /// cannot be cancelled: check [`is_lost`](Self::is_lost) between its steps, or watch
    /// [`cancellation_token`](Self::cancellation_token), taken before this call.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] as above.
    pub fn run<T>(self, work: impl FnOnce() -> T) -> Result<T, Error> {
        let out = work();
        if let Some(reason) = self.inner.lost_reason() {
            let name = self.inner.semaphore().to_owned();
            drop(self);
            return Err(Error::LeaseLost { name, reason });
        }
        drop(self);
        Ok(out)
    }

    /// Releases the permit now and waits for Redis to confirm it; see
    /// [`redsem::Permit::release`](crate::Permit::release).
    ///
    /// # Errors
    /// As the async method.
    pub fn release(self) -> Result<(), Error> {
        let Permit { inner, rt } = self;
        rt.block_on(inner.release())
    }

    /// Stops renewing without releasing: the slot frees when the lease expires.
    pub fn detach(self) {
        self.inner.detach();
    }
}

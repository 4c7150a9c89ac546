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
//! # Panics
//! Every blocking call panics when made from inside an async runtime (as `reqwest::blocking`
//! does), and so does dropping the last clone of a blocking [`Client`] (with the semaphores
//! and permits opened from it, which keep its runtime alive) there: use the async API in
//! async code. Creating the [`Client`] panics if the operating system
//! refuses to start its thread.
//!
//! # Cancellation
//! A blocking call cannot be cancelled; bound acquisitions with the `_timeout` methods or
//! [`AcquireOptions::timeout`](crate::AcquireOptions::timeout). Work guarded by a permit runs
//! on the calling thread and is not interrupted when the permit is lost: check
//! [`Permit::is_lost`] (cheap, no I/O) between steps, or watch
//! [`Permit::cancellation_token`].

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::options::AcquireOptions;
use crate::permit::Fence;
use crate::stats::Stats;

/// The runtime shared by a blocking client and everything opened from it.
type Rt = Arc<Runtime>;

/// A blocking [`redsem::Client`](crate::Client): the same connections and background tasks,
/// on a runtime of its own. Cloning is cheap and shares both.
#[derive(Clone, Debug)]
pub struct Client {
    inner: crate::Client,
    rt: Rt,
}

impl Client {
    /// Connects with default settings; see [`redsem::Client::connect`](crate::Client::connect)
    /// for the URLs. Starts the client's runtime thread.
    ///
    /// # Errors
    /// As [`redsem::Client::connect`](crate::Client::connect).
    pub fn connect(url: &str) -> Result<Client, Error> {
        Client::from_builder(crate::Client::builder(url))
    }

    /// Connects with the settings of an async [`ClientBuilder`](crate::ClientBuilder)
    /// (key prefix, timeouts, TLS, synced mode): `Client::from_builder(redsem::Client::builder(url).prefix("app"))`.
    ///
    /// # Errors
    /// As [`ClientBuilder::build`](crate::ClientBuilder::build).
    pub fn from_builder(builder: crate::ClientBuilder) -> Result<Client, Error> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("redsem-blocking")
            .enable_all()
            .build()
            .expect("the redsem-blocking runtime thread could not be started");
        let rt = Arc::new(rt);
        let inner = rt.block_on(builder.build())?;
        Ok(Client { inner, rt })
    }

    /// The async client inside, for code that mixes both.
    pub fn as_async(&self) -> &crate::Client {
        &self.inner
    }

    /// Starts opening the semaphore `name` with `limit` permits shared by every replica
    /// (see [`redsem::Client::semaphore`](crate::Client::semaphore)). Nothing is sent until
    /// [`SemaphoreBuilder::open`].
    pub fn semaphore(&self, name: impl Into<String>, limit: u32) -> SemaphoreBuilder {
        SemaphoreBuilder {
            inner: self.inner.semaphore(name, limit),
            rt: self.rt.clone(),
        }
    }

    /// [`redsem::Client::list_semaphores`](crate::Client::list_semaphores), blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn list_semaphores(&self) -> Result<Vec<String>, Error> {
        self.rt.block_on(self.inner.list_semaphores())
    }

    /// [`redsem::Client::inspect`](crate::Client::inspect), blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn inspect(&self, name: &str) -> Result<Stats, Error> {
        self.rt.block_on(self.inner.inspect(name))
    }

    /// [`redsem::Client::delete_semaphore`](crate::Client::delete_semaphore), blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn delete_semaphore(&self, name: &str, force: bool) -> Result<u32, Error> {
        self.rt.block_on(self.inner.delete_semaphore(name, force))
    }

    /// [`redsem::Client::shutdown`](crate::Client::shutdown), blocking: every release done,
    /// background tasks stopped. Call it before the process exits.
    pub fn shutdown(&self) {
        self.rt.block_on(self.inner.shutdown());
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
/// handle, and may be used from several threads at once.
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
    /// `work` returned: a blocking closure cannot be cancelled, so long work should check
    /// [`Permit::is_lost`] itself (use [`acquire`](Self::acquire) and the permit for that).
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
    pub fn resize(&self, new_limit: u32) -> Result<u32, Error> {
        self.rt.block_on(self.inner.resize(new_limit))
    }

    /// [`redsem::Semaphore::add_permits`](crate::Semaphore::add_permits), blocking.
    ///
    /// # Errors
    /// As the async method.
    pub fn add_permits(&self, delta: i64) -> Result<u32, Error> {
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
}

/// A blocking [`redsem::Permit`](crate::Permit): renewed in the background while it lives,
/// released when dropped (in the background; [`release`](Self::release) waits for it).
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

    /// Runs `work` on this thread while holding the permit, then releases it. Returns
    /// `work`'s value, or [`Error::LeaseLost`] when the permit was lost by the time `work`
    /// returned (the work itself is not interrupted: check [`is_lost`](Self::is_lost)
    /// between its steps).
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

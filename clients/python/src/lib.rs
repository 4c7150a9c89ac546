//! `redsem._native`: the PyO3 bindings of the Python package `redsem` over the `redsem` crate.
//!
//! Only conversions live here: every protocol rule, the batching, the renewals and the
//! notifications are the crate's. Each async method returns an `asyncio` awaitable made by
//! the bridge of `bridge.rs`: the Rust future runs on one process-wide
//! Tokio runtime without the GIL, and cancelling the awaitable drops it (the crate's
//! documented cancel safety applies). The typed, documented Python API is
//! `python/redsem/*.py`; this module's stub is `python/redsem/_native.pyi`.
//!
//! Errors: [`to_py`] is the one place where a `redsem::Error` becomes a Python exception (the
//! classes are defined in `redsem/errors.py`).
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bridge::{Failure, spawn};
use futures_util::FutureExt as _;
use futures_util::future::{BoxFuture, Shared};
use pyo3::prelude::*;
use redsem::{AcquireOptions, Error, Fence, ForceReleased, LostReason, NoPermitsReason, Resized};
use tokio_util::sync::CancellationToken;

/// The name of a Python exception class of `redsem.errors` and the attributes to set on it.
type Attrs = Vec<(&'static str, Py<PyAny>)>;

/// The one mapping from `redsem::Error` to the Python exception hierarchy of
/// `redsem.errors`: the class named after the variant, the Rust `Display` as its message,
/// and the variant's fields as attributes (`semaphore` wherever the error names one).
pub(crate) fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let message = e.to_string();
    let semaphore = e.semaphore().map(str::to_owned);
    let mut attrs: Attrs = Vec::new();
    macro_rules! put {
        ($k:literal, $v:expr) => {
            match $v.into_pyobject(py) {
                Ok(v) => attrs.push(($k, v.to_owned().into_any().unbind())),
                Err(err) => return err.into(),
            }
        };
    }
    let class = match &e {
        Error::InvalidArgument(_) => "InvalidArgument",
        Error::LimitConflict {
            requested, stored, ..
        } => {
            put!("requested", *requested);
            put!("stored", *stored);
            "LimitConflict"
        }
        Error::TooManyPermits {
            requested, limit, ..
        } => {
            put!("requested", *requested);
            put!("limit", *limit);
            "TooManyPermits"
        }
        Error::NoPermits { reason, .. } => {
            put!("reason", no_permits_reason(*reason));
            "NoPermits"
        }
        Error::Timeout { timeout, .. } => {
            put!("timeout", timeout.as_secs_f64());
            "Timeout"
        }
        Error::LeaseLost { reason, .. } => {
            put!("reason", lost_reason(*reason));
            "LeaseLost"
        }
        Error::RemovedFromQueue { .. } => "RemovedFromQueue",
        Error::HandoffGone { holder_id, .. } => {
            put!("holder_id", holder_id.as_str());
            "HandoffGone"
        }
        Error::Closed { .. } => "Closed",
        Error::UnknownSemaphore { prefix, .. } => {
            put!("prefix", prefix.as_str());
            "UnknownSemaphore"
        }
        Error::InUse {
            holders, waiters, ..
        } => {
            put!("holders", *holders);
            put!("waiters", *waiters);
            "InUse"
        }
        Error::WrongType { .. } => "WrongType",
        Error::NotASemaphore { .. } => "NotASemaphore",
        Error::ProtocolMismatch { .. } => "ProtocolMismatch",
        Error::Corrupt { .. } => "Corrupt",
        Error::EvictingPolicy { policy, .. } => {
            put!("policy", policy.as_str());
            "EvictingPolicy"
        }
        Error::NoPermission(_) => "NoPermission",
        Error::Auth(_) => "AuthError",
        Error::NotReplicated { acked, wanted, .. } => {
            put!("acked", *acked);
            put!("wanted", *wanted);
            "NotReplicated"
        }
        Error::Unreachable(_) => "Unreachable",
        Error::Backend(b) => {
            put!("code", b.code());
            "BackendError"
        }
        _ => "RedsemError",
    };
    put!("semaphore", semaphore);
    put!("retryable", e.is_retryable());
    let build = || -> PyResult<PyErr> {
        let cls = py.import("redsem.errors")?.getattr(class)?;
        let exc = cls.call1((message.as_str(),))?;
        for (k, v) in attrs {
            exc.setattr(k, v)?;
        }
        Ok(PyErr::from_value(exc))
    };
    build().unwrap_or_else(|err| err)
}

fn lost_reason(r: LostReason) -> &'static str {
    match r {
        LostReason::NotHolder => "not_holder",
        LostReason::Unreachable => "unreachable",
        LostReason::Shutdown => "shutdown",
        LostReason::Refused => "refused",
        LostReason::Deleted => "deleted",
        LostReason::HandedOff => "handed_off",
        LostReason::MaxHold => "max_hold",
        LostReason::Overwritten => "overwritten",
        _ => "other",
    }
}

/// A [`Resized`] as `(previous, limit, [(id, permits, label), ...])`, which `redsem.Resized`
/// wraps.
type ResizedTuple = (u32, u32, Vec<(String, u32, String)>);

fn resized(r: Resized) -> ResizedTuple {
    let rejected = r
        .rejected
        .into_iter()
        .map(|w| (w.id, w.permits, w.label))
        .collect();
    (r.previous, r.limit, rejected)
}

/// A [`ForceReleased`] as `"holder"`, `"waiter"` or `"not_found"`.
fn force_released(f: ForceReleased) -> &'static str {
    match f {
        ForceReleased::Holder => "holder",
        ForceReleased::Waiter => "waiter",
        _ => "not_found",
    }
}

fn no_permits_reason(r: NoPermitsReason) -> &'static str {
    match r {
        NoPermitsReason::NoneFree => "none_free",
        NoPermitsReason::QueuedFirst => "queued_first",
        NoPermitsReason::LocalCap => "local_cap",
        _ => "other",
    }
}

/// Seconds (a Python float) as a `Duration`; a negative, NaN or huge value is an
/// `InvalidArgument`, as the crate reports bad input.
fn secs(py: Python<'_>, what: &str, v: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(v).map_err(|_| {
        to_py(
            py,
            Error::InvalidArgument(format!(
                "{what} must be a finite, non-negative number of seconds, not {v}"
            )),
        )
    })
}

fn opt_secs(py: Python<'_>, what: &str, v: Option<f64>) -> PyResult<Option<Duration>> {
    v.map(|v| secs(py, what, v)).transpose()
}

/// Set in a child process after `fork()` (`os.register_at_fork` in `redsem/__init__.py`) when
/// the parent had started the Tokio runtime: its threads are gone in the child and the
/// parent's sockets must not be shared, so every entry point refuses there.
static FORKED: AtomicBool = AtomicBool::new(false);

#[pyfunction]
fn _mark_forked() {
    // A child of a process that never started the runtime can use the package normally.
    if bridge::runtime_started() {
        FORKED.store(true, Ordering::SeqCst);
    }
}

fn check_fork(py: Python<'_>) -> PyResult<()> {
    if FORKED.load(Ordering::SeqCst) {
        return Err(to_py(
            py,
            Error::InvalidArgument(
                "this process was forked after redsem started its runtime in the parent: \
                 use redsem only in processes started with the `spawn` or `forkserver` \
                 method, or import and use it only after the fork (gunicorn/celery: in a \
                 post-fork hook)"
                    .into(),
            ),
        ));
    }
    Ok(())
}

/// Connects a client (`redsem::ClientBuilder`).
#[pyfunction]
#[pyo3(signature = (url, *, prefix=None, connect_timeout=None, response_timeout=None,
    tls_ca=None, tls_cert=None, tls_key=None, tls_ca_pem=None, tls_cert_pem=None,
    tls_key_pem=None, synced_replicas=None, synced_timeout=1.0, scripts_only=false))]
#[allow(clippy::too_many_arguments)]
fn connect<'py>(
    py: Python<'py>,
    url: String,
    prefix: Option<String>,
    connect_timeout: Option<f64>,
    response_timeout: Option<f64>,
    tls_ca: Option<std::path::PathBuf>,
    tls_cert: Option<std::path::PathBuf>,
    tls_key: Option<std::path::PathBuf>,
    tls_ca_pem: Option<Vec<u8>>,
    tls_cert_pem: Option<Vec<u8>>,
    tls_key_pem: Option<Vec<u8>>,
    synced_replicas: Option<u32>,
    synced_timeout: f64,
    scripts_only: bool,
) -> PyResult<Bound<'py, PyAny>> {
    check_fork(py)?;
    let mut b = redsem::Client::builder(url);
    if let Some(p) = prefix {
        b = b.prefix(p);
    }
    if let Some(d) = opt_secs(py, "connect_timeout", connect_timeout)? {
        b = b.connect_timeout(d);
    }
    if let Some(d) = opt_secs(py, "response_timeout", response_timeout)? {
        b = b.response_timeout(d);
    }
    if let Some(p) = tls_ca {
        b = b.tls_ca(p);
    }
    if let Some(p) = tls_cert {
        b = b.tls_cert(p);
    }
    if let Some(p) = tls_key {
        b = b.tls_key(p);
    }
    if let Some(p) = tls_ca_pem {
        b = b.tls_ca_pem(p);
    }
    if let Some(p) = tls_cert_pem {
        b = b.tls_cert_pem(p);
    }
    if let Some(p) = tls_key_pem {
        b = b.tls_key_pem(p);
    }
    if let Some(n) = synced_replicas {
        b = b.synced_replicas(n, secs(py, "synced_timeout", synced_timeout)?);
    }
    b = b.scripts_only(scripts_only);
    spawn(py, async move {
        let client = b.build().await.map_err(Failure::from)?;
        Ok::<_, Failure>(Client { inner: client })
    })
}

/// `redsem::Client`.
#[pyclass(frozen, module = "redsem._native")]
struct Client {
    inner: redsem::Client,
}

#[pymethods]
impl Client {
    #[getter]
    fn prefix(&self) -> &str {
        self.inner.prefix()
    }

    #[getter]
    fn id(&self) -> &str {
        self.inner.id()
    }

    fn ping<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let c = self.inner.clone();
        spawn(py, async move { c.ping().await.map_err(Failure::from) })
    }

    fn shutdown<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let c = self.inner.clone();
        spawn(py, async move {
            c.shutdown().await;
            Ok::<_, Failure>(())
        })
    }

    fn is_shut_down(&self) -> bool {
        self.inner.is_shut_down()
    }

    #[pyo3(signature = (name, limit, *, lease=None, renew_every=None, fallback_poll=None,
        local_cap=None, label=None, allow_evicting_policy=false, limit_policy="require"))]
    #[allow(clippy::too_many_arguments)]
    fn semaphore<'py>(
        &self,
        py: Python<'py>,
        name: String,
        limit: i64,
        lease: Option<f64>,
        renew_every: Option<f64>,
        fallback_poll: Option<f64>,
        local_cap: Option<u32>,
        label: Option<String>,
        allow_evicting_policy: bool,
        limit_policy: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        check_fork(py)?;
        let policy = match limit_policy {
            "require" => redsem::LimitPolicy::Require,
            "adopt" => redsem::LimitPolicy::Adopt,
            "create_or_adopt" => redsem::LimitPolicy::CreateOrAdopt,
            "resize" => redsem::LimitPolicy::Resize,
            other => {
                return Err(to_py(
                    py,
                    Error::InvalidArgument(format!(
                        "limit_policy {other:?}: use \"require\", \"adopt\", \"create_or_adopt\" or \"resize\""
                    )),
                ));
            }
        };
        let limit = redsem::check_limit(limit).map_err(|e| to_py(py, e))?;
        let mut b = self
            .inner
            .semaphore(name, limit)
            .allow_evicting_policy(allow_evicting_policy)
            .limit_policy(policy);
        if let Some(d) = opt_secs(py, "lease", lease)? {
            b = b.lease(d);
        }
        if let Some(d) = opt_secs(py, "renew_every", renew_every)? {
            b = b.renew_every(d);
        }
        if let Some(d) = opt_secs(py, "fallback_poll", fallback_poll)? {
            b = b.fallback_poll(d);
        }
        if let Some(n) = local_cap {
            b = b.local_cap(n);
        }
        if let Some(l) = label {
            b = b.label(l);
        }
        spawn(py, async move {
            let sem = b.open().await.map_err(Failure::from)?;
            Ok::<_, Failure>(Semaphore { inner: sem })
        })
    }

    fn list_semaphores<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let c = self.inner.clone();
        spawn(py, async move {
            c.list_semaphores().await.map_err(Failure::from)
        })
    }

    /// `Client::load_library`: the library's name, `redsem_<hash>`.
    fn load_library<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let c = self.inner.clone();
        spawn(
            py,
            async move { c.load_library().await.map_err(Failure::from) },
        )
    }

    /// The `Stats` as JSON (the schema of `redsem stats --json`), listing at most `listed`
    /// holders and waiters (`Client::inspect_listing`).
    #[pyo3(signature = (name, listed=redsem::STATS_LISTED as i64))]
    fn inspect<'py>(
        &self,
        py: Python<'py>,
        name: String,
        listed: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let listed = to_listed(py, listed)?;
        let c = self.inner.clone();
        spawn(py, async move {
            let s = c
                .inspect_listing(&name, listed)
                .await
                .map_err(Failure::from)?;
            stats_json(&s)
        })
    }

    fn resize_existing<'py>(
        &self,
        py: Python<'py>,
        name: String,
        new_limit: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let new_limit = redsem::check_limit(new_limit).map_err(|e| to_py(py, e))?;
        let c = self.inner.clone();
        spawn(py, async move {
            c.resize_existing(&name, new_limit)
                .await
                .map(resized)
                .map_err(Failure::from)
        })
    }

    fn force_release_existing<'py>(
        &self,
        py: Python<'py>,
        name: String,
        holder_id: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let c = self.inner.clone();
        spawn(py, async move {
            c.force_release_existing(&name, &holder_id)
                .await
                .map(force_released)
                .map_err(Failure::from)
        })
    }

    fn add_permits_existing<'py>(
        &self,
        py: Python<'py>,
        name: String,
        delta: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let c = self.inner.clone();
        spawn(py, async move {
            c.add_permits_existing(&name, delta)
                .await
                .map(resized)
                .map_err(Failure::from)
        })
    }

    fn purge_keys<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        let c = self.inner.clone();
        spawn(py, async move {
            c.purge_keys(&name).await.map_err(Failure::from)
        })
    }

    #[pyo3(signature = (name, *, force=false))]
    fn delete_semaphore<'py>(
        &self,
        py: Python<'py>,
        name: String,
        force: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let c = self.inner.clone();
        spawn(py, async move {
            c.delete_semaphore(&name, force)
                .await
                .map_err(Failure::from)
        })
    }

    fn flush_releases<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let c = self.inner.clone();
        spawn(py, async move {
            c.flush_releases().await;
            Ok::<_, Failure>(())
        })
    }

    fn fenced_store(&self, fence_key: String) -> FencedStore {
        FencedStore {
            inner: redsem::fencing::FencedStore::new(&self.inner, fence_key),
        }
    }
}

/// How many entries a snapshot lists, as `InvalidArgument` when negative (the library
/// refuses more than `MAX_LISTED`).
fn to_listed(py: Python<'_>, v: i64) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| {
        to_py(
            py,
            Error::InvalidArgument(format!("a snapshot lists 0 or more entries, not {v}")),
        )
    })
}

fn stats_json(s: &redsem::Stats) -> Result<String, Failure> {
    serde_json::to_string(s)
        .map_err(|e| Failure::Runtime(format!("cannot serialise the stats: {e}")))
}

/// `redsem::Semaphore` (a handle).
#[pyclass(frozen, module = "redsem._native")]
struct Semaphore {
    inner: redsem::Semaphore,
}

#[pymethods]
impl Semaphore {
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    #[getter]
    fn limit(&self) -> u32 {
        self.inner.limit()
    }

    fn available_permits(&self) -> u32 {
        self.inner.available_permits()
    }

    /// `acquire_with(AcquireOptions)`.
    #[pyo3(signature = (*, permits=1, lease=None, label=None, timeout=None, try_only=false,
        priority=0, max_hold=None))]
    #[allow(clippy::too_many_arguments)]
    fn acquire<'py>(
        &self,
        py: Python<'py>,
        permits: u32,
        lease: Option<f64>,
        label: Option<String>,
        timeout: Option<f64>,
        try_only: bool,
        priority: i64,
        max_hold: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        check_fork(py)?;
        let priority = u8::try_from(priority).map_err(|_| {
            to_py(
                py,
                redsem::Error::InvalidArgument(format!(
                    "priority {priority} is outside 0..={}",
                    redsem::MAX_PRIORITY
                )),
            )
        })?;
        let mut o = AcquireOptions::new()
            .permits(permits)
            .try_only(try_only)
            .priority(priority);
        if let Some(d) = opt_secs(py, "lease", lease)? {
            o = o.lease(d);
        }
        if let Some(l) = label {
            o = o.label(l);
        }
        if let Some(d) = opt_secs(py, "timeout", timeout)? {
            o = o.timeout(d);
        }
        if let Some(d) = opt_secs(py, "max_hold", max_hold)? {
            o = o.max_hold(d);
        }
        let sem = self.inner.clone();
        spawn(py, async move {
            let permit = sem.acquire_with(o).await.map_err(Failure::from)?;
            Ok::<_, Failure>(Permit::new(permit))
        })
    }

    #[pyo3(signature = (listed=redsem::STATS_LISTED as i64))]
    fn stats<'py>(&self, py: Python<'py>, listed: i64) -> PyResult<Bound<'py, PyAny>> {
        let listed = to_listed(py, listed)?;
        let s = self.inner.clone();
        spawn(py, async move {
            let st = s.stats_listing(listed).await.map_err(Failure::from)?;
            stats_json(&st)
        })
    }

    fn resize<'py>(&self, py: Python<'py>, new_limit: i64) -> PyResult<Bound<'py, PyAny>> {
        let new_limit = redsem::check_limit(new_limit).map_err(|e| to_py(py, e))?;
        let s = self.inner.clone();
        spawn(py, async move {
            s.resize(new_limit)
                .await
                .map(resized)
                .map_err(Failure::from)
        })
    }

    fn add_permits<'py>(&self, py: Python<'py>, delta: i64) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        spawn(py, async move {
            s.add_permits(delta)
                .await
                .map(resized)
                .map_err(Failure::from)
        })
    }

    fn force_release<'py>(
        &self,
        py: Python<'py>,
        holder_id: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        spawn(py, async move {
            s.force_release(&holder_id).await.map_err(Failure::from)
        })
    }

    /// `Semaphore::adopt` of a hand-off token's text.
    fn adopt<'py>(&self, py: Python<'py>, token: &str) -> PyResult<Bound<'py, PyAny>> {
        check_fork(py)?;
        let token: redsem::HandoffToken = token.parse().map_err(|e| to_py(py, e))?;
        let s = self.inner.clone();
        spawn(py, async move {
            let permit = s.adopt(&token).await.map_err(Failure::from)?;
            Ok::<_, Failure>(Permit::new(permit))
        })
    }

    /// `Semaphore::release_handoff` of a hand-off token's text.
    fn release_handoff<'py>(&self, py: Python<'py>, token: &str) -> PyResult<Bound<'py, PyAny>> {
        let token: redsem::HandoffToken = token.parse().map_err(|e| to_py(py, e))?;
        let s = self.inner.clone();
        spawn(py, async move {
            s.release_handoff(&token).await.map_err(Failure::from)
        })
    }

    fn close(&self) {
        self.inner.close();
    }

    fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    fn local_counts(&self) -> (usize, usize) {
        self.inner.local_counts()
    }
}

/// `redsem::Permit`. The permit itself sits behind an async mutex so that `release` and
/// `set_lease` (which consume or borrow it mutably across an await) can run while Python
/// holds other references; what never changes is copied out at creation.
#[pyclass(frozen, module = "redsem._native")]
struct Permit {
    inner: Arc<tokio::sync::Mutex<Option<redsem::Permit>>>,
    semaphore: String,
    holder_id: String,
    ticket: u64,
    permits: u32,
    fences: Vec<Fence>,
    lost: Shared<BoxFuture<'static, LostReason>>,
    /// Cancelled once the permit is lost: readable while `release`/`set_lease` borrow it.
    token: CancellationToken,
}

impl Permit {
    fn new(p: redsem::Permit) -> Permit {
        Permit {
            semaphore: p.semaphore().to_owned(),
            holder_id: p.holder_id().to_owned(),
            ticket: p.ticket(),
            permits: p.num_permits(),
            fences: p.fences().to_vec(),
            lost: p.lost().boxed().shared(),
            token: p.cancellation_token(),
            inner: Arc::new(tokio::sync::Mutex::new(Some(p))),
        }
    }
}

#[pymethods]
impl Permit {
    #[getter]
    fn semaphore(&self) -> &str {
        &self.semaphore
    }

    #[getter]
    fn holder_id(&self) -> &str {
        &self.holder_id
    }

    #[getter]
    fn ticket(&self) -> u64 {
        self.ticket
    }

    #[getter]
    fn permits(&self) -> u32 {
        self.permits
    }

    #[getter]
    fn slots(&self) -> Vec<u32> {
        self.fences.iter().map(|f| f.slot).collect()
    }

    /// `(slot, generation)` pairs.
    #[getter]
    fn fences(&self) -> Vec<(u32, u64)> {
        self.fences.iter().map(|f| (f.slot, f.generation)).collect()
    }

    /// Whether it was released (or detached) through this object.
    #[getter]
    fn released(&self) -> bool {
        match self.inner.try_lock() {
            Ok(g) => g.is_none(),
            Err(_) => false,
        }
    }

    fn is_lost(&self) -> bool {
        match self.inner.try_lock() {
            Ok(g) => g
                .as_ref()
                .map_or_else(|| self.token.is_cancelled(), |p| p.is_lost()),
            Err(_) => self.token.is_cancelled(),
        }
    }

    fn lost_reason(&self) -> Option<&'static str> {
        if let Some(r) = self.lost.peek() {
            return Some(lost_reason(*r));
        }
        match self.inner.try_lock() {
            Ok(g) => g.as_ref().and_then(|p| p.lost_reason()).map(lost_reason),
            Err(_) => None,
        }
    }

    /// Seconds; 0 once released or lost.
    fn lease_left(&self) -> f64 {
        match self.inner.try_lock() {
            Ok(g) => g.as_ref().map_or(0.0, |p| p.lease_left().as_secs_f64()),
            Err(_) => 0.0,
        }
    }

    /// Seconds; `None` once released.
    fn lease(&self) -> Option<f64> {
        match self.inner.try_lock() {
            Ok(g) => g.as_ref().map(|p| p.lease().as_secs_f64()),
            Err(_) => None,
        }
    }

    /// Resolves with the reason once lost; never if it is not.
    fn wait_lost<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let lost = self.lost.clone();
        spawn(py, async move { Ok::<_, Failure>(lost_reason(lost.await)) })
    }

    /// The `LeaseLost` exception for this permit (raised by `Permit.run` and `async with`
    /// when the permit was lost), or `None` while it is not lost.
    fn lost_error(&self, py: Python<'_>) -> Option<Py<pyo3::exceptions::PyBaseException>> {
        let reason = self.lost.peek().copied().or_else(|| {
            self.inner
                .try_lock()
                .ok()
                .and_then(|g| g.as_ref().and_then(|p| p.lost_reason()))
        })?;
        Some(to_py(py, Error::lease_lost_for_binding(&self.semaphore, reason)).into_value(py))
    }

    fn set_lease<'py>(&self, py: Python<'py>, lease: f64) -> PyResult<Bound<'py, PyAny>> {
        let lease = secs(py, "lease", lease)?;
        let inner = self.inner.clone();
        let name = self.semaphore.clone();
        spawn(py, async move {
            let mut g = inner.lock().await;
            match g.as_mut() {
                Some(p) => p.set_lease(lease).await.map_err(Failure::from),
                None => Err(Failure::from(Error::InvalidArgument(format!(
                    "semaphore {name:?}: set_lease on a permit that was already released"
                )))),
            }
        })
    }

    /// Releases and waits for Redis to confirm. Idempotent (a second call does nothing).
    fn release<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        spawn(py, async move {
            let p = inner.lock().await.take();
            match p {
                Some(p) => p.release().await.map_err(Failure::from),
                None => Ok::<_, Failure>(()),
            }
        })
    }

    /// `Permit::export`: the hand-off token's text. The permit counts as released here
    /// (this process no longer renews it); exporting it twice is an `InvalidArgument`.
    fn export<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        let name = self.semaphore.clone();
        spawn(py, async move {
            let p = inner.lock().await.take();
            match p {
                Some(p) => p
                    .export()
                    .await
                    .map(|t| t.to_string())
                    .map_err(Failure::from),
                None => Err(Failure::from(Error::InvalidArgument(format!(
                    "semaphore {name:?}: export of a permit that was already released, detached or exported"
                )))),
            }
        })
    }

    /// Releases in the background (no I/O here): as dropping the Rust permit.
    fn release_nowait(&self) {
        if let Ok(mut g) = self.inner.try_lock() {
            drop(g.take());
        }
    }

    fn detach(&self) {
        if let Ok(mut g) = self.inner.try_lock()
            && let Some(p) = g.take()
        {
            p.detach();
        }
    }
}

/// `redsem::fencing::FencedStore`.
#[pyclass(frozen, module = "redsem._native")]
struct FencedStore {
    inner: redsem::fencing::FencedStore,
}

#[pymethods]
impl FencedStore {
    fn check<'py>(
        &self,
        py: Python<'py>,
        slot: u32,
        generation: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        spawn(py, async move {
            s.check(Fence { slot, generation })
                .await
                .map_err(Failure::from)
        })
    }

    fn write<'py>(
        &self,
        py: Python<'py>,
        slot: u32,
        generation: u64,
        key: String,
        value: Vec<u8>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        spawn(py, async move {
            s.write(Fence { slot, generation }, &key, &value)
                .await
                .map_err(Failure::from)
        })
    }
}

/// Runs the redsem CLI (`redsem_cli::main`) in this process with `argv` (`argv[0]` is the
/// program name) and returns its exit status. The GIL is released meanwhile; the CLI runs
/// its own runtime on this thread.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<OsString>) -> u8 {
    py.detach(|| redsem_cli::main(argv))
}

/// The crate's limits, for the Python layer's documentation and checks.
fn constants(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MAX_LIMIT", redsem::MAX_LIMIT)?;
    m.add("MAX_NAME_LEN", redsem::MAX_NAME_LEN)?;
    m.add("MAX_DURATION", redsem::MAX_DURATION.as_secs_f64())?;
    m.add("MIN_LEASE", redsem::MIN_LEASE.as_secs_f64())?;
    m.add("DEFAULT_PREFIX", redsem::DEFAULT_PREFIX)?;
    m.add("STATS_LISTED", redsem::STATS_LISTED)?;
    m.add("MAX_LISTED", redsem::MAX_LISTED)?;
    Ok(())
}

mod bridge;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(bridge::_drain, m)?)?;
    m.add_function(wrap_pyfunction!(bridge::_complete, m)?)?;
    m.add_class::<bridge::CancelOnDone>()?;
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(_mark_forked, m)?)?;
    m.add_class::<Client>()?;
    m.add_class::<Semaphore>()?;
    m.add_class::<Permit>()?;
    m.add_class::<FencedStore>()?;
    constants(m)?;
    Ok(())
}

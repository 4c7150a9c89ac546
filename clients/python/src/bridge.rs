//! The bridge from Rust futures to `asyncio`: [`spawn`] runs a future on the package's Tokio
//! runtime and returns an `asyncio.Future` of the calling thread's running loop.
//!
//! Why not `pyo3_async_runtimes::tokio::future_into_py`: it resolves the asyncio future from
//! a Tokio thread that attaches to the interpreter and is still attached (dropping its
//! guard) after `call_soon_threadsafe`, so when the awaited call is a program's last (e.g.
//! `await client.close()` before returning from `asyncio.run`), the main thread can start
//! finalising the interpreter meanwhile, and that thread then aborts the process
//! (`PyGILState_Release: thread state must be current`) or crashes in a thread-exit
//! destructor. Seen on interop/python/worker.py about one run in ten. Here every attach of a
//! Tokio thread is counted, and an `atexit` hook ([`_drain`], registered by
//! `redsem/__init__.py`) waits for the ones in progress and turns later ones into no-ops
//! before the interpreter finalises.
//!
//! Cancellation: a done-callback on the asyncio future ([`CancelOnDone`]) signals the Tokio
//! task, which drops the Rust future at once (the crate's documented cancel safety applies);
//! a result that arrives for a cancelled future is dropped (a `Permit` then releases itself
//! in the background).

use std::future::Future;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pyo3::BoundObject;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tokio::sync::oneshot;

/// Why a bridged call failed: an error of the crate (mapped by `to_py`), or of the binding.
pub(crate) enum Failure {
    Redsem(redsem::Error),
    Runtime(String),
}

impl From<redsem::Error> for Failure {
    fn from(e: redsem::Error) -> Failure {
        Failure::Redsem(e)
    }
}

impl Failure {
    fn into_py(self, py: Python<'_>) -> PyErr {
        match self {
            Failure::Redsem(e) => crate::to_py(py, e),
            Failure::Runtime(text) => PyRuntimeError::new_err(text),
        }
    }
}

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// Whether [`runtime`] was built in this process (or in the parent it was forked from).
pub(crate) fn runtime_started() -> bool {
    RUNTIME.get().is_some()
}

/// The process-wide runtime (multi-thread, one worker per core), built at first use.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("redsem")
            .build()
            .expect("redsem: cannot start the Tokio runtime")
    })
}

/// Set by [`_drain`] at interpreter exit: Tokio threads no longer attach.
static CLOSING: AtomicBool = AtomicBool::new(false);
/// Tokio threads attached, or about to attach, to deliver a result.
static ATTACHED: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` attached to the interpreter from a Tokio thread, unless the interpreter is
/// about to finalise (then `f` is not run, and what it would have delivered is dropped).
fn attach_from_tokio<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    ATTACHED.fetch_add(1, Ordering::SeqCst);
    let out = if CLOSING.load(Ordering::SeqCst) {
        None
    } else {
        Some(Python::attach(f))
    };
    ATTACHED.fetch_sub(1, Ordering::SeqCst);
    out
}

/// `atexit` hook: from now on Tokio threads do not attach, and the attaches in progress are
/// waited for (at most 5 s), with the GIL released so that they can finish.
#[pyfunction]
pub(crate) fn _drain(py: Python<'_>) {
    CLOSING.store(true, Ordering::SeqCst);
    py.detach(|| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while ATTACHED.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// The done-callback of a bridged asyncio future: tells its Tokio task that the future is
/// done (cancelled, or resolved), so that a still-running Rust future is dropped.
#[pyclass(module = "redsem._native")]
pub(crate) struct CancelOnDone {
    tx: Mutex<Option<oneshot::Sender<()>>>,
}

#[pymethods]
impl CancelOnDone {
    fn __call__(&self, _future: &Bound<'_, PyAny>) {
        if let Ok(mut tx) = self.tx.lock()
            && let Some(tx) = tx.take()
        {
            let _ = tx.send(());
        }
    }
}

/// Sets the result or exception of `future` unless it is already done (cancelled): called
/// on the loop's thread through `call_soon_threadsafe`.
#[pyfunction]
pub(crate) fn _complete(
    future: &Bound<'_, PyAny>,
    ok: bool,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    if future.call_method0("done")?.is_truthy()? {
        return Ok(());
    }
    let method = if ok { "set_result" } else { "set_exception" };
    future.call_method1(method, (value,))?;
    Ok(())
}

/// Runs `fut` on the runtime; returns an `asyncio.Future` of the running loop (a
/// `RuntimeError` without one) resolved with its output. Cancelling the asyncio future
/// drops `fut`. `fut` is first polled here, before this returns (without the GIL): calls
/// take effect in the order they were made, two `acquire`s of one loop queue in that order
/// ([`redsem::bindings::start_now`]).
pub(crate) fn spawn<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, Failure>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let fut = py.detach(|| {
        let _runtime = runtime().enter();
        redsem::bindings::start_now(fut)
    });
    let future = event_loop.call_method0("create_future")?;
    let (tx, mut rx) = oneshot::channel::<()>();
    let callback = Bound::new(
        py,
        CancelOnDone {
            tx: Mutex::new(Some(tx)),
        },
    )?;
    future.call_method1("add_done_callback", (callback,))?;
    let complete = py.import("redsem._native")?.getattr("_complete")?.unbind();
    let loop_ref = event_loop.unbind();
    let future_ref = future.clone().unbind();
    runtime().spawn(async move {
        let out = tokio::select! {
            biased;
            _ = &mut rx => None,
            out = fut => Some(out),
        };
        attach_from_tokio(move |py| {
            let Some(out) = out else {
                // Cancelled: drop the references with the GIL held.
                drop((loop_ref, future_ref, complete));
                return;
            };
            let (ok, value) = match out {
                Ok(v) => match v.into_pyobject(py) {
                    Ok(v) => (true, v.into_any().into_bound().unbind()),
                    Err(e) => (false, Into::<PyErr>::into(e).into_value(py).into_any()),
                },
                Err(f) => (false, f.into_py(py).into_value(py).into_any()),
            };
            // A closed loop refuses: the result is dropped (a Permit releases itself).
            let _ = loop_ref.bind(py).call_method1(
                "call_soon_threadsafe",
                (complete.bind(py), future_ref.bind(py), ok, value),
            );
        });
    });
    Ok(future)
}

//! The native half of the npm package `redsem`: napi-rs bindings over the `redsem` crate.
//!
//! This file only converts: JavaScript values to the crate's arguments, the crate's results
//! to JavaScript objects, and [`redsem::Error`] to one JSON-encoded napi error (see
//! `to_js`) that `index.js` turns into an `Error` subclass with a `code`. Every rule of the
//! protocol (leases, renewals, batching, FIFO, fencing) is the crate's. The public API, with
//! its documentation and types, is `index.js` / `index.d.ts`; this module's exports are
//! internal.
//!
//! Each async method runs on napi's Tokio runtime (one per process, shared by every Node.js
//! environment). A waiting `acquire` can be cancelled through a [`CancelToken`]: the crate's
//! future is then dropped, and its cancel safety applies (the ticket leaves the queue, a
//! grant that arrived meanwhile is released).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use napi::bindgen_prelude::*;
use napi_derive::napi;
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------------------
// Errors: the one place where redsem::Error becomes a JavaScript error.

/// Marks the message of a napi error that carries a redsem error as JSON (`index.js`
/// recognises it, parses it and throws the matching `Error` subclass).
const ERROR_TAG: &str = "\u{1}redsem-error:";

/// The JSON fields of one error: its `code`, message, and the variant's fields.
struct JsError {
    code: &'static str,
    message: String,
    fields: Vec<(&'static str, Field)>,
}

enum Field {
    Str(String),
    Num(f64),
    Bool(bool),
}

impl JsError {
    fn new(code: &'static str, message: String) -> JsError {
        JsError {
            code,
            message,
            fields: Vec::new(),
        }
    }
    fn str(mut self, k: &'static str, v: impl Into<String>) -> Self {
        self.fields.push((k, Field::Str(v.into())));
        self
    }
    fn num(mut self, k: &'static str, v: f64) -> Self {
        self.fields.push((k, Field::Num(v)));
        self
    }
    fn into_napi(self) -> napi::Error {
        let mut map = serde_json::Map::new();
        map.insert("code".into(), self.code.into());
        map.insert("message".into(), self.message.into());
        for (k, v) in self.fields {
            let v = match v {
                Field::Str(s) => serde_json::Value::from(s),
                Field::Num(n) => serde_json::Value::from(n),
                Field::Bool(b) => serde_json::Value::from(b),
            };
            map.insert(k.into(), v);
        }
        napi::Error::from_reason(format!("{ERROR_TAG}{}", serde_json::Value::Object(map)))
    }
}

fn lost_reason(r: redsem::LostReason) -> &'static str {
    match r {
        redsem::LostReason::NotHolder => "notHolder",
        redsem::LostReason::Unreachable => "unreachable",
        redsem::LostReason::Shutdown => "shutdown",
        redsem::LostReason::Refused => "refused",
        redsem::LostReason::Deleted => "deleted",
        redsem::LostReason::HandedOff => "handedOff",
        redsem::LostReason::MaxHold => "maxHold",
        redsem::LostReason::Overwritten => "overwritten",
        _ => "unknown",
    }
}

fn no_permits_reason(r: redsem::NoPermitsReason) -> &'static str {
    match r {
        redsem::NoPermitsReason::NoneFree => "noneFree",
        redsem::NoPermitsReason::QueuedFirst => "queuedFirst",
        redsem::NoPermitsReason::LocalCap => "localCap",
        _ => "unknown",
    }
}

/// The JavaScript form of a redsem error: a `code` per variant (`index.js` has the class
/// of each), the crate's message, the semaphore's name where the error has one, and the
/// variant's fields.
fn to_js(e: redsem::Error) -> napi::Error {
    use redsem::Error as E;
    let message = e.to_string();
    let retryable = e.is_retryable();
    let js = match &e {
        E::InvalidArgument(_) => JsError::new("ERR_REDSEM_INVALID_ARGUMENT", message),
        E::LimitConflict {
            requested, stored, ..
        } => JsError::new("ERR_REDSEM_LIMIT_CONFLICT", message)
            .num("requested", f64::from(*requested))
            .num("stored", f64::from(*stored)),
        E::TooManyPermits {
            requested, limit, ..
        } => JsError::new("ERR_REDSEM_TOO_MANY_PERMITS", message)
            .num("requested", f64::from(*requested))
            .num("limit", f64::from(*limit)),
        E::NoPermits { reason, .. } => {
            JsError::new("ERR_REDSEM_NO_PERMITS", message).str("reason", no_permits_reason(*reason))
        }
        E::Timeout { timeout, .. } => JsError::new("ERR_REDSEM_TIMEOUT", message)
            .num("timeoutMs", timeout.as_secs_f64() * 1000.0),
        E::LeaseLost { reason, .. } => {
            JsError::new("ERR_REDSEM_LEASE_LOST", message).str("reason", lost_reason(*reason))
        }
        E::RemovedFromQueue { .. } => JsError::new("ERR_REDSEM_REMOVED_FROM_QUEUE", message),
        E::HandoffGone { holder_id, .. } => {
            JsError::new("ERR_REDSEM_HANDOFF_GONE", message).str("holderId", holder_id.clone())
        }
        E::Closed { .. } => JsError::new("ERR_REDSEM_CLOSED", message),
        E::UnknownSemaphore { prefix, .. } => {
            JsError::new("ERR_REDSEM_UNKNOWN_SEMAPHORE", message).str("prefix", prefix.clone())
        }
        E::InUse {
            holders, waiters, ..
        } => JsError::new("ERR_REDSEM_IN_USE", message)
            .num("holders", f64::from(*holders))
            .num("waiters", f64::from(*waiters)),
        E::WrongType { .. } => JsError::new("ERR_REDSEM_WRONG_TYPE", message),
        E::NotASemaphore { .. } => JsError::new("ERR_REDSEM_NOT_A_SEMAPHORE", message),
        E::ProtocolMismatch { .. } => JsError::new("ERR_REDSEM_PROTOCOL_MISMATCH", message),
        E::Corrupt { .. } => JsError::new("ERR_REDSEM_CORRUPT", message),
        E::EvictingPolicy { policy, .. } => {
            JsError::new("ERR_REDSEM_EVICTING_POLICY", message).str("policy", policy.clone())
        }
        E::NoPermission(_) => JsError::new("ERR_REDSEM_NO_PERMISSION", message),
        E::Auth(_) => JsError::new("ERR_REDSEM_AUTH", message),
        E::NotReplicated {
            acked,
            wanted,
            timeout,
            ..
        } => JsError::new("ERR_REDSEM_NOT_REPLICATED", message)
            .num("acked", f64::from(*acked))
            .num("wanted", f64::from(*wanted))
            .num("timeoutMs", timeout.as_secs_f64() * 1000.0),
        E::Unreachable(_) => JsError::new("ERR_REDSEM_UNREACHABLE", message),
        E::Backend(_) => JsError::new("ERR_REDSEM_BACKEND", message),
        // a variant added to the crate later: the generic class until it gets its own
        _ => JsError::new("ERR_REDSEM", message),
    };
    let mut js = js;
    if let Some(name) = e.semaphore() {
        js = js.str("semaphore", name);
    }
    js.fields.push(("retryable", Field::Bool(retryable)));
    js.into_napi()
}

/// `InvalidArgument` for a JavaScript value the crate's types cannot hold.
fn invalid(message: String) -> napi::Error {
    to_js(redsem::Error::InvalidArgument(message))
}

/// Runs `fut` on napi-rs's runtime and returns its promise, `fut` first polled here, before
/// this returns: a call takes effect in the order it was made (two `acquire`s of one event
/// loop queue in that order), not when a runtime worker first runs its task
/// ([`redsem::bindings::start_now`]).
fn start<'env, T, F>(env: &'env Env, fut: F) -> Result<PromiseRaw<'env, T>>
where
    T: ToNapiValue + Send + 'static,
    F: std::future::Future<Output = Result<T>> + Send + 'static,
{
    let started = within_runtime_if_available(|| redsem::bindings::start_now(fut));
    env.spawn_future(started)
}

/// An acquisition cancelled through its [`CancelToken`] (`index.js` rejects with the
/// `AbortSignal`'s reason instead).
fn aborted() -> napi::Error {
    JsError::new("ABORT_ERR", "the operation was aborted".into()).into_napi()
}

/// A limit from JavaScript, checked by the library (one wording for every path, negative and
/// huge values included).
fn to_limit(v: f64) -> Result<u32> {
    if v.fract() != 0.0 || !v.is_finite() {
        return Err(invalid(format!(
            "limit must be a whole number in 1..={}, not {v}",
            redsem::MAX_LIMIT
        )));
    }
    // (a saturating cast: beyond i64 the value is out of range all the same)
    redsem::check_limit(v as i64).map_err(to_js)
}

fn to_u32(what: &str, v: f64) -> Result<u32> {
    if v.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&v) {
        Ok(v as u32)
    } else {
        Err(invalid(format!(
            "{what} must be a whole number between 0 and {}, not {v}",
            u32::MAX
        )))
    }
}

/// How many entries a snapshot lists: `redsem::STATS_LISTED` when not given (the library
/// refuses more than `MAX_LISTED`).
fn to_listed(v: Option<f64>) -> Result<usize> {
    v.map_or(Ok(redsem::STATS_LISTED), |v| {
        to_u32("listed", v).map(|n| n as usize)
    })
}

fn to_i64(what: &str, v: f64) -> Result<i64> {
    // 2^53: the largest range where every whole number is exact in a JavaScript number
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if v.fract() == 0.0 && (-EXACT..=EXACT).contains(&v) {
        Ok(v as i64)
    } else {
        Err(invalid(format!("{what} must be a whole number, not {v}")))
    }
}

/// Milliseconds from JavaScript; the crate checks the range it accepts.
fn to_duration(what: &str, ms: f64) -> Result<Duration> {
    if !ms.is_finite() || ms < 0.0 {
        return Err(invalid(format!(
            "{what} must be a finite number of milliseconds >= 0, not {ms}"
        )));
    }
    Duration::try_from_secs_f64(ms / 1000.0)
        .map_err(|_| invalid(format!("{what} {ms} ms is out of range")))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn parse_fence(s: &str) -> Result<redsem::Fence> {
    let bad = || {
        invalid(format!(
            "fence {s:?} is not of the form \"slot:generation\" (e.g. \"3:1712345678901234\")"
        ))
    };
    let (slot, generation) = s.split_once(':').ok_or_else(bad)?;
    Ok(redsem::Fence {
        slot: slot.parse().map_err(|_| bad())?,
        generation: generation.parse().map_err(|_| bad())?,
    })
}

// ---------------------------------------------------------------------------------------
// Cancellation

/// A cancellation handle for one native call: `index.js` makes one per `acquire` with an
/// `AbortSignal` and cancels it when the signal fires.
#[napi]
pub struct CancelToken {
    token: CancellationToken,
}

#[napi]
impl CancelToken {
    #[napi(constructor)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> CancelToken {
        CancelToken {
            token: CancellationToken::new(),
        }
    }

    /// Cancels the call: its future is dropped at its next poll.
    #[napi]
    pub fn cancel(&self) {
        self.token.cancel();
    }
}

// ---------------------------------------------------------------------------------------
// Client

/// Options of `connect` (see index.d.ts `ConnectOptions`).
#[napi(object)]
pub struct ConnectOptions {
    pub prefix: Option<String>,
    pub connect_timeout_ms: Option<f64>,
    pub response_timeout_ms: Option<f64>,
    pub tls_ca: Option<String>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
    pub tls_ca_pem: Option<String>,
    pub tls_cert_pem: Option<String>,
    pub tls_key_pem: Option<String>,
    pub synced_replicas: Option<f64>,
    pub synced_timeout_ms: Option<f64>,
    pub scripts_only: Option<bool>,
}

/// Connects a client (`redsem.connect`).
#[napi]
pub async fn connect(url: String, options: Option<ConnectOptions>) -> Result<Client> {
    let mut b = redsem::Client::builder(url);
    if let Some(o) = options {
        if let Some(p) = o.prefix {
            b = b.prefix(p);
        }
        if let Some(t) = o.connect_timeout_ms {
            b = b.connect_timeout(to_duration("connectTimeoutMs", t)?);
        }
        if let Some(t) = o.response_timeout_ms {
            b = b.response_timeout(to_duration("responseTimeoutMs", t)?);
        }
        if let Some(p) = o.tls_ca {
            b = b.tls_ca(p);
        }
        if let Some(p) = o.tls_cert {
            b = b.tls_cert(p);
        }
        if let Some(p) = o.tls_key {
            b = b.tls_key(p);
        }
        if let Some(p) = o.tls_ca_pem {
            b = b.tls_ca_pem(p);
        }
        if let Some(p) = o.tls_cert_pem {
            b = b.tls_cert_pem(p);
        }
        if let Some(p) = o.tls_key_pem {
            b = b.tls_key_pem(p);
        }
        match (o.synced_replicas, o.synced_timeout_ms) {
            (None, None) => {}
            (Some(n), Some(t)) => {
                b = b.synced_replicas(
                    to_u32("syncedReplicas", n)?,
                    to_duration("syncedTimeoutMs", t)?,
                )
            }
            _ => {
                return Err(invalid(
                    "synced mode needs both syncedReplicas and syncedTimeoutMs".into(),
                ));
            }
        }
        if let Some(s) = o.scripts_only {
            b = b.scripts_only(s);
        }
    }
    let inner = b.build().await.map_err(to_js)?;
    Ok(Client { inner })
}

/// A connected client (see index.d.ts `Client`).
#[napi]
pub struct Client {
    inner: redsem::Client,
}

/// Options of `Client.semaphore` (see index.d.ts `SemaphoreOptions`).
#[napi(object)]
pub struct SemaphoreOptions {
    pub limit: f64,
    pub lease_ms: Option<f64>,
    pub renew_every_ms: Option<f64>,
    pub fallback_poll_ms: Option<f64>,
    pub local_cap: Option<f64>,
    pub label: Option<String>,
    pub allow_evicting_policy: Option<bool>,
    pub limit_policy: Option<String>,
}

#[napi]
impl Client {
    #[napi(getter)]
    pub fn prefix(&self) -> String {
        self.inner.prefix().to_owned()
    }

    #[napi(getter)]
    pub fn id(&self) -> String {
        self.inner.id().to_owned()
    }

    #[napi(getter)]
    pub fn is_closed(&self) -> bool {
        self.inner.is_shut_down()
    }

    #[napi]
    pub async fn ping(&self) -> Result<()> {
        let c = self.inner.clone();
        c.ping().await.map_err(to_js)
    }

    #[napi]
    pub async fn semaphore(&self, name: String, options: SemaphoreOptions) -> Result<Semaphore> {
        let mut b = self.inner.semaphore(name, to_limit(options.limit)?);
        if let Some(l) = options.lease_ms {
            b = b.lease(to_duration("leaseMs", l)?);
        }
        if let Some(r) = options.renew_every_ms {
            b = b.renew_every(to_duration("renewEveryMs", r)?);
        }
        if let Some(f) = options.fallback_poll_ms {
            b = b.fallback_poll(to_duration("fallbackPollMs", f)?);
        }
        if let Some(c) = options.local_cap {
            b = b.local_cap(to_u32("localCap", c)?);
        }
        if let Some(l) = options.label {
            b = b.label(l);
        }
        if let Some(a) = options.allow_evicting_policy {
            b = b.allow_evicting_policy(a);
        }
        if let Some(p) = options.limit_policy {
            b = b.limit_policy(match p.as_str() {
                "require" => redsem::LimitPolicy::Require,
                "adopt" => redsem::LimitPolicy::Adopt,
                "createOrAdopt" => redsem::LimitPolicy::CreateOrAdopt,
                "resize" => redsem::LimitPolicy::Resize,
                other => {
                    return Err(to_js(redsem::Error::InvalidArgument(format!(
                        "limitPolicy {other:?}: use 'require', 'adopt', 'createOrAdopt' or 'resize'"
                    ))));
                }
            });
        }
        let inner = b.open().await.map_err(to_js)?;
        Ok(Semaphore { inner })
    }

    #[napi]
    pub async fn close(&self) {
        let c = self.inner.clone();
        c.shutdown().await;
    }

    #[napi]
    pub async fn flush_releases(&self) {
        let c = self.inner.clone();
        c.flush_releases().await;
    }

    #[napi]
    pub async fn list_semaphores(&self) -> Result<Vec<String>> {
        let c = self.inner.clone();
        c.list_semaphores().await.map_err(to_js)
    }

    /// `Client::load_library`: the library's name, `redsem_<hash>`.
    #[napi]
    pub async fn load_library(&self) -> Result<String> {
        let c = self.inner.clone();
        c.load_library().await.map_err(to_js)
    }

    /// `Client::inspect_listing`: at most `listed` (default 100) holders and waiters listed.
    #[napi]
    pub async fn inspect(&self, name: String, listed: Option<f64>) -> Result<Stats> {
        let c = self.inner.clone();
        let listed = to_listed(listed)?;
        c.inspect_listing(&name, listed)
            .await
            .map(Stats::from)
            .map_err(to_js)
    }

    #[napi]
    pub async fn resize_existing(&self, name: String, limit: f64) -> Result<Resized> {
        let c = self.inner.clone();
        let limit = to_limit(limit)?;
        c.resize_existing(&name, limit)
            .await
            .map(Resized::from)
            .map_err(to_js)
    }

    /// `"holder"`, `"waiter"`, or `null` when there was no such entry.
    #[napi]
    pub async fn force_release_existing(
        &self,
        name: String,
        holder_id: String,
    ) -> Result<Option<&'static str>> {
        let c = self.inner.clone();
        let found = c
            .force_release_existing(&name, &holder_id)
            .await
            .map_err(to_js)?;
        Ok(match found {
            redsem::ForceReleased::Holder => Some("holder"),
            redsem::ForceReleased::Waiter => Some("waiter"),
            _ => None,
        })
    }

    #[napi]
    pub async fn add_permits_existing(&self, name: String, delta: f64) -> Result<Resized> {
        let c = self.inner.clone();
        let delta = to_i64("delta", delta)?;
        c.add_permits_existing(&name, delta)
            .await
            .map(Resized::from)
            .map_err(to_js)
    }

    #[napi]
    pub async fn purge_keys(&self, name: String) -> Result<u32> {
        let c = self.inner.clone();
        c.purge_keys(&name).await.map_err(to_js)
    }

    #[napi]
    pub async fn delete_semaphore(&self, name: String, force: bool) -> Result<u32> {
        let c = self.inner.clone();
        c.delete_semaphore(&name, force).await.map_err(to_js)
    }

    #[napi]
    pub fn fenced_store(&self, fence_key: String) -> FencedStore {
        FencedStore {
            inner: redsem::fencing::FencedStore::new(&self.inner, fence_key),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Semaphore

/// Options of one acquisition (see index.d.ts `AcquireOptions`).
#[napi(object)]
pub struct AcquireOptions {
    pub permits: Option<f64>,
    pub timeout_ms: Option<f64>,
    pub lease_ms: Option<f64>,
    pub label: Option<String>,
    pub priority: Option<f64>,
    pub max_hold_ms: Option<f64>,
}

impl AcquireOptions {
    fn into_rust(self, try_only: bool) -> Result<redsem::AcquireOptions> {
        let mut o = redsem::AcquireOptions::new().try_only(try_only);
        if let Some(n) = self.permits {
            o = o.permits(to_u32("permits", n)?);
        }
        if let Some(t) = self.timeout_ms {
            o = o.timeout(to_duration("timeoutMs", t)?);
        }
        if let Some(l) = self.lease_ms {
            o = o.lease(to_duration("leaseMs", l)?);
        }
        if let Some(l) = self.label {
            o = o.label(l);
        }
        if let Some(p) = self.priority {
            // (the library refuses a class above MAX_PRIORITY, in its one wording)
            if p.fract() != 0.0 || !(0.0..=255.0).contains(&p) {
                return Err(invalid(format!(
                    "priority {p} is outside 0..={}",
                    redsem::MAX_PRIORITY
                )));
            }
            o = o.priority(p as u8);
        }
        if let Some(m) = self.max_hold_ms {
            o = o.max_hold(to_duration("maxHoldMs", m)?);
        }
        Ok(o)
    }
}

/// An open semaphore handle (see index.d.ts `Semaphore`).
#[napi]
pub struct Semaphore {
    inner: redsem::Semaphore,
}

/// `(holders, waiters)` of this handle in this process.
#[napi(object)]
pub struct LocalCounts {
    pub holders: u32,
    pub waiters: u32,
}

#[napi]
impl Semaphore {
    #[napi(getter)]
    pub fn name(&self) -> String {
        self.inner.name().to_owned()
    }

    #[napi(getter)]
    pub fn limit(&self) -> u32 {
        self.inner.limit()
    }

    #[napi(getter)]
    pub fn available_permits(&self) -> u32 {
        self.inner.available_permits()
    }

    #[napi(getter)]
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    #[napi]
    pub fn local_counts(&self) -> LocalCounts {
        let (holders, waiters) = self.inner.local_counts();
        LocalCounts {
            holders: holders as u32,
            waiters: waiters as u32,
        }
    }

    /// `acquire` (`tryOnly` false) or `tryAcquire` (true), cancelled by `cancel`. Takes its
    /// place in the queue before it returns (`start`): two calls queue in call order.
    #[napi(ts_return_type = "Promise<Permit>")]
    pub fn acquire<'env>(
        &self,
        env: &'env Env,
        options: Option<AcquireOptions>,
        try_only: bool,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'env, Permit>> {
        let options = match options {
            Some(o) => o.into_rust(try_only)?,
            None => redsem::AcquireOptions::new().try_only(try_only),
        };
        let sem = self.inner.clone();
        let token = cancel.map(|c| c.token.clone()).unwrap_or_default();
        start(env, async move {
            let permit = tokio::select! {
                biased;
                _ = token.cancelled() => return Err(aborted()),
                p = sem.acquire_with(options) => p.map_err(to_js)?,
            };
            Ok(Permit::new(permit))
        })
    }

    /// `Semaphore::stats_listing`: at most `listed` (default 100) holders and waiters listed.
    #[napi]
    pub async fn stats(&self, listed: Option<f64>) -> Result<Stats> {
        let s = self.inner.clone();
        let listed = to_listed(listed)?;
        s.stats_listing(listed)
            .await
            .map(Stats::from)
            .map_err(to_js)
    }

    #[napi]
    pub async fn resize(&self, limit: f64) -> Result<Resized> {
        let s = self.inner.clone();
        let limit = to_limit(limit)?;
        s.resize(limit).await.map(Resized::from).map_err(to_js)
    }

    #[napi]
    pub async fn add_permits(&self, delta: f64) -> Result<Resized> {
        let s = self.inner.clone();
        let delta = to_i64("delta", delta)?;
        s.add_permits(delta).await.map(Resized::from).map_err(to_js)
    }

    #[napi]
    pub async fn force_release(&self, holder_id: String) -> Result<bool> {
        let s = self.inner.clone();
        s.force_release(&holder_id).await.map_err(to_js)
    }

    /// `Semaphore::adopt` of a hand-off token's text.
    #[napi]
    pub async fn adopt(&self, token: String) -> Result<Permit> {
        let token: redsem::HandoffToken = token.parse().map_err(to_js)?;
        let s = self.inner.clone();
        s.adopt(&token).await.map(Permit::new).map_err(to_js)
    }

    /// `Semaphore::release_handoff` of a hand-off token's text.
    #[napi]
    pub async fn release_handoff(&self, token: String) -> Result<bool> {
        let token: redsem::HandoffToken = token.parse().map_err(to_js)?;
        let s = self.inner.clone();
        s.release_handoff(&token).await.map_err(to_js)
    }

    #[napi]
    pub fn close(&self) {
        self.inner.close();
    }
}

// ---------------------------------------------------------------------------------------
// Permit

/// A held permit (see index.d.ts `Permit`). The crate's permit lives here until `release`,
/// `detach`, or the JavaScript object is garbage-collected (which drops it: the crate then
/// releases it in the background).
#[napi]
pub struct Permit {
    held: Arc<Mutex<Option<redsem::Permit>>>,
    /// Cancelled when the permit is released or detached: ends `watchLost`.
    done: CancellationToken,
    semaphore: String,
    holder_id: String,
    ticket: i64,
    slots: Vec<u32>,
    fences: Vec<String>,
    num_permits: u32,
}

impl Permit {
    fn new(p: redsem::Permit) -> Permit {
        Permit {
            semaphore: p.semaphore().to_owned(),
            holder_id: p.holder_id().to_owned(),
            ticket: p.ticket() as i64,
            slots: p.slots(),
            fences: p.fences().iter().map(ToString::to_string).collect(),
            num_permits: p.num_permits(),
            done: CancellationToken::new(),
            held: Arc::new(Mutex::new(Some(p))),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&redsem::Permit) -> T) -> Option<T> {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(f)
    }

    fn take(&self) -> Option<redsem::Permit> {
        let p = self.held.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.done.cancel();
        p
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        // garbage-collected while held: the crate's Drop releases in the background
        self.done.cancel();
    }
}

#[napi]
impl Permit {
    #[napi(getter)]
    pub fn semaphore(&self) -> String {
        self.semaphore.clone()
    }

    #[napi(getter)]
    pub fn holder_id(&self) -> String {
        self.holder_id.clone()
    }

    #[napi(getter)]
    pub fn ticket(&self) -> i64 {
        self.ticket
    }

    #[napi(getter)]
    pub fn num_permits(&self) -> u32 {
        self.num_permits
    }

    #[napi(getter)]
    pub fn slots(&self) -> Vec<u32> {
        self.slots.clone()
    }

    #[napi(getter)]
    pub fn fences(&self) -> Vec<String> {
        self.fences.clone()
    }

    /// Whether it was released or detached.
    #[napi(getter)]
    pub fn is_released(&self) -> bool {
        self.with(|_| ()).is_none()
    }

    #[napi(getter)]
    pub fn is_lost(&self) -> bool {
        self.with(redsem::Permit::is_lost).unwrap_or(false)
    }

    #[napi(getter)]
    pub fn lost_reason(&self) -> Option<&'static str> {
        self.with(|p| p.lost_reason().map(lost_reason)).flatten()
    }

    #[napi(getter)]
    pub fn lease_left_ms(&self) -> f64 {
        self.with(|p| ms(p.lease_left())).unwrap_or(0.0)
    }

    #[napi(getter)]
    pub fn lease_ms(&self) -> f64 {
        self.with(|p| ms(p.lease())).unwrap_or(0.0)
    }

    /// Resolves once the lease is lost with the error that says so (the tagged message of
    /// a `LeaseLostError`, see `to_js`), or with `null` once the permit is released or
    /// detached (so that a pending watch never keeps Node.js alive past them).
    #[napi]
    pub async fn watch_lost(&self) -> Option<String> {
        // `Permit::lost` borrows the permit (edition-2024 capture), so wait on its token,
        // which is cancelled at the same moment, and read the reason then
        let token = self.with(redsem::Permit::cancellation_token)?;
        let done = self.done.clone();
        let reason = tokio::select! {
            biased;
            // gone from `held` means released (its release may cancel the token too)
            _ = token.cancelled() => self.with(|p| p.lost_reason())?,
            _ = done.cancelled() => return None,
        }?;
        Some(self.lost_message(reason))
    }

    /// The error `watchLost` resolves with, now: `null` while the permit is not lost (or
    /// once it is released or detached). Lets `permit.signal` be aborted at once when it is
    /// first read after the loss.
    #[napi]
    pub fn lost_error(&self) -> Option<String> {
        let reason = self.with(|p| p.lost_reason())??;
        Some(self.lost_message(reason))
    }

    /// The tagged message of the `LeaseLostError` for `reason`: the crate's own message of
    /// Error::LeaseLost (which it builds only inside).
    fn lost_message(&self, reason: redsem::LostReason) -> String {
        let js = JsError::new(
            "ERR_REDSEM_LEASE_LOST",
            format!(
                "semaphore {:?}: the slot was lost: {reason}",
                self.semaphore
            ),
        )
        .str("reason", lost_reason(reason))
        .str("semaphore", self.semaphore.clone());
        js.into_napi().reason
    }

    #[napi]
    pub async fn set_lease(&self, lease_ms: f64) -> Result<()> {
        let lease = to_duration("leaseMs", lease_ms)?;
        // the crate's set_lease needs the permit itself: take it out for the call
        let held = self.held.clone();
        let Some(mut p) = held.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Err(self.released_error());
        };
        let r = p.set_lease(lease).await;
        *held.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        r.map_err(to_js)
    }

    /// Releases and waits for Redis to confirm; a no-op once released or detached.
    #[napi]
    pub async fn release(&self) -> Result<()> {
        match self.take() {
            Some(p) => p.release().await.map_err(to_js),
            None => Ok(()),
        }
    }

    #[napi]
    pub fn detach(&self) {
        if let Some(p) = self.take() {
            p.detach();
        }
    }

    /// `Permit::export`: the hand-off token's text; the permit counts as released here.
    #[napi]
    pub async fn export(&self) -> Result<String> {
        match self.take() {
            Some(p) => p.export().await.map(|t| t.to_string()).map_err(to_js),
            None => Err(invalid(format!(
                "the permit {} of semaphore {:?} was already released, detached or exported",
                self.holder_id, self.semaphore
            ))),
        }
    }
}

impl Permit {
    fn released_error(&self) -> napi::Error {
        invalid(format!(
            "the permit {} of semaphore {:?} was already released or detached",
            self.holder_id, self.semaphore
        ))
    }
}

// ---------------------------------------------------------------------------------------
// Stats

/// A holder in `Stats` (index.d.ts `HolderInfo`).
#[napi(object)]
pub struct HolderInfo {
    pub id: String,
    pub label: String,
    pub permits: u32,
    pub slots: Vec<u32>,
    pub fences: Vec<String>,
    pub held_ms: f64,
    pub lease_left_ms: f64,
}

/// A waiter in `Stats` (index.d.ts `WaiterInfo`).
#[napi(object)]
pub struct WaiterInfo {
    pub id: String,
    pub label: String,
    pub permits: u32,
    pub position: u32,
    pub ticket: i64,
    pub priority: u32,
    pub waited_ms: f64,
    pub lease_left_ms: f64,
}

/// What a change of the limit did (index.d.ts `Resized`).
#[napi(object)]
pub struct Resized {
    pub previous: u32,
    pub limit: u32,
    pub rejected: Vec<RejectedWaiter>,
}

/// A queued request a shrink rejected (index.d.ts `RejectedWaiter`).
#[napi(object)]
pub struct RejectedWaiter {
    pub id: String,
    pub permits: u32,
    pub label: String,
}

impl From<redsem::Resized> for Resized {
    fn from(r: redsem::Resized) -> Resized {
        Resized {
            previous: r.previous,
            limit: r.limit,
            rejected: r
                .rejected
                .into_iter()
                .map(|w| RejectedWaiter {
                    id: w.id,
                    permits: w.permits,
                    label: w.label,
                })
                .collect(),
        }
    }
}

/// A snapshot of one semaphore (index.d.ts `Stats`).
#[napi(object)]
pub struct Stats {
    pub name: String,
    pub limit: u32,
    pub in_use: u32,
    pub available: u32,
    pub holders: Vec<HolderInfo>,
    pub waiters: Vec<WaiterInfo>,
    pub holder_count: u32,
    pub waiter_count: u32,
    pub grants_total: i64,
    pub expired_total: i64,
    pub repairs_total: i64,
    pub server_time_ms: i64,
}

impl From<redsem::Stats> for Stats {
    fn from(s: redsem::Stats) -> Stats {
        Stats {
            holders: s
                .holders
                .into_iter()
                .map(|h| HolderInfo {
                    slots: h.fences.iter().map(|f| f.slot).collect(),
                    fences: h.fences.iter().map(ToString::to_string).collect(),
                    id: h.id,
                    label: h.label,
                    permits: h.permits,
                    held_ms: ms(h.held),
                    lease_left_ms: ms(h.lease_left),
                })
                .collect(),
            waiters: s
                .waiters
                .into_iter()
                .map(|w| WaiterInfo {
                    id: w.id,
                    label: w.label,
                    permits: w.permits,
                    position: w.position as u32,
                    ticket: w.ticket as i64,
                    priority: u32::from(w.priority),
                    waited_ms: ms(w.waited),
                    lease_left_ms: ms(w.lease_left),
                })
                .collect(),
            holder_count: s.holder_count as u32,
            waiter_count: s.waiter_count as u32,
            name: s.name,
            limit: s.limit,
            in_use: s.in_use,
            available: s.available,
            grants_total: s.grants_total as i64,
            expired_total: s.expired_total as i64,
            repairs_total: s.repairs_total as i64,
            server_time_ms: s.server_time_ms as i64,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Fencing

/// The crate's `redsem::fencing::FencedStore` (index.d.ts `FencedStore`).
#[napi]
pub struct FencedStore {
    inner: redsem::fencing::FencedStore,
}

#[napi]
impl FencedStore {
    #[napi]
    pub async fn check(&self, fence: String) -> Result<bool> {
        let fence = parse_fence(&fence)?;
        let s = self.inner.clone();
        s.check(fence).await.map_err(to_js)
    }

    #[napi]
    pub async fn write(&self, fence: String, key: String, value: Buffer) -> Result<bool> {
        let fence = parse_fence(&fence)?;
        let s = self.inner.clone();
        let value = value.to_vec();
        s.write(fence, &key, &value).await.map_err(to_js)
    }
}

// ---------------------------------------------------------------------------------------
// The CLI

/// Runs the `redsem` command line in this process (`npx redsem …`): `args` are the words
/// after the program name. Blocks the calling thread until the command is done (the CLI
/// builds its own runtime) and returns its exit status.
///
/// The process becomes the command line, as the standalone binary, so two things Node.js
/// set up at start are undone first:
/// - Node.js opens the standard streams (fds 0–2) close-on-exec; the CLI's `run` hands
///   them to the command it starts, so that flag is cleared;
/// - Node.js handles SIGINT and SIGTERM itself (it restores the terminal and dies of the
///   signal), which would kill the process before the CLI forwards the signal to its
///   command and releases: their default dispositions are restored, and the CLI installs
///   its own handlers, as in the binary.
#[napi]
pub fn cli_main(args: Vec<String>) -> u32 {
    #[cfg(unix)]
    become_the_cli();
    let argv = std::iter::once("redsem".to_owned()).chain(args);
    u32::from(redsem_cli::main(argv))
}

#[cfg(unix)]
fn become_the_cli() {
    for fd in 0..=2 {
        // SAFETY: fcntl on a descriptor number only reads and sets its flags; an fd that is
        // not open makes it fail with EBADF, which is ignored
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC != 0 {
                libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            }
        }
    }
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: restores the default disposition, before any handler of the CLI exists;
        // no other thread of this process relies on Node.js's handlers from here on
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
}

//! The `redsem` library (crates/redsem) as a design, used exactly as its documentation shows:
//! one [`redsem::Client`] per process (two connections: commands and RESP3 pushes), one
//! semaphore handle (one per semaphore with the worker's `--semaphores`) opened with the
//! contract's limit and lease, every other setting at the
//! library's defaults (renewal every lease/3, 1 s fallback poll). The worker releases with
//! [`redsem::Permit::release`]`.await`, so `done_ns` is after the release round trip.

use std::time::Duration;

use super::{AcquireError, Params};

/// How long a synced grant waits for its replicas (the `synced` scenario).
pub const SYNCED_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether the library's design can run.
pub const AVAILABLE: bool = true;

/// Top-level commands the library's clients send besides script calls (see
/// [`DesignKind::sent_commands`](super::DesignKind::sent_commands)): the notifier's
/// (un)subscriptions, and in synced mode the `WAIT` after each grant's confirmation (never
/// sent otherwise). Every state change is a script call (`EVALSHA`, `EVAL` or `SCRIPT LOAD`
/// after a NOSCRIPT); its health-check `PING`s are not the semaphore's work.
pub const TOP_LEVEL: &[&str] = &["subscribe", "unsubscribe", "wait"];

/// The library's permit.
pub type RedsemPermit = redsem::Permit;

/// A `redsem` semaphore handle and the client it belongs to.
pub struct RedsemSemaphore {
    _client: redsem::Client,
    sem: redsem::Semaphore,
}

impl RedsemSemaphore {
    /// Connects the client and opens the semaphore (SUBSCRIBE + one script).
    /// With `scripts`, the client runs the scripts instead of the Functions library.
    pub async fn open(p: &Params, scripts: bool) -> anyhow::Result<Self> {
        let client = Self::client(p, scripts).await?;
        Self::open_with(&client, p).await
    }

    /// The process's client; with `synced_replicas` > 0 in synced mode (1 s to acknowledge).
    async fn client(p: &Params, scripts: bool) -> anyhow::Result<redsem::Client> {
        let mut b = redsem::Client::builder(p.redis_url.as_str()).scripts_only(scripts);
        if p.synced_replicas > 0 {
            b = b.synced_replicas(p.synced_replicas, SYNCED_TIMEOUT);
        }
        Ok(b.build().await?)
    }

    /// Opens one semaphore per name through one client, as a process that uses many
    /// semaphores would.
    pub async fn open_many(
        p: &Params,
        names: &[String],
        scripts: bool,
    ) -> anyhow::Result<Vec<Self>> {
        let client = Self::client(p, scripts).await?;
        let mut sems = Vec::with_capacity(names.len());
        for name in names {
            let p = Params {
                name: name.clone(),
                ..p.clone()
            };
            sems.push(Self::open_with(&client, &p).await?);
        }
        Ok(sems)
    }

    async fn open_with(client: &redsem::Client, p: &Params) -> anyhow::Result<Self> {
        let sem = client
            .semaphore(p.name.as_str(), p.limit)
            .lease(Duration::from_millis(p.lease_ms))
            .open()
            .await?;
        Ok(RedsemSemaphore {
            _client: client.clone(),
            sem,
        })
    }

    /// `sem.acquire().await`.
    pub async fn acquire(&self) -> Result<RedsemPermit, AcquireError> {
        self.sem
            .acquire()
            .await
            .map_err(|e| AcquireError::Other(e.into()))
    }

    /// `permit.release().await`.
    pub async fn release(&self, permit: RedsemPermit) -> anyhow::Result<()> {
        permit.release().await?;
        Ok(())
    }

    /// Closes the handle; the client's tasks stop when it is dropped.
    pub async fn close(self) {
        self.sem.close();
    }
}

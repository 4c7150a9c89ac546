//! The `redsem` library as a design (placeholder until the library's API exists).

use super::{AcquireError, Params};

/// Whether the library's design can run (false until `crates/redsem` has its API).
pub const AVAILABLE: bool = false;

/// Top-level commands the library's clients send besides script calls (see
/// [`DesignKind::sent_commands`](super::DesignKind::sent_commands)).
pub const TOP_LEVEL: &[&str] = &[];

/// The library's permit.
pub struct RedsemPermit(());

/// A `redsem` semaphore.
pub struct RedsemSemaphore(());

impl RedsemSemaphore {
    /// Not available yet.
    pub async fn open(_p: &Params) -> anyhow::Result<Self> {
        anyhow::bail!("redsem design not yet available")
    }

    /// Not available yet.
    pub async fn acquire(&self) -> Result<RedsemPermit, AcquireError> {
        Err(AcquireError::Other(anyhow::anyhow!(
            "redsem design not yet available"
        )))
    }

    /// Not available yet.
    pub async fn release(&self, _permit: RedsemPermit) -> anyhow::Result<()> {
        anyhow::bail!("redsem design not yet available")
    }

    /// Nothing to stop.
    pub async fn close(self) {}
}

//! [`LossSignal`]: how a permit learns that it was lost. The lease's clock lives in the
//! handle's state ([`HandleState`](crate::core::HandleState)); this is only the news.

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::LostReason;

/// The loss of one permit, shared by the permit and the handle's state: a watch of the
/// reason (first one wins) and a token cancelled with it (`Permit::run`, `Permit::token`).
pub(crate) struct LossSignal {
    lost_tx: watch::Sender<Option<LostReason>>,
    token: CancellationToken,
}

impl LossSignal {
    pub(crate) fn new() -> LossSignal {
        LossSignal {
            lost_tx: watch::Sender::new(None),
            token: CancellationToken::new(),
        }
    }

    /// Marks the permit lost (the first reason wins) and cancels its token.
    pub(crate) fn lose(&self, reason: LostReason) {
        self.lost_tx.send_if_modified(|v| {
            if v.is_none() {
                *v = Some(reason);
                true
            } else {
                false
            }
        });
        self.token.cancel();
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    /// Why it was lost, once it was.
    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        *self.lost_tx.borrow()
    }

    /// Follows the loss (`None` until it is lost).
    pub(crate) fn lost_receiver(&self) -> watch::Receiver<Option<LostReason>> {
        self.lost_tx.subscribe()
    }

    /// The token cancelled when the permit is lost.
    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_reason_wins_and_the_token_is_cancelled() {
        let s = LossSignal::new();
        assert!(!s.is_lost() && !s.token().is_cancelled());
        s.lose(LostReason::Unreachable);
        s.lose(LostReason::NotHolder);
        assert_eq!(s.lost_reason(), Some(LostReason::Unreachable));
        assert!(s.token().is_cancelled());
    }
}

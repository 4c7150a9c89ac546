//! [`ReleaseCombiner`]: the in-place releases of one handle, combined into few calls.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::remote::{Calls, Remote};
use crate::error::CallResult;
use crate::protocol::Removal;

/// Most releases sent in one script call.
const RELEASES_PER_CALL: usize = 256;

/// The in-place releases ([`Held::release`](super::held::Held::release)) of one semaphore
/// handle, combined: a release made while none is in flight is sent at once by its own task
/// (no hand-over to another task, so a lone release costs exactly one round trip); releases
/// made while one is in flight gather and leave together as one `release.lua` call once it
/// returned, sent by a task spawned for them, which keeps sending what gathers meanwhile.
/// N concurrent releases thus cost a few calls instead of N.
///
/// No retries here: a failed call is reported to each release it carried, whose permits
/// hand them to the background releaser (see `Held::release`).
pub(crate) struct ReleaseCombiner<C: Calls> {
    remote: Arc<Remote>,
    conn: C,
    state: Mutex<Combining>,
}

/// Whether a release call is in flight, and the releases waiting for it to return.
#[derive(Default)]
struct Combining {
    in_flight: bool,
    waiting: Vec<Waiting>,
}

/// A release waiting for the call in flight to return: its id, and where its answer goes.
type Waiting = (String, oneshot::Sender<CallResult<()>>);

impl<C: Calls + Sync> ReleaseCombiner<C> {
    pub(crate) fn new(remote: Arc<Remote>, conn: C) -> Arc<ReleaseCombiner<C>> {
        Arc::new(ReleaseCombiner {
            remote,
            conn,
            state: Mutex::new(Combining::default()),
        })
    }

    /// Removes the entry `id` (idempotent) and returns what Redis answered to the call that
    /// carried it, or `None` if that call was never made (the runtime is shutting down).
    ///
    /// Cancel safe: dropping the future may leave the release sent or not (the caller then
    /// releases again in the background); the releases waiting behind it are sent all the
    /// same.
    pub(crate) async fn release(self: &Arc<Self>, id: String) -> Option<CallResult<()>> {
        let waiting = {
            let mut st = self.state.lock().unwrap();
            if st.in_flight {
                let (tx, rx) = oneshot::channel();
                st.waiting.push((id.clone(), tx));
                Some(rx)
            } else {
                st.in_flight = true;
                None
            }
        };
        if let Some(rx) = waiting {
            return rx.await.ok();
        }
        let turn = Turn(self.clone());
        let mut conn = self.conn.clone();
        let result = conn
            .release(&self.remote, &Removal::of(&[id.as_str()]))
            .await
            .map(drop);
        drop(turn);
        Some(result)
    }

    /// Sends the waiting releases, in calls of at most [`RELEASES_PER_CALL`], until none is
    /// left.
    async fn drain(self: Arc<Self>, mut batch: Vec<Waiting>) {
        let mut conn = self.conn.clone();
        loop {
            let ids: Vec<&str> = batch.iter().map(|(id, _)| id.as_str()).collect();
            let result = conn
                .release(&self.remote, &Removal::of(&ids))
                .await
                .map(drop);
            drop(ids);
            for (_, done) in batch.drain(..) {
                let _ = done.send(result.clone());
            }
            let mut st = self.state.lock().unwrap();
            if st.waiting.is_empty() {
                st.in_flight = false;
                return;
            }
            let n = st.waiting.len().min(RELEASES_PER_CALL);
            batch = st.waiting.drain(..n).collect();
        }
    }
}

/// The turn of a release sent at once: when it ends (its call returned, or its future was
/// dropped), the releases that gathered meanwhile go to a task of their own, or nothing is
/// in flight any more.
struct Turn<C: Calls + Sync>(Arc<ReleaseCombiner<C>>);

impl<C: Calls + Sync> Drop for Turn<C> {
    fn drop(&mut self) {
        let mut st = self.0.state.lock().unwrap();
        if st.waiting.is_empty() {
            st.in_flight = false;
            return;
        }
        let n = st.waiting.len().min(RELEASES_PER_CALL);
        let batch: Vec<_> = st.waiting.drain(..n).collect();
        drop(st);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(self.0.clone().drain(batch))),
            // no runtime (dropped while shutting down): the waiting releases are told so
            // (their permits release in the background), and nothing is in flight
            Err(_) => {
                let mut st = self.0.state.lock().unwrap();
                st.waiting.clear();
                st.in_flight = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::protocol::keys::Keys;
    use crate::protocol::{AcquireArgs, AcquireReply};

    /// Records the ids of each release call, which takes `delay`.
    #[derive(Clone)]
    struct ReleaseRecorder {
        delay: Duration,
        calls: CallLog,
    }

    impl Calls for ReleaseRecorder {
        async fn acquire(
            &mut self,
            _: &Remote,
            _: &[AcquireArgs<'_>],
        ) -> CallResult<Vec<AcquireReply>> {
            unreachable!("releases only")
        }

        async fn release(&mut self, _: &Remote, r: &Removal<'_>) -> CallResult<u64> {
            let ids: Vec<String> = r.ids.iter().map(|s| s.to_string()).collect();
            self.calls.lock().unwrap().push(ids);
            tokio::time::sleep(self.delay).await;
            Ok(r.ids.len() as u64)
        }
    }

    /// The ids of each call made, in order.
    type CallLog = Arc<Mutex<Vec<Vec<String>>>>;

    fn releases() -> (Arc<ReleaseCombiner<ReleaseRecorder>>, CallLog) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let conn = ReleaseRecorder {
            delay: Duration::from_millis(10),
            calls: calls.clone(),
        };
        let remote = Arc::new(Remote::new(
            Keys::new("redsem", "r").unwrap(),
            10,
            "PUBLISH",
        ));
        (ReleaseCombiner::new(remote, conn), calls)
    }

    /// `r.release(id)` in a task of its own.
    fn spawn_release(
        r: &Arc<ReleaseCombiner<ReleaseRecorder>>,
        id: &str,
    ) -> tokio::task::JoinHandle<Option<CallResult<()>>> {
        let (r, id) = (r.clone(), id.to_owned());
        tokio::spawn(async move { r.release(id).await })
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_release_is_sent_at_once_by_its_own_task() {
        let (r, calls) = releases();
        let start = tokio::time::Instant::now();
        assert!(matches!(r.release("a".into()).await, Some(Ok(()))));
        assert_eq!(start.elapsed(), Duration::from_millis(10), "one call");
        assert_eq!(*calls.lock().unwrap(), [vec!["a"]]);
        assert!(matches!(r.release("b".into()).await, Some(Ok(()))));
        assert_eq!(*calls.lock().unwrap(), [vec!["a"], vec!["b"]]);
    }

    #[tokio::test(start_paused = true)]
    async fn releases_made_during_a_call_leave_together_once_it_returned() {
        let (r, calls) = releases();
        let first = spawn_release(&r, "a");
        tokio::task::yield_now().await; // "a" is in flight
        let rest: Vec<_> = ["b", "c", "d"]
            .iter()
            .map(|id| spawn_release(&r, id))
            .collect();
        assert!(matches!(first.await.unwrap(), Some(Ok(()))));
        for t in rest {
            assert!(matches!(t.await.unwrap(), Some(Ok(()))));
        }
        assert_eq!(*calls.lock().unwrap(), [vec!["a"], vec!["b", "c", "d"]]);
        // nothing in flight any more: the next one leaves at once, alone
        assert!(matches!(r.release("e".into()).await, Some(Ok(()))));
        assert_eq!(calls.lock().unwrap().last().unwrap(), &["e"]);
    }

    #[tokio::test(start_paused = true)]
    async fn releases_waiting_behind_a_dropped_release_are_sent_all_the_same() {
        let (r, calls) = releases();
        let first = spawn_release(&r, "a");
        tokio::task::yield_now().await; // "a" is in flight
        let waiting = spawn_release(&r, "b");
        tokio::task::yield_now().await; // "b" waits behind it
        first.abort();
        assert!(matches!(waiting.await.unwrap(), Some(Ok(()))));
        assert_eq!(*calls.lock().unwrap(), [vec!["a"], vec!["b"]]);
    }
}

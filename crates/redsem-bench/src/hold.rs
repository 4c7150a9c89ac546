//! The hold of a job: a permit held for the requested time, to within tens of microseconds.
//!
//! Every place the benchmark holds a permit for a requested time goes through [`until`]
//! (today the contract worker's job, [`crate::worker`], which every design and every scenario
//! runs; the designs themselves never hold).
//!
//! Why not `tokio::time::sleep(hold)` alone: tokio's timer has a 1 ms granularity and fires on
//! the first tick at or after the deadline, so a 20 ms sleep lasts 20.9–21.3 ms. That overshoot
//! was charged to every design's nominal efficiency (capping it near 0.94), while the Python
//! peers' `asyncio.sleep` is exact to a fraction of a millisecond.
//!
//! How: the bulk of the hold is a tokio sleep until [`HANDOVER`] before the deadline (cheap
//! for any number of holders, and for the crash scenario's one-hour holds); the rest is one
//! `std::thread::sleep` on a thread of tokio's blocking pool whose timer slack is set to 1 ns
//! (`PR_SET_TIMERSLACK`, per thread), so the kernel's high-resolution timer wakes it at the
//! deadline give or take a few tens of microseconds, and the job's task is woken through the
//! runtime's unpark right after.
//!
//! Why not a spin (`tokio::task::yield_now` until `Instant::now()` passes the deadline): it
//! would be exact to a microsecond, but a spinning runtime thread burns a core for the last
//! 1–2 ms of every hold, i.e. 5–10 % of each 20 ms job. On a 2-core machine that CPU is taken
//! from Redis and the other workers, and it would be charged to every design's *client CPU per
//! job* (0.2 ms today), which it would multiply. The sleeping thread costs one wake-up per job,
//! and only holders within [`HANDOVER`] of their deadline occupy a pool thread (threads are
//! reused: the pool keeps idle ones for 10 s).

use std::time::Duration;

use tokio::time::Instant;

/// How long before the deadline the tokio sleep hands over to the precise sleep: tokio wakes
/// up to ~1.1 ms after the instant asked for, so 2 ms leaves the precise sleep some room even
/// when the runtime is a little late.
pub const HANDOVER: Duration = Duration::from_millis(2);

/// Returns at `deadline` (at once if it has passed), within tens of microseconds, without
/// spinning: see the [module docs](self).
pub async fn until(deadline: Instant) {
    if deadline.saturating_duration_since(Instant::now()) > HANDOVER {
        tokio::time::sleep_until(deadline - HANDOVER).await;
    }
    if deadline <= Instant::now() {
        return;
    }
    let deadline = deadline.into_std();
    let fine = tokio::task::spawn_blocking(move || {
        fine_timer_slack();
        std::thread::sleep(deadline.saturating_duration_since(std::time::Instant::now()));
    });
    if fine.await.is_err() {
        // the pool refused the task (runtime shutting down): finish on tokio's timer
        tokio::time::sleep_until(deadline.into()).await;
    }
}

/// Sets the calling thread's timer slack to 1 ns (Linux; the default is 50 µs), so that its
/// sleeps end at their deadline.
fn fine_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and only affects the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The overshoots of `n` holds of `hold` each, run `concurrent` at a time.
    async fn overshoots(n: usize, concurrent: usize, hold: Duration) -> Vec<Duration> {
        let mut all = Vec::with_capacity(n);
        for _ in 0..n / concurrent {
            let holds = (0..concurrent).map(|_| async {
                let start = Instant::now();
                until(start + hold).await;
                // (checked_sub: None when a hold ended early)
                start.elapsed().checked_sub(hold)
            });
            for over in futures_util::future::join_all(holds).await {
                all.push(over.expect("a hold ended before its deadline"));
            }
        }
        all
    }

    fn mean_us(overshoots: &[Duration]) -> f64 {
        overshoots.iter().sum::<Duration>().as_secs_f64() * 1e6 / overshoots.len() as f64
    }

    /// A hold never ends before its deadline, alone or among others. How precise it is, is the
    /// benchmark's to measure (its *mean / p99 hold* columns), not a timed assertion's: the
    /// figures are printed here only as a hint.
    #[tokio::test(flavor = "current_thread")]
    async fn holds_never_end_early() {
        let hold = Duration::from_millis(5);
        let alone = overshoots(50, 1, hold).await;
        let together = overshoots(50, 10, hold).await;
        assert_eq!((alone.len(), together.len()), (50, 50));
        eprintln!(
            "mean overshoot of a 5 ms hold: {:.0} µs one at a time, {:.0} µs with 10 at once",
            mean_us(&alone),
            mean_us(&together)
        );
    }

    /// The precise part of a hold runs on a thread whose timer slack is 1 ns (the mechanism the
    /// precision rests on, checked without timing anything).
    #[test]
    fn the_precise_sleep_runs_with_a_fine_timer_slack() {
        std::thread::spawn(|| {
            // SAFETY: PR_GET_TIMERSLACK takes no argument and only reads the calling thread's.
            let before = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
            fine_timer_slack();
            let after = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
            assert_eq!(
                after, 1,
                "timer slack after fine_timer_slack (before: {before} ns)"
            );
        })
        .join()
        .unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_past_deadline_returns_at_once() {
        let start = Instant::now();
        until(start - Duration::from_millis(1)).await;
        until(start).await;
        assert!(start.elapsed() < Duration::from_millis(500));
    }
}

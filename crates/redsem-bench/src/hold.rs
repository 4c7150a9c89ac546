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

    /// Mean overshoot of `n` holds of `hold` each, run `concurrent` at a time, in µs.
    async fn mean_overshoot_us(n: usize, concurrent: usize, hold: Duration) -> f64 {
        let mut total = Duration::ZERO;
        for _ in 0..n / concurrent {
            let holds = (0..concurrent).map(|_| async {
                let start = Instant::now();
                until(start + hold).await;
                start.elapsed() - hold
            });
            total += futures_util::future::join_all(holds)
                .await
                .into_iter()
                .sum::<Duration>();
        }
        total.as_secs_f64() * 1e6 / (n / concurrent * concurrent) as f64
    }

    #[tokio::test(flavor = "current_thread")]
    async fn holds_are_precise_on_average() {
        let hold = Duration::from_millis(5);
        let alone = mean_overshoot_us(50, 1, hold).await;
        let together = mean_overshoot_us(50, 10, hold).await;
        let mut tokio_only = Duration::ZERO;
        for _ in 0..20 {
            let start = Instant::now();
            tokio::time::sleep(hold).await;
            tokio_only += start.elapsed() - hold;
        }
        eprintln!(
            "mean overshoot of a 5 ms hold: {alone:.0} µs one at a time, {together:.0} µs with 10 \
             at once; tokio::time::sleep alone: {:.0} µs",
            tokio_only.as_secs_f64() * 1e6 / 20.0
        );
        // generous bounds (a loaded machine): tokio's own timer is ~1 ms late on average
        assert!(alone < 1000.0, "{alone} µs");
        assert!(together < 1000.0, "{together} µs");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_past_deadline_returns_at_once() {
        let start = Instant::now();
        until(start - Duration::from_millis(1)).await;
        until(start).await;
        assert!(start.elapsed() < Duration::from_millis(500));
    }
}

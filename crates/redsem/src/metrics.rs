//! Metric names, and the recording calls behind the `metrics` feature.
//!
//! With the `metrics` feature, redsem records through the [`metrics`](https://docs.rs/metrics)
//! facade: install any recorder (Prometheus exporter, StatsD, an OpenTelemetry bridge) and
//! these series appear; with no recorder installed each call is a few nanoseconds. Without
//! the feature the recording calls compile to nothing; the names below stay available, for
//! dashboards and alerts written in Rust.
//!
//! Every series has the label `semaphore` (the semaphore's name). Counters and histograms are
//! per process: each replica reports what it saw. Call `describe()` (feature `metrics`) once after installing a
//! recorder to register units and help texts.
//!
//! | name | type | extra labels | what |
//! |---|---|---|---|
//! | `redsem_acquire_wait_seconds` | histogram | | from the call to `acquire*`/`try_acquire*` to the grant (granted acquisitions only) |
//! | `redsem_acquire_failures_total` | counter | `reason` = `timeout`, `no_permits`, `closed`, `too_many_permits`, `removed_from_queue`, `invalid_argument`, `error` | acquisitions that returned an error |
//! | `redsem_grants_total` | counter | | acquisitions granted to this process: one per [`Permit`](crate::Permit), whatever its number of permits (an `acquire_many(3)` counts 1), like [`Stats::grants_total`](crate::Stats::grants_total) server-wide |
//! | `redsem_hold_seconds` | histogram | | from the grant to the release, drop, detach or loss of the permit |
//! | `redsem_renewals_total` | counter | | renewals of a handle that reached Redis (one per heartbeat, whatever the number of leases; the renewals of several handles may share one call) |
//! | `redsem_renewals_failed_total` | counter | | renewals of a handle that failed or timed out (they are retried) |
//! | `redsem_leases_lost_total` | counter | `reason` = `not_holder`, `unreachable`, `shutdown`, `refused`, `deleted` | permits lost (see [`LostReason`](crate::LostReason)) |
//! | `redsem_expiries_reaped_total` | counter (absolute) | | leases of holders and waiters reaped on expiry since the semaphore was created, *server-wide*: set from [`Semaphore::stats`](crate::Semaphore::stats) |
//! | `redsem_releases_abandoned_total` | counter | | background releases given up after retries (the entries expire with their leases) |
//! | `redsem_local_waiters` | gauge | | acquisitions of this process waiting now |
//! | `redsem_local_holders` | gauge | | [`Permit`](crate::Permit)s of this process alive now: one per granted acquisition, whatever its number of permits (an `acquire_many(3)` counts 1), like the holders of [`Semaphore::local_counts`](crate::Semaphore::local_counts); a lost permit counts until dropped |
//!
//! `redsem_leases_lost_total` and `redsem_releases_abandoned_total` should stay at zero in a
//! healthy system: alert on their rate. A growing `redsem_expiries_reaped_total` means
//! processes die (or pause past their lease) while holding or waiting.

/// Histogram: seconds from the call to `acquire*`/`try_acquire*` to the grant.
pub const ACQUIRE_WAIT_SECONDS: &str = "redsem_acquire_wait_seconds";
/// Counter: acquisitions that returned an error, by `reason`.
pub const ACQUIRE_FAILURES_TOTAL: &str = "redsem_acquire_failures_total";
/// Counter: acquisitions granted to this process (one per [`Permit`](crate::Permit), whatever
/// its number of permits).
pub const GRANTS_TOTAL: &str = "redsem_grants_total";
/// Histogram: seconds from grant to release, drop, detach or loss.
pub const HOLD_SECONDS: &str = "redsem_hold_seconds";
/// Counter: batched renewal calls that reached Redis.
pub const RENEWALS_TOTAL: &str = "redsem_renewals_total";
/// Counter: batched renewal calls that failed or timed out.
pub const RENEWALS_FAILED_TOTAL: &str = "redsem_renewals_failed_total";
/// Counter: permits lost, by `reason` (`not_holder`, `unreachable`, `shutdown`).
pub const LEASES_LOST_TOTAL: &str = "redsem_leases_lost_total";
/// Counter (absolute, server-wide): leases reaped on expiry, as last seen by
/// [`Semaphore::stats`](crate::Semaphore::stats).
pub const EXPIRIES_REAPED_TOTAL: &str = "redsem_expiries_reaped_total";
/// Counter: background releases given up after retries.
pub const RELEASES_ABANDONED_TOTAL: &str = "redsem_releases_abandoned_total";
/// Gauge: acquisitions of this process waiting now.
pub const LOCAL_WAITERS: &str = "redsem_local_waiters";
/// Gauge: [`Permit`](crate::Permit)s of this process alive now (one per granted acquisition,
/// whatever its number of permits).
pub const LOCAL_HOLDERS: &str = "redsem_local_holders";

/// Registers the unit and help text of every redsem metric with the installed recorder.
/// Optional; call it once after installing the recorder.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(
        ACQUIRE_WAIT_SECONDS,
        Unit::Seconds,
        "Time from an acquire call to its grant"
    );
    describe_counter!(
        ACQUIRE_FAILURES_TOTAL,
        Unit::Count,
        "Acquisitions that returned an error, by reason"
    );
    describe_counter!(
        GRANTS_TOTAL,
        Unit::Count,
        "Acquisitions granted to this process (one per Permit, whatever its number of permits)"
    );
    describe_histogram!(
        HOLD_SECONDS,
        Unit::Seconds,
        "Time from grant to release, drop or loss of a permit"
    );
    describe_counter!(
        RENEWALS_TOTAL,
        Unit::Count,
        "Batched lease renewal calls that reached Redis"
    );
    describe_counter!(
        RENEWALS_FAILED_TOTAL,
        Unit::Count,
        "Batched lease renewal calls that failed or timed out"
    );
    describe_counter!(
        LEASES_LOST_TOTAL,
        Unit::Count,
        "Permits lost because their lease could not be renewed, by reason"
    );
    describe_counter!(
        EXPIRIES_REAPED_TOTAL,
        Unit::Count,
        "Leases reaped on expiry since the semaphore was created (server-wide)"
    );
    describe_counter!(
        RELEASES_ABANDONED_TOTAL,
        Unit::Count,
        "Background releases given up after retries"
    );
    describe_gauge!(
        LOCAL_WAITERS,
        Unit::Count,
        "Acquisitions of this process waiting now"
    );
    describe_gauge!(
        LOCAL_HOLDERS,
        Unit::Count,
        "Permit values of this process alive now (one per granted acquisition)"
    );
}

pub(crate) use imp::*;

#[cfg(feature = "metrics")]
mod imp {
    use std::time::Duration;

    use ::metrics::{counter, gauge, histogram};
    use tokio::time::Instant;

    use super::*;
    use crate::error::{Error, LostReason};

    pub(crate) fn acquired(sem: &str, waited: Duration) {
        histogram!(ACQUIRE_WAIT_SECONDS, "semaphore" => sem.to_owned())
            .record(waited.as_secs_f64());
        counter!(GRANTS_TOTAL, "semaphore" => sem.to_owned()).increment(1);
    }

    pub(crate) fn acquire_failed(sem: &str, err: &Error) {
        let reason = match err {
            Error::Timeout { .. } => "timeout",
            Error::NoPermits { .. } => "no_permits",
            Error::Closed { .. } => "closed",
            Error::TooManyPermits { .. } => "too_many_permits",
            Error::RemovedFromQueue { .. } => "removed_from_queue",
            Error::InvalidArgument(_) => "invalid_argument",
            _ => "error",
        };
        counter!(ACQUIRE_FAILURES_TOTAL, "semaphore" => sem.to_owned(), "reason" => reason)
            .increment(1);
    }

    pub(crate) fn renewal(sem: &str, ok: bool) {
        let name = if ok {
            RENEWALS_TOTAL
        } else {
            RENEWALS_FAILED_TOTAL
        };
        counter!(name, "semaphore" => sem.to_owned()).increment(1);
    }

    pub(crate) fn lease_lost(sem: &str, reason: LostReason) {
        let reason = match reason {
            LostReason::NotHolder => "not_holder",
            LostReason::Unreachable => "unreachable",
            LostReason::Shutdown => "shutdown",
            LostReason::Refused => "refused",
            LostReason::Deleted => "deleted",
        };
        counter!(LEASES_LOST_TOTAL, "semaphore" => sem.to_owned(), "reason" => reason).increment(1);
    }

    pub(crate) fn expiries_seen(sem: &str, total: u64) {
        counter!(EXPIRIES_REAPED_TOTAL, "semaphore" => sem.to_owned()).absolute(total);
    }

    pub(crate) fn releases_abandoned(sem: &str, n: usize) {
        counter!(RELEASES_ABANDONED_TOTAL, "semaphore" => sem.to_owned()).increment(n as u64);
    }

    /// Counts one local waiter in `redsem_local_waiters` for as long as it lives.
    pub(crate) struct WaiterGauge(String);

    impl WaiterGauge {
        pub(crate) fn new(sem: &str) -> WaiterGauge {
            gauge!(LOCAL_WAITERS, "semaphore" => sem.to_owned()).increment(1.0);
            WaiterGauge(sem.to_owned())
        }

        /// The waiter stops waiting: it leaves the gauge now.
        pub(crate) fn done(self) {}
    }

    impl Drop for WaiterGauge {
        fn drop(&mut self) {
            gauge!(LOCAL_WAITERS, "semaphore" => self.0.clone()).decrement(1.0);
        }
    }

    /// Counts one `Permit` (whatever its number of permits) in `redsem_local_holders`, and
    /// records `redsem_hold_seconds` when dropped.
    pub(crate) struct HoldTimer {
        sem: String,
        since: Instant,
    }

    impl HoldTimer {
        pub(crate) fn new(sem: &str) -> HoldTimer {
            gauge!(LOCAL_HOLDERS, "semaphore" => sem.to_owned()).increment(1.0);
            HoldTimer {
                sem: sem.to_owned(),
                since: Instant::now(),
            }
        }
    }

    impl Drop for HoldTimer {
        fn drop(&mut self) {
            gauge!(LOCAL_HOLDERS, "semaphore" => self.sem.clone()).decrement(1.0);
            histogram!(HOLD_SECONDS, "semaphore" => self.sem.clone())
                .record(self.since.elapsed().as_secs_f64());
        }
    }
}

/// Without the feature: the same calls, doing nothing.
#[cfg(not(feature = "metrics"))]
mod imp {
    use std::time::Duration;

    use crate::error::{Error, LostReason};

    #[inline(always)]
    pub(crate) fn acquired(_: &str, _: Duration) {}
    #[inline(always)]
    pub(crate) fn acquire_failed(_: &str, _: &Error) {}
    #[inline(always)]
    pub(crate) fn renewal(_: &str, _: bool) {}
    #[inline(always)]
    pub(crate) fn lease_lost(_: &str, _: LostReason) {}
    #[inline(always)]
    pub(crate) fn expiries_seen(_: &str, _: u64) {}
    #[inline(always)]
    pub(crate) fn releases_abandoned(_: &str, _: usize) {}

    pub(crate) struct WaiterGauge;
    impl WaiterGauge {
        #[inline(always)]
        pub(crate) fn new(_: &str) -> WaiterGauge {
            WaiterGauge
        }
        #[inline(always)]
        pub(crate) fn done(self) {}
    }

    pub(crate) struct HoldTimer;
    impl HoldTimer {
        #[inline(always)]
        pub(crate) fn new(_: &str) -> HoldTimer {
            HoldTimer
        }
    }
}

//! Metric names, and the recording calls behind the `metrics` feature.
//!
//! With the `metrics` feature, redsem records through the [`metrics`](https://docs.rs/metrics)
//! facade: install any recorder (Prometheus exporter, StatsD, an OpenTelemetry bridge) and
//! these series appear; with no recorder installed each call is a few nanoseconds. Without
//! the feature the recording calls compile to nothing; the names below stay available, for
//! dashboards and alerts written in Rust.
//!
//! Every series has the label `semaphore` (the semaphore's name), and every name starts with
//! `redsem_client_`: these are *per process* (each replica reports what it did; `sum()` over
//! replicas is the total). What Redis holds for a semaphore, server-wide (its limit, holders,
//! queue, grants, expiries, repairs), is `redsem_semaphore_*`, served by the CLI's exporter
//! (`redsem exporter`), never by the library, so no quantity is counted twice. The one table
//! of every metric, its type, labels and meaning, with the dashboard and alert rules built
//! on them: `docs/metrics.md` in the repository. Call `describe()` (feature `metrics`) once
//! after installing a recorder to register units and help texts.
//!
//! `redsem_client_leases_lost_total` and `redsem_client_releases_abandoned_total` should stay
//! at zero in a healthy system: alert on their rate.

/// Histogram: seconds from the call to `acquire*`/`try_acquire*` to the grant.
pub const ACQUIRE_WAIT_SECONDS: &str = "redsem_client_acquire_wait_seconds";
/// Counter: acquisitions that returned an error, by `reason`.
pub const ACQUIRE_FAILURES_TOTAL: &str = "redsem_client_acquire_failures_total";
/// Counter: acquisitions granted to this process (one per [`Permit`](crate::Permit), whatever
/// its number of permits).
pub const GRANTS_TOTAL: &str = "redsem_client_grants_total";
/// Histogram: seconds from grant to release, drop, detach or loss.
pub const HOLD_SECONDS: &str = "redsem_client_hold_seconds";
/// Counter: batched renewal calls that reached Redis.
pub const RENEWALS_TOTAL: &str = "redsem_client_renewals_total";
/// Counter: batched renewal calls that failed or timed out.
pub const RENEWALS_FAILED_TOTAL: &str = "redsem_client_renewals_failed_total";
/// Counter: permits lost, by `reason` (`not_holder`, `unreachable`, `shutdown`, `refused`,
/// `deleted`, `handed_off`, `max_hold`: [`LostReason`](crate::LostReason) in snake case).
pub const LEASES_LOST_TOTAL: &str = "redsem_client_leases_lost_total";
/// Counter: background releases given up after retries.
pub const RELEASES_ABANDONED_TOTAL: &str = "redsem_client_releases_abandoned_total";
/// Gauge: acquisitions of this process waiting now.
pub const LOCAL_WAITERS: &str = "redsem_client_waiters";
/// Gauge: [`Permit`](crate::Permit)s of this process alive now (one per granted acquisition,
/// whatever its number of permits).
pub const LOCAL_HOLDERS: &str = "redsem_client_holders";

/// Every metric name the library records, in the order of `docs/metrics.md`'s table.
pub const ALL: &[&str] = &[
    ACQUIRE_WAIT_SECONDS,
    ACQUIRE_FAILURES_TOTAL,
    GRANTS_TOTAL,
    HOLD_SECONDS,
    RENEWALS_TOTAL,
    RENEWALS_FAILED_TOTAL,
    LEASES_LOST_TOTAL,
    RELEASES_ABANDONED_TOTAL,
    LOCAL_WAITERS,
    LOCAL_HOLDERS,
];

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
            LostReason::HandedOff => "handed_off",
            LostReason::MaxHold => "max_hold",
            LostReason::Overwritten => "overwritten",
        };
        counter!(LEASES_LOST_TOTAL, "semaphore" => sem.to_owned(), "reason" => reason).increment(1);
    }

    pub(crate) fn releases_abandoned(sem: &str, n: usize) {
        counter!(RELEASES_ABANDONED_TOTAL, "semaphore" => sem.to_owned()).increment(n as u64);
    }

    /// Counts one local waiter in `redsem_client_waiters` for as long as it lives.
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

    /// Counts one `Permit` (whatever its number of permits) in `redsem_client_holders`, and
    /// records `redsem_client_hold_seconds` when dropped.
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

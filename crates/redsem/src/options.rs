//! [`AcquireOptions`]: what one acquisition may ask for beyond one permit.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::{Ask, Custom, Timing};
use crate::error::Error;

/// Longest accepted lease, renewal or poll interval, and timeout: 365 days.
///
/// Durations are stored in Redis as milliseconds and added to this process's clock; the
/// bound keeps both far from overflow (`Duration::MAX` would panic or wrap). Longer values
/// are refused with [`Error::InvalidArgument`]; to wait without a time limit, use
/// [`Semaphore::acquire`](crate::Semaphore::acquire) instead of a huge timeout.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// [`Error::InvalidArgument`] when `d` (named `what`) is above [`MAX_DURATION`].
pub(crate) fn check_duration(what: &str, d: Duration) -> Result<(), Error> {
    if d > MAX_DURATION {
        return Err(Error::InvalidArgument(format!(
            "{what} {d:?} is longer than the maximum of 365 days (redsem::MAX_DURATION)"
        )));
    }
    Ok(())
}

/// The highest priority class ([`AcquireOptions::priority`]): classes are `0..=9`, 0 the
/// default.
pub const MAX_PRIORITY: u8 = 9;

/// Longest label, in bytes (as for [`SemaphoreBuilder::label`](crate::SemaphoreBuilder::label)).
pub(crate) const MAX_LABEL_LEN: usize = 200;

/// The options of one acquisition, for [`Semaphore::acquire_with`](crate::Semaphore::acquire_with):
/// how many permits, the holder's lease and label, a timeout, or no waiting at all.
///
/// Every field has the default of [`Semaphore::acquire`](crate::Semaphore::acquire): one
/// permit, the handle's lease and label, no timeout, waiting in the queue. Building the
/// options costs nothing; they are checked when the acquisition starts.
///
/// ```
/// use std::time::Duration;
/// use redsem::AcquireOptions;
///
/// let opts = AcquireOptions::new()
///     .permits(2)
///     .lease(Duration::from_secs(60))
///     .label("request 7f3a: nightly export")
///     .timeout(Duration::from_secs(5));
/// assert_eq!(opts.get_permits(), 2);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "AcquireOptions do nothing until passed to Semaphore::acquire_with"]
pub struct AcquireOptions {
    permits: u32,
    lease: Option<Duration>,
    label: Option<String>,
    timeout: Option<Duration>,
    try_only: bool,
    priority: u8,
    max_hold: Option<Duration>,
}

impl Default for AcquireOptions {
    fn default() -> Self {
        AcquireOptions {
            permits: 1,
            lease: None,
            label: None,
            timeout: None,
            try_only: false,
            priority: 0,
            max_hold: None,
        }
    }
}

impl AcquireOptions {
    /// One permit, the handle's lease and label, no timeout, waiting in the queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many permits to take at once (default 1), granted together in FIFO order (see
    /// [Fairness](crate::Semaphore#fairness)).
    pub fn permits(mut self, n: u32) -> Self {
        self.permits = n;
        self
    }

    /// The lease of this holder (default: the handle's, see
    /// [`SemaphoreBuilder::lease`](crate::SemaphoreBuilder::lease)). A crashed holder's
    /// slots are free again at most one lease after its last renewal: give a long job a long
    /// lease only if its slots may stay blocked that long after a crash. The handle renews
    /// every holder at its own renewal interval, which must be at most a third of this
    /// lease. While waiting, the request keeps the handle's lease.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The label shown for this holder (and for its ticket while it waits) in
    /// [`Semaphore::stats`](crate::Semaphore::stats), e.g. a request id (default: the
    /// handle's). At most 200 bytes, without control characters (newlines, tabs, escapes).
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Gives up after `timeout` with [`Error::Timeout`], counted from the first poll of the
    /// acquisition (default: wait as long as it takes). Its place in the queue is given up.
    /// A zero timeout takes the permits only if they are free now and nobody is queued, as
    /// [`try_only`](Self::try_only) does (one round trip, never queued), and fails with
    /// [`Error::Timeout`] otherwise: not a race between the round trip and the clock.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Takes the permits only if they are free now and nobody is queued, and never queues
    /// (default `false`): [`Error::NoPermits { .. }`] otherwise. Cannot be combined with a timeout.
    pub fn try_only(mut self, try_only: bool) -> Self {
        self.try_only = try_only;
        self
    }

    /// The priority class of this request, `0..=`[`MAX_PRIORITY`] (default 0): a higher class
    /// is served first, FIFO within a class. Without priorities (every request in class 0)
    /// the queue is plain FIFO, exactly as without this option.
    ///
    /// **Aging, so that nothing starves**: a request's place in the queue is its ticket less
    /// 1000 tickets per class, fixed when it queues. So a request of class `p` is served
    /// before one of class `q < p` that queued earlier only if it arrived within
    /// `1000 × (p − q)` tickets (requests, across every process) of it: a class-0 request is
    /// overtaken by at most 9,000 later requests, however many high-priority requests keep
    /// coming, and then everything that arrives later queues behind it. Its priority rises
    /// with the requests issued after it, not with the clock.
    ///
    /// The rest of the queue's rules stay: a request at the head that needs more permits than
    /// are free blocks everyone behind it; granted waiters are woken by a notification to
    /// their process only. A request that finds free permits and nobody queued ahead of it
    /// (of its own class or above, or aged past it) is granted at once, even with others
    /// queued behind its place; [`try_only`](Self::try_only) follows the same rule. Costs
    /// nothing extra: the class is one more argument of the acquire call and, when not 0,
    /// one more field of the request's record in Redis. Values above [`MAX_PRIORITY`] are
    /// refused with [`Error::InvalidArgument`].
    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    /// The priority class asked for (0 by default).
    pub fn get_priority(&self) -> u8 {
        self.priority
    }

    /// The longest this acquisition may hold its permits (default: as long as the permit
    /// lives). At the grant + `max_hold` the permit is *lost* with [`LostReason::MaxHold`]:
    /// [`Permit::lost`] resolves, its cancellation token is cancelled and [`Permit::run`]
    /// drops the work it guards, as for any other loss.
    ///
    /// What it promises:
    /// - **Renewals stop in Redis.** At that moment the entry is *detached* in Redis (as by
    ///   [`Permit::detach`]): it leaves the handle's session for one nobody renews and keeps
    ///   the lease expiry it has then, so Redis frees its slots within one lease (of this
    ///   holder) even if the program keeps the lost `Permit` and ignores the loss.
    /// - **Dropping or releasing the lost permit frees the slots at once** (one release
    ///   call), as for a permit that was not lost.
    /// - The time counts from the moment this process learns of the grant (the reply of the
    ///   acquire call, or the grant's notification), a little after Redis granted it; in
    ///   synced mode, before the replicas confirm it. The entry therefore stays in Redis at
    ///   most `max_hold` + one lease after this process learned of the grant (plus the time
    ///   the detachment takes to reach Redis; less once the lost permit is dropped).
    ///
    /// Until the deadline nothing changes: the lease is renewed as usual, and a permit lost
    /// earlier for another reason keeps that reason.
    ///
    /// Cost: one timer (a small task) per permit acquired with a maximum hold time, ended
    /// when the permit is dropped; at the deadline, one `release.lua` call in the
    /// background (the detachment, batched with the client's releases).
    ///
    /// Checked when the acquisition starts: zero, or above [`MAX_DURATION`], is an
    /// [`Error::InvalidArgument`] (nothing is queued).
    ///
    /// [`LostReason::MaxHold`]: crate::LostReason::MaxHold
    /// [`Permit::lost`]: crate::Permit::lost
    /// [`Permit::run`]: crate::Permit::run
    /// [`Permit::detach`]: crate::Permit::detach
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// The number of permits asked for.
    pub fn get_permits(&self) -> u32 {
        self.permits
    }

    /// The lease asked for, if not the handle's.
    pub fn get_lease(&self) -> Option<Duration> {
        self.lease
    }

    /// The label asked for, if not the handle's.
    pub fn get_label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// The timeout, if any.
    pub fn get_timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Whether the acquisition never queues.
    pub fn is_try_only(&self) -> bool {
        self.try_only
    }

    /// The maximum hold time, if any (see [`max_hold`](Self::max_hold)).
    pub fn get_max_hold(&self) -> Option<Duration> {
        self.max_hold
    }

    /// Checks the options against the handle's timing and turns them into the engine's
    /// request.
    pub(crate) fn into_ask(self, timing: &Timing) -> Result<Ask, Error> {
        if let Some(timeout) = self.timeout {
            if self.try_only {
                return Err(Error::InvalidArgument(
                    "a try-only acquisition never waits: drop its timeout, or drop try_only".into(),
                ));
            }
            check_duration("acquire timeout", timeout)?;
        }
        if let Some(lease) = self.lease {
            check_duration("lease", lease)?;
            timing
                .check_holder_lease(lease)
                .map_err(Error::InvalidArgument)?;
        }
        if let Some(label) = &self.label {
            check_label(label)?;
        }
        check_priority(self.priority)?;
        if let Some(max_hold) = self.max_hold {
            check_max_hold(max_hold)?;
        }
        let custom = (self.lease.is_some()
            || self.label.is_some()
            || self.priority != 0
            || self.max_hold.is_some())
        .then(|| {
            Arc::new(Custom {
                lease: self.lease,
                label: self.label,
                priority: self.priority,
                max_hold: self.max_hold,
            })
        });
        // (a zero timeout: only if free now)
        let zero_timeout = self.timeout == Some(Duration::ZERO);
        Ok(Ask {
            n: self.permits,
            try_only: self.try_only || zero_timeout,
            timeout: self.timeout.filter(|_| !zero_timeout),
            zero_timeout,
            custom,
        })
    }
}

/// [`Error::InvalidArgument`] for a priority class above [`MAX_PRIORITY`].
pub(crate) fn check_priority(priority: u8) -> Result<(), Error> {
    if priority > MAX_PRIORITY {
        return Err(Error::InvalidArgument(format!(
            "priority {priority} is outside 0..={MAX_PRIORITY}: classes are 0 (the default) to \
             {MAX_PRIORITY}, higher served first"
        )));
    }
    Ok(())
}

/// [`Error::InvalidArgument`] for a maximum hold time of zero (the permit would be lost as
/// it is granted) or above [`MAX_DURATION`].
fn check_max_hold(max_hold: Duration) -> Result<(), Error> {
    if max_hold.is_zero() {
        return Err(Error::InvalidArgument(
            "max_hold is zero: a permit could not be held at all; give a positive maximum \
             hold time, or none to hold as long as the permit lives"
                .into(),
        ));
    }
    check_duration("max_hold", max_hold)
}

/// Checks a label as [`SemaphoreBuilder::label`](crate::SemaphoreBuilder::label) and
/// [`AcquireOptions::label`] do, so that a program can refuse bad input before it connects
/// (the CLI checks `--label` with it). Costs nothing: no I/O.
///
/// # Errors
///
/// [`Error::InvalidArgument`] for a label longer than 200 bytes, or one with a control
/// character (a newline, a tab, an escape sequence), which would garble what `stats`,
/// `watch` and logs show.
pub fn check_label(label: &str) -> Result<(), Error> {
    if let Some(c) = label.chars().find(|c| c.is_control()) {
        return Err(Error::InvalidArgument(format!(
            "label {} contains the control character {c:?}: a label is one line of \
             printable text",
            crate::error::display_name(label)
        )));
    }
    if label.len() > MAX_LABEL_LEN {
        return Err(Error::InvalidArgument(format!(
            "label is {} bytes long; the maximum is {MAX_LABEL_LEN}",
            label.len()
        )));
    }
    Ok(())
}

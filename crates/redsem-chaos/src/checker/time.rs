//! The times of the logs (µs since the epoch, of `CLOCK_REALTIME`) as the properties use
//! them: in milliseconds, printed, and windows of them.

/// Microseconds as milliseconds.
pub(super) fn ms(us: i64) -> f64 {
    us as f64 / 1000.0
}

/// A time of the logs (µs since the epoch) as seconds with six decimals: enough to find the
/// line in the logs.
pub(super) fn ms_fmt(us: i64) -> String {
    format!("{}.{:06}", us / 1_000_000, us % 1_000_000)
}

/// Whether `[a, b]` meets one of `windows`.
pub(super) fn overlaps(windows: &[(i64, i64)], a: i64, b: i64) -> bool {
    windows.iter().any(|&(s, e)| s <= b && e >= a)
}

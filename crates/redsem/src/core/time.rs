//! The core's one notion of time.

/// A point in time. Tokio's, so that tests drive the core in paused time; the core itself
/// never asks for the current time (every `now` is an argument).
pub(crate) use tokio::time::Instant;

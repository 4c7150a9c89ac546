//! `redsem watch`: a live view of one semaphore, redrawn every interval, with alerts.
//!
//! On a terminal the screen is cleared and redrawn with plain ANSI sequences (no terminal
//! library needed for that); otherwise one block per refresh is printed, so the output can
//! be logged or piped.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use tokio::time::Instant;

use crate::common::{self, Failure, fmt_clock, fmt_dur};
use crate::show::render_stats;
use crate::{Global, WatchArgs};

/// Refreshes kept for the wait-time trend.
const HISTORY: usize = 40;
const SPARKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// What `watch` remembers between refreshes.
#[derive(Default)]
pub struct Watcher {
    /// Oldest wait at each refresh (zero when nobody waits), oldest first.
    history: VecDeque<Duration>,
    /// Grants counter and time of the previous refresh.
    last_grants: Option<(u64, Instant)>,
    /// Consecutive refreshes that saw waiters while permits were free.
    free_while_waiting: u32,
    /// Since when the queue has been longer than the limit.
    above_limit_since: Option<Instant>,
}

impl Watcher {
    /// Renders one refresh and the alerts it raises; `now` is the local time of the sample.
    pub fn frame(&mut self, s: &redsem::Stats, now: Instant, alert_after: Duration) -> String {
        let mut out = render_stats(s);
        out.push('\n');

        // wait-time trend
        let wait = s.oldest_wait().unwrap_or_default();
        self.history.push_back(wait);
        if self.history.len() > HISTORY {
            self.history.pop_front();
        }
        let max = self.history.iter().max().copied().unwrap_or_default();
        let min = self.history.iter().min().copied().unwrap_or_default();
        let _ = writeln!(
            out,
            "wait trend  {}  now {}, min {}, max {} over the last {} refresh(es){}",
            sparkline(&self.history),
            fmt_dur(wait),
            fmt_dur(min),
            fmt_dur(max),
            self.history.len(),
            trend(&self.history)
        );

        // grant rate
        if let Some((grants, at)) = self.last_grants {
            let secs = now.duration_since(at).as_secs_f64();
            if secs > 0.0 {
                let rate = s.grants_total.saturating_sub(grants) as f64 / secs;
                let _ = writeln!(out, "grants      {rate:.1}/s");
            }
        }
        self.last_grants = Some((s.grants_total, now));

        // alerts
        if !s.waiters.is_empty() && s.available > 0 {
            self.free_while_waiting += 1;
        } else {
            self.free_while_waiting = 0;
        }
        if self.free_while_waiting >= 2 {
            let head = &s.waiters[0];
            let why = if head.permits > s.available {
                format!(
                    "the head of the queue asks for {} permits at once: FIFO order keeps the others behind it until {} are free",
                    head.permits, head.permits
                )
            } else {
                "free permits are not being granted: check that every client runs a compatible redsem".to_owned()
            };
            let _ = writeln!(
                out,
                "WARNING: {} waiter(s) stay queued while {} permit(s) are free ({why})",
                s.waiter_count, s.available
            );
        }
        let state = if s.in_use < s.limit {
            format!(
                "only {} of {} permits in use: the downstream is idle while work waits",
                s.in_use, s.limit
            )
        } else {
            "every permit in use: the holders are slow, or the limit is too low".to_owned()
        };
        // Waits are counted from when Redis queued the request (`waited`), not from when this
        // watch first saw it: a watch started late alerts as one started early would.
        if let Some(head) = s.waiters.first().filter(|w| w.waited >= alert_after) {
            let _ = writeln!(
                out,
                "WARNING: the head of the queue has waited {} (over --alert-after {}), {} waiting ({state})",
                fmt_dur(head.waited),
                fmt_dur(alert_after),
                s.waiter_count
            );
        }
        if s.waiter_count > s.limit as usize {
            // The queue has been longer than the limit at least since the (limit + 1)-th
            // waiter joined it (those before it still wait, so they waited then too), and
            // at least since this watch first saw it so. (Beyond the waiters listed, only
            // the latter is known.)
            let joined = s
                .waiters
                .get(s.limit as usize)
                .map_or(Duration::ZERO, |w| w.waited);
            let seen = *self.above_limit_since.get_or_insert(now);
            let lasted = now.duration_since(seen).max(joined);
            if lasted >= alert_after {
                let _ = writeln!(
                    out,
                    "WARNING: the queue ({}) has stayed above the limit ({}) for {} ({state})",
                    s.waiter_count,
                    s.limit,
                    fmt_dur(lasted)
                );
            }
        } else {
            self.above_limit_since = None;
        }
        out
    }
}

fn sparkline(values: &VecDeque<Duration>) -> String {
    let max = values.iter().max().copied().unwrap_or_default();
    values
        .iter()
        .map(|v| {
            if max.is_zero() {
                SPARKS[0]
            } else {
                let i = (v.as_secs_f64() / max.as_secs_f64() * 7.0).round() as usize;
                SPARKS[i.min(7)]
            }
        })
        .collect()
}

/// `, rising` / `, falling` / `` comparing the newest wait with the one a few refreshes ago.
fn trend(values: &VecDeque<Duration>) -> &'static str {
    let n = values.len();
    if n < 3 {
        return "";
    }
    let now = values[n - 1].as_secs_f64();
    let before = values[n.saturating_sub(10).min(n - 3)].as_secs_f64();
    if now > before * 1.2 + 0.1 {
        ", rising"
    } else if now + 0.1 < before * 0.8 {
        ", falling"
    } else {
        ", steady"
    }
}

/// `redsem watch NAME`.
pub async fn watch(g: &Global, a: WatchArgs) -> Result<u8, Failure> {
    if a.interval.is_zero() {
        return Err(Failure::Other(
            "--interval must be greater than zero".into(),
        ));
    }
    let client = common::connect(g).await?;
    // fail at once, with the right exit code, if the semaphore does not exist
    let mut first = Some(client.inspect(&a.name).await?);
    let tty = std::io::stdout().is_terminal();
    let mut watcher = Watcher::default();
    let mut next = Instant::now();
    let mut shown = 0u64;
    loop {
        let now = Instant::now();
        let snapshot = match first.take() {
            Some(s) => Ok(s),
            None => client.inspect(&a.name).await,
        };
        let mut frame = String::new();
        let head = format!(
            "redsem watch {:?}, every {}{}",
            a.name,
            fmt_dur(a.interval),
            if tty { " (Ctrl-C to quit)" } else { "" }
        );
        // the last refresh failed: the exit status after --iterations is then 125
        let failing = snapshot.is_err();
        match snapshot {
            Ok(s) => {
                let _ = writeln!(frame, "{head} at {}\n", fmt_clock(s.server_time_ms));
                frame.push_str(&watcher.frame(&s, now, a.alert_after));
            }
            Err(e @ redsem::Error::UnknownSemaphore { .. }) => return Err(e.into()),
            Err(e) => {
                // keep watching through a Redis restart
                let _ = writeln!(
                    frame,
                    "{head}\n\nredsem: error: {}; retrying",
                    common::describe(&e)
                );
            }
        }
        let mut stdout = std::io::stdout().lock();
        let written = if tty {
            write!(stdout, "\x1b[H\x1b[2J{frame}")
        } else {
            writeln!(stdout, "{frame}")
        };
        if written.and_then(|()| stdout.flush()).is_err() {
            return Ok(0); // stdout closed (e.g. `| head`)
        }
        drop(stdout);
        shown += 1;
        if a.iterations.is_some_and(|n| shown >= n) {
            return Ok(if failing { common::EXIT_ERROR } else { 0 });
        }
        next += a.interval;
        let now = Instant::now();
        if next < now {
            next = now;
        }
        tokio::time::sleep_until(next).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparkline_scales_to_the_maximum() {
        let v: VecDeque<Duration> = [0, 500, 1000].map(Duration::from_millis).into();
        assert_eq!(sparkline(&v), "▁▅█");
        let zeros: VecDeque<Duration> = [0, 0].map(Duration::from_millis).into();
        assert_eq!(sparkline(&zeros), "▁▁");
    }

    #[test]
    fn trend_compares_with_earlier_refreshes() {
        let up: VecDeque<Duration> = [0, 1, 2, 3].map(Duration::from_secs).into();
        assert_eq!(trend(&up), ", rising");
        let down: VecDeque<Duration> = [3, 2, 1, 0].map(Duration::from_secs).into();
        assert_eq!(trend(&down), ", falling");
        let flat: VecDeque<Duration> = [1, 1, 1].map(Duration::from_secs).into();
        assert_eq!(trend(&flat), ", steady");
    }
}

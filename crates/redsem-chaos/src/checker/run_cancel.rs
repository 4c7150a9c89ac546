//! Property 7, `run-cancel`: every `Permit::run` whose permit was lost had its work dropped
//! at once: within the slack of the `lost` report (the two are logged by different tasks of
//! the worker), or the work had already finished. How soon the loss itself is noticed is
//! property 3's bound (one renewal interval).

use super::logs::Logs;
use super::report::Report;
use super::time::ms_fmt;

/// Checks property 7.
pub(super) fn check(logs: &Logs, r: &mut Report) {
    let t = logs.t;
    for o in &logs.ops {
        if !o.run_style {
            continue;
        }
        let Some((lost, _)) = &o.lost else { continue };
        match o.cancel {
            Some(c) if (c - lost).abs() <= t.slack => {}
            Some(c) => r.violation(
                "run-cancel",
                format!(
                    "op {}: lost at {} but its work was dropped at {}",
                    o.name,
                    ms_fmt(*lost),
                    ms_fmt(c)
                ),
            ),
            None if o.done.is_some_and(|d| d <= *lost) => {}
            None => r.violation(
                "run-cancel",
                format!(
                    "op {}: run() reported the permit lost at {} but its work was never dropped",
                    o.name,
                    ms_fmt(*lost)
                ),
            ),
        }
    }
}

//! `redsem stats`, `list`, `limit` and `release`: one-shot operator commands.

use std::fmt::Write as _;
use std::time::Duration;

use futures_util::StreamExt;
use serde::Serialize;

use crate::common::{self, Failure, fmt_dur, fmt_fences, table};
use crate::{DeleteArgs, Global, LimitArgs, LimitChange, ListArgs, ReleaseArgs, StatsArgs};

/// Labels are cut to this many bytes in tables (JSON has them whole).
const LABEL_WIDTH: usize = 60;

/// `redsem stats NAME [--json]`.
pub async fn stats(g: &Global, a: StatsArgs) -> Result<u8, Failure> {
    let client = common::connect(g).await?;
    let s = client.inspect(&a.name).await?;
    if a.json {
        out!("{}\n", to_json(&s)?);
    } else {
        out!("{}", render_stats(&s));
    }
    Ok(0)
}

/// Pretty JSON of `v`, or a one-line failure.
pub(crate) fn to_json<T: Serialize>(v: &T) -> Result<String, Failure> {
    serde_json::to_string_pretty(v).map_err(|e| Failure::Other(format!("cannot encode JSON: {e}")))
}

/// The human view of one snapshot (also the body of `watch`): its summary, its holders and
/// its queue.
pub fn render_stats(s: &redsem::Stats) -> String {
    let mut out = summary(s);
    out.push('\n');
    out.push_str(&holders(s));
    out.push('\n');
    out.push_str(&queue(s));
    out
}

/// The first lines of [`render_stats`]: counts, totals and a warning after repairs.
fn summary(s: &redsem::Stats) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "semaphore {:?}: limit {}, {} in use, {} available; {} holder(s), {} waiter(s){}",
        s.name,
        s.limit,
        s.in_use,
        s.available,
        s.holder_count,
        s.waiter_count,
        match s.oldest_wait() {
            Some(w) => format!(", oldest wait {}", fmt_dur(w)),
            None => String::new(),
        }
    );
    let _ = writeln!(
        out,
        "granted {} time(s) since creation, {} lease(s) expired",
        s.grants_total, s.expired_total
    );
    if s.repairs_total > 0 {
        let _ = writeln!(
            out,
            "WARNING: repaired {} time(s) after keys of this semaphore were lost (evicted or deleted): check Redis's maxmemory-policy and persistence",
            s.repairs_total
        );
    }
    out
}

/// The holders' table of [`render_stats`].
fn holders(s: &redsem::Stats) -> String {
    let mut out = String::new();
    if s.holders.is_empty() {
        out.push_str("HOLDERS: none\n");
    } else {
        out.push_str("HOLDERS\n");
        let rows: Vec<Vec<String>> = s
            .holders
            .iter()
            .map(|h| {
                vec![
                    h.id.clone(),
                    h.permits.to_string(),
                    fmt_fences(&h.fences),
                    fmt_dur(h.held),
                    fmt_dur(h.lease_left),
                    common::truncate(&h.label, LABEL_WIDTH),
                ]
            })
            .collect();
        out.push_str(&table(
            &["ID", "PERMITS", "SLOT:FENCE", "HELD", "LEASE LEFT", "LABEL"],
            &rows,
        ));
        if s.holder_count > s.holders.len() {
            let _ = writeln!(
                out,
                "… and {} more holder(s), not listed",
                s.holder_count - s.holders.len()
            );
        }
    }
    out
}

/// The queue's table of [`render_stats`].
fn queue(s: &redsem::Stats) -> String {
    let mut out = String::new();
    if s.waiters.is_empty() {
        out.push_str("QUEUE: empty\n");
    } else {
        // the priority column only where someone asked for a class (the default is 0)
        let classes = s.waiters.iter().any(|w| w.priority != 0);
        out.push_str(if classes {
            "QUEUE (in grant order: higher priority first, FIFO within a class)\n"
        } else {
            "QUEUE (FIFO order)\n"
        });
        let rows: Vec<Vec<String>> = s
            .waiters
            .iter()
            .map(|w| {
                let mut row = vec![
                    w.position.to_string(),
                    w.id.clone(),
                    w.permits.to_string(),
                    w.ticket.to_string(),
                ];
                if classes {
                    row.push(w.priority.to_string());
                }
                row.extend([fmt_dur(w.waited), common::truncate(&w.label, LABEL_WIDTH)]);
                row
            })
            .collect();
        let head: &[&str] = if classes {
            &[
                "POS", "ID", "PERMITS", "TICKET", "PRIORITY", "WAITED", "LABEL",
            ]
        } else {
            &["POS", "ID", "PERMITS", "TICKET", "WAITED", "LABEL"]
        };
        out.push_str(&table(head, &rows));
        if s.waiter_count > s.waiters.len() {
            let _ = writeln!(
                out,
                "… and {} more waiter(s) behind them, not listed",
                s.waiter_count - s.waiters.len()
            );
        }
    }
    out
}

/// One row of `redsem list --json`.
#[derive(Serialize)]
struct ListEntry {
    name: String,
    limit: u32,
    in_use: u32,
    available: u32,
    holders: usize,
    waiters: usize,
    /// Milliseconds the head of the queue has waited; `null` when nobody waits.
    oldest_wait_ms: Option<u64>,
    grants_total: u64,
    expired_total: u64,
}

/// `redsem list [--json]`.
pub async fn list(g: &Global, a: ListArgs) -> Result<u8, Failure> {
    let client = common::connect(g).await?;
    let names = client.list_semaphores().await?;
    // a few snapshots in flight at once, in name order
    let snapshots: Vec<_> = futures_util::stream::iter(names)
        .map(|name| {
            let client = client.clone();
            // the counts and the head of the queue (its wait): one entry listed at most
            async move { (client.inspect_listing(&name, 1).await, name) }
        })
        .buffered(16)
        .collect()
        .await;
    let mut entries = Vec::with_capacity(snapshots.len());
    let mut skipped = 0;
    for (snapshot, name) in snapshots {
        match snapshot {
            Ok(s) => entries.push(ListEntry {
                oldest_wait_ms: s.oldest_wait().map(|d| d.as_millis() as u64),
                name: s.name,
                limit: s.limit,
                in_use: s.in_use,
                available: s.available,
                holders: s.holder_count,
                waiters: s.waiter_count,
                grants_total: s.grants_total,
                expired_total: s.expired_total,
            }),
            // deleted between the scan and now
            Err(redsem::Error::UnknownSemaphore { .. }) => {}
            // a foreign key that looks like ours, or a broken one: say so, show the others
            Err(e) => {
                say!("redsem: skipping {name:?}: {}", common::describe(&e));
                skipped += 1;
            }
        }
    }
    // an incomplete listing is not a success: a script must not take it for the whole
    let status = if skipped > 0 {
        say!("redsem: {skipped} semaphore(s) could not be read (above): the listing is incomplete");
        common::EXIT_ERROR
    } else {
        0
    };
    if a.json {
        out!("{}\n", to_json(&entries)?);
        return Ok(status);
    }
    if entries.is_empty() {
        if skipped == 0 {
            out!("no semaphores under key prefix {:?}\n", g.prefix);
        }
        return Ok(status);
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                e.name.clone(),
                e.limit.to_string(),
                e.in_use.to_string(),
                e.holders.to_string(),
                e.waiters.to_string(),
                e.oldest_wait_ms
                    .map(|ms| fmt_dur(Duration::from_millis(ms)))
                    .unwrap_or_else(|| "-".into()),
                e.grants_total.to_string(),
            ]
        })
        .collect();
    out!(
        "{}",
        table(
            &[
                "NAME",
                "LIMIT",
                "IN USE",
                "HOLDERS",
                "WAITERS",
                "OLDEST WAIT",
                "GRANTS"
            ],
            &rows
        )
    );
    Ok(status)
}

/// `redsem limit NAME L|+N|-N`.
pub async fn limit(g: &Global, a: LimitArgs) -> Result<u8, Failure> {
    let client = common::connect(g).await?;
    let resized = match a.limit {
        LimitChange::To(new) => client.resize_existing(&a.name, new).await?,
        LimitChange::By(delta) => client.add_permits_existing(&a.name, delta).await?,
    };
    let (old, new) = (resized.previous, resized.limit);
    let note = if new < old {
        format!(
            " (holders keep their permits: nobody is admitted until fewer than {new} are in use)"
        )
    } else if new > old {
        " (waiters admitted at once)".to_owned()
    } else {
        String::new()
    };
    out!("semaphore {:?}: limit {old} -> {new}{note}\n", a.name);
    if !resized.rejected.is_empty() {
        out!(
            "rejected {} queued request(s) larger than the new limit (their acquires fail, naming limit {}):\n",
            resized.rejected.len(),
            new
        );
        let rows: Vec<Vec<String>> = resized
            .rejected
            .iter()
            .map(|w| {
                vec![
                    w.id.clone(),
                    w.permits.to_string(),
                    common::truncate(&w.label, LABEL_WIDTH),
                ]
            })
            .collect();
        out!("{}", table(&["ID", "PERMITS", "LABEL"], &rows));
    }
    Ok(0)
}

/// `redsem delete NAME [--force [--delete-foreign-data]]`.
pub async fn delete(g: &Global, a: DeleteArgs) -> Result<u8, Failure> {
    let client = common::connect(g).await?;
    let evicted = if a.delete_foreign_data {
        client.purge_keys(&a.name).await?
    } else {
        client.delete_semaphore(&a.name, a.force).await?
    };
    if evicted > 0 {
        out!(
            "semaphore {:?}: deleted, evicting {evicted} holder(s) and waiter(s); holders learn it at their next renewal\n",
            a.name
        );
    } else {
        out!("semaphore {:?}: deleted\n", a.name);
    }
    Ok(0)
}

/// `redsem load-library`: loads redsem's Functions library and prints its name.
pub async fn load_library(g: &Global) -> Result<u8, Failure> {
    let client = common::connect(g).await?;
    let name = client.load_library().await?;
    out!("loaded redsem's Functions library {name}\n");
    Ok(0)
}

/// `redsem release NAME --holder ID`: releases a holder, or removes a waiter from the queue.
pub async fn release(g: &Global, a: ReleaseArgs) -> Result<u8, Failure> {
    let client = common::connect(g).await?;
    // best effort: say what is being released (what the release found decides the message)
    let before = client.inspect(&a.name).await?;
    match client.force_release_existing(&a.name, &a.holder).await? {
        redsem::ForceReleased::Holder => {
            let what = match before.holders.iter().find(|h| h.id == a.holder) {
                Some(h) => format!(
                    "holder {} ({}, slot:fence {}, held {})",
                    h.id,
                    h.label,
                    fmt_fences(&h.fences),
                    fmt_dur(h.held)
                ),
                None => format!("holder {}", a.holder),
            };
            out!(
                "semaphore {:?}: released {what}; it learns so at its next renewal, and its slots' next holders get higher fences\n",
                a.name
            );
            Ok(0)
        }
        redsem::ForceReleased::Waiter => {
            let what = match before.waiters.iter().find(|w| w.id == a.holder) {
                Some(w) => format!(
                    "waiter {} ({}, queue position {})",
                    w.id, w.label, w.position
                ),
                None => format!("waiter {}", a.holder),
            };
            out!(
                "semaphore {:?}: removed {what} from the queue; it was not granted, and its acquire fails (`redsem run` exits {})\n",
                a.name,
                common::EXIT_REMOVED
            );
            Ok(0)
        }
        _ => Err(Failure::Other(format!(
            "semaphore {:?} has no holder or waiter {:?} (it may have finished; `redsem stats {}` lists them)",
            a.name, a.holder, a.name
        ))),
    }
}

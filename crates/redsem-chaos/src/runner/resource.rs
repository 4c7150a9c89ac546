//! The fenced resource: the workers register their grants (`A`), their waits (`B`) and
//! their ends (`E`) with it, and send it their writes (`W`) with their fencing token, over
//! `resource.sock`. Each write is decided by the shipped
//! [`FencedStore`](redsem::fencing::FencedStore) (`fence.lua`) on a Redis of its own that no
//! fault touches: accepted when its generation is the highest the store has seen for the slot
//! (or equal), rejected otherwise — generations alone, whatever Redis incarnation granted
//! them. It logs every grant (`hold`, with the incarnation for the other properties) and every
//! decision (`write`) in `runner.log`, under one lock held across the store's call, so the log
//! order is the decision order. Its registrations and stores are in `state.rs`
//! (`ResourceState`, `Store`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use redsem::Fence;

use super::state::{Shared, epoch_of};
use crate::now_us;

/// Serves the workers' connections to the resource on `listener`.
pub(super) async fn resource_server(listener: UnixListener, shared: Arc<Shared>) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(resource_conn(stream, shared.clone()));
    }
}

async fn resource_conn(stream: UnixStream, shared: Arc<Shared>) {
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    let mut worker = u32::MAX;
    while let Ok(Some(line)) = lines.next_line().await {
        let f: Vec<&str> = line.split(' ').collect();
        match (f[0], f.len()) {
            ("H", 3) => worker = f[1].parse().unwrap_or(u32::MAX),
            ("B", 3) => {
                shared.with_worker(worker, |ws| ws.waiting.insert(f[1].to_owned()));
            }
            ("A", 7) => {
                let sem: usize = f[2].parse().unwrap_or(0);
                let begin: i64 = f[3].parse().unwrap_or(0);
                let acq: i64 = f[4].parse().unwrap_or(i64::MAX);
                let mut epoch = epoch_of(&shared.restarts.lock().unwrap(), begin, acq);
                if epoch.is_none() {
                    epoch = incarnation_holding(&shared, sem, f[5]).await;
                }
                shared
                    .resource
                    .lock()
                    .unwrap()
                    .ops
                    .insert(f[1].to_owned(), (sem, epoch));
                shared.acquisitions.fetch_add(1, Ordering::Relaxed);
                let e = epoch.map_or("?".to_owned(), |e| e.to_string());
                shared
                    .log
                    .line(&format!("hold {} {worker} {} {sem} {e}", now_us(), f[1]));
                shared.with_worker(worker, |ws| {
                    ws.waiting.remove(f[1]);
                    ws.holding.insert(f[1].to_owned(), (sem, f[5].to_owned()));
                });
            }
            ("W", 6) => {
                let (seq, op) = (f[1], f[2]);
                let slot: u32 = f[3].parse().unwrap_or(u32::MAX);
                let generation: u64 = f[4].parse().unwrap_or(0);
                let sent = f[5];
                let decision = {
                    let _order = shared.store.order.lock().await;
                    let known = shared.resource.lock().unwrap().ops.get(op).copied();
                    let (sem, epoch, d) = match known {
                        Some((sem, epoch)) => {
                            let fence = Fence { slot, generation };
                            let key = format!("chaos:{{sem{sem}}}:value");
                            let d = match shared.store.stores[sem]
                                .write(fence, &key, format!("{op} {seq}").as_bytes())
                                .await
                            {
                                Ok(true) => 'A',
                                Ok(false) => 'R',
                                // the store's Redis is never faulted: should not happen
                                Err(e) => {
                                    eprintln!("redsem-chaos: the fenced store failed: {e}");
                                    'X'
                                }
                            };
                            (sem, epoch.map_or("?".to_owned(), |e| e.to_string()), d)
                        }
                        None => (usize::MAX, "?".to_owned(), 'X'),
                    };
                    // logged under the order lock: the log order is the decision order
                    shared.log.line(&format!(
                        "write {} {worker} {op} {sem} {slot} {epoch} {generation} {sent} {d}",
                        now_us()
                    ));
                    d
                };
                let _ = w.write_all(format!("{seq} {decision}\n").as_bytes()).await;
            }
            ("E", 2) => {
                shared.resource.lock().unwrap().ops.remove(f[1]);
                shared.with_worker(worker, |ws| {
                    ws.waiting.remove(f[1]);
                    ws.holding.remove(f[1]);
                });
            }
            _ => {}
        }
    }
}

/// For a grant whose acquire overlapped a restart: the current incarnation if its entry is
/// there (holder ids are unique, so the grant was made there), when no restart began while
/// looking.
async fn incarnation_holding(shared: &Shared, sem: usize, holder: &str) -> Option<u32> {
    let state = || {
        let r = shared.restarts.lock().unwrap();
        (r.len(), r.last().is_none_or(|x| x.1 != i64::MAX))
    };
    let (before, settled) = state();
    if !settled {
        return None;
    }
    let mut guard = shared.direct.lock().await;
    if guard.is_none() {
        let client = redis::Client::open(shared.redis_url.as_str()).ok()?;
        let conn = tokio::time::timeout(
            Duration::from_millis(500),
            client.get_multiplexed_async_connection(),
        )
        .await
        .ok()?
        .ok()?;
        *guard = Some(conn);
    }
    let conn = guard.as_mut()?;
    let keys = shared.cfg.keys(&shared.cfg.sems.get(sem)?.name).ok()?;
    let found = tokio::time::timeout(
        Duration::from_secs(2),
        redis::cmd("HEXISTS")
            .arg(&keys.meta)
            .arg(holder)
            .query_async::<i64>(conn),
    )
    .await;
    let found = match found {
        Ok(Ok(n)) => n == 1,
        _ => {
            *guard = None;
            return None;
        }
    };
    let (after, settled) = state();
    (found && settled && after == before).then_some(before as u32)
}

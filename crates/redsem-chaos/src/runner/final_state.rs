//! What Redis holds once every worker has exited, saved as `final.json` for the checker's
//! `cleanup` property: entries without a lease, leases that outlive the workers, keys,
//! subscriptions and connections left, and what remains once the leases ran out and redsem
//! reaped them.

use std::collections::HashSet;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use serde::{Deserialize, Serialize};

use crate::config::{Config, SemSpec};
use crate::now_us;

/// What Redis holds once every worker has exited (see [`crate::checker`], property
/// "cleanup").
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct FinalState {
    /// When the last worker had exited.
    pub exited_at: i64,
    /// When the state below was read.
    pub read_at: i64,
    /// Entries (ids in the records, queue or slot table) without a lease: they would never
    /// expire.
    pub orphans: Vec<String>,
    /// Leases that end later than one lease after the last worker exited.
    pub leases_too_long: Vec<String>,
    /// Entries (with a lease) left by the workers, per semaphore, before reaping.
    pub entries_left: Vec<(String, usize)>,
    /// Keys other than the semaphores' seven.
    pub foreign_keys: Vec<String>,
    /// Pub/sub channels still subscribed.
    pub channels: Vec<String>,
    /// Client connections still open (other than the checker's own).
    pub clients: Vec<String>,
    /// Problems after the leases ran out and a redsem call reaped them.
    pub after_reap: Vec<String>,
    /// The read failed.
    pub error: Option<String>,
}

/// Reads what Redis holds once every worker has exited (`exited_at`).
pub(super) async fn final_state(cfg: &Config, url: &str, exited_at: i64) -> FinalState {
    let mut st = FinalState {
        exited_at,
        ..FinalState::default()
    };
    if let Err(e) = read_final(cfg, url, &mut st).await {
        st.error = Some(format!("{e:#}"));
    }
    st
}

async fn read_final(cfg: &Config, url: &str, st: &mut FinalState) -> anyhow::Result<()> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    st.clients = clients_left(&mut conn).await?;
    st.channels = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("*")
        .query_async(&mut conn)
        .await?;
    st.read_at = now_us();
    let mut known: HashSet<String> = HashSet::new();
    for s in &cfg.sems {
        known.extend(cfg.keys(&s.name)?.in_script_order().map(str::to_owned));
    }
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await?;
    st.foreign_keys = keys.into_iter().filter(|k| !known.contains(k)).collect();
    let now_ms = st.read_at / 1000;
    // Lease expiries are in Redis's time, which a `clock-step` fault moved ahead of real
    // time: they are compared in real time
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
    let redis_ahead_ms = (secs * 1_000_000 + micros) / 1000 - now_ms;
    let mut latest_expiry = 0i64;
    for s in &cfg.sems {
        let latest = entries_left(cfg, s, &mut conn, redis_ahead_ms, st).await?;
        latest_expiry = latest_expiry.max(latest);
    }
    // wait for the last lease to run out, then let redsem reap (any script call does)
    let wait = (latest_expiry - now_ms + cfg.slack_ms as i64).clamp(0, 3 * cfg.lease_ms as i64);
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    entries_after_reap(cfg, url, st).await?;
    for s in &cfg.sems {
        keys_after_reap(cfg, s, &mut conn, st).await?;
    }
    Ok(())
}

/// The client connections still open (the proxies are gone: the server gets a moment to see
/// their connections close), other than this one and the replica's link.
async fn clients_left(conn: &mut MultiplexedConnection) -> anyhow::Result<Vec<String>> {
    let mut clients = Vec::new();
    for _ in 0..20 {
        let list: String = redis::cmd("CLIENT").arg("LIST").query_async(conn).await?;
        clients = list
            .lines()
            .filter(|l| !l.contains("cmd=client|list") && !l.trim().is_empty())
            // the replica's link (`failover-replica`) is not a client's
            .filter(|l| {
                !l.split(' ')
                    .any(|f| f.strip_prefix("flags=").is_some_and(|f| f.contains('S')))
            })
            .map(str::to_owned)
            .collect();
        if clients.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(clients)
}

/// Records the entries the workers left in semaphore `s`: those without a lease (orphans),
/// the leases that end too late, and their number. Returns the latest expiry of its leases
/// (real time, ms; `0` if none), given Redis's clock `redis_ahead_ms` ahead of real time.
async fn entries_left(
    cfg: &Config,
    s: &SemSpec,
    conn: &mut MultiplexedConnection,
    redis_ahead_ms: i64,
    st: &mut FinalState,
) -> anyhow::Result<i64> {
    let keys = cfg.keys(&s.name)?;
    // session leases; an entry has a lease when its session (in the index) has one
    let exp: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(&keys.exp)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await?;
    // (not the lease set's marker `#`, which never expires)
    let exp: Vec<(String, f64)> = exp.into_iter().filter(|(sid, _)| sid != "#").collect();
    let sessions: HashSet<&str> = exp.iter().map(|(sid, _)| sid.as_str()).collect();
    let index: Vec<String> = members(conn, &keys.own).await?;
    let with_lease: HashSet<&str> = index
        .iter()
        .filter_map(|m| m.split_once('|'))
        .filter(|(sid, _)| sessions.contains(sid))
        .map(|(_, id)| id)
        .collect();
    let meta: Vec<String> = redis::cmd("HKEYS")
        .arg(&keys.meta)
        .query_async(conn)
        .await?;
    let queue: Vec<String> = members(conn, &keys.queue).await?;
    let holders: Vec<String> = redis::cmd("HVALS")
        .arg(&keys.slots)
        .query_async(conn)
        .await?;
    for id in meta.iter().chain(&queue).chain(&holders) {
        if !with_lease.contains(id.as_str()) {
            st.orphans.push(format!("{}: {id}", s.name));
        }
    }
    let mut latest_expiry = 0i64;
    for (id, score) in &exp {
        let score = *score as i64 - redis_ahead_ms;
        latest_expiry = latest_expiry.max(score);
        if score > st.exited_at / 1000 + cfg.lease_ms as i64 + cfg.slack_ms as i64 {
            st.leases_too_long.push(format!(
                "{}: {id} expires {} ms after the last worker exited",
                s.name,
                score - st.exited_at / 1000
            ));
        }
    }
    st.entries_left.push((s.name.clone(), exp.len()));
    Ok(latest_expiry)
}

/// The members of the sorted set `key`.
async fn members(conn: &mut MultiplexedConnection, key: &str) -> redis::RedisResult<Vec<String>> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
}

/// Once every lease ran out: lets redsem reap (its `inspect` does), and records the holders
/// and waiters it still shows.
async fn entries_after_reap(cfg: &Config, url: &str, st: &mut FinalState) -> anyhow::Result<()> {
    let rs = redsem::Client::builder(url)
        .prefix(crate::config::PREFIX)
        .build()
        .await?;
    for s in &cfg.sems {
        // opening reaps (`open.lua`; `stats.lua`, which `inspect` runs, is read-only: it leaves
        // out what has expired but removes nothing)
        let opened = rs
            .semaphore(&s.name, s.limit)
            .limit_policy(redsem::LimitPolicy::Adopt)
            .allow_evicting_policy(true)
            .open()
            .await;
        match opened {
            Ok(sem) => drop(sem),
            Err(redsem::Error::UnknownSemaphore { .. }) => {}
            Err(e) => st
                .after_reap
                .push(format!("{}: opening to reap failed: {e}", s.name)),
        }
        match rs.inspect(&s.name).await {
            Ok(stats) => {
                if stats.holder_count > 0 || stats.waiter_count > 0 {
                    st.after_reap.push(format!(
                        "{}: {} holders and {} waiters left after every lease ran out",
                        s.name, stats.holder_count, stats.waiter_count
                    ));
                }
            }
            Err(redsem::Error::UnknownSemaphore { .. }) => {}
            Err(e) => st
                .after_reap
                .push(format!("{}: inspect failed: {e}", s.name)),
        }
    }
    drop(rs);
    Ok(())
}

/// Records the keys of semaphore `s` that still hold entries once they were reaped, and free
/// slots fewer than the limit.
async fn keys_after_reap(
    cfg: &Config,
    s: &SemSpec,
    conn: &mut MultiplexedConnection,
    st: &mut FinalState,
) -> anyhow::Result<()> {
    let keys = cfg.keys(&s.name)?;
    let sorted_sets = [&keys.queue, &keys.exp].map(|k| (k, true));
    let hashes = [&keys.meta, &keys.slots].map(|k| (k, false));
    for (key, sorted_set) in sorted_sets.into_iter().chain(hashes) {
        // members left (of `exp`, not its marker `#`, whose score +inf stays with the
        // configuration); fields of a hash
        let exists: i64 = if sorted_set {
            redis::cmd("ZCOUNT")
                .arg(key)
                .arg("-inf")
                .arg("(+inf")
                .query_async(conn)
                .await?
        } else {
            redis::cmd("EXISTS").arg(key).query_async(conn).await?
        };
        if exists != 0 {
            st.after_reap
                .push(format!("{}: key {key} still exists", s.name));
        }
    }
    let cfg_exists: i64 = redis::cmd("EXISTS")
        .arg(&keys.cfg)
        .query_async(conn)
        .await?;
    if cfg_exists == 1 {
        // the free slots as the scripts count them (docs/PROTOCOL.md, "Free slots"): those
        // listed in `free` below the high-water mark `hw`, and every slot from `hw` up to the
        // limit
        let limit = i64::from(s.limit);
        let hw: Option<i64> = redis::cmd("HGET")
            .arg(&keys.cfg)
            .arg("hw")
            .query_async(conn)
            .await?;
        let hw = hw.unwrap_or(0);
        let listed: i64 = redis::cmd("ZCOUNT")
            .arg(&keys.free)
            .arg(0)
            .arg(format!("({}", hw.min(limit)))
            .query_async(conn)
            .await?;
        let free = listed + (limit - hw).max(0);
        if free != limit {
            st.after_reap.push(format!(
                "{}: {free} free slots of {limit} once nobody holds any (high-water mark {hw}, {listed} listed)",
                s.name
            ));
        }
    }
    Ok(())
}

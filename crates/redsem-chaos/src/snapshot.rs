//! Periodic, atomic snapshots of every semaphore's state in Redis, taken by a read-only Lua
//! script on a direct connection (not through a worker's proxy; with `failover-replica`,
//! through the runner's unfaulted proxy, which follows the failovers): the ground truth the checker compares
//! the workers' beliefs with. The script reads and never writes, so it reaps nothing: an
//! expired entry stays visible, with its expiry, until a redsem script reaps it.
//!
//! `snapshots.log`:
//!
//! | line | meaning |
//! |---|---|
//! | `I <n> <id>` | entry id `<id>` is called `<n>` below |
//! | `S <sent> <received> <redis_us> <sem> <limit> <entries> <slots>` | one semaphore at Redis time `<redis_us>` |
//!
//! `<entries>` is `-` or `;`-separated `<n>:<exp_ms>:<queue rank>:<permits>:<granted_ms>:<ticket>:<slots>:<fences>:<priority>`
//! (`-1` for a missing field, slots `a,b` or `-`, fences (generations, same order) likewise); an entry is every id found in the lease
//! set, the queue or the records. `<slots>` is `-` or `;`-separated `<slot>=<n>` (the slot
//! table). `<sent>`/`<received>` (runner clock) tell which Redis incarnation answered.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use redis::Value;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::events::Log;
use crate::now_us;

/// The snapshot script's body. It runs after the library's own prelude
/// (`redsem::internals::script_source`), whose `decode` reads an entry's record and `sess_of`
/// names its session exactly as the library's scripts do; it writes nothing.
const SNAPSHOT_LUA: &str = r#"
local t = redis.call('TIME')
local res = { tonumber(t[1]) * 1000000 + tonumber(t[2]) }
for i = 1, #KEYS, 6 do
  local cfg, queue, exp, meta, slots, own =
    KEYS[i], KEYS[i + 1], KEYS[i + 2], KEYS[i + 3], KEYS[i + 4], KEYS[i + 5]
  local limit = tonumber(redis.call('HGET', cfg, 'limit') or '-1')
  local recs, seen = {}, {}
  local function rec(id)
    local r = seen[id]
    if not r then
      r = { id = id, e = -1, q = -1 }
      seen[id] = r
      recs[#recs + 1] = r
    end
    return r
  end
  -- an entry's lease is its session's: '<channel id>~<lease ms>', listed in the index
  local sess = {}
  local e = redis.call('ZRANGE', exp, 0, -1, 'WITHSCORES')
  for j = 1, #e, 2 do sess[e[j]] = tonumber(e[j + 1]) end
  for _, mem in ipairs(redis.call('ZRANGE', own, 0, -1)) do
    local bar = string.find(mem, '|', 1, true)
    if bar and string.sub(mem, bar + 1, bar + 1) ~= '!' then
      rec(string.sub(mem, bar + 1)).e = sess[string.sub(mem, 1, bar - 1)] or -1
    end
  end
  local q = redis.call('ZRANGE', queue, 0, -1)
  for j = 1, #q do rec(q[j]).q = j end
  for _, id in ipairs(redis.call('HKEYS', meta)) do rec(id) end
  local lines = {}
  for _, r in ipairs(recs) do
    local n, a, tk, s, fs, p = -1, -1, -1, '-', '-', 0
    local raw = redis.call('HGET', meta, r.id)
    if raw then
      K_META = meta -- (the prelude's: named in decode's error)
      local m = decode(raw)
      -- the session the record names, as the library's scripts compute it (the index may
      -- have lost it): a detached holder's is its own ('o'), else its client's
      local sid = sess_of(m)
      if sess[sid] then r.e = sess[sid] end
      n = m.n or -1
      a = tonumber(m.a) or -1
      tk = m.t or -1
      p = m.p or 0
      if m.s then s = table.concat(m.s, ','); fs = table.concat(m.f, ',') end
    end
    lines[#lines + 1] = string.format('%s %d %d %d %d %d %s %s %d', r.id, r.e, r.q, n, a, tk, s, fs, p)
  end
  local sl = redis.call('HGETALL', slots)
  local sls = {}
  for j = 1, #sl, 2 do sls[#sls + 1] = sl[j] .. ' ' .. sl[j + 1] end
  res[#res + 1] = limit
  res[#res + 1] = table.concat(lines, '\n')
  res[#res + 1] = table.concat(sls, '\n')
end
return res
"#;

/// Takes a snapshot every `cfg.snapshot_ms` until `stop`, appending to `path`.
pub async fn run(url: String, cfg: Config, path: &Path, stop: CancellationToken) {
    let log = match Log::buffered(path) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("redsem-chaos: cannot write {}: {e}", path.display());
            return;
        }
    };
    let script = redis::Script::new(&redsem::internals::script_source(SNAPSHOT_LUA));
    let client = match redis::Client::open(url.as_str()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("redsem-chaos: bad Redis URL {url}: {e}");
            return;
        }
    };
    // six keys of each semaphore (`cfg`, `queue`, `exp`, `meta`, `slots`, `own`), in the
    // library's layout under the run's prefix
    let mut all_keys: Vec<String> = Vec::new();
    for s in &cfg.sems {
        match cfg.keys(&s.name) {
            Ok(k) => all_keys.extend([k.cfg, k.queue, k.exp, k.meta, k.slots, k.own]),
            Err(e) => {
                eprintln!("redsem-chaos: {e}");
                return;
            }
        }
    }
    let mut interned: HashMap<String, u32> = HashMap::new();
    let mut conn: Option<redis::aio::MultiplexedConnection> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.snapshot_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        if conn.is_none() {
            let c = tokio::time::timeout(
                Duration::from_millis(500),
                client.get_multiplexed_async_connection(),
            )
            .await;
            match c {
                Ok(Ok(c)) => conn = Some(c),
                _ => continue,
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let mut inv = script.prepare_invoke();
        for k in &all_keys {
            inv.key(k);
        }
        let sent = now_us();
        let reply =
            tokio::time::timeout(Duration::from_secs(3), inv.invoke_async::<Value>(c)).await;
        let received = now_us();
        let Ok(Ok(Value::Array(items))) = reply else {
            conn = None;
            continue;
        };
        record(&log, &mut interned, sent, received, &items, cfg.sems.len());
    }
    log.flush();
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => String::new(),
    }
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => text(other).parse().unwrap_or(-1),
    }
}

fn record(
    log: &Log,
    interned: &mut HashMap<String, u32>,
    sent: i64,
    received: i64,
    items: &[Value],
    sems: usize,
) {
    if items.len() != 1 + 3 * sems {
        return;
    }
    let redis_us = int(&items[0]);
    let mut intern = |id: &str| -> u32 {
        if let Some(&n) = interned.get(id) {
            return n;
        }
        let n = interned.len() as u32;
        interned.insert(id.to_owned(), n);
        log.line(&format!("I {n} {id}"));
        n
    };
    for s in 0..sems {
        let limit = int(&items[1 + 3 * s]);
        let entries_raw = text(&items[2 + 3 * s]);
        let slots_raw = text(&items[3 + 3 * s]);
        let mut entries = Vec::new();
        for line in entries_raw.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() != 9 {
                continue;
            }
            let n = intern(f[0]);
            entries.push(format!(
                "{n}:{}:{}:{}:{}:{}:{}:{}:{}",
                f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8]
            ));
        }
        let mut slots = Vec::new();
        for line in slots_raw.lines() {
            if let Some((slot, id)) = line.split_once(' ') {
                slots.push(format!("{slot}={}", intern(id)));
            }
        }
        let join = |v: Vec<String>| {
            if v.is_empty() {
                "-".to_owned()
            } else {
                v.join(";")
            }
        };
        log.line(&format!(
            "S {sent} {received} {redis_us} {s} {limit} {} {}",
            join(entries),
            join(slots)
        ));
    }
}

//! Shared helpers for redsem's integration tests: private servers, clients, and checks of
//! what a semaphore left in Redis.
#![allow(dead_code)]

use std::time::Duration;

#[allow(unused_imports)]
pub use test_support::{Flavor, Reply, Server, ServerOptions, flavors};

/// A client with short timeouts, suitable for tests that break things.
pub async fn client(server: &Server) -> redsem::Client {
    redsem::Client::builder(server.url())
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap()
}

pub async fn open(
    client: &redsem::Client,
    name: &str,
    limit: u32,
    lease: Duration,
) -> redsem::Semaphore {
    client
        .semaphore(name, limit)
        .lease(lease)
        .open()
        .await
        .unwrap()
}

pub fn key(name: &str, suffix: &str) -> String {
    format!("redsem:{{{name}}}:{suffix}")
}

/// Members of a key of semaphore `name`: its sessions for `exp` (not the `#` marker, whose
/// score is `+inf`), every member for the other sorted sets (`own` with its marker), the
/// fields of a hash.
pub fn card(server: &Server, name: &str, suffix: &str) -> i64 {
    let k = key(name, suffix);
    match suffix {
        "exp" => server.cmd(&["ZCOUNT", &k, "-inf", "(+inf"]),
        "queue" | "free" | "own" => server.cmd(&["ZCARD", &k]),
        _ => server.cmd(&["HLEN", &k]),
    }
    .as_int()
    .unwrap()
}

/// The free slots of semaphore `name`: those listed in `free` below the limit, and the
/// unlisted ones from the high-water mark (`cfg.hw`) up to the limit.
pub fn free_slots(server: &Server, name: &str) -> i64 {
    const FREE: &str = "local l = tonumber(redis.call('HGET', KEYS[1], 'limit') or '0') \
        local hw = tonumber(redis.call('HGET', KEYS[1], 'hw') or '0') \
        local n = redis.call('ZCOUNT', KEYS[2], '-inf', '(' .. l) \
        if hw < l then n = n + l - hw end return n";
    server
        .cmd(&["EVAL", FREE, "2", &key(name, "cfg"), &key(name, "free")])
        .as_int()
        .unwrap()
}

/// Entries in the session index of semaphore `name` (`<session>|<id>`; not its `#` marker,
/// nor the `<session>|!<id>` notes of entries removed by someone else).
pub fn indexed(server: &Server, name: &str) -> i64 {
    const LIVE: &str = "local n = 0 for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do \
        local bar = string.find(m, '|', 1, true) \
        if bar and string.sub(m, bar + 1, bar + 1) ~= '!' then n = n + 1 end end return n";
    server
        .cmd(&["EVAL", LIVE, "1", &key(name, "own")])
        .as_int()
        .unwrap()
}

/// The session (`<channel id>~<lease ms>`) the entry `id` of semaphore `name` belongs to, as
/// the index says.
pub fn session_of(server: &Server, name: &str, id: &str) -> String {
    let members = server.cmd(&["ZRANGE", &key(name, "own"), "0", "-1"]);
    let Reply::Array(members) = members else {
        panic!("{members:?}")
    };
    members
        .iter()
        .filter_map(|m| m.as_str())
        .find_map(|m| m.strip_suffix(&format!("|{id}")).map(str::to_owned))
        .unwrap_or_else(|| panic!("{id} is not in the index of {name}"))
}

/// Holders, waiters, indexed entries and records left for the semaphore `name`.
pub fn entries(server: &Server, name: &str) -> [i64; 4] {
    [
        card(server, name, "slots"),
        card(server, name, "queue"),
        indexed(server, name),
        card(server, name, "meta"),
    ]
}

/// Waits (generously) until the semaphore holds no entry at all, and panics otherwise.
pub async fn assert_nothing_left(server: &Server, name: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let e = entries(server, name);
        if e == [0, 0, 0, 0] {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "semaphore {name} left entries in Redis (slots, queue, indexed, records) = {e:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The field `name` of an entry's record as stored in `meta` (docs/PROTOCOL.md, "Records":
/// `n|t|p|c|o|l|w|q|a|s|f|<label length>|<label>`): `"n"`, `"t"`, ... `"f"`, or `"lb"`, the
/// label.
pub fn record_field(raw: &str, name: &str) -> String {
    const NAMES: [&str; 11] = ["n", "t", "p", "c", "o", "l", "w", "q", "a", "s", "f"];
    let fields: Vec<&str> = raw.splitn(12, '|').collect();
    if name == "lb" {
        let (len, rest) = fields[11].split_once('|').unwrap();
        return rest[..len.parse::<usize>().unwrap()].to_owned();
    }
    let i = NAMES.iter().position(|n| *n == name).unwrap();
    fields[i].to_owned()
}

/// Polls `cond` every 10 ms until it holds or `within` passes.
pub async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}

/// Waits until at least `n` requests are queued on `sem` (its stats say so); panics after
/// 20 s.
pub async fn until_queued(sem: &redsem::Semaphore, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while sem.stats().await.unwrap().waiter_count < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} requests did not queue"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every Redis (and Valkey, when installed) flavour, one fresh server each.
pub fn servers() -> Vec<Server> {
    flavors().into_iter().map(Server::start).collect()
}

/// Redis's clock (`TIME`) in microseconds: what fence generations are derived from.
pub fn redis_time_us(server: &Server) -> u64 {
    match server.cmd(&["TIME"]) {
        Reply::Array(t) => {
            let part = |i: usize| t[i].as_str().unwrap().parse::<u64>().unwrap();
            part(0) * 1_000_000 + part(1)
        }
        other => panic!("TIME answered {other:?}"),
    }
}

/// `(calls, usec)` per command since the last `CONFIG RESETSTAT` (`INFO commandstats`).
pub fn command_stats(server: &Server) -> std::collections::HashMap<String, (u64, u64)> {
    let info = server.cmd(&["INFO", "commandstats"]);
    let text = info.as_str().unwrap().to_owned();
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("cmdstat_")?;
            let (name, fields) = rest.split_once(':')?;
            let field = |f: &str| {
                fields
                    .split(',')
                    .find_map(|x| x.strip_prefix(f))
                    .and_then(|v| v.parse::<u64>().ok())
            };
            Some((name.to_owned(), (field("calls=")?, field("usec=")?)))
        })
        .collect()
}

/// Redis's `calls` of `command` so far (from `INFO commandstats`).
pub fn calls(server: &Server, command: &str) -> u64 {
    let info = match server.cmd(&["INFO", "commandstats"]) {
        Reply::Bulk(s) => s,
        other => panic!("{other:?}"),
    };
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The commands a client sends to run one of redsem's scripts: a function of its library, or
/// the script itself where the library cannot be used (one per call).
pub const SCRIPT_CALLS: [&str; 5] = ["fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval"];

/// Calls of redsem's scripts so far (functions and scripts, [`SCRIPT_CALLS`]).
pub fn script_calls(server: &Server) -> u64 {
    SCRIPT_CALLS.iter().map(|c| calls(server, c)).sum()
}

/// Kills every subscriber (pub/sub) connection of `server`; at least one must have existed.
pub fn kill_subscribers(server: &Server) {
    assert!(
        server
            .cmd(&["CLIENT", "KILL", "TYPE", "pubsub"])
            .as_int()
            .unwrap()
            >= 1,
        "no subscriber connection to kill"
    );
}

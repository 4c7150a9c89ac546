//! The semaphore designs under test, behind one small enum so the worker drives them alike.
//!
//! Four are re-implementations of the reference text ("Distributed Semaphores with Redis",
//! `shared/seed/000_32ec7f3e92f46f3b.txt`) and exist only in this benchmark, never in the
//! library's API; the fifth is the `redsem` library itself:
//!
//! | design | reference | module |
//! |---|---|---|
//! | `counter` | section 1, INCR/DECR counter (code verbatim) | [`counter`] |
//! | `zset-poll` | section 1, leased sorted set, 20 ms poll (prose only) | [`zset_poll`] |
//! | `fifo-poll` | section 2, FIFO tickets, 20 ms poll (ENQUEUE/CHECK verbatim) | [`fifo_poll`] |
//! | `fifo-notify` | section 3, FIFO + pub/sub release notification (class verbatim) | [`fifo_notify`] |
//! | `redsem` | the library in `crates/redsem` | [`redsem`] |
//!
//! The gaps of the reference are filled exactly as the Python peers did
//! (`shared/bench/peers/GAPS.md`, `peers/py/seed_semaphores.py`); each module says how. The
//! Lua scripts are `.lua` files beside the module that loads them, byte-for-byte the peers'
//! strings (so their SHA1, and thus the EVALSHA a Python and a Rust worker send, are equal; a
//! unit test pins them).
//!
//! Client set-up shared by the baselines (a deliberate, documented difference from redis-py's
//! pool): each worker process opens **one** multiplexed redis-rs connection that all its tasks
//! share (commands of concurrent tasks are pipelined on it), with no response timeout (redis-py
//! has none either; redis-rs' default of 500 ms would turn a loaded Redis into spurious
//! errors), plus one pub/sub connection for `fifo-notify`.

pub mod counter;
pub mod fifo_notify;
pub mod fifo_poll;
pub mod redsem;
pub mod zset_poll;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

/// The designs, by their command-line names.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum DesignKind {
    /// INCR/DECR counter: no lease, leaks slots of crashed holders.
    #[value(name = "counter")]
    Counter,
    /// Leased sorted set, polling every 20 ms (unqueued, unfair).
    #[value(name = "zset-poll", alias = "zset_poll")]
    ZsetPoll,
    /// FIFO tickets, polling every 20 ms.
    #[value(name = "fifo-poll", alias = "fifo_poll")]
    FifoPoll,
    /// FIFO tickets + pub/sub release notification waking every local waiter, 250 ms fallback.
    #[value(name = "fifo-notify", alias = "fifo_notify")]
    FifoNotify,
    /// The `redsem` library (FIFO, targeted wake-up), calling its Redis Functions library.
    #[value(name = "redsem")]
    Redsem,
    /// The `redsem` library running its scripts (`EVALSHA`) instead of its Functions library:
    /// the path of servers where the library cannot be used.
    #[value(name = "redsem-scripts", alias = "redsem_scripts")]
    RedsemScripts,
}

impl DesignKind {
    /// Every design, in table order.
    pub const ALL: [DesignKind; 6] = [
        DesignKind::Counter,
        DesignKind::ZsetPoll,
        DesignKind::FifoPoll,
        DesignKind::FifoNotify,
        DesignKind::Redsem,
        DesignKind::RedsemScripts,
    ];

    /// The command-line name (`zset-poll`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DesignKind::Counter => "counter",
            DesignKind::ZsetPoll => "zset-poll",
            DesignKind::FifoPoll => "fifo-poll",
            DesignKind::FifoNotify => "fifo-notify",
            DesignKind::Redsem => "redsem",
            DesignKind::RedsemScripts => "redsem-scripts",
        }
    }

    /// Parses a command-line name (also the peers' `zset_poll` spelling).
    pub fn parse(s: &str) -> Option<DesignKind> {
        let s = s.trim().replace('_', "-");
        DesignKind::ALL.into_iter().find(|d| d.name() == s)
    }

    /// One line for reports.
    pub fn description(self) -> &'static str {
        match self {
            DesignKind::Counter => "INCR/DECR counter (reference s.1)",
            DesignKind::ZsetPoll => "leased sorted set, polling 20 ms (reference s.1)",
            DesignKind::FifoPoll => "FIFO tickets, polling 20 ms (reference s.2)",
            DesignKind::FifoNotify => {
                "FIFO tickets + pub/sub release notify, 250 ms fallback (reference s.3)"
            }
            DesignKind::Redsem => "redsem library: FIFO tickets, targeted wake-up",
            DesignKind::RedsemScripts => {
                "redsem library running its scripts (EVALSHA) instead of its Functions library"
            }
        }
    }

    /// Whether this is the library (either path).
    pub fn is_redsem(self) -> bool {
        matches!(self, DesignKind::Redsem | DesignKind::RedsemScripts)
    }

    /// Whether a crashed holder's slot comes back (the design has a lease).
    pub fn has_lease(self) -> bool {
        !matches!(self, DesignKind::Counter)
    }

    /// Redis commands this design's clients send themselves ("round trips" in the reports),
    /// counted from `INFO commandstats` (`calls` per command) after `CONFIG RESETSTAT`.
    ///
    /// Counting rule, per design:
    /// - every script call: `EVAL`, `EVALSHA`, `EVAL_RO`, `EVALSHA_RO`, `FCALL`, `FCALL_RO`,
    ///   `SCRIPT LOAD` (commands *inside* scripts are not sent by a client and not counted);
    /// - plus the design's own top-level commands: `counter` INCR + DECR; `zset-poll` ZREM;
    ///   `fifo-poll` MULTI + EXEC + the 2 ZREMs queued in each release transaction (counted as
    ///   2 x EXEC, because the CHECK script also issues ZREM, for expired entries); `fifo-notify`
    ///   the same plus the queued PUBLISH (1 x EXEC) and SUBSCRIBE; `redsem` the top-level
    ///   commands listed in [`redsem::TOP_LEVEL`].
    ///
    /// A MULTI/EXEC transaction thus counts every command as sent (MULTI, each queued command,
    /// EXEC), although redis-rs writes a transaction in one go and reads its replies together:
    /// the figure counts client requests, not TCP exchanges. Connection handshakes (HELLO,
    /// CLIENT SETINFO, SELECT, ...) and the harness's own commands are never counted.
    pub fn sent_commands(self, stats: &BTreeMap<String, u64>) -> u64 {
        let get = |k: &str| stats.get(k).copied().unwrap_or(0);
        let scripts: u64 = crate::metrics::SCRIPT_COMMANDS.iter().map(|k| get(k)).sum();
        let exec = get("exec");
        scripts
            + match self {
                DesignKind::Counter => get("incr") + get("decr"),
                DesignKind::ZsetPoll => get("zrem"),
                DesignKind::FifoPoll => get("multi") + exec + 2 * exec,
                DesignKind::FifoNotify => get("multi") + exec + 3 * exec + get("subscribe"),
                DesignKind::Redsem | DesignKind::RedsemScripts => {
                    self::redsem::TOP_LEVEL.iter().map(|k| get(k)).sum()
                }
            }
    }
}

impl fmt::Display for DesignKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What every design needs to open its semaphore.
#[derive(Clone, Debug)]
pub struct Params {
    /// Redis URL, e.g. `redis://127.0.0.1:16379/0`.
    pub redis_url: String,
    /// Semaphore name; keys are derived from it (`sem:NAME:*` for the baselines).
    pub name: String,
    /// Maximum simultaneous holders.
    pub limit: u32,
    /// Lease (TTL) in milliseconds, for the designs that have one.
    pub lease_ms: u64,
    /// `redsem` only: grants wait for this many replicas (synced mode; 0 = off).
    pub synced_replicas: u32,
}

/// Why one acquire attempt failed (the worker retries and counts it).
#[derive(Debug)]
pub enum AcquireError {
    /// The waiter's own queue entry expired while it waited (FIFO designs' CHECK returned -1,
    /// the reference's `TimeoutError("semaphore lease expired while waiting")`). Retried at once.
    LeaseExpired,
    /// A Redis or library error. Retried after a 10 ms pause.
    Other(anyhow::Error),
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireError::LeaseExpired => f.write_str("semaphore lease expired while waiting"),
            AcquireError::Other(e) => write!(f, "{e:#}"),
        }
    }
}

impl From<redis::RedisError> for AcquireError {
    fn from(e: redis::RedisError) -> Self {
        AcquireError::Other(e.into())
    }
}

/// A held slot, to be given back to [`Semaphore::release`].
pub enum Permit {
    /// Baselines: the random token of this acquisition (empty for `counter`).
    Token(String),
    /// The library's permit.
    Redsem(self::redsem::RedsemPermit),
}

/// One opened semaphore of any design, shared by all tasks of a worker process.
pub enum Semaphore {
    /// See [`counter::CounterSemaphore`].
    Counter(counter::CounterSemaphore),
    /// See [`zset_poll::LeasedSemaphore`].
    ZsetPoll(zset_poll::LeasedSemaphore),
    /// See [`fifo_poll::FifoPollingSemaphore`].
    FifoPoll(fifo_poll::FifoPollingSemaphore),
    /// See [`fifo_notify::NotifySemaphore`].
    FifoNotify(fifo_notify::NotifySemaphore),
    /// See [`redsem::RedsemSemaphore`].
    Redsem(self::redsem::RedsemSemaphore),
}

impl Semaphore {
    /// Connects and does all set-up (script loading, subscription) so that the first
    /// acquire costs no more than any other.
    pub async fn open(kind: DesignKind, p: &Params) -> anyhow::Result<Semaphore> {
        Ok(match kind {
            DesignKind::Counter => Semaphore::Counter(counter::CounterSemaphore::open(p).await?),
            DesignKind::ZsetPoll => Semaphore::ZsetPoll(zset_poll::LeasedSemaphore::open(p).await?),
            DesignKind::FifoPoll => {
                Semaphore::FifoPoll(fifo_poll::FifoPollingSemaphore::open(p).await?)
            }
            DesignKind::FifoNotify => {
                Semaphore::FifoNotify(fifo_notify::NotifySemaphore::open(p).await?)
            }
            DesignKind::Redsem => {
                Semaphore::Redsem(self::redsem::RedsemSemaphore::open(p, false).await?)
            }
            DesignKind::RedsemScripts => {
                Semaphore::Redsem(self::redsem::RedsemSemaphore::open(p, true).await?)
            }
        })
    }

    /// Opens `count` semaphores named `NAME-0` .. `NAME-<count-1>` (just `NAME` when `count`
    /// is 1, as [`Semaphore::open`]). The library's share one client, as one process using many
    /// semaphores would; each baseline opens its own connection(s) per semaphore.
    pub async fn open_many(
        kind: DesignKind,
        p: &Params,
        count: u32,
    ) -> anyhow::Result<Vec<Semaphore>> {
        if count <= 1 {
            return Ok(vec![Semaphore::open(kind, p).await?]);
        }
        let names: Vec<String> = (0..count).map(|i| format!("{}-{i}", p.name)).collect();
        if kind.is_redsem() {
            let scripts = kind == DesignKind::RedsemScripts;
            let sems = self::redsem::RedsemSemaphore::open_many(p, &names, scripts).await?;
            return Ok(sems.into_iter().map(Semaphore::Redsem).collect());
        }
        let mut sems = Vec::with_capacity(names.len());
        for name in names {
            let p = Params { name, ..p.clone() };
            sems.push(Semaphore::open(kind, &p).await?);
        }
        Ok(sems)
    }

    /// Waits for a slot.
    pub async fn acquire(&self) -> Result<Permit, AcquireError> {
        // Each design's future is boxed, so that a waiting task holds that design's future
        // only, not the largest of all designs' (the memory scenario measures per-waiter cost).
        match self {
            Semaphore::Counter(s) => Box::pin(s.acquire()).await.map(Permit::Token),
            Semaphore::ZsetPoll(s) => Box::pin(s.acquire()).await.map(Permit::Token),
            Semaphore::FifoPoll(s) => Box::pin(s.acquire()).await.map(Permit::Token),
            Semaphore::FifoNotify(s) => Box::pin(s.acquire()).await.map(Permit::Token),
            Semaphore::Redsem(s) => Box::pin(s.acquire()).await.map(Permit::Redsem),
        }
    }

    /// Gives a slot back; returns when Redis confirmed it.
    pub async fn release(&self, permit: Permit) -> anyhow::Result<()> {
        match (self, permit) {
            (Semaphore::Counter(s), Permit::Token(t)) => Box::pin(s.release(&t)).await,
            (Semaphore::ZsetPoll(s), Permit::Token(t)) => Box::pin(s.release(&t)).await,
            (Semaphore::FifoPoll(s), Permit::Token(t)) => Box::pin(s.release(&t)).await,
            (Semaphore::FifoNotify(s), Permit::Token(t)) => Box::pin(s.release(&t)).await,
            (Semaphore::Redsem(s), Permit::Redsem(p)) => Box::pin(s.release(p)).await,
            _ => anyhow::bail!("permit of another design"),
        }
    }

    /// Stops background tasks (the `fifo-notify` listener; the library's own).
    pub async fn close(self) {
        match self {
            Semaphore::FifoNotify(s) => s.close(),
            Semaphore::Redsem(s) => s.close().await,
            _ => {}
        }
    }
}

/// Opens the multiplexed connection every baseline uses: no response timeout, 5 s to connect.
pub async fn connect(redis_url: &str) -> anyhow::Result<MultiplexedConnection> {
    let client = redis::Client::open(redis_url)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(Duration::from_secs(5)));
    Ok(client
        .get_multiplexed_async_connection_with_config(&config)
        .await?)
}

/// A fresh random token per acquisition, like the reference's `uuid.uuid4().hex`.
pub fn new_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Lua files must stay byte-identical to the peers' Python strings: same SHA1.
    #[test]
    fn lua_scripts_are_the_peers_strings() {
        let cases = [
            (
                zset_poll::ACQUIRE_LUA,
                "7e0097e1158b63e6807698281af9b3eb3cdff7b5",
            ),
            (
                fifo_poll::ENQUEUE_LUA,
                "6cdc8b3588ffa514754aa071b42332d9bf98d375",
            ),
            (
                fifo_poll::CHECK_LUA,
                "cb31334545afb558fb2ad4800d74b41392989afa",
            ),
        ];
        for (code, sha) in cases {
            assert_eq!(redis::Script::new(code).get_hash(), sha);
        }
    }

    #[test]
    fn names_round_trip() {
        for d in DesignKind::ALL {
            assert_eq!(DesignKind::parse(d.name()), Some(d));
        }
        assert_eq!(
            DesignKind::parse("fifo_notify"),
            Some(DesignKind::FifoNotify)
        );
        assert_eq!(DesignKind::parse("nope"), None);
    }

    #[test]
    fn sent_commands_counting() {
        let stats: BTreeMap<String, u64> = [
            ("evalsha", 10),
            ("script|load", 2),
            ("multi", 3),
            ("exec", 3),
            ("zrem", 6),
            ("publish", 3),
            ("subscribe", 1),
            ("zadd", 40),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(DesignKind::FifoPoll.sent_commands(&stats), 12 + 3 + 3 + 6);
        assert_eq!(
            DesignKind::FifoNotify.sent_commands(&stats),
            12 + 3 + 3 + 9 + 1
        );
        assert_eq!(DesignKind::ZsetPoll.sent_commands(&stats), 12 + 6);
    }
}

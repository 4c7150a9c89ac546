//! The Lua scripts and their typed wrappers: the protocol, as this crate speaks it.
//!
//! Every state change is one of these scripts, run atomically by Redis. Each `.lua` file
//! beside this one documents its ARGV and reply; `prelude.lua` (reaping, FIFO granting,
//! targeted publishing) is prepended to each. The wrappers here are the only code that
//! builds script arguments; [`reply`] is the only code that parses replies and
//! notifications; [`denied`] explains permission refusals.
//!
//! Nothing here keeps state: a wrapper takes a connection and a [`Target`] and returns a
//! typed reply or a [`CallError`].

mod denied;
pub(crate) mod ids;
pub(crate) mod keys;
mod library;
mod reply;

use std::sync::LazyLock;

use redis::{Script, Value};

pub(crate) use crate::backend::Conn;
pub(crate) use crate::backend::Node;
use crate::codes::{self, Code};
use crate::error::{CallError, CallResult};
use crate::protocol::keys::Keys;
pub(crate) use denied::subscription as explain_denied_subscription;
pub(crate) use reply::{
    AcquireReply, EntryState, Grant, Notice, Opened, RemovedBy, Renewal, ResizeReply, StatsReply,
    parse_notices,
};

const PRELUDE: &str = include_str!("lua/prelude.lua");

/// A script and its source (to name what a failing line calls); also a function of the
/// [`library`].
struct Lua {
    /// Its name in errors.
    name: &'static str,
    /// Its function's name in the library, after the library's name.
    function: &'static str,
    /// What follows the prelude: `begin(KEYS, ARGV)`, then the script's own code.
    code: String,
    /// The script: the prelude, then `code` (the `no-writes` line first for a read-only one).
    source: String,
    script: Script,
    /// Declared `no-writes`: run with `EVALSHA_RO` / `FCALL_RO`.
    read_only: bool,
    /// Only removes (its first write frees memory): runs at `maxmemory` as a function too.
    allow_oom: bool,
    /// `<library>_<function>`, made on the first call (the library's name depends on every
    /// script's text).
    function_name: std::sync::OnceLock<String>,
}

/// The script a client sends for the script file `body` (its text): the prelude, `begin`, the
/// body (docs/PROTOCOL.md, "Calling a script").
pub fn script_source(body: &str) -> String {
    format!("{PRELUDE}\nbegin(KEYS, ARGV)\n{body}")
}

/// The first line of a read-only script: Redis (7.0 and later) then refuses any write in it,
/// and runs it for `EVALSHA_RO` (which a user allowed only to read the keys may call).
const READ_ONLY: &str = "#!lua flags=no-writes";

impl Lua {
    /// The script `body` (with `extra` before it, if any), called `function` in the library.
    fn new(name: &'static str, function: &'static str, extra: &str, body: &str) -> Lua {
        let code = if extra.is_empty() {
            format!("begin(KEYS, ARGV)\n{body}")
        } else {
            format!("begin(KEYS, ARGV)\n{extra}\n{body}")
        };
        let source = format!("{PRELUDE}\n{code}");
        debug_assert!(!extra.is_empty() || source == script_source(body));
        Lua {
            name,
            function,
            script: Script::new(&source),
            source,
            code,
            read_only: false,
            allow_oom: false,
            function_name: std::sync::OnceLock::new(),
        }
    }

    /// [`new`](Self::new), declared `no-writes`: run with `EVALSHA_RO` / `FCALL_RO`.
    fn new_read_only(name: &'static str, function: &'static str, extra: &str, body: &str) -> Lua {
        let plain = Lua::new(name, function, extra, body);
        let source = format!("{READ_ONLY}\n{}", plain.source);
        Lua {
            script: Script::new(&source),
            source,
            read_only: true,
            ..plain
        }
    }

    /// [`new`](Self::new) for a script that only removes: `allow-oom` as a function.
    fn new_removing(name: &'static str, function: &'static str, extra: &str, body: &str) -> Lua {
        Lua {
            allow_oom: true,
            ..Lua::new(name, function, extra, body)
        }
    }

    /// Runs the script on the semaphore `t` with the common header (limit, channel base,
    /// publish command) and the arguments `args` adds. Errors for lack of permission name
    /// what the user may not do (see [`denied`]).
    async fn run(
        &self,
        conn: &mut Conn,
        t: &Target<'_>,
        args: impl Fn(&mut redis::Cmd),
    ) -> CallResult<Value> {
        let values = self
            .pipelined(
                conn,
                t,
                |cmd| {
                    let keys = t.keys.in_script_order();
                    cmd.arg(keys.len())
                        .arg(&keys[..])
                        .arg(t.limit)
                        .arg(&t.keys.channel_base)
                        .arg(t.publish);
                    args(cmd);
                },
                |_| {},
            )
            .await?;
        values
            .into_iter()
            .next()
            .ok_or_else(|| reply::unexpected(&Value::Nil))
    }

    /// [`denied::script`] for this script, as the call ran: the library's text names the
    /// failing line of a function, the script's of a script.
    fn explain(&self, e: redis::RedisError, t: &Target<'_>, conn: &Conn) -> CallError {
        let source = if conn.scripting().scripts() {
            &self.source
        } else {
            &LIBRARY.text
        };
        denied::script(e, self.name, source, t.keys, t.publish)
    }

    /// Runs the function (`FCALL`, or `FCALL_RO` for a read-only one) or, where the library
    /// cannot be used, the script (`EVALSHA`/`EVALSHA_RO`) with the arguments (from the
    /// number of keys on) that `args` adds, followed by the commands `then` adds, in one
    /// pipeline on the node that holds `t`'s keys. Errors stay values, nested ones included
    /// (the call's reply is the first value; an error of the call itself is returned,
    /// explained). A library or script the server does not know yet is loaded, and the
    /// pipeline sent again; a refused library makes the connection run the scripts.
    async fn pipelined(
        &self,
        conn: &mut Conn,
        t: &Target<'_>,
        args: impl Fn(&mut redis::Cmd),
        then: impl Fn(&mut redis::Pipeline),
    ) -> CallResult<Vec<Value>> {
        let (mut library_loaded, mut script_loaded) = (false, false);
        loop {
            let functions = !conn.scripting().scripts();
            let mut call = match (functions, self.read_only) {
                (true, false) => redis::cmd("FCALL"),
                (true, true) => redis::cmd("FCALL_RO"),
                (false, false) => redis::cmd("EVALSHA"),
                (false, true) => redis::cmd("EVALSHA_RO"),
            };
            if functions {
                call.arg(
                    self.function_name
                        .get_or_init(|| format!("{}_{}", LIBRARY.name, self.function)),
                );
            } else {
                call.arg(self.script.get_hash());
            }
            args(&mut call);
            let mut pipe = redis::pipe();
            pipe.ignore_errors().add_command(call);
            then(&mut pipe);
            let values = conn.pipeline_on_key(&t.keys.cfg, &pipe).await?;
            let e = match values.first() {
                Some(Value::ServerError(e)) => e.clone(),
                Some(_) => return Ok(values),
                None => return Err(reply::unexpected(&Value::Array(values))),
            };
            let text = e.to_string();
            let code = Code::of_reply(e.code(), &text);
            if functions && code == Code::NoFunction && !library_loaded {
                library_loaded = true;
                LIBRARY.load(conn).await?;
            } else if functions && codes::refuses_fcall(e.code(), &text) {
                LIBRARY.use_scripts(conn, &text);
            } else if !functions && code == Code::NoScript && !script_loaded {
                script_loaded = true;
                self.load(conn).await?;
            } else if let Some(refused) = conn
                .scripting()
                .refused()
                .filter(|_| codes::refuses_evalsha(e.code(), &text))
            {
                return Err(CallError::Denied(format!(
                    "the Redis user may run neither redsem's Functions library ({refused}) nor \
                     its scripts ({}): grant FCALL and FCALL_RO, and load the library once per \
                     server as a user allowed FUNCTION LOAD (`redsem load-library`), or grant \
                     EVALSHA, EVALSHA_RO and SCRIPT LOAD (docs/security.md)",
                    text.trim()
                )));
            } else {
                return Err(self.explain(e.into(), t, conn));
            }
        }
    }

    async fn load(&self, conn: &mut Conn) -> redis::RedisResult<()> {
        self.script
            .prepare_invoke()
            .load_async(conn)
            .await
            .map(drop)
    }
}

static ACQUIRE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("acquire", "acquire", "", include_str!("lua/acquire.lua")));
static RENEW: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("renew", "renew", "", include_str!("lua/renew.lua")));
/// `renew.lua` for several semaphores in one call: the prelude, `renew.lua` wrapped as the
/// function `renew_one`, then the loop over the semaphores (`renew_many.lua`).
static RENEW_MANY: LazyLock<Lua> = LazyLock::new(|| {
    let renew_one = format!(
        "local function renew_one()\n{}\nend",
        include_str!("lua/renew.lua")
    );
    Lua::new(
        "renew_many",
        "renew_many",
        &renew_one,
        include_str!("lua/renew_many.lua"),
    )
});
static LEASE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("lease", "lease", "", include_str!("lua/lease.lua")));
static RELEASE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new_removing("release", "release", "", include_str!("lua/release.lua")));
static OPEN: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("open", "open", "", include_str!("lua/open.lua")));
static RESIZE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("resize", "resize", "", include_str!("lua/resize.lua")));
static STATS: LazyLock<Lua> =
    LazyLock::new(|| Lua::new_read_only("stats", "stats", "", include_str!("lua/stats.lua")));

/// Prepended to a script body for the operator functions: a missing configuration means "no
/// such semaphore" (nil reply), where the plain scripts would create it.
const GUARD: &str = "if redis.call('EXISTS', K_CFG) == 0 then return false end";

static STATS_EXISTING: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new_read_only("inspect", "inspect", GUARD, include_str!("lua/stats.lua"))
});
static RESIZE_EXISTING: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        "resize",
        "resize_existing",
        GUARD,
        include_str!("lua/resize.lua"),
    )
});
static DELETE_EXISTING: LazyLock<Lua> =
    LazyLock::new(|| Lua::new_removing("delete", "delete", GUARD, include_str!("lua/delete.lua")));
static RELEASE_EXISTING: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new_removing(
        "force-release",
        "force_release",
        GUARD,
        include_str!("lua/release.lua"),
    )
});

/// The Functions library of this build: every script of the protocol (`fence.lua`, not a
/// semaphore's, aside) as a function.
static LIBRARY: LazyLock<library::Library> = LazyLock::new(|| {
    let ops: Vec<library::Op<'_>> = all()
        .into_iter()
        .map(|l| library::Op {
            function: l.function,
            code: &l.code,
            read_only: l.read_only,
            allow_oom: l.allow_oom,
        })
        .collect();
    library::Library::new(PRELUDE, &ops)
});

/// Loads this build's Functions library (on a cluster, on every master) and returns its name.
pub(crate) async fn install_library(conn: &mut Conn) -> CallResult<String> {
    LIBRARY.install(conn).await
}

/// Every script of the protocol (`fence.lua`, not a semaphore's, aside).
fn all() -> Vec<&'static Lua> {
    vec![
        &ACQUIRE,
        &RENEW,
        &RENEW_MANY,
        &LEASE,
        &RELEASE,
        &OPEN,
        &RESIZE,
        &STATS,
        &STATS_EXISTING,
        &RESIZE_EXISTING,
        &DELETE_EXISTING,
        &RELEASE_EXISTING,
    ]
}

/// What a script needs to address one semaphore: its keys, the limit to (re)create it with,
/// and how grants are published.
#[derive(Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) keys: &'a Keys,
    pub(crate) limit: u32,
    pub(crate) publish: &'static str,
}

/// Parameters of one acquisition.
pub(crate) struct AcquireArgs<'a> {
    pub(crate) id: &'a str,
    pub(crate) n: u32,
    pub(crate) lease_ms: u64,
    pub(crate) wait_lease_ms: u64,
    /// The handle's channel id: grants for this waiter are published on
    /// `<channel base><channel id>` (see [`Keys::channel`]).
    pub(crate) channel_id: &'a str,
    pub(crate) label: &'a str,
    pub(crate) try_only: bool,
    /// Its priority class, `0..=MAX_PRIORITY`.
    pub(crate) priority: u8,
}

/// Tickets per priority class in a waiter's place: a waiter is overtaken by at most this
/// many later requests per class above its own (docs/PROTOCOL.md, "Priority classes"; the
/// prelude's `AGING`).
pub(crate) const PRIORITY_AGING: u64 = 1000;

/// The place in the queue (its score in `queue`) of a waiter with `ticket` and `priority`,
/// as the prelude's `score_of` computes it: the ticket less `PRIORITY_AGING + 1/16` per
/// class (exact in an `f64`). The queue is ordered by place.
pub(crate) fn queue_place(ticket: u64, priority: u8) -> f64 {
    ticket as f64 - f64::from(priority) * (PRIORITY_AGING as f64 + 0.0625)
}

/// Runs a batch of acquisitions in one script call, in order; one reply per request.
pub(crate) async fn acquire(
    conn: &mut Conn,
    t: &Target<'_>,
    batch: &[AcquireArgs<'_>],
) -> CallResult<(Vec<AcquireReply>, Option<u32>)> {
    let v = ACQUIRE
        .run(conn, t, |inv| {
            inv.arg(batch.len());
            for a in batch {
                inv.arg(a.id)
                    .arg(a.n)
                    .arg(a.lease_ms)
                    .arg(a.wait_lease_ms)
                    .arg(a.channel_id)
                    .arg(a.label)
                    .arg(if a.try_only { "try" } else { "wait" })
                    .arg(a.priority);
            }
        })
        .await?;
    reply::acquire(&v, batch.len())
}

/// A session to renew: its id (`<channel id>~<lease ms>`) and lease in ms.
pub(crate) type Session<'a> = (&'a str, u64);

/// Renews the listed sessions (whose entries live on with them) and checks the listed
/// entries (never re-creates one). Returns the time to the nearest lease expiry, one state
/// per id, the free permits and limit seen, which sessions had a lease, the head of the
/// queue and the sessions' entries that someone else removed.
pub(crate) async fn renew(
    conn: &mut Conn,
    t: &Target<'_>,
    sessions: &[Session<'_>],
    ids: &[&str],
) -> CallResult<Renewal> {
    let values = renew_then(conn, t, sessions, ids, |_| {}).await?;
    reply::renew(&values[0], sessions.len(), ids.len())
}

/// A `renew.lua` call on `t` for `sessions` and `ids`, followed in the same pipeline by the
/// commands `then` adds: the script's reply first, then theirs (see [`Lua::pipelined`]).
async fn renew_then(
    conn: &mut Conn,
    t: &Target<'_>,
    sessions: &[Session<'_>],
    ids: &[&str],
    then: impl Fn(&mut redis::Pipeline),
) -> CallResult<Vec<Value>> {
    let a = RenewArgs {
        target: *t,
        sessions,
        ids,
    };
    RENEW
        .pipelined(
            conn,
            t,
            |cmd| {
                let keys = t.keys.in_script_order();
                cmd.arg(keys.len()).arg(&keys[..]);
                renew_args(cmd, &a);
            },
            then,
        )
        .await
}

/// One semaphore's part of a [`renew_many`] call: what [`renew`] takes.
pub(crate) struct RenewArgs<'a> {
    pub(crate) target: Target<'a>,
    pub(crate) sessions: &'a [Session<'a>],
    pub(crate) ids: &'a [&'a str],
}

/// Adds to `cmd` the arguments of a `renew.lua` call on `a.target`: the common header, the
/// sessions, the ids.
fn renew_args(cmd: &mut redis::Cmd, a: &RenewArgs<'_>) {
    cmd.arg(a.target.limit)
        .arg(&a.target.keys.channel_base)
        .arg(a.target.publish)
        .arg(a.sessions.len());
    for (sid, ms) in a.sessions {
        cmd.arg(*sid).arg(*ms);
    }
    for id in a.ids {
        cmd.arg(*id);
    }
}

/// [`renew`] for several semaphores in one `renew_many.lua` call (their keys must live on one
/// node; on a cluster, in one hash slot). One result per semaphore, in order: a semaphore
/// whose renewal fails (a key of a foreign type, another protocol version, a refusal by ACL)
/// fails alone, with the error a [`renew`] of it would give. `Err` when the call as a whole
/// failed.
pub(crate) async fn renew_many(
    conn: &mut Conn,
    batch: &[RenewArgs<'_>],
) -> CallResult<Vec<CallResult<Renewal>>> {
    let Some(first) = batch.first() else {
        return Ok(Vec::new());
    };
    let values = RENEW_MANY
        .pipelined(
            conn,
            &first.target,
            |cmd| {
                cmd.arg(batch.len() * 7);
                for a in batch {
                    cmd.arg(&a.target.keys.in_script_order()[..]);
                }
                cmd.arg(batch.len());
                for a in batch {
                    cmd.arg(4 + 2 * a.sessions.len() + a.ids.len());
                    renew_args(cmd, a);
                }
            },
            |_| {},
        )
        .await?;
    let replies = match values.first() {
        Some(Value::Array(replies)) if replies.len() == batch.len() => replies,
        Some(other) => return Err(reply::unexpected(other)),
        None => return Err(reply::unexpected(&Value::Nil)),
    };
    Ok(replies
        .iter()
        .zip(batch)
        .map(|(v, a)| match v {
            Value::ServerError(e) => Err(RENEW_MANY.explain(e.clone().into(), &a.target, conn)),
            v => reply::renew(v, a.sessions.len(), a.ids.len()),
        })
        .collect())
}

/// What a `lease.lua` call does with the holder's owner.
#[derive(Clone, Copy)]
pub(crate) enum Owner<'a> {
    /// The holder must belong to the handle with this channel id
    /// ([`EntryState::Moved`] otherwise: nothing changed).
    Is(&'a str),
    /// The holder moves to the handle with this channel id, from whatever session it is
    /// in (a hand-off's adoption).
    Adopt(&'a str),
}

/// Sets the lease of the holder `id` to `lease_ms` and extends it by that much from now
/// (never re-creates the entry), checking or changing its owner. Returns its state: held,
/// gone, or moved (another handle owns it).
pub(crate) async fn set_lease(
    conn: &mut Conn,
    t: &Target<'_>,
    id: &str,
    lease_ms: u64,
    owner: Owner<'_>,
) -> CallResult<EntryState> {
    let v = LEASE
        .run(conn, t, |inv| {
            inv.arg(id).arg(lease_ms);
            match owner {
                Owner::Is(channel_id) => inv.arg(channel_id).arg("0"),
                Owner::Adopt(channel_id) => inv.arg(channel_id).arg("1"),
            };
        })
        .await?;
    reply::entry(&v)
}

/// What [`renew_and_wait`] learnt: the renewal's reply, and how many replicas acknowledged
/// it.
pub(crate) type SyncedRenewal = (Renewal, u32);

/// Synced mode: renews `ids` and, on the same connection, `WAIT`s for `replicas` replicas
/// (replication is ordered, so a replica that has this renewal also has the grants before
/// it). Returns the entries' states and how many replicas acknowledged.
pub(crate) async fn renew_and_wait(
    conn: &mut Conn,
    t: &Target<'_>,
    sessions: &[Session<'_>],
    ids: &[&str],
    replicas: u32,
    timeout: std::time::Duration,
) -> CallResult<SyncedRenewal> {
    let values = renew_then(conn, t, sessions, ids, |pipe| {
        pipe.cmd("WAIT")
            .arg(replicas)
            .arg(timeout.as_millis() as u64);
    })
    .await?;
    let (renewed, acked) = match values.as_slice() {
        [renewed, acked] => (renewed, acked),
        _ => return Err(reply::unexpected(&Value::Array(values))),
    };
    if let Value::ServerError(e) = acked {
        return Err(CallError::Redis(e.clone().into()));
    }
    let renewal = reply::renew(renewed, sessions.len(), ids.len())?;
    Ok((renewal, reply::integer(acked)?.max(0) as u32))
}

/// What one `release.lua` call does: remove `ids` (holders or queued waiters), detach the
/// holders `detach` (they leave their session for one nobody renews), end the sessions `end`
/// that have no entry left.
#[derive(Default)]
pub(crate) struct Removal<'a> {
    pub(crate) ids: &'a [&'a str],
    pub(crate) detach: &'a [&'a str],
    pub(crate) end: &'a [&'a str],
}

impl<'a> Removal<'a> {
    /// Removes `ids`, nothing else.
    pub(crate) fn of(ids: &'a [&'a str]) -> Removal<'a> {
        Removal {
            ids,
            ..Removal::default()
        }
    }
}

/// Runs a [`Removal`] (idempotent). `force` marks an operator's release. Returns how many of
/// the ids to remove existed.
pub(crate) async fn release(
    conn: &mut Conn,
    t: &Target<'_>,
    r: &Removal<'_>,
    force: bool,
) -> CallResult<u64> {
    let v = RELEASE
        .run(conn, t, |inv| {
            inv.arg(if force { "1" } else { "0" })
                .arg(r.end.len())
                .arg(r.detach.len());
            for sid in r.end {
                inv.arg(*sid);
            }
            for id in r.detach {
                inv.arg(*id);
            }
            for id in r.ids {
                inv.arg(*id);
            }
        })
        .await?;
    Ok(reply::integer(&v)? as u64)
}

/// Checks key types, creates the semaphore if missing; returns the stored limit, whether it
/// was created, a key with a TTL, and the free permits.
/// Runs `open.lua`; `None` when the semaphore does not exist and `create` is false (then
/// nothing was written). With `check_policy`, the script first reads the server's
/// `maxmemory-policy` (`INFO memory`, allowed to users that may not run `CONFIG GET`) and
/// refuses one that evicts any key before it writes anything ([`Opened::refused`]).
pub(crate) async fn open(
    conn: &mut Conn,
    t: &Target<'_>,
    create: bool,
    check_policy: bool,
) -> CallResult<Option<Opened>> {
    let v = OPEN
        .run(conn, t, |inv| {
            inv.arg(if create { "1" } else { "0" })
                .arg(if check_policy { "1" } else { "0" });
        })
        .await?;
    reply::open(&v)
}

/// Changes the stored limit by `delta` atomically; returns the previous limit, the new one
/// (`None`, and no change, when it would be outside `1..=max`) and the waiters it rejected.
pub(crate) async fn add_to_limit(
    conn: &mut Conn,
    t: &Target<'_>,
    delta: i64,
    max: u32,
) -> CallResult<ResizeReply> {
    let v = RESIZE
        .run(conn, t, |inv| {
            inv.arg(delta).arg("add").arg(max);
        })
        .await?;
    reply::resize(&v)
}

/// Sets the stored limit; returns the previous one and the waiters it rejected.
pub(crate) async fn resize(
    conn: &mut Conn,
    t: &Target<'_>,
    new_limit: u32,
) -> CallResult<ResizeReply> {
    let v = RESIZE
        .run(conn, t, |inv| {
            inv.arg(new_limit).arg("set");
        })
        .await?;
    reply::resize(&v)
}

/// A consistent snapshot of the semaphore, read-only (`FCALL_RO`, or `EVALSHA_RO` as a
/// script), listing at most
/// `listed` holders and waiters.
pub(crate) async fn stats(
    conn: &mut Conn,
    t: &Target<'_>,
    listed: usize,
) -> CallResult<StatsReply> {
    let v = STATS
        .run(conn, t, |cmd| {
            cmd.arg(listed);
        })
        .await?;
    reply::stats(&v)
}

/// The operator functions: the same scripts behind [`GUARD`], so that they never create a
/// semaphore. `None` when the semaphore does not exist. (The limit of the header is never
/// used: the guard returns first when the configuration is missing.)
fn existing<'a>(keys: &'a Keys, publish: &'static str) -> Target<'a> {
    Target {
        keys,
        limit: 1,
        publish,
    }
}

/// [`stats`] of an existing semaphore.
pub(crate) async fn stats_existing(
    conn: &mut Conn,
    keys: &Keys,
    publish: &'static str,
    listed: usize,
) -> CallResult<Option<StatsReply>> {
    let v = STATS_EXISTING
        .run(conn, &existing(keys, publish), |cmd| {
            cmd.arg(listed);
        })
        .await?;
    unless_nil(v, |v| reply::stats(&v))
}

/// [`resize`] of an existing semaphore.
pub(crate) async fn resize_existing(
    conn: &mut Conn,
    keys: &Keys,
    publish: &'static str,
    new_limit: u32,
) -> CallResult<Option<ResizeReply>> {
    let v = RESIZE_EXISTING
        .run(conn, &existing(keys, publish), |inv| {
            inv.arg(new_limit.to_string()).arg("set");
        })
        .await?;
    unless_nil(v, |v| reply::resize(&v))
}

/// [`add_to_limit`] of an existing semaphore.
pub(crate) async fn add_to_limit_existing(
    conn: &mut Conn,
    keys: &Keys,
    publish: &'static str,
    delta: i64,
    max: u32,
) -> CallResult<Option<ResizeReply>> {
    let v = RESIZE_EXISTING
        .run(conn, &existing(keys, publish), |inv| {
            inv.arg(delta).arg("add").arg(max);
        })
        .await?;
    unless_nil(v, |v| reply::resize(&v))
}

/// A forced [`release`] of `id` (an operator's); returns `(holders, waiters)` removed: at most
/// one of them 1. `existing`: in an existing semaphore only (`None` when there is none).
pub(crate) async fn force_release(
    conn: &mut Conn,
    t: &Target<'_>,
    existing_only: bool,
    id: &str,
) -> CallResult<Option<(u64, u64)>> {
    let script = if existing_only {
        &RELEASE_EXISTING
    } else {
        &RELEASE
    };
    let v = script
        .run(conn, t, |inv| {
            inv.arg("2").arg(0).arg(0).arg(id);
        })
        .await?;
    unless_nil(v, |v| {
        let (holders, waiters) = reply::pair(&v)?;
        Ok((holders.max(0) as u64, waiters.max(0) as u64))
    })
}

/// [`force_release`] of `id` in an existing semaphore.
pub(crate) async fn force_release_existing(
    conn: &mut Conn,
    keys: &Keys,
    publish: &'static str,
    id: &str,
) -> CallResult<Option<(u64, u64)>> {
    force_release(conn, &existing(keys, publish), true, id).await
}

/// What [`delete_existing`] did: whether it deleted, and the holders and waiters it found
/// (evicted when it deleted).
pub(crate) struct Deletion {
    pub(crate) deleted: bool,
    pub(crate) holders: u32,
    pub(crate) waiters: u32,
}

/// How [`delete_existing`] deletes.
#[derive(Clone, Copy)]
pub(crate) enum DeleteMode {
    /// Refused while it has holders or waiters.
    IfUnused,
    /// Evicting holders and waiters; refused over another program's data.
    Force,
    /// Every key, whatever it holds.
    Purge,
}

/// Deletes an existing semaphore's keys, as `mode` says.
pub(crate) async fn delete_existing(
    conn: &mut Conn,
    keys: &Keys,
    publish: &'static str,
    mode: DeleteMode,
) -> CallResult<Option<Deletion>> {
    let v = DELETE_EXISTING
        .run(conn, &existing(keys, publish), |inv| {
            inv.arg(match mode {
                DeleteMode::IfUnused => "0",
                DeleteMode::Force => "1",
                DeleteMode::Purge => "2",
            });
        })
        .await?;
    unless_nil(v, |v| {
        let (deleted, holders, waiters) = reply::triple(&v)?;
        Ok(Deletion {
            deleted: deleted == 1,
            holders: holders.max(0) as u32,
            waiters: waiters.max(0) as u32,
        })
    })
}

/// `None` for the guard's nil reply, else the parsed reply.
fn unless_nil<T>(v: Value, parse: impl FnOnce(Value) -> CallResult<T>) -> CallResult<Option<T>> {
    match v {
        Value::Nil => Ok(None),
        v => parse(v).map(Some),
    }
}

/// `fence.lua`: not a semaphore script (no prelude); it checks a fencing token at a resource.
static FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/fence.lua")));

/// Checks the fencing token `(slot, generation)` against the record at `fence_key` and, if
/// it is current, `SET`s `write`'s key to its value. Returns whether the token was accepted.
pub(crate) async fn fence(
    conn: &mut Conn,
    fence_key: &str,
    slot: u32,
    generation: u64,
    write: Option<(&str, &[u8])>,
) -> redis::RedisResult<bool> {
    let mut inv = FENCE.prepare_invoke();
    inv.key(fence_key).arg(slot).arg(generation);
    if let Some((key, value)) = write {
        inv.key(key).arg(value);
    }
    let accepted: i64 = inv.invoke_async(conn).await?;
    Ok(accepted == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's place of a waiter is the prelude's `score_of`: one aging constant.
    #[test]
    fn the_aging_of_priority_classes_is_the_preludes() {
        assert!(
            PRELUDE.contains(&format!("local AGING = {PRIORITY_AGING}\n")),
            "prelude.lua's AGING differs from PRIORITY_AGING"
        );
        assert!(PRELUDE.contains("m.t - m.p * (AGING + 0.0625)"));
        assert_eq!(queue_place(17, 0), 17.0);
        assert_eq!(queue_place(5, 1), 5.0 - 1000.0625);
        // within a class FIFO; a class above overtakes the requests of up to 1000 tickets
        // before it per class, no more
        assert!(queue_place(2_001, 2) < queue_place(1, 0));
        assert!(queue_place(2_002, 2) > queue_place(1, 0));
        assert!(queue_place(9_001, crate::MAX_PRIORITY) < queue_place(1, 0));
        assert!(queue_place(9_002, crate::MAX_PRIORITY) > queue_place(1, 0));
    }
    /// The names a Lua line assigns (`a, b = ...`; not `local`, not a field or index, not a
    /// comparison): the plain identifiers left of its first `=`.
    fn assigned(line: &str) -> Vec<&str> {
        let t = line.trim_start();
        if t.starts_with("local ") || t.starts_with("--") {
            return vec![];
        }
        let Some(at) = t.find('=') else {
            return vec![];
        };
        if t[at + 1..].starts_with('=') || t[..at].ends_with(['~', '<', '>', '=']) {
            return vec![];
        }
        let names: Vec<&str> = t[..at].split(',').map(str::trim).collect();
        let ident = |n: &&str| {
            !n.is_empty()
                && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !n.starts_with(|c: char| c.is_ascii_digit())
        };
        if names.iter().all(ident) {
            names
        } else {
            vec![]
        }
    }

    /// In the Functions library the prelude's top-level values live as long as the library,
    /// shared by every call: each one that a function assigns must be set again by `begin`,
    /// or a call would see what an earlier one left (NOW_MS_S once was not).
    #[test]
    fn begin_sets_every_value_that_a_call_changes() {
        let mut top: Vec<&str> = vec![]; // the top-level locals (not functions)
        for line in PRELUDE.lines() {
            if let Some(rest) = line.strip_prefix("local ")
                && !rest.starts_with("function ")
            {
                let names = rest.split('=').next().unwrap_or_default();
                top.extend(names.split(',').map(str::trim).filter(|n| !n.is_empty()));
            }
        }
        // (begin sets some itself, and the rest through on_semaphore)
        let body = |name: &str| {
            PRELUDE
                .split(&format!("\nlocal function {name}("))
                .nth(1)
                .and_then(|b| b.split("\nend\n").next())
                .unwrap_or_else(|| panic!("prelude.lua defines {name}"))
        };
        let (begin, on_semaphore) = (body("begin"), body("on_semaphore"));
        assert!(begin.contains("on_semaphore(keys, 0, args)"));
        let set_by_begin: Vec<&str> = begin
            .lines()
            .chain(on_semaphore.lines())
            .flat_map(assigned)
            .collect();
        let mut missing: Vec<&str> = vec![];
        for line in PRELUDE.lines().filter(|l| l.starts_with(' ')) {
            for name in assigned(line) {
                if top.contains(&name) && !set_by_begin.contains(&name) && !missing.contains(&name)
                {
                    missing.push(name);
                }
            }
        }
        assert!(
            missing.is_empty(),
            "prelude.lua: functions assign {missing:?}, which begin() does not set"
        );
        // (the check reads what it should)
        assert!(set_by_begin.contains(&"NOW_MS_S") && set_by_begin.contains(&"POOL"));
        assert!(set_by_begin.contains(&"HELD") && set_by_begin.contains(&"K_OWN"));
        assert!(top.contains(&"NOW_MS_S") && top.contains(&"HW"));
    }
}

//! The Lua scripts and their typed wrappers.
//!
//! Every state change is one of these scripts, run atomically by Redis. Each `.lua` file
//! beside this one documents its ARGV and reply; `prelude.lua` (reaping, FIFO granting,
//! targeted publishing) is prepended to each. The wrappers here are the only code that
//! builds script arguments and parses replies.

use std::sync::LazyLock;

use redis::{Script, Value};

use crate::backend::{DENIED, denied};
use crate::keys::Keys;

const PRELUDE: &str = include_str!("prelude.lua");

/// A script and its source (to name what a failing line calls).
pub(crate) struct Lua {
    name: &'static str,
    source: String,
    script: Script,
}

impl Lua {
    /// `body` with the prelude (and `extra`, if any) in front of it.
    pub(crate) fn new(name: &'static str, extra: &str, body: &str) -> Lua {
        let source = if extra.is_empty() {
            format!("{PRELUDE}\n{body}")
        } else {
            format!("{PRELUDE}\n{extra}\n{body}")
        };
        Lua {
            name,
            script: Script::new(&source),
            source,
        }
    }

    /// Runs the script on `keys` with the common header (limit, channel base, publish
    /// command) and the arguments `args` adds. Errors for lack of permission name what the
    /// user may not do (see [`explain_denied`]).
    pub(crate) async fn run(
        &self,
        conn: &mut Conn,
        keys: &Keys,
        limit: u32,
        publish: &'static str,
        args: impl FnOnce(&mut redis::ScriptInvocation<'_>),
    ) -> redis::RedisResult<Value> {
        let mut inv = self.script.prepare_invoke();
        for k in &keys.all {
            inv.key(k);
        }
        inv.arg(limit).arg(&keys.channel_base).arg(publish);
        args(&mut inv);
        inv.invoke_async(conn)
            .await
            .map_err(|e| explain_denied(e, self, keys, publish))
    }

    pub(crate) fn hash(&self) -> &str {
        self.script.get_hash()
    }

    pub(crate) async fn load(&self, conn: &mut Conn) -> redis::RedisResult<()> {
        self.script
            .prepare_invoke()
            .load_async(conn)
            .await
            .map(drop)
    }
}

static ACQUIRE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("acquire", "", include_str!("acquire.lua")));
static RENEW: LazyLock<Lua> = LazyLock::new(|| Lua::new("renew", "", include_str!("renew.lua")));
static RELEASE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("release", "", include_str!("release.lua")));
static OPEN: LazyLock<Lua> = LazyLock::new(|| Lua::new("open", "", include_str!("open.lua")));
static RESIZE: LazyLock<Lua> = LazyLock::new(|| Lua::new("resize", "", include_str!("resize.lua")));
static STATS: LazyLock<Lua> = LazyLock::new(|| Lua::new("stats", "", include_str!("stats.lua")));

/// The connection every script runs on: one server, a cluster, or the Sentinel master.
pub(crate) type Conn = crate::backend::Conn;

/// What a script needs to address one semaphore: its keys, the limit to (re)create it with,
/// and how grants are published.
pub(crate) struct Target<'a> {
    pub(crate) keys: &'a Keys,
    pub(crate) limit: u32,
    pub(crate) publish: &'static str,
}

async fn invoke(
    conn: &mut Conn,
    script: &Lua,
    t: &Target<'_>,
    args: impl FnOnce(&mut redis::ScriptInvocation<'_>),
) -> redis::RedisResult<Value> {
    script.run(conn, t.keys, t.limit, t.publish, args).await
}

/// Rewrites an ACL refusal so that it names what the user lacks.
///
/// Redis and Valkey do not always say: inside a script, Redis 7.0 reports "can't run this
/// command" with the script's line number only, and neither names a refused key or channel.
/// The line number points into `script`'s source, which names the command; the keys and the
/// channels are those of the semaphore.
pub(crate) fn explain_denied(
    e: redis::RedisError,
    script: &Lua,
    keys: &Keys,
    publish: &str,
) -> redis::RedisError {
    let text = e.to_string();
    let lower = text.to_ascii_lowercase();
    let acl = e.code() == Some("NOPERM")
        || lower.contains("no permissions")
        || lower.contains("acl failure")
        || lower.contains("the user executing the script can't");
    if !acl || text.contains(DENIED) {
        return e;
    }
    let key_pattern = format!("{}*", keys.channel_base.trim_end_matches("c:"));
    let channels = format!("{}*", keys.channel_base);
    let in_script = line_of(&text)
        .and_then(|n| script.source.lines().nth(n.saturating_sub(1)))
        .map(str::trim);
    // Valkey names the command ('hget'); Redis 7.0 inside a script only gives the line
    let on_line = in_script
        .map(|line| called_commands(line, publish))
        .unwrap_or_default();
    let named = quoted_command(&text).map(str::to_ascii_uppercase);
    let what = if lower.contains("channel") {
        format!("publish to or subscribe to the channels {channels:?} ({publish})")
    } else if lower.contains("key") {
        format!(
            "access the keys of semaphore {:?} ({key_pattern:?})",
            keys.name
        )
    } else if let Some(cmd) = &named {
        format!("run the command {cmd}")
    } else if on_line.len() == 1 {
        format!("run the command {}", on_line[0])
    } else if !on_line.is_empty() {
        format!("run one of the commands {}", on_line.join(", "))
    } else {
        "run a command redsem needs".to_owned()
    };
    let place = if in_script.is_some() {
        format!(" (inside redsem's {} script)", script.name)
    } else {
        String::new()
    };
    denied(format!(
        "the Redis user may not {what}{place}; Redis said: {}",
        text.trim()
    ))
}

/// The line number in "... @user_script:12 ..." (Redis) / "... @user_script:12." (Valkey).
fn line_of(text: &str) -> Option<usize> {
    let at = text.find("@user_script:")? + "@user_script:".len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The commands a script line calls: `redis.call('HGET', ...)` → `HGET`;
/// `redis.call(PUB, ...)` → the publish command.
fn called_commands(line: &str, publish: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for call in line.split("redis.call(").skip(1) {
        let cmd = match call.strip_prefix('\'') {
            Some(rest) => rest
                .split('\'')
                .next()
                .unwrap_or_default()
                .to_ascii_uppercase(),
            None if call.starts_with("PUB") => publish.to_owned(),
            None => continue,
        };
        if !cmd.is_empty() && !out.contains(&cmd) {
            out.push(cmd);
        }
    }
    out
}

/// `'script|load'` in "... no permissions to run the 'script|load' command".
fn quoted_command(text: &str) -> Option<&str> {
    let start = text.find("run the '")? + "run the '".len();
    let len = text[start..].find('\'')?;
    Some(&text[start..start + len])
}

/// A granted entry's ticket, slots and their fencing generations (same order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) ticket: u64,
    pub(crate) slots: Vec<u32>,
    pub(crate) fences: Vec<u64>,
}

/// Reply of `acquire.lua`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// Boxed: the reply travels through a channel per request, sized for the largest variant.
    Granted(Box<Grant>),
    Queued {
        ticket: u64,
        next_expiry_ms: Option<u64>,
    },
    NoCapacity,
    TooMany {
        limit: u32,
    },
}

/// Parameters of one acquisition.
pub(crate) struct AcquireArgs<'a> {
    pub(crate) id: &'a str,
    pub(crate) n: u32,
    pub(crate) lease_ms: u64,
    pub(crate) wait_lease_ms: u64,
    pub(crate) client_channel: &'a str,
    pub(crate) label: &'a str,
    pub(crate) try_only: bool,
}

/// Runs a batch of acquisitions in one script call, in order; one reply per request.
pub(crate) async fn acquire(
    conn: &mut Conn,
    t: &Target<'_>,
    batch: &[AcquireArgs<'_>],
) -> redis::RedisResult<Vec<AcquireReply>> {
    let v = invoke(conn, &ACQUIRE, t, |inv| {
        inv.arg(batch.len());
        for a in batch {
            inv.arg(a.id)
                .arg(a.n)
                .arg(a.lease_ms)
                .arg(a.wait_lease_ms)
                .arg(a.client_channel)
                .arg(a.label)
                .arg(if a.try_only { "try" } else { "wait" });
        }
    })
    .await?;
    let replies = array(&v)?
        .iter()
        .map(|r| {
            let items = array(r)?;
            Ok(match int(items.first())? {
                1 => AcquireReply::Granted(Box::new(grant(items)?)),
                0 => AcquireReply::Queued {
                    ticket: int(items.get(1))? as u64,
                    next_expiry_ms: expiry(int(items.get(2))?),
                },
                -1 => AcquireReply::NoCapacity,
                -2 => AcquireReply::TooMany {
                    limit: int(items.get(1))? as u32,
                },
                _ => return Err(unexpected(r)),
            })
        })
        .collect::<redis::RedisResult<Vec<_>>>()?;
    if replies.len() != batch.len() {
        return Err(unexpected(&v));
    }
    Ok(replies)
}

/// One entry's state in a renewal reply.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum EntryState {
    Held(Grant),
    Waiting,
    Gone,
}

/// Renews (never re-creates) the listed entries. Returns the time to the nearest lease expiry
/// and one state per id.
pub(crate) async fn renew(
    conn: &mut Conn,
    t: &Target<'_>,
    ids: &[&str],
) -> redis::RedisResult<(Option<u64>, Vec<EntryState>)> {
    let v = invoke(conn, &RENEW, t, |inv| {
        for id in ids {
            inv.arg(*id);
        }
    })
    .await?;
    parse_renew(&v, ids.len())
}

fn parse_renew(v: &Value, ids: usize) -> redis::RedisResult<(Option<u64>, Vec<EntryState>)> {
    let items = array(v)?;
    let next = expiry(int(items.first())?);
    let states = array(items.get(1).ok_or_else(|| unexpected(v))?)?
        .iter()
        .map(|s| {
            let s = array(s)?;
            Ok(match int(s.first())? {
                1 => EntryState::Held(grant(s)?),
                0 => EntryState::Waiting,
                _ => EntryState::Gone,
            })
        })
        .collect::<redis::RedisResult<Vec<_>>>()?;
    if states.len() != ids {
        return Err(unexpected(v));
    }
    Ok((next, states))
}

/// Synced mode: renews `id` and, on the same connection, `WAIT`s for `replicas` replicas
/// (replication is ordered, so a replica that has this renewal also has the grant before
/// it). Returns the entry's state and how many replicas acknowledged.
pub(crate) async fn renew_and_wait(
    conn: &mut Conn,
    t: &Target<'_>,
    id: &str,
    replicas: u32,
    timeout: std::time::Duration,
) -> redis::RedisResult<(EntryState, u32)> {
    for attempt in 0..2 {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(RENEW.hash())
            .arg(t.keys.all.len())
            .arg(&t.keys.all[..])
            .arg(t.limit)
            .arg(&t.keys.channel_base)
            .arg(t.publish)
            .arg(id);
        let mut pipe = redis::pipe();
        pipe.ignore_errors()
            .add_command(evalsha)
            .cmd("WAIT")
            .arg(replicas)
            .arg(timeout.as_millis() as u64);
        let values = conn.pipeline_on_key(&t.keys.all[0], &pipe).await?;
        let (renewed, acked) = match values.as_slice() {
            [renewed, acked] => (renewed, acked),
            _ => return Err(unexpected(&Value::Array(values))),
        };
        if let Value::ServerError(e) = renewed {
            if e.code() == "NOSCRIPT" && attempt == 0 {
                RENEW.load(conn).await?;
                continue;
            }
            return Err(explain_denied(e.clone().into(), &RENEW, t.keys, t.publish));
        }
        if let Value::ServerError(e) = acked {
            return Err(e.clone().into());
        }
        let (_, mut states) = parse_renew(renewed, 1)?;
        return Ok((states.remove(0), int(Some(acked))?.max(0) as u32));
    }
    unreachable!("the second attempt returns")
}

/// Removes holders or queued waiters (idempotent). `force` advances the slots' fences.
/// Returns how many existed.
pub(crate) async fn release(
    conn: &mut Conn,
    t: &Target<'_>,
    ids: &[&str],
    force: bool,
) -> redis::RedisResult<u64> {
    let v = invoke(conn, &RELEASE, t, |inv| {
        inv.arg(if force { "1" } else { "0" });
        for id in ids {
            inv.arg(*id);
        }
    })
    .await?;
    Ok(int(Some(&v))? as u64)
}

/// Checks key types, creates the semaphore if missing; returns (stored limit, created).
pub(crate) async fn open(conn: &mut Conn, t: &Target<'_>) -> redis::RedisResult<(u32, bool)> {
    let v = invoke(conn, &OPEN, t, |_| {}).await?;
    let items = array(&v)?;
    Ok((int(items.first())? as u32, int(items.get(1))? == 1))
}

/// Sets the stored limit; returns the previous one.
pub(crate) async fn resize(
    conn: &mut Conn,
    t: &Target<'_>,
    new_limit: u32,
) -> redis::RedisResult<u32> {
    let v = invoke(conn, &RESIZE, t, |inv| {
        inv.arg(new_limit);
    })
    .await?;
    Ok(int(Some(&v))? as u32)
}

/// Raw snapshot from `stats.lua`.
pub(crate) struct RawStats {
    pub(crate) now_ms: u64,
    pub(crate) limit: u32,
    pub(crate) in_use: u32,
    pub(crate) grants: u64,
    pub(crate) expired: u64,
    pub(crate) holders_json: String,
    pub(crate) waiters_json: String,
}

pub(crate) async fn stats(conn: &mut Conn, t: &Target<'_>) -> redis::RedisResult<RawStats> {
    let v = invoke(conn, &STATS, t, |_| {}).await?;
    let items = array(&v)?;
    Ok(RawStats {
        now_ms: int(items.first())? as u64,
        limit: int(items.get(1))? as u32,
        in_use: int(items.get(2))? as u32,
        grants: int(items.get(3))? as u64,
        expired: int(items.get(4))? as u64,
        holders_json: string(items.get(5))?,
        waiters_json: string(items.get(6))?,
    })
}

fn expiry(ms: i64) -> Option<u64> {
    (ms >= 0).then_some(ms as u64)
}

fn grant(items: &[Value]) -> redis::RedisResult<Grant> {
    let ints = |v: Option<&Value>| -> redis::RedisResult<Vec<i64>> {
        array(v.ok_or_else(|| unexpected(&Value::Nil))?)?
            .iter()
            .map(|x| int(Some(x)))
            .collect()
    };
    Ok(Grant {
        ticket: int(items.get(3))? as u64,
        slots: ints(items.get(1))?.into_iter().map(|s| s as u32).collect(),
        fences: ints(items.get(2))?.into_iter().map(|f| f as u64).collect(),
    })
}

fn array(v: &Value) -> redis::RedisResult<&[Value]> {
    match v {
        Value::Array(items) => Ok(items),
        // Lua's empty table comes back as an empty array, or as nil in some versions
        Value::Nil => Ok(&[]),
        other => Err(unexpected(other)),
    }
}

fn int(v: Option<&Value>) -> redis::RedisResult<i64> {
    match v {
        Some(Value::Int(i)) => Ok(*i),
        Some(Value::BulkString(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| unexpected(&Value::BulkString(b.clone()))),
        other => Err(unexpected(other.unwrap_or(&Value::Nil))),
    }
}

fn string(v: Option<&Value>) -> redis::RedisResult<String> {
    match v {
        Some(Value::BulkString(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
        Some(Value::SimpleString(s)) => Ok(s.clone()),
        other => Err(unexpected(other.unwrap_or(&Value::Nil))),
    }
}

fn unexpected(v: &Value) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply from a redsem script (is another redsem protocol version using these keys?)",
        format!("{v:?}"),
    ))
}

/// A message published on a client channel: grants and rejections for that client's waiters.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Notice {
    Granted { id: String, grant: Grant },
    Rejected { id: String },
}

/// Parses `g:<id>:<ticket>:<slots>:<fences>;x:<id>;...` (see `publish` in prelude.lua).
pub(crate) fn parse_notices(payload: &str) -> Vec<Notice> {
    fn nums<T: std::str::FromStr>(s: &str) -> Option<Vec<T>> {
        if s.is_empty() {
            return Some(Vec::new());
        }
        s.split(',').map(|x| x.parse().ok()).collect()
    }
    payload
        .split(';')
        .filter_map(|rec| {
            let mut parts = rec.split(':');
            match (parts.next()?, parts.next()?) {
                ("g", id) => {
                    let ticket = parts.next()?.parse().ok()?;
                    let slots = nums(parts.next()?)?;
                    let fences = nums(parts.next()?)?;
                    Some(Notice::Granted {
                        id: id.to_owned(),
                        grant: Grant {
                            ticket,
                            slots,
                            fences,
                        },
                    })
                }
                ("x", id) => Some(Notice::Rejected { id: id.to_owned() }),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_script_lines_name_their_commands() {
        assert_eq!(
            line_of("ERR ... script: abc, on @user_script:12."),
            Some(12)
        );
        assert_eq!(
            line_of("ERR ACL failure in script: x script: on @user_script:7."),
            Some(7)
        );
        assert_eq!(
            called_commands(
                "redis.call('HLEN', K_CFG); redis.call('ZCARD', K_QUEUE)",
                "PUBLISH"
            ),
            vec!["HLEN", "ZCARD"]
        );
        assert_eq!(
            called_commands("redis.call(PUB, CH_BASE .. c, msg)", "SPUBLISH"),
            vec!["SPUBLISH"]
        );
        assert_eq!(
            quoted_command("NOPERM User u has no permissions to run the 'script|load' command"),
            Some("script|load")
        );
    }

    #[test]
    fn notices_parse() {
        let n = parse_notices("g:ab:42:0,3:7,1;x:cd");
        assert_eq!(
            n,
            vec![
                Notice::Granted {
                    id: "ab".into(),
                    grant: Grant {
                        ticket: 42,
                        slots: vec![0, 3],
                        fences: vec![7, 1]
                    }
                },
                Notice::Rejected { id: "cd".into() }
            ]
        );
        assert!(parse_notices("garbage").is_empty());
    }
}

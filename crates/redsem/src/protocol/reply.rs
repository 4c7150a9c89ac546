//! Reply parsing: the only code that reads what the scripts return and what they publish.
//!
//! Each `.lua` file documents its reply; `prelude.lua` documents the notification payload
//! and `stats.lua` the records of holders and waiters it returns (docs/PROTOCOL.md, "Records").

use redis::Value;

use crate::error::{CallError, CallResult};

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
    /// Try mode: not granted; `queued_first` when enough permits were free but others were
    /// queued (FIFO), otherwise too few were free.
    NoCapacity {
        queued_first: bool,
    },
    TooMany {
        limit: u32,
    },
}

/// Parses the reply of `acquire.lua` for a batch of `requests` requests: one flat array of
/// integers, the permits free after the batch first, then each request's reply in order.
pub(super) fn acquire(v: &Value, requests: usize) -> CallResult<(Vec<AcquireReply>, Option<u32>)> {
    let items = array(v)?;
    let mut rest = items.iter();
    let mut next = || int(rest.next());
    let free = next()?.clamp(0, u32::MAX as i64) as u32;
    let mut replies = Vec::with_capacity(requests);
    for _ in 0..requests {
        replies.push(match next()? {
            1 => {
                let ticket = next()? as u64;
                let k = usize::try_from(next()?).map_err(|_| unexpected(v))?;
                if k > items.len() {
                    return Err(unexpected(v));
                }
                let slots = (0..k)
                    .map(|_| next().map(|s| s as u32))
                    .collect::<CallResult<Vec<_>>>()?;
                let fences = (0..k)
                    .map(|_| next().map(|f| f as u64))
                    .collect::<CallResult<Vec<_>>>()?;
                AcquireReply::Granted(Box::new(Grant {
                    ticket,
                    slots,
                    fences,
                }))
            }
            0 => AcquireReply::Queued {
                ticket: next()? as u64,
                next_expiry_ms: expiry(next()?),
            },
            -1 => AcquireReply::NoCapacity {
                queued_first: next()? == 2,
            },
            -2 => AcquireReply::TooMany {
                limit: next()? as u32,
            },
            _ => return Err(unexpected(v)),
        });
    }
    // (nothing may follow the last reply)
    if next().is_ok() {
        return Err(unexpected(v));
    }
    Ok((replies, Some(free)))
}

/// One entry's state in a renewal reply.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum EntryState {
    Held(Grant),
    Waiting,
    Gone,
    /// Held, but by another client handle: adopted from this one (a hand-off), so this
    /// handle's sessions no longer keep it alive (`-3`).
    Moved,
}

pub(super) fn renew(v: &Value, sessions: usize, ids: usize) -> CallResult<Renewal> {
    let items = array(v)?;
    let next = expiry(int(items.first())?);
    let states = array(items.get(1).ok_or_else(|| unexpected(v))?)?
        .iter()
        .map(entry)
        .collect::<CallResult<Vec<_>>>()?;
    if states.len() != ids {
        return Err(unexpected(v));
    }
    let seen = (
        int(items.get(2))?.clamp(0, u32::MAX as i64) as u32,
        int(items.get(3))?.clamp(0, u32::MAX as i64) as u32,
    );
    let had_lease = array(items.get(4).ok_or_else(|| unexpected(v))?)?
        .iter()
        .map(|f| int(Some(f)).map(|f| f == 1))
        .collect::<CallResult<Vec<_>>>()?;
    if had_lease.len() != sessions {
        return Err(unexpected(v));
    }
    // (nil when nobody waits)
    let head = match items.get(5) {
        Some(Value::Nil) => None,
        head => Some(int(head)?),
    };
    let removed_ids = array(items.get(6).ok_or_else(|| unexpected(v))?)?
        .iter()
        .map(|id| string(Some(id)))
        .collect::<CallResult<Vec<_>>>()?;
    // why each was removed, one per id
    let why = array(items.get(7).ok_or_else(|| unexpected(v))?)?;
    if why.len() != removed_ids.len() {
        return Err(unexpected(v));
    }
    let removed = removed_ids
        .into_iter()
        .zip(why)
        .map(|(id, w)| match int(Some(w))? {
            1 => Ok((id, RemovedBy::Operator)),
            2 => Ok((id, RemovedBy::Rejected)),
            _ => Err(unexpected(v)),
        })
        .collect::<CallResult<Vec<_>>>()?;
    let deleted = int(items.get(8))? == 1;
    // the highest ticket granted per priority class
    let served = array(items.get(9).ok_or_else(|| unexpected(v))?)?
        .iter()
        .map(|t| int(Some(t)).map(|t| u64::try_from(t).unwrap_or(0)))
        .collect::<CallResult<Vec<_>>>()?;
    // the highest ticket issued (absent from the replies of older libraries)
    let issued = match items.get(10) {
        None => None,
        t => Some(u64::try_from(int(t)?).unwrap_or(0)),
    };
    Ok(Renewal {
        next_expiry: next,
        states,
        seen,
        had_lease,
        head,
        served,
        issued,
        removed,
        deleted,
    })
}

/// What one `renew.lua` call answered.
pub(crate) struct Renewal {
    /// Time to the nearest lease expiry in Redis, if any.
    pub(crate) next_expiry: Option<u64>,
    /// One state per id sent.
    pub(crate) states: Vec<EntryState>,
    /// `(free permits, stored limit)` at the time of the call.
    pub(crate) seen: (u32, u32),
    /// One flag per session sent: it had a lease (`false`: it had expired, and its entries
    /// were reaped, or it was never used; its lease starts now).
    pub(crate) had_lease: Vec<bool>,
    /// The place of the head of the queue, rounded down (`None`: nobody waits). A waiter with
    /// a lower place ([`super::queue_place`]) was granted or removed meanwhile.
    pub(crate) head: Option<i64>,
    /// The highest ticket granted in each priority class (index = class; missing: none).
    /// Within a class grants follow tickets: a waiter of class `c` whose ticket is at or
    /// below `served[c]` was granted or removed meanwhile, also when a higher class queued
    /// ahead of it (which the head alone does not show).
    pub(crate) served: Vec<u64>,
    /// The highest ticket issued (`cfg.seq`): a waiter whose ticket is above it was queued
    /// before the configuration was lost and re-created without its entry (a `FLUSHALL`),
    /// and is gone, however high `served` is.
    pub(crate) issued: Option<u64>,
    /// Entries of the sessions sent that someone else removed since their last renewal, and
    /// why.
    pub(crate) removed: Vec<(String, RemovedBy)>,
    /// The semaphore was deleted (`delete.lua` with force): every entry is gone, and the
    /// renewal did not re-create it.
    pub(crate) deleted: bool,
}

/// Why someone other than its client removed an entry (`renew.lua`'s reasons).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RemovedBy {
    /// An operator's forced release.
    Operator,
    /// A waiter that asked for more permits than the limit, after a shrink.
    Rejected,
}

/// What `resize.lua` answered in its reporting modes (`set`, `add`): the previous limit, the
/// new one (`None`: an `add` refused, nothing changed), and the waiters it rejected as
/// `(id, permits, label)`, in queue order.
pub(crate) type ResizeReply = (u32, Option<u32>, Vec<(String, u32, String)>);

/// Parses `{previous, new, {{id, permits, label}...}}` (`resize.lua` with `set` or `add`).
pub(super) fn resize(v: &Value) -> CallResult<ResizeReply> {
    let items = array(v)?;
    let old = int(items.first())?.max(0) as u32;
    let new = int(items.get(1))?;
    let rejected = match items.get(2) {
        Some(r) => array(r)?
            .iter()
            .map(|e| {
                let e = array(e)?;
                Ok((
                    string(e.first())?,
                    int(e.get(1))?.max(0) as u32,
                    string(e.get(2))?,
                ))
            })
            .collect::<CallResult<Vec<_>>>()?,
        None => Vec::new(),
    };
    Ok((old, (new > 0).then_some(new as u32), rejected))
}

/// Two integers: `{a, b}` (trailing elements, which a later version may add, are ignored).
pub(super) fn pair(v: &Value) -> CallResult<(i64, i64)> {
    let items = array(v)?;
    if items.len() < 2 {
        return Err(unexpected(v));
    }
    Ok((int(items.first())?, int(items.get(1))?))
}

/// Three integers: `{a, b, c}` (trailing elements are ignored, as for [`pair`]).
pub(super) fn triple(v: &Value) -> CallResult<(i64, i64, i64)> {
    let items = array(v)?;
    if items.len() < 3 {
        return Err(unexpected(v));
    }
    Ok((int(items.first())?, int(items.get(1))?, int(items.get(2))?))
}

/// The state of one entry: `{1, slots, fences, ticket}`, `{0}`, `{-1}` or `{-3}`
/// (`renew.lua`, `lease.lua`).
pub(super) fn entry(v: &Value) -> CallResult<EntryState> {
    let s = array(v)?;
    Ok(match int(s.first())? {
        1 => EntryState::Held(grant(s)?),
        0 => EntryState::Waiting,
        -3 => EntryState::Moved,
        _ => EntryState::Gone,
    })
}

/// A snapshot from `stats.lua`, its records decoded.
pub(crate) struct StatsReply {
    /// Redis `TIME` of the snapshot, in ms.
    pub(crate) now_ms: u64,
    pub(crate) limit: u32,
    pub(crate) in_use: u32,
    /// Grants since creation.
    pub(crate) grants: u64,
    /// Entries reaped on expiry since creation.
    pub(crate) expired: u64,
    /// Repairs of lost keys since the configuration was (re)created.
    pub(crate) repairs: u64,
    /// Some holders (at most the number asked for).
    pub(crate) holders: Vec<Entry>,
    /// Waiters in queue order, from the position asked for (at most the number asked for).
    pub(crate) waiters: Vec<Entry>,
    /// How many holders and waiters there are in all.
    pub(crate) holder_count: u64,
    pub(crate) waiter_count: u64,
}

/// One holder or waiter as stored in the `meta` hash (times in ms, Redis `TIME`).
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) permits: u32,
    pub(crate) label: String,
    pub(crate) ticket: u64,
    /// Its priority class (0 by default).
    pub(crate) priority: u8,
    /// When it joined the queue.
    pub(crate) queued_at: u64,
    /// When it was granted (holders).
    pub(crate) granted_at: Option<u64>,
    /// Its slots and the fencing generation of each, same order (holders; empty otherwise).
    pub(crate) slots: Vec<u32>,
    pub(crate) fences: Vec<u64>,
    /// When its lease expires unless renewed (`None`: its session has no lease).
    pub(crate) expires_at: Option<u64>,
}

/// Reads an entry's record as `stats.lua` returns it, stored in `meta` (the prelude's
/// `encode`): `n|t|p|c|o|l|w|q|a|s|f|<label length>|<label>`, fields this version does not
/// know after the label.
fn record(id: String, raw: &[u8], expires_at: i64) -> CallResult<Entry> {
    let unreadable = || {
        CallError::Unreadable(format!(
            "unreadable entry {id:?} in Redis ({:?}); is another protocol version using these keys?",
            String::from_utf8_lossy(&raw[..raw.len().min(60)])
        ))
    };
    let mut fields = raw.splitn(12, |&b| b == b'|');
    let mut next = || fields.next().ok_or_else(unreadable);
    let num = |f: &[u8]| -> CallResult<u64> {
        std::str::from_utf8(f)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(unreadable)
    };
    let opt = |f: &[u8]| -> CallResult<Option<u64>> {
        if f.is_empty() {
            Ok(None)
        } else {
            num(f).map(Some)
        }
    };
    let list = |f: &[u8]| -> CallResult<Vec<u64>> {
        if f.is_empty() {
            return Ok(Vec::new());
        }
        f.split(|&b| b == b',').map(num).collect()
    };
    let permits = num(next()?)? as u32;
    let ticket = num(next()?)?;
    let priority = opt(next()?)?.unwrap_or(0) as u8;
    let _channel = next()?;
    let _owner = next()?;
    let _lease = next()?;
    let _wait_lease = next()?;
    let queued_at = num(next()?)?;
    let granted_at = opt(next()?)?;
    let slots = list(next()?)?.into_iter().map(|s| s as u32).collect();
    let fences = list(next()?)?;
    let tail = next()?;
    let at = tail
        .iter()
        .position(|&b| b == b'|')
        .ok_or_else(unreadable)?;
    let len = num(&tail[..at])? as usize;
    let label = tail.get(at + 1..at + 1 + len).ok_or_else(unreadable)?;
    Ok(Entry {
        label: String::from_utf8_lossy(label).into_owned(),
        id,
        permits,
        ticket,
        priority,
        queued_at,
        granted_at,
        slots,
        fences,
        expires_at: u64::try_from(expires_at).ok(),
    })
}

/// The entries of `stats.lua`'s `{id, record, expiry, ...}`.
fn entries(v: Option<&Value>) -> CallResult<Vec<Entry>> {
    let items = array(v.ok_or_else(|| unexpected(&Value::Nil))?)?;
    items
        .chunks(3)
        .map(|e| match e {
            [id, Value::BulkString(raw), expiry] => {
                record(string(Some(id))?, raw, int(Some(expiry))?)
            }
            _ => Err(unexpected(&Value::Array(e.to_vec()))),
        })
        .collect()
}

/// Parses the reply of `stats.lua` (the same with the guard of the operator functions).
pub(super) fn stats(v: &Value) -> CallResult<StatsReply> {
    let items = array(v)?;
    let holders = entries(items.get(5))?;
    let waiters = entries(items.get(6))?;
    Ok(StatsReply {
        holder_count: int(items.get(8))?.max(0) as u64,
        waiter_count: int(items.get(9))?.max(0) as u64,
        now_ms: int(items.first())? as u64,
        limit: int(items.get(1))? as u32,
        in_use: int(items.get(2))? as u32,
        grants: int(items.get(3))? as u64,
        expired: int(items.get(4))? as u64,
        repairs: int(items.get(7))? as u64,
        holders,
        waiters,
    })
}

/// Parses a reply that is one integer.
pub(super) fn integer(v: &Value) -> CallResult<i64> {
    int(Some(v))
}

/// Parses the reply of `open.lua`: (stored limit, created, a key that carries a TTL).
pub(super) fn open(v: &Value) -> CallResult<Option<Opened>> {
    let items = array(v)?;
    if items.is_empty() {
        return Ok(None); // absent, and not to be created
    }
    let with_ttl = match items.get(2) {
        Some(v) => Some(string(Some(v))?).filter(|k| !k.is_empty()),
        None => None,
    };
    let policy = match items.get(4).or_else(|| items.get(1)) {
        Some(v @ Value::BulkString(_)) => Some(string(Some(v))?).filter(|p| !p.is_empty()),
        _ => None,
    };
    let limit = int(items.first())?;
    if limit < 0 {
        // an evicting policy, refused: nothing was written
        return Ok(Some(Opened {
            limit: 0,
            created: false,
            with_ttl: None,
            free: 0,
            policy,
            refused: true,
        }));
    }
    let limit = limit as u32;
    Ok(Some(Opened {
        policy,
        refused: false,
        limit,
        created: int(items.get(1))? == 1,
        with_ttl,
        free: match items.get(3) {
            Some(f) => int(Some(f))?.clamp(0, u32::MAX as i64) as u32,
            None => limit,
        },
    }))
}

/// What `open.lua` answered.
pub(crate) struct Opened {
    /// The stored limit.
    pub(crate) limit: u32,
    /// Whether this call created the semaphore.
    pub(crate) created: bool,
    /// A key of the semaphore that carries a TTL, if any.
    pub(crate) with_ttl: Option<String>,
    /// Permits free now.
    pub(crate) free: u32,
    /// The server's `maxmemory-policy`, when asked for.
    pub(crate) policy: Option<String>,
    /// The policy evicts any key: refused, nothing was written or created.
    pub(crate) refused: bool,
}

fn expiry(ms: i64) -> Option<u64> {
    (ms >= 0).then_some(ms as u64)
}

fn grant(items: &[Value]) -> CallResult<Grant> {
    let ints = |v: Option<&Value>| -> CallResult<Vec<i64>> {
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

fn array(v: &Value) -> CallResult<&[Value]> {
    match v {
        Value::Array(items) => Ok(items),
        // Lua's empty table comes back as an empty array, or as nil in some versions
        Value::Nil => Ok(&[]),
        other => Err(unexpected(other)),
    }
}

fn int(v: Option<&Value>) -> CallResult<i64> {
    match v {
        Some(Value::Int(i)) => Ok(*i),
        Some(Value::BulkString(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| unexpected(&Value::BulkString(b.clone()))),
        other => Err(unexpected(other.unwrap_or(&Value::Nil))),
    }
}

fn string(v: Option<&Value>) -> CallResult<String> {
    match v {
        Some(Value::BulkString(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
        Some(Value::SimpleString(s)) => Ok(s.clone()),
        other => Err(unexpected(other.unwrap_or(&Value::Nil))),
    }
}

pub(super) fn unexpected(v: &Value) -> CallError {
    CallError::Redis(redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply from a redsem script (is another redsem protocol version using these keys?)",
        format!("{v:?}"),
    )))
}

/// A message published on a handle's channel: grants and rejections for its waiters.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Notice {
    Granted {
        id: String,
        grant: Grant,
    },
    Rejected {
        id: String,
    },
    /// An operator removed the waiter (a forced release).
    Removed {
        id: String,
    },
}

/// Parses `g:<id>:<ticket>:<slots>:<fences>;x:<id>;r:<id>;...` (see `publish` in
/// prelude.lua, and release.lua for `r:`). Records of unknown types are ignored.
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
                ("r", id) => Some(Notice::Removed { id: id.to_owned() }),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_parse() {
        let n = parse_notices("g:ab:42:0,3:7,1;x:cd;r:ef;z:unknown");
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
                Notice::Rejected { id: "cd".into() },
                Notice::Removed { id: "ef".into() }
            ]
        );
        assert!(parse_notices("garbage").is_empty());
    }

    fn ints(v: &[i64]) -> Value {
        Value::Array(v.iter().map(|&i| Value::Int(i)).collect())
    }

    #[test]
    fn an_acquire_batch_is_one_flat_array() {
        // free 3; granted 2 permits; queued (lease due in 1500 ms); queued (no lease due);
        // a try behind the queue; too many
        let v = ints(&[3, 1, 7, 2, 0, 4, 90, 90, 0, 8, 1500, 0, 9, -1, -1, 2, -2, 5]);
        let (replies, free) = acquire(&v, 5).unwrap();
        assert_eq!(free, Some(3));
        assert_eq!(
            replies,
            vec![
                AcquireReply::Granted(Box::new(Grant {
                    ticket: 7,
                    slots: vec![0, 4],
                    fences: vec![90, 90]
                })),
                AcquireReply::Queued {
                    ticket: 8,
                    next_expiry_ms: Some(1500)
                },
                AcquireReply::Queued {
                    ticket: 9,
                    next_expiry_ms: None
                },
                AcquireReply::NoCapacity { queued_first: true },
                AcquireReply::TooMany { limit: 5 },
            ]
        );
        // a reply cut short, one with more than the requests, an unknown code, a negative
        // count: each is an error, never a guess
        assert!(acquire(&ints(&[3, 1, 7, 2, 0, 4, 90]), 1).is_err());
        assert!(acquire(&ints(&[3, -2, 5, 0]), 1).is_err());
        assert!(acquire(&ints(&[3, 2, 5]), 1).is_err());
        assert!(acquire(&ints(&[3, 1, 7, -1]), 1).is_err());
        assert!(acquire(&ints(&[3, -2, 5]), 2).is_err());
    }
}

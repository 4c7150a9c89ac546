//! Property test: random sequences of acquire / acquire_many / try_acquire (each with a
//! priority class) / release / cancel (alone, or several in one call as a client combines
//! them) / an operator's forced release / expiry / renewal / resize are run against the Lua
//! scripts in Redis and against a small in-memory model of the semantics. After every step the two must agree on the reply,
//! the holders and their slots, the queue order, the free slots and the holders' fences, and
//! no repair may have been counted (no key is lost here); at the end,
//! the notifications each client channel received must be exactly the grants,
//! rejections and removals the model made for that client's waiters, in order.
//!
//! Fence generations come from Redis's clock (`max(stored + 1, TIME in µs)`), so the model
//! numbers them 1, 2, 3… per slot, and the real ones are translated to that numbering: each
//! new generation seen for a slot must be above every earlier one (checked), and becomes the
//! next number.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::*;
use proptest::prelude::*;
use redis::Value;

fn script(body: &str) -> redis::Script {
    redis::Script::new(&redsem::internals::script_source(body))
}

#[derive(Clone, Debug)]
enum Op {
    /// A batch of 1 to 3 acquisitions `(n, try_only, client, priority)` in one script call.
    Acquire {
        reqs: Vec<(u32, bool, usize, u8)>,
    },
    /// Release holders or cancel waiters (same script): one, or 2 or 3 in one call (the same
    /// one twice, maybe) as a client's combined releases are sent: they are removed, then
    /// what they freed is granted once.
    Release {
        picks: Vec<usize>,
    },
    /// An operator removes 1 or 2 entries (`redsem release`: force "2"): the same removal and
    /// grants, and each removed waiter's client is told (`r:<id>`) after the grants.
    ForceRelease {
        picks: Vec<usize>,
    },
    /// The lease of the entry's session runs out (as if its client died): every entry of
    /// that client expires with it.
    Expire {
        pick: usize,
    },
    Renew {
        pick: usize,
    },
    Resize {
        limit: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => proptest::collection::vec((1u32..=4, any::<bool>(), 0usize..2, priority()), 1..=3).prop_map(|reqs| Op::Acquire { reqs }),
        3 => any::<usize>().prop_map(|pick| Op::Release { picks: vec![pick] }),
        1 => proptest::collection::vec(any::<usize>(), 2..=3).prop_map(|picks| Op::Release { picks }),
        1 => proptest::collection::vec(any::<usize>(), 1..=2).prop_map(|picks| Op::ForceRelease { picks }),
        1 => any::<usize>().prop_map(|pick| Op::Expire { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Renew { pick }),
        1 => (1u32..=5).prop_map(|limit| Op::Resize { limit }),
    ]
}

/// A priority class: mostly the default 0.
fn priority() -> impl Strategy<Value = u8> {
    prop_oneof![3 => Just(0u8), 1 => 1u8..=2]
}

/// A waiter's place in the queue (docs/PROTOCOL.md, "Priority classes"): its ticket less
/// 1000 and a sixteenth per class.
fn place(ticket: u64, priority: u8) -> f64 {
    ticket as f64 - f64::from(priority) * 1000.0625
}

#[derive(Clone, Debug, PartialEq)]
struct Entry {
    n: u32,
    client: usize,
    ticket: u64,
    priority: u8,
    slots: Vec<u32>,
    fences: Vec<u64>,
}

#[derive(Debug, PartialEq)]
enum Reply {
    Granted {
        slots: Vec<u32>,
        fences: Vec<u64>,
        ticket: u64,
    },
    Queued {
        ticket: u64,
    },
    NoCapacity,
    TooMany {
        limit: u32,
    },
    Removed(u64),
    /// (holders removed, waiters removed)
    Forced(u64, u64),
    /// A renewal: the states, the head's place (rounded down) and the highest ticket granted
    /// in each priority class.
    States(Vec<i64>, Option<i64>, Vec<i64>),
    Batch(Vec<Reply>),
    Limit(u32),
}

/// The semantics, in memory.
struct Model {
    limit: u32,
    seq: u64,
    queue: Vec<String>,
    entries: HashMap<String, Entry>,
    free: BTreeSet<u32>,
    fence: BTreeMap<u32, u64>,
    expired: BTreeSet<String>,
    notices: [Vec<String>; 2],
    /// The highest ticket granted in each priority class.
    served: [u64; 10],
}

impl Model {
    fn new(limit: u32) -> Model {
        Model {
            limit,
            seq: 0,
            queue: vec![],
            entries: HashMap::new(),
            free: (0..limit).collect(),
            fence: BTreeMap::new(),
            expired: BTreeSet::new(),
            notices: [vec![], vec![]],
            served: [0; 10],
        }
    }
    fn place_of(&self, id: &str) -> f64 {
        let e = &self.entries[id];
        place(e.ticket, e.priority)
    }
    /// Queues `id` at its place (the queue is ordered by place).
    fn enqueue(&mut self, id: &str) {
        let p = self.place_of(id);
        let at = self
            .queue
            .iter()
            .position(|q| self.place_of(q) > p)
            .unwrap_or(self.queue.len());
        self.queue.insert(at, id.to_owned());
    }
    /// The head's place rounded down, as renew.lua reports it (None: nobody waits).
    fn head_place(&self) -> Option<i64> {
        self.queue.first().map(|h| self.place_of(h).floor() as i64)
    }
    fn used(&self) -> u32 {
        self.entries.values().map(|e| e.slots.len() as u32).sum()
    }
    fn drop_entry(&mut self, id: &str) -> Option<Entry> {
        self.queue.retain(|q| q != id);
        self.expired.remove(id);
        let e = self.entries.remove(id)?;
        for &s in &e.slots {
            if s < self.limit {
                self.free.insert(s);
            }
        }
        Some(e)
    }
    fn grant(&mut self, id: &str) {
        let n = self.entries[id].n as usize;
        let slots: Vec<u32> = self.free.iter().copied().take(n).collect();
        let mut fences = vec![];
        for &s in &slots {
            self.free.remove(&s);
            let g = self.fence.entry(s).or_insert(0);
            *g += 1;
            fences.push(*g);
        }
        let e = self.entries.get_mut(id).unwrap();
        e.slots = slots;
        e.fences = fences;
        let served = &mut self.served[usize::from(e.priority)];
        *served = (*served).max(e.ticket);
        self.queue.retain(|q| q != id);
    }
    /// FIFO grants; returns (id, granted?) for each grant or rejection made.
    fn pump(&mut self) -> Vec<(String, bool)> {
        let mut out = vec![];
        while let Some(head) = self.queue.first().cloned() {
            let n = self.entries[&head].n;
            if n > self.limit {
                let e = self.drop_entry(&head).unwrap();
                out.push((head, false));
                let _ = e;
            } else if self.used() + n > self.limit {
                break;
            } else {
                self.grant(&head);
                out.push((head, true));
            }
        }
        out
    }
    fn publish(&mut self, out: &[(String, bool)], skip: Option<&str>) {
        for (id, ok) in out {
            if Some(id.as_str()) == skip {
                continue;
            }
            let e = self.entries.get(id);
            let client = e
                .map(|e| e.client)
                .unwrap_or_else(|| id.starts_with("c1").into());
            let rec = match (ok, e) {
                (true, Some(e)) => {
                    format!("g:{id}:{}:{}:{}", e.ticket, join(&e.slots), join(&e.fences))
                }
                _ => format!("x:{id}"),
            };
            self.notices[client].push(rec);
        }
    }
    fn settle(&mut self) -> Vec<(String, bool)> {
        for id in std::mem::take(&mut self.expired) {
            self.drop_entry(&id);
        }
        let out = self.pump();
        self.publish(&out, None);
        out
    }
    fn reply_of(&self, id: &str) -> Reply {
        let e = &self.entries[id];
        Reply::Granted {
            slots: e.slots.clone(),
            fences: e.fences.clone(),
            ticket: e.ticket,
        }
    }
}

/// The entry `pick` designates among the live ones ("none", an id that never existed, when
/// there is none).
fn pick_id(live: &[String], pick: usize) -> String {
    live.get(pick % live.len().max(1))
        .cloned()
        .unwrap_or_else(|| "none".into())
}

fn join<T: ToString>(v: &[T]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The scripts, driven through a plain connection.
struct Real {
    con: redis::Connection,
    /// The generations seen per slot, in order (see the module docs).
    gens: HashMap<u32, Vec<u64>>,
    keys: Vec<String>,
    base: String,
    acquire: redis::Script,
    release: redis::Script,
    renew: redis::Script,
    resize: redis::Script,
}

impl Real {
    /// The model's number (1, 2, …) of the real generation `raw` of `slot`; a new one must
    /// be above every earlier one of the slot.
    fn ord(&mut self, slot: u32, raw: u64) -> u64 {
        let seen = self.gens.entry(slot).or_default();
        if let Some(i) = seen.iter().position(|&g| g == raw) {
            return i as u64 + 1;
        }
        if let Some(&last) = seen.last() {
            assert!(raw > last, "slot {slot}: generation {raw} after {last}");
        }
        seen.push(raw);
        seen.len() as u64
    }

    fn ord_all(&mut self, slots: &[u32], raw: &[u64]) -> Vec<u64> {
        slots
            .iter()
            .zip(raw)
            .map(|(&s, &g)| self.ord(s, g))
            .collect()
    }

    /// A reply with its generations in the model's numbering.
    fn translate(&mut self, r: Reply) -> Reply {
        match r {
            Reply::Granted {
                slots,
                fences,
                ticket,
            } => {
                let fences = self.ord_all(&slots, &fences);
                Reply::Granted {
                    slots,
                    fences,
                    ticket,
                }
            }
            Reply::Batch(rs) => Reply::Batch(rs.into_iter().map(|r| self.translate(r)).collect()),
            other => other,
        }
    }

    /// A notice `g:<id>:<ticket>:<slots>:<fences>` with its generations in the model's
    /// numbering (other notices as they are).
    fn translate_notice(&mut self, notice: &str) -> String {
        let parts: Vec<&str> = notice.split(':').collect();
        if parts.len() != 5 || parts[0] != "g" {
            return notice.to_owned();
        }
        let nums = |t: &str| -> Vec<u64> { t.split(',').map(|x| x.parse().unwrap()).collect() };
        let slots: Vec<u32> = nums(parts[3]).into_iter().map(|s| s as u32).collect();
        let fences = self.ord_all(&slots, &nums(parts[4]));
        let join = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        format!("g:{}:{}:{}:{}", parts[1], parts[2], parts[3], join(&fences))
    }

    /// release.lua on `ids`, with `force` ("0", or "2" for an operator's release).
    fn release_ids(&mut self, force: &str, ids: &[String]) -> Value {
        let mut args: Vec<String> = vec![force.into(), "0".into(), "0".into()];
        args.extend(ids.iter().cloned());
        self.call(&self.release.clone(), &args)
    }

    fn call(&mut self, s: &redis::Script, args: &[String]) -> Value {
        let mut inv = s.prepare_invoke();
        for k in &self.keys {
            inv.key(k);
        }
        inv.arg(5).arg(&self.base).arg("PUBLISH");
        for a in args {
            inv.arg(a);
        }
        inv.invoke(&mut self.con).unwrap()
    }
}

fn ints(v: &Value) -> Vec<i64> {
    match v {
        Value::Array(a) => a
            .iter()
            .map(|x| match x {
                Value::Int(i) => *i,
                other => panic!("{other:?}"),
            })
            .collect(),
        Value::Nil => vec![],
        other => panic!("{other:?}"),
    }
}

/// The replies of an `acquire.lua` call: one flat array of integers, the permits free first,
/// then each request's reply (see the script).
fn parse_acquire(v: &Value) -> Vec<Reply> {
    let all = ints(v);
    let mut rest = all.iter().copied().skip(1);
    let mut out = vec![];
    while let Some(code) = rest.next() {
        let mut next = || rest.next().unwrap_or_else(|| panic!("short reply {v:?}"));
        out.push(match code {
            1 => {
                let ticket = next() as u64;
                let k = next() as usize;
                let slots = (0..k).map(|_| next() as u32).collect();
                let fences = (0..k).map(|_| next() as u64).collect();
                Reply::Granted {
                    slots,
                    fences,
                    ticket,
                }
            }
            0 => {
                let ticket = next() as u64;
                next(); // the next expiry
                Reply::Queued { ticket }
            }
            -1 => {
                next(); // why
                Reply::NoCapacity
            }
            -2 => Reply::TooMany {
                limit: next() as u32,
            },
            other => panic!("{other}"),
        });
    }
    out
}

/// (holders: id -> entry's slots and fences, queue, free slots)
type Snapshot = (
    BTreeMap<String, (Vec<u32>, Vec<u64>)>,
    Vec<String>,
    Vec<u32>,
);

fn snapshot_real(r: &mut Real) -> Snapshot {
    use redis::Commands;
    let slots: HashMap<u32, String> = r.con.hgetall(&r.keys[4]).unwrap();
    let mut holders: BTreeMap<String, (Vec<u32>, Vec<u64>)> = BTreeMap::new();
    for (s, id) in slots {
        holders.entry(id.clone()).or_default().0.push(s);
    }
    for (id, (slots, fences)) in holders.iter_mut() {
        slots.sort();
        let raw: String = r.con.hget(&r.keys[3], id).unwrap();
        // the record's slots and fences (docs/PROTOCOL.md, "Records": fields 10 and 11)
        let fields: Vec<&str> = raw.splitn(12, '|').collect();
        let rec: Vec<u32> = fields[9].split(',').map(|x| x.parse().unwrap()).collect();
        assert_eq!(&rec, slots, "record and slot map agree");
        let raw: Vec<u64> = fields[10].split(',').map(|x| x.parse().unwrap()).collect();
        *fences = raw;
    }
    let holders = holders
        .into_iter()
        .map(|(id, (slots, raw))| {
            let fences = r.ord_all(&slots, &raw);
            (id, (slots, fences))
        })
        .collect();
    let queue: Vec<String> = r.con.zrange(&r.keys[1], 0, -1).unwrap();
    // the free slots: those listed, and the unlisted ones from the high-water mark up to
    // the limit
    let mut free: Vec<u32> = r.con.zrange(&r.keys[5], 0, -1).unwrap();
    let limit: Option<u32> = r.con.hget(&r.keys[0], "limit").unwrap();
    let hw: Option<u32> = r.con.hget(&r.keys[0], "hw").unwrap();
    free.extend(hw.unwrap_or(0)..limit.unwrap_or(0));
    free.sort();
    (holders, queue, free)
}

/// (cfg.repairs, cfg.hw, the slots held), each 0 when absent.
fn counters_real(r: &mut Real) -> (u64, u64, u64) {
    use redis::Commands;
    let (repairs, hw): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
        .arg(&r.keys[0])
        .arg("repairs")
        .arg("hw")
        .query(&mut r.con)
        .unwrap();
    let held: u64 = r.con.hlen(&r.keys[4]).unwrap();
    (repairs.unwrap_or(0), hw.unwrap_or(0), held)
}

fn snapshot_model(m: &Model) -> Snapshot {
    let holders = m
        .entries
        .iter()
        .filter(|(_, e)| !e.slots.is_empty())
        .map(|(id, e)| (id.clone(), (e.slots.clone(), e.fences.clone())))
        .collect();
    (holders, m.queue.clone(), m.free.iter().copied().collect())
}

static CASE: AtomicU32 = AtomicU32::new(0);

fn run_case(server: &Server, ops: &[Op]) -> Result<(), TestCaseError> {
    let case = CASE.fetch_add(1, Ordering::SeqCst);
    let tag = format!("m:{{p{case}}}:");
    let keys: Vec<String> = ["cfg", "queue", "exp", "meta", "slots", "free", "own"]
        .iter()
        .map(|k| format!("{tag}{k}"))
        .collect();
    let base = format!("{tag}c:");
    let client = redis::Client::open(server.url()).unwrap();
    let mut sub = client.get_connection().unwrap();
    let mut sub = sub.as_pubsub();
    sub.subscribe(&[format!("{base}c0"), format!("{base}c1")])
        .unwrap();
    let mut real = Real {
        gens: HashMap::new(),
        con: client.get_connection().unwrap(),
        keys,
        base,
        acquire: script(include_str!("../src/protocol/lua/acquire.lua")),
        release: script(include_str!("../src/protocol/lua/release.lua")),
        renew: script(include_str!("../src/protocol/lua/renew.lua")),
        resize: script(include_str!("../src/protocol/lua/resize.lua")),
    };
    // create the semaphore (limit 5), as Semaphore::open does
    real.call(&script(include_str!("../src/protocol/lua/open.lua")), &[]);
    let mut model = Model::new(5);
    let mut next_id = 0;
    let mut ids: Vec<String> = vec![]; // every id ever created, for picking
    for op in ops {
        let live: Vec<String> = ids
            .iter()
            .filter(|id| model.entries.contains_key(*id))
            .cloned()
            .collect();
        let (want, got) = match op {
            Op::Acquire { reqs } => {
                let mut args = vec![reqs.len().to_string()];
                let mut batch_ids = vec![];
                for (n, try_only, client, priority) in reqs {
                    let id = format!("c{client}-{next_id}");
                    next_id += 1;
                    ids.push(id.clone());
                    batch_ids.push(id.clone());
                    args.extend([
                        id,
                        n.to_string(),
                        "60000".into(),
                        "60000".into(),
                        format!("c{client}"),
                        "label".into(),
                        if *try_only { "try" } else { "wait" }.into(),
                        priority.to_string(),
                    ]);
                }
                let reply = real.call(&real.acquire.clone(), &args);
                let got = real.translate(Reply::Batch(parse_acquire(&reply)));
                // one settle for the call, then each request in order
                model.settle();
                let mut want = vec![];
                for ((n, try_only, client, priority), id) in reqs.iter().zip(batch_ids) {
                    // queued ahead of it: a lower place than the one its ticket would give
                    let mine = place(model.seq + 1, *priority);
                    let ahead = model.queue.iter().any(|q| model.place_of(q) < mine);
                    want.push(if *n > model.limit {
                        Reply::TooMany { limit: model.limit }
                    } else if *try_only {
                        if ahead || model.used() + n > model.limit {
                            Reply::NoCapacity
                        } else {
                            model.seq += 1;
                            model.entries.insert(
                                id.clone(),
                                Entry {
                                    n: *n,
                                    client: *client,
                                    ticket: model.seq,
                                    priority: *priority,
                                    slots: vec![],
                                    fences: vec![],
                                },
                            );
                            model.grant(&id);
                            model.reply_of(&id)
                        }
                    } else {
                        model.seq += 1;
                        model.entries.insert(
                            id.clone(),
                            Entry {
                                n: *n,
                                client: *client,
                                ticket: model.seq,
                                priority: *priority,
                                slots: vec![],
                                fences: vec![],
                            },
                        );
                        model.enqueue(&id);
                        let out = model.pump();
                        model.publish(&out, Some(&id));
                        if out.iter().any(|(g, ok)| g == &id && *ok) {
                            model.reply_of(&id)
                        } else {
                            Reply::Queued { ticket: model.seq }
                        }
                    });
                }
                (Reply::Batch(want), got)
            }
            Op::Release { picks } => {
                let ids: Vec<String> = picks.iter().map(|p| pick_id(&live, *p)).collect();
                let got = match real.release_ids("0", &ids) {
                    Value::Int(i) => Reply::Removed(i as u64),
                    v => panic!("{v:?}"),
                };
                // (an id sent twice is removed once)
                let removed = ids
                    .iter()
                    .filter(|id| model.drop_entry(id).is_some())
                    .count();
                // a release grants what it frees, and reaps nothing
                let out = model.pump();
                model.publish(&out, None);
                (Reply::Removed(removed as u64), got)
            }
            Op::ForceRelease { picks } => {
                let mut ids: Vec<String> = picks.iter().map(|p| pick_id(&live, *p)).collect();
                ids.dedup();
                let got = match real.release_ids("2", &ids) {
                    Value::Array(v) => match v.as_slice() {
                        [Value::Int(h), Value::Int(w)] => Reply::Forced(*h as u64, *w as u64),
                        other => panic!("{other:?}"),
                    },
                    v => panic!("{v:?}"),
                };
                let (mut holders, mut told) = (0, vec![]);
                for id in &ids {
                    match model.drop_entry(id) {
                        Some(e) if e.slots.is_empty() => told.push((id.clone(), e.client)),
                        Some(_) => holders += 1,
                        None => {}
                    }
                }
                let out = model.pump();
                model.publish(&out, None);
                for (id, client) in &told {
                    model.notices[*client].push(format!("r:{id}"));
                }
                (Reply::Forced(holders, told.len() as u64), got)
            }
            Op::Expire { pick } => {
                if let Some(id) = live.get(pick % live.len().max(1)) {
                    let client = model.entries[id].client;
                    let _: i64 = redis::cmd("ZADD")
                        .arg(&real.keys[2])
                        .arg("XX")
                        .arg(1)
                        .arg(format!("c{client}~60000"))
                        .query(&mut real.con)
                        .unwrap();
                    for (id, e) in &model.entries {
                        if e.client == client {
                            model.expired.insert(id.clone());
                        }
                    }
                }
                (Reply::Removed(0), Reply::Removed(0))
            }
            Op::Renew { pick } => {
                let id = pick_id(&live, *pick);
                let v = real.call(&real.renew.clone(), &["0".into(), id.clone()]);
                let Value::Array(a) = &v else { panic!("{v:?}") };
                let Value::Array(states) = &a[1] else {
                    panic!("{v:?}")
                };
                let got = Reply::States(
                    states
                        .iter()
                        .map(|s| match s {
                            Value::Array(a) => match a[0] {
                                Value::Int(i) => i,
                                _ => panic!("{s:?}"),
                            },
                            _ => panic!("{s:?}"),
                        })
                        .collect(),
                    match &a[5] {
                        Value::Nil => None,
                        Value::Int(h) => Some(*h),
                        other => panic!("head {other:?}"),
                    },
                    ints(&a[9]),
                );
                model.settle();
                let state = match model.entries.get(&id) {
                    None => -1,
                    Some(e) if e.slots.is_empty() => 0,
                    Some(_) => 1,
                };
                let served = model.served.iter().map(|&t| t as i64).collect();
                (Reply::States(vec![state], model.head_place(), served), got)
            }
            Op::Resize { limit } => {
                let got = Reply::Limit(
                    match real.call(&real.resize.clone(), &[limit.to_string()]) {
                        Value::Int(i) => i as u32,
                        v => panic!("{v:?}"),
                    },
                );
                let old = model.limit;
                if *limit > old {
                    for s in old..*limit {
                        if !model.entries.values().any(|e| e.slots.contains(&s)) {
                            model.free.insert(s);
                        }
                    }
                } else {
                    model.free.retain(|s| s < limit);
                }
                model.limit = *limit;
                // a shrink rejects every queued request above the new limit, wherever it
                // waits, then pumps (one message per client for both)
                for id in std::mem::take(&mut model.expired) {
                    model.drop_entry(&id);
                }
                let mut out = vec![];
                if *limit < old {
                    for id in model.queue.clone() {
                        if model.entries[&id].n > *limit {
                            model.drop_entry(&id);
                            out.push((id, false));
                        }
                    }
                }
                out.extend(model.pump());
                model.publish(&out, None);
                (Reply::Limit(old), got)
            }
        };
        prop_assert_eq!(&want, &got, "reply to {:?}", op);
        prop_assert_eq!(
            snapshot_model(&model),
            snapshot_real(&mut real),
            "state after {:?}",
            op
        );
        // No key is ever lost here: a repair would be a false alarm (`stats` reports
        // repairs to operators as key loss), and the high-water mark is 0 exactly when no
        // slot is held (docs/PROTOCOL.md, "Free slots").
        let (repairs, hw, held) = counters_real(&mut real);
        prop_assert_eq!(repairs, 0, "repairs counted after {:?}", op);
        prop_assert_eq!(
            hw == 0,
            held == 0,
            "cfg.hw {} with {} slots held after {:?}",
            hw,
            held,
            op
        );
    }
    // the notifications: exactly the model's, per client channel, in order
    sub.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut got: [Vec<String>; 2] = [vec![], vec![]];
    while let Ok(msg) = sub.get_message() {
        let ch: String = msg.get_channel_name().to_owned();
        let payload: String = msg.get_payload().unwrap();
        let client = if ch.ends_with("c1") { 1 } else { 0 };
        for notice in payload.split(';') {
            got[client].push(real.translate_notice(notice));
        }
    }
    prop_assert_eq!(&model.notices, &got, "notifications");
    Ok(())
}

#[test]
fn scripts_agree_with_the_model() {
    for server in servers() {
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(96);
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases,
            ..ProptestConfig::default()
        });
        runner
            .run(&proptest::collection::vec(op(), 1..40), |ops| {
                run_case(&server, &ops)
            })
            .unwrap_or_else(|e| panic!("{}: {e}", server.flavor()));
    }
}

/// A batch whose requests could take more free slots than are listed pops them ahead in one
/// call (the prelude's POOL): its grants take the lowest in order, and what a request that
/// queues did not take is listed as free again when the batch's writes are made. The model
/// checks the holders' slots and the free slots after every step.
#[test]
fn a_batch_takes_the_lowest_free_slots_and_lists_again_what_it_popped_ahead() {
    let acquire = |reqs: &[(u32, bool, usize, u8)]| Op::Acquire {
        reqs: reqs.to_vec(),
    };
    let ops = [
        // slots 0..3 (nothing listed: the high-water mark)
        acquire(&[
            (1, false, 0, 0),
            (1, false, 0, 0),
            (1, false, 1, 0),
            (1, false, 1, 0),
        ]),
        // slots 0 and 2 freed: listed below the mark
        Op::Release { picks: vec![0] },
        Op::Release { picks: vec![1] },
        // 1 + 3 asked with 3 free: the first takes slot 0, the second queues; slot 2, popped
        // ahead, is listed again
        acquire(&[(1, false, 0, 0), (3, false, 1, 0)]),
        // the queued one is granted 2, 4 and a freed slot once one is released
        Op::Release { picks: vec![0] },
        // a batch behind a queue pops nothing ahead; a try that does not fit takes nothing
        acquire(&[(1, true, 0, 0), (2, false, 0, 1), (1, false, 1, 0)]),
        Op::Release { picks: vec![1] },
        Op::Release { picks: vec![0] },
        acquire(&[(2, false, 0, 0), (1, false, 1, 0), (9, false, 0, 0)]),
    ];
    for server in servers() {
        run_case(&server, &ops).unwrap_or_else(|e| panic!("{}: {e}", server.flavor()));
    }
}

//! # Guide: choosing a limit, a lease, and knowing what can go wrong
//!
//! This module holds documentation only.
//!
//! ## Which concurrency limit does this need?
//!
//! | what must be limited | use |
//! |---|---|
//! | calls at once, inside one process | [`tokio::sync::Semaphore`]: no network, nanoseconds |
//! | calls at once, across every replica, fairly | a [`Semaphore`](crate::Semaphore): one round trip to acquire, one to release |
//! | …and exceeding the limit causes damage, not just load | a [`Semaphore`](crate::Semaphore) **and** [fencing tokens](crate::fencing) checked by the resource: leases alone cannot stop a paused holder |
//! | calls per second (a rate, not a concurrency) | a rate limiter (token bucket, GCRA), not a semaphore: a different question |
//!
//! A distributed semaphore limits *concurrency*, not throughput: with a limit of 4 and 10 ms
//! calls, 400 calls per second go through.
//!
//! Put a local cap ([`SemaphoreBuilder::local_cap`](crate::SemaphoreBuilder::local_cap)) in
//! front of it when one replica could otherwise queue thousands of tickets.
//!
//! The same choice as a chart, question by question:
//!
//! ```text
//! Is the scarce thing a number of operations per unit of time (an API quota per second)?
//! ├─ yes ─> a rate limiter. A semaphore bounds how many run at once, not how often.
//! └─ no: it is a number of things at once (connections, licences, GPUs, a fragile service).
//!    Is every user of it inside one process?
//!    ├─ yes ─> tokio::sync::Semaphore. No network, no lease, nothing to renew.
//!    └─ no: replicas, workers, cron jobs on several hosts, services in several languages.
//!       Is going over the limit merely slower (load), or harmful (corruption, a ban, a bill)?
//!       ├─ load ────> redsem: FIFO across processes, crash-safe leases.
//!       └─ harmful ─> redsem AND a fence check at the resource (crate::fencing): a paused
//!                     holder cannot be stopped by its lease, only refused by the resource.
//! ```
//!
//! Neither redsem nor a rate limiter replaces the other: an API that allows 10 requests per
//! second *and* 3 at a time needs both.
//!
//! ## Changing the limit during a rolling deploy
//!
//! The limit is stored in Redis, one for every replica. By default a replica that opens the
//! semaphore with another limit fails ([`Error::LimitConflict`](crate::Error::LimitConflict)),
//! which stops a rolling deploy that changes the limit in config. Choose who owns the limit
//! with [`SemaphoreBuilder::limit_policy`](crate::SemaphoreBuilder::limit_policy): the
//! recipe is in [`LimitPolicy`](crate::LimitPolicy) ("Rolling deploys"). `redsem run` adopts
//! the stored limit unless `--strict-limit`.
//!
//! ## Choosing the lease and the renewal interval
//!
//! The **lease** bounds how long a crashed holder blocks its slot, and how long a crashed
//! waiter stays in the queue: after `kill -9`, the slot is granted to the next waiter within
//! one lease of the holder's last renewal (the waiters' process re-checks exactly when the
//! nearest lease is due, it does not wait for a poll). Shorter is faster recovery.
//!
//! The **renewal interval** (default and at most lease / 3) bounds how long a healthy
//! holder can go without reaching Redis. A holder whose renewals all fail — Redis down,
//! network cut, process paused — declares its permit lost a safety margin (lease / 10, at
//! most 1 s) *before* the lease could expire on the server — counted from a renewal about
//! one interval older than its last, in case a failover promoted a replica that missed the
//! last ones (docs/PROTOCOL.md, rule 4) — so [`Permit::run`](crate::Permit::run)
//! cancels the work before another process can be granted the slot, as long as this
//! process's clock and scheduler keep running. Renewals cost one batched script call per
//! process per interval, whatever the number of permits held.
//!
//! Rules of thumb:
//! - lease ≥ 3 × the longest pause you want to survive (GC, a slow Redis), and ≥ 10 × the
//!   99th-percentile round trip to Redis, delays of this process's scheduler included (with
//!   renewals every third of the lease, trusted from the one before the last, about a
//!   quarter of the lease is left for two round trips and their delays); never below
//!   [`MIN_LEASE`](crate::MIN_LEASE) (250 ms), which the library refuses;
//! - lease ≤ the longest time you accept a slot to stay blocked after a crash;
//! - the hold itself can be any length: it is the renewals that keep it.
//!
//! The **fallback poll** (default 1 s) bounds how long a waiter waits for a grant whose
//! notification was lost (pub/sub is at-most-once). Each process with waiters makes one
//! call per interval, whatever the number of its waiters. Waiters hold leases too, so they
//! are also renewed every renewal interval: a lease shorter than the fallback poll is fine.
//!
//! A job longer than its lease needs nothing special: keep the lease short (fast crash
//! recovery) and let the renewals carry the job (see `examples/long_job.rs`).
//!
//! ## Bounding how long a permit is held
//!
//! Renewals let a live holder keep its permit for ever: a hung job that still renews blocks
//! its slot as long as its process lives. To bound that, give the acquisition a maximum
//! hold time ([`AcquireOptions::max_hold`](crate::AcquireOptions::max_hold); `redsem run
//! --max-hold`): at the grant (as this process learns it) + that time, the permit is lost
//! with [`LostReason::MaxHold`](crate::LostReason::MaxHold), so
//! [`Permit::run`](crate::Permit::run) drops the work, and Redis stops renewing the entry
//! (it is detached, keeping the lease it has). Dropping the lost permit frees the slot at
//! once; a program that keeps it and ignores the loss still loses the slot within one
//! lease. Choose it well above the job's normal duration: it is a guard against hung work,
//! not a scheduler.
//!
//! ## Serving some requests first
//!
//! The queue is FIFO. When some work must not wait behind a backlog (an interactive request
//! behind a batch), give it a priority class
//! ([`AcquireOptions::priority`](crate::AcquireOptions::priority), 0 to 9, higher first;
//! `redsem run --priority`): it is served before lower classes, FIFO within its class.
//! Nothing starves: a request is overtaken by at most 1,000 later requests per class above
//! its own (a class-0 request by at most 9,000), after which everything that arrives queues
//! behind it. Leave the default class 0 to everything else: without classes the queue is
//! plain FIFO.
//!
//! ```no_run
//! # async fn example(sem: redsem::Semaphore) -> Result<(), redsem::Error> {
//! use redsem::AcquireOptions;
//! let urgent = sem.acquire_with(AcquireOptions::new().priority(5)).await?;
//! # drop(urgent); Ok(()) }
//! ```
//!
//! ## What happens on each failure
//!
//! | failure | what redsem does | what you see |
//! |---|---|---|
//! | holder process killed | its lease expires; the next script run reaps it and grants the slot in FIFO order | the next waiter starts within one lease |
//! | waiter process killed | its ticket's lease expires and it leaves the queue | the waiters behind it move up within one lease |
//! | acquire future dropped (timeout, `select!`, task abort) | the ticket is removed in the background; a grant that raced in is released | nothing leaks |
//! | permit dropped | released in the background (batched) | the next waiter starts within a round trip |
//! | holder exceeds its maximum hold time ([`AcquireOptions::max_hold`](crate::AcquireOptions::max_hold)) | the permit is lost with [`LostReason::MaxHold`](crate::LostReason::MaxHold) and its entry detached in Redis (no longer renewed) | `run` returns [`Error::LeaseLost`](crate::Error::LeaseLost), the work is cancelled; the slot frees when the permit is dropped, or within one lease if the program keeps it |
//! | notification lost, subscriber connection killed | the subscriber reconnects, re-subscribes and re-checks every local waiter; otherwise the fallback poll finds the grant | a delay of at most the fallback interval |
//! | Redis unreachable while holding | renewals are retried; before the lease could expire the permit is lost with [`LostReason::Unreachable`](crate::LostReason::Unreachable) | `run` returns [`Error::LeaseLost`](crate::Error::LeaseLost), the work is cancelled |
//! | holder paused past its lease (SIGSTOP, GC, VM freeze) | the server reaps it; the slot goes to the next waiter with a higher fence; on wake-up the renewal finds it gone ([`LostReason::NotHolder`](crate::LostReason::NotHolder)) | between the expiry and the wake-up, the paused holder may still act: only fencing stops it |
//! | Redis restarted with its data lost | holders' renewals find their entries gone (lost), waiters queue again at the back, the configuration is re-created from the limit the processes opened with | holders lose their slots (each learns it at its next renewal); new fences are still above every earlier one (they come from Redis's clock), so a fenced resource rejects the old holders once a new one used it |
//! | Redis failover to a replica (asynchronous replication) | the last writes may be missing on the new primary: a grant may be forgotten, and its slot granted again; a release may be forgotten too, so the client sends the releases of the last 10 s again once it follows the new master | up to `limit` extra holders until the old ones' renewals fail; the new grants' fences are above the forgotten ones', so fencing protects the resource; no released entry lives on |
//! | one of the semaphore's keys evicted or deleted (`maxmemory-policy allkeys-*`, a `DEL`) | every script detects it first, in O(1) (markers in `own` and `exp`, the queue's length in `cfg`), and rebuilds the keys from what survives before it grants or queues (docs/PROTOCOL.md, "Lost keys") | never more holders than the limit; [`Stats::repairs_total`](crate::Stats::repairs_total) counts the repairs; holders whose record was lost stop at their next renewal |
//! | a key replaced by a foreign value | the scripts fail with `WRONGTYPE`; a holder's renewal that finds it gives the permit up at once ([`LostReason::Overwritten`](crate::LostReason::Overwritten)), its handle's waiters ask again | [`Error::WrongType`](crate::Error::WrongType) naming the semaphore; `run` returns [`Error::LeaseLost`](crate::Error::LeaseLost), the work is cancelled |
//! | another program's hash at the configuration key (`cfg`) | every script refuses it (`REDSEM_FOREIGN`) instead of adopting or misreading it; a forced delete leaves it (and any key of a foreign type) alone | [`Error::NotASemaphore`](crate::Error::NotASemaphore); only [`Client::purge_keys`](crate::Client::purge_keys) deletes it |
//! | a request behind the tower layer loses its permit | the inner future is dropped | the response future fails with [`Error::LeaseLost`](crate::Error::LeaseLost) (boxed) |
//! | the semaphore was created by a newer, incompatible protocol version | every script refuses it before changing anything (a `REDSEM_PROTOCOL` error reply) | [`Error::ProtocolMismatch`](crate::Error::ProtocolMismatch) naming both versions |
//!
//! ## Guarantees
//!
//! - **Limit**: at most `limit` permits are granted at once *among holders whose lease is
//!   valid in Redis*, always (every grant is decided inside one atomic script, against the
//!   stored limit).
//! - **Local safety**: a holder that cannot renew learns it lost the permit before its lease
//!   can expire in Redis — unless its own process is paused or its clock jumps. With a paused
//!   holder, more than `limit` processes may *believe* they hold a slot; fencing tokens make
//!   the resource reject the stale one.
//! - **Fences only go up**: a slot's generation is `max(previous + 1, Redis TIME in µs)`, so
//!   every token issued after a data loss (`FLUSHALL`, a restart without persistence, a
//!   failover to a lagging replica) is above every token issued before it for that slot —
//!   *assuming Redis's clock does not go back* past the earlier grant (a promoted replica's
//!   clock may lag the old master's by at most the failover's duration: NTP keeps hosts within
//!   milliseconds, a failover takes seconds). Tokens are unique per slot.
//! - **Clock steps**: a permit is trusted until lease − margin (a tenth, at most 1 s) after
//!   its trusted renewal (one whose answer came at least one renewal interval before a later
//!   renewal was sent). A forward step of Redis's clock shortens leases by the
//!   step: up to the margin is always covered, up to the margin + one renewal interval when
//!   no renewal was lost.
//! - **FIFO**: permits are granted in ticket order; a multi-permit request at the head blocks
//!   those behind it (no starvation).
//! - **Liveness**: a free permit is granted to the head of the queue by the same script that
//!   freed it; the head's process learns it from a notification, or at the latest within the
//!   fallback interval.
//! - **Cleanup**: every entry has a lease; nothing a crashed process wrote outlives it. The
//!   semaphore's own configuration (limit, free slots, the last fence generation) stays in Redis.
//!
//! ## Handing a permit to another process
//!
//! A scheduler acquires; a worker (another process, maybe in Python or Node.js) does the work,
//! renews the permit meanwhile and releases it. [`Permit::export`](crate::Permit::export)
//! turns the permit into a [`HandoffToken`](crate::HandoffToken), a printable string to pass
//! along with the job; the worker calls [`Semaphore::adopt`](crate::Semaphore::adopt) with
//! it, and holds a [`Permit`](crate::Permit) with the same slots, fences and holder id:
//!
//! ```no_run
//! # async fn scheduler(sem: redsem::Semaphore) -> Result<(), redsem::Error> {
//! // the scheduler: one round trip; it no longer renews the permit
//! let token = sem.acquire().await?.export().await?;
//! let job = format!("{{\"handoff\": \"{token}\"}}"); // enqueue it with the job
//! # Ok(()) }
//! # async fn worker(sem: redsem::Semaphore, text: &str) -> Result<(), redsem::Error> {
//! // the worker: one round trip; from now on it renews the permit
//! let token: redsem::HandoffToken = text.parse()?;
//! let permit = sem.adopt(&token).await?;
//! permit.run(async { /* the work */ }).await?; // released at the end
//! # Ok(()) }
//! ```
//!
//! Between the export and the adoption nobody renews the permit: it stays held for what was
//! left of its lease ([`Permit::lease_left`](crate::Permit::lease_left) at the export), and
//! if no worker adopts it by then Redis frees the slots (the adoption then fails with
//! [`Error::HandoffGone`](crate::Error::HandoffGone)). So give the permit a lease longer
//! than the time a job may wait in between ([`AcquireOptions::lease`](crate::AcquireOptions::lease),
//! or [`Permit::set_lease`](crate::Permit::set_lease) before exporting), at the price of a
//! longer wait for the slots after a crash. A job that will not run: release its permit
//! with [`Semaphore::release_handoff`](crate::Semaphore::release_handoff) (from any process).
//!
//! Give each token to one worker. If two adopt it, the last one holds the permit and the
//! first finds it lost ([`LostReason::HandedOff`](crate::LostReason::HandedOff)) at its next
//! renewal; until then both believe they hold it, with the same fences.
//!
//! ## Limiting requests in tower, axum, hyper, reqwest or tonic stacks
//!
//! With the `tower` feature, `redsem::tower::ConcurrencyLimitLayer` wraps any tower
//! `Service`: each request holds a permit while it runs, across every replica. Unlike tower's
//! own `ConcurrencyLimit`, the permit is taken when the request is *called*, not when the
//! service is *readied* (a readied, idle service would otherwise hold a Redis lease), and it
//! is released when the response future completes or is dropped. A lost permit fails the
//! request with [`Error::LeaseLost`](crate::Error::LeaseLost); an acquire timeout fails it
//! with [`Error::Timeout`](crate::Error::Timeout) (or, with a zero timeout,
//! [`Error::NoPermits`](crate::Error::NoPermits)), boxed in `tower::BoxError`. In axum, turn
//! these into responses with `HandleErrorLayer` (e.g. 503 and `Retry-After`). See
//! `examples/fragile_http.rs` for a client stack limited across processes.
//!
//! ## Observability
//!
//! **tracing** (always on; free without a subscriber). Spans:
//!
//! | span | level | fields | covers |
//! |---|---|---|---|
//! | `redsem.acquire` | debug | `semaphore`, `permits`, `mode` (`wait`/`try`), `holder`, `ticket`, `slots` | one acquisition, from the call to the grant or error |
//! | `redsem.hold` | info | `semaphore`, `holder`, `ticket`, `slots` | the work run by [`Permit::run`](crate::Permit::run): your own events inside carry the permit's identity |
//! | `redsem.renew` | debug | `semaphore`, `holders`, `waiters` | one batched renewal call |
//!
//! Events (target `redsem::...`):
//!
//! | message | level | fields |
//! |---|---|---|
//! | `waiting in the queue` | debug | `ticket` (in `redsem.acquire`) |
//! | `granted` | debug | `waited_ms` (in `redsem.acquire`, which has `holder`, `ticket`, `slots`) |
//! | `acquire failed` | debug | `error`, `waited_ms` |
//! | `renewed` | debug | (in `redsem.renew`) |
//! | `heartbeat failed; retrying`, `heartbeat timed out; retrying` | warn | `semaphore`, `error` |
//! | `lease lost` | warn | `semaphore`, `holder`, `ticket`, `slots`, `reason` |
//! | `released`, `released (in the background)`, `detached: ...` | debug | `semaphore`, `holder`, `ticket`, `slots` |
//! | `background release failed`, `giving up the background release: ...` | warn | `semaphore`, `attempt` / `entries` |
//!
//! **metrics** (feature `metrics`, through the `metrics` facade): wait time, hold time,
//! grants, failures, renewals, lost leases, expiries reaped, abandoned releases and local
//! queue depth, each labelled by `semaphore`; the names and meanings are in
//! [`metrics`](crate::metrics). Alert on `redsem_client_leases_lost_total` and
//! `redsem_client_releases_abandoned_total`; watch `redsem_client_acquire_wait_seconds` and
//! `redsem_client_waiters` for a limit that is too low.
//!
//! ## Sharing a semaphore with other languages
//!
//! The protocol is open: `docs/PROTOCOL.md` in the repository specifies the keys, every
//! script's keys, arguments and replies, the notification messages, what a client must do
//! and the versioning rule. A client in another language loads the same Lua scripts and
//! follows those rules; `interop/python` is such a client, and the tests run it together
//! with Rust processes on one semaphore (one limit, one FIFO order).
//!
//! The `cfg` hash of a semaphore records its protocol version (`ver`, now 1). An
//! incompatible change bumps it; every script of every version checks it first, so an old
//! client facing a newer semaphore fails with a `REDSEM_PROTOCOL` error
//! ([`Error::ProtocolMismatch`](crate::Error::ProtocolMismatch) in Rust) instead of
//! misreading it. Compatible additions (new optional fields, new message records, which
//! clients ignore) keep the version.
//!
//! ## Protocol, in brief
//!
//! Keys share the hash tag `{<name>}`: `<prefix>:{<name>}:cfg`, `:queue`, `:exp` (session
//! leases), `:meta`, `:slots`, `:free`, `:own` (the entries of each session); each client
//! handle listens on `<prefix>:{<name>}:c:<id>`.
//! The Lua scripts beside `src/protocol/mod.rs` document their arguments and replies;
//! `docs/PROTOCOL.md` is the full specification.

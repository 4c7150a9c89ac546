//! `redsem run`: wait for permits in FIFO order, run a command in its own process group
//! while the library renews the lease, forward signals, and kill the group if the slot is
//! lost.

use std::ffi::{OsStr, OsString};
use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::Instant;

use crate::common::{
    self, EXIT_ERROR, EXIT_LOST, EXIT_MAX_HOLD, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_REMOVED,
    Failure, fmt_dur, fmt_fences,
};
use crate::{Global, RunArgs};

/// Shown by `redsem run --help` (before the exit-status table).
pub const RUN_HELP: &str = "\
Environment of the command:
  REDSEM_NAME    the semaphore's name
  REDSEM_SLOTS   the slots held, comma-separated (e.g. 0,3), each in 0..limit
  REDSEM_FENCES  slot:generation fencing tokens, comma-separated (e.g. 0:17,3:4)
  REDSEM_HOLDER  the holder id (as in `redsem stats`, for `redsem release --holder`)
  REDSEM_TICKET  the FIFO ticket number the permits were granted under
REDSEM_URL (which often holds a password) is removed from it unless --pass-url; the rest of
redsem's environment, REDIS_URL included, is passed on as it is.

--limit creates the semaphore; an existing one keeps the limit stored in Redis (which
`redsem limit` changes for everyone), and redsem uses that (with --strict-limit, a different
stored limit is an error). The command is looked up before waiting: a command that cannot
run fails at once (126, 127).

The command runs in its own process group. SIGINT, SIGTERM and SIGHUP sent to redsem are
forwarded to that group (each followed by SIGCONT: a stopped command ends too); the permits
are released as soon as the command exits. In a terminal, Ctrl-Z stops redsem with the
command, as a shell job (`fg` continues both; while stopped, the lease is not renewed). If the
slot is lost (a renewal found it gone: an operator released it, or Redis lost it), the
group gets SIGTERM, then SIGKILL after --kill-after. While Redis does not confirm renewals,
the group gets SIGTERM --kill-after before the lease could run out in Redis and SIGKILL at
that moment, before the slot can be granted elsewhere; so --kill-after may be at most half
the lease (default: a quarter of it, at most 10s), and redsem renews every
(lease - kill-after) / 4. With --max-hold, the group is stopped the same way (SIGTERM, then
SIGKILL after --kill-after) once the permits were held that long, counted from the grant, and
redsem exits 77: Redis stops renewing them at that moment, and they are released as soon as
the command is gone. If redsem itself is killed, the command gets SIGTERM (Linux) and the
permits free within one lease.";

/// How long `run`, once done (the command ended, or it gave up waiting), waits for Redis to
/// confirm the release of its permits or of its place in the queue before it exits: one
/// round trip when Redis answers. When Redis does not answer in time, the permits free when
/// their lease expires.
const RELEASE_WAIT: Duration = Duration::from_secs(1);

/// The least time `run` gives Redis to count the holders for the message of a wait that
/// ended without the permits, once it left the queue (see `not_granted`).
const COUNT_WAIT: Duration = Duration::from_millis(200);

/// A `--lease` longer than this is accepted with a warning: it is how long a crashed
/// holder's permits stay blocked.
const LONG_LEASE: Duration = Duration::from_secs(60 * 60);

/// The longest `--kill-after` when none is given; the default is a quarter of the lease.
const DEFAULT_KILL_AFTER_MAX: Duration = Duration::from_secs(10);

/// How `run` stops its command in time: the grace between SIGTERM and SIGKILL, and how often
/// the lease is renewed so that in normal operation it never comes within that grace of
/// running out (see [`RUN_HELP`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stopping {
    /// `--kill-after`, or its default.
    kill_after: Duration,
    /// The renewal interval of the handle.
    renew_every: Duration,
}

impl Stopping {
    /// The stopping rule for `--lease` and `--kill-after`: SIGTERM when the permit's local
    /// deadline (which the library keeps a safety margin before the lease can expire in
    /// Redis) is `kill_after` away, SIGKILL at the deadline. Renewing every
    /// (lease − kill_after) / 4 keeps the deadline at least about
    /// 0.44 × (lease − kill_after) − margin beyond `kill_after` between renewals (the
    /// library trusts a lease from the renewal before the last), so a renewal may come late
    /// by that much before the command is stopped. Errors: a `kill_after` above half the
    /// lease, which would leave the renewals too little room.
    fn new(lease: Duration, kill_after: Option<Duration>) -> Result<Stopping, String> {
        let kill_after = kill_after.unwrap_or_else(|| (lease / 4).min(DEFAULT_KILL_AFTER_MAX));
        if kill_after > lease / 2 {
            return Err(format!(
                "--kill-after {} does not fit --lease {}: while Redis does not confirm renewals, \
                 the command gets SIGTERM --kill-after before its lease could run out in Redis, \
                 and SIGKILL at that moment, so --kill-after may be at most half the lease ({}): \
                 give --lease {} or more, or a shorter --kill-after",
                fmt_dur(kill_after),
                fmt_dur(lease),
                fmt_dur(lease / 2),
                fmt_dur(kill_after * 2),
            ));
        }
        Ok(Stopping {
            kill_after,
            renew_every: (lease - kill_after) / 4,
        })
    }
}

/// The signals `run` forwards to the command.
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal received, as its number.
    async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        libc::SIGKILL => "SIGKILL",
        _ => "signal",
    }
}

/// Runs `redsem run`; returns the exit code.
pub async fn run(g: &Global, a: RunArgs) -> Result<u8, Failure> {
    let stop = Stopping::new(a.lease, a.kill_after).map_err(Failure::Other)?;
    let mut signals = Signals::install()
        .map_err(|e| Failure::Other(format!("cannot install signal handlers: {e}")))?;
    let (program, args) = program_and_args(&a);
    let label = a
        .label
        .clone()
        .unwrap_or_else(|| default_label(a.command()));
    warn_if_long(a.lease);

    // Do not queue for a command that cannot run.
    if let Err((code, what)) = check_program(&program) {
        if let Some(why) = mistyped_option(&program).filter(|_| !a.shell) {
            return Err(Failure::Other(why));
        }
        say!("redsem: cannot run {:?}: {what}", program.to_string_lossy());
        return Ok(code);
    }

    // Nothing is queued yet: a signal here just stops.
    let setup = async {
        let client = common::connect(g).await?;
        let sem = open(&client, &a, &label, stop).await?;
        Ok::<_, Failure>((client, sem))
    };
    let (client, sem) = tokio::select! {
        r = setup => r?,
        sig = signals.recv() => return Ok(128 + sig as u8),
    };

    let started = Instant::now();
    let permit = loop {
        let permit = match wait_for_permits(&client, &sem, &a, &mut signals, started).await? {
            Ok(permit) => permit,
            Err(code) => return Ok(code),
        };
        match until_confirmed(&permit, &stop, &a, &mut signals).await {
            Ok(()) => break permit,
            Err(Some(sig)) => {
                drop(permit);
                shutdown(&client).await;
                return Ok(128 + sig as u8);
            }
            // lost before the command started: nothing ran, so it queues again
            Err(None) => {
                say!(
                    "redsem: the slot of semaphore {:?} was lost before the command started \
                     (Redis did not confirm its lease in time: it stalled or was unreachable); \
                     queueing again",
                    a.name()
                );
            }
        }
    };
    let mut child = match command(g, &a, &program, &args, &permit).spawn() {
        Ok(c) => c,
        Err(e) => return Ok(cannot_spawn(&e, &program, permit, &client).await),
    };
    let pgid = child.id().map(|p| p as i32).unwrap_or(0);
    let terminal = Terminal::hand_to(pgid);
    let (status, stopped) = watch(&mut child, &permit, &terminal, stop, &a, &mut signals).await;
    terminal.take_back();
    let status = status.map_err(|e| Failure::Other(format!("cannot wait for the command: {e}")))?;

    if let Some(code) = stopped {
        // the lease is gone, or about to be: nothing of the group may keep using the resource
        killpg(pgid, libc::SIGKILL);
        // (a permit lost to --max-hold is still in Redis: this releases it at once)
        drop(permit);
        shutdown(&client).await;
        return Ok(code);
    }
    release(permit, &client, &a).await;
    Ok(exit_code(status))
}

/// Warns about a `--lease` longer than [`LONG_LEASE`].
fn warn_if_long(lease: Duration) {
    if lease > LONG_LEASE {
        say!(
            "redsem: warning: --lease {}: if redsem or its host dies (kill -9, a power cut), \
             its permits stay blocked for up to {} before anyone else can have them; the lease \
             is renewed while the command runs, so a long command does not need a long lease \
             (the default 10s is enough)",
            fmt_dur(lease),
            fmt_dur(lease)
        );
    }
}

/// How much more than `--kill-after` of its lease a permit must have confirmed before the
/// command starts (see [`until_confirmed`]).
const START_SLACK: Duration = Duration::from_millis(200);

/// Waits until `permit`'s lease is confirmed far enough ahead for the command to start
/// without being stopped at once: more than `--kill-after` (+ [`START_SLACK`]) of it left.
/// It always is, but for a grant made just after Redis stalled or was unreachable for a good
/// part of the waiter's lease: the lease it keeps was last confirmed before the stall, and
/// is trusted again only after renewals (the library trusts a lease from the renewal before
/// the last: about one renewal interval). `Err(None)` when the permit is lost first (its
/// lease could have run out): the command never ran; `Err(Some(sig))` when a signal came.
async fn until_confirmed(
    permit: &redsem::Permit,
    stop: &Stopping,
    a: &RunArgs,
    signals: &mut Signals,
) -> Result<(), Option<i32>> {
    let enough = stop.kill_after + START_SLACK;
    if permit.lease_left() > enough {
        return Ok(());
    }
    if a.verbose {
        say!(
            "redsem: granted, but Redis confirmed its lease too long ago ({} of it is trusted, \
             --kill-after is {}): waiting for renewals before the command starts",
            fmt_dur(permit.lease_left()),
            fmt_dur(stop.kill_after)
        );
    }
    let lost = permit.lost();
    tokio::pin!(lost);
    // (the lease left only grows with a renewal the heartbeat gets: looked at often, cheap)
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        tokio::select! {
            _ = &mut lost => return Err(None),
            sig = signals.recv() => return Err(Some(sig)),
            _ = tick.tick() => if permit.lease_left() > enough {
                return Ok(());
            },
        }
    }
}

/// Waits for the permits (`-v`: showing the progress), within what is left of the wait
/// limit (`--timeout`) since `started`. `Ok(Err(code))`: `run` ends with that exit status
/// without running the command (a signal came, the permits were not free in time, an
/// operator removed the request), the client shut down and the reason said.
async fn wait_for_permits(
    client: &redsem::Client,
    sem: &redsem::Semaphore,
    a: &RunArgs,
    signals: &mut Signals,
    started: Instant,
) -> Result<Result<redsem::Permit, u8>, Failure> {
    let name = a.name();
    if a.verbose {
        say!(
            "redsem: waiting for {} permit(s) of {name:?} (limit {})",
            a.permits,
            sem.limit()
        );
    }
    let acquire = sem.acquire_with(acquire_options(a, started.elapsed()));
    let acquired = tokio::select! {
        r = acquire => r,
        () = progress(client, name, a.permits, started), if a.verbose => unreachable!(),
        sig = signals.recv() => {
            // the cancelled acquire leaves the queue in the background: let it finish
            shutdown(client).await;
            return Ok(Err(128 + sig as u8));
        }
    };
    let permit = match acquired {
        Ok(p) => p,
        Err(e @ (redsem::Error::Timeout { .. } | redsem::Error::NoPermits { .. })) => {
            let waited = started.elapsed();
            // leaving the queue (done in the background: waited for, so that the count
            // leaves this request out) and counting the holders for the message share one
            // bound: a stalled Redis delays the exit by about RELEASE_WAIT, not a response
            // timeout; then the client is shut down (nothing is left for it to release)
            let deadline = Instant::now() + RELEASE_WAIT;
            let _ = tokio::time::timeout_at(deadline, client.flush_releases()).await;
            let message = not_granted(client, a, &e, waited, deadline).await;
            shutdown_by(client, Instant::now() + COUNT_WAIT).await;
            say!("{message}");
            return Ok(Err(a.conflict_exit_code));
        }
        Err(redsem::Error::RemovedFromQueue { .. }) => {
            shutdown(client).await;
            say!(
                "redsem: an operator removed this request for {} permit(s) of semaphore {name:?} from the queue (`redsem release`); the command was not run",
                a.permits
            );
            return Ok(Err(EXIT_REMOVED));
        }
        Err(e) => {
            shutdown(client).await;
            return Err(e.into());
        }
    };
    if a.verbose {
        say!(
            "redsem: acquired slot(s) {} of {name:?} after {} (holder {})",
            fmt_fences(permit.fences()),
            fmt_dur(started.elapsed()),
            permit.holder_id()
        );
    }
    Ok(Ok(permit))
}

/// The message of a wait that ended without the permits after `waited` (`e`: a timeout, or
/// `-n` or `--timeout 0` finding them taken), with how busy the semaphore is, read before
/// `deadline` (or within [`COUNT_WAIT`] when it has passed), or why that could not be read.
async fn not_granted(
    client: &redsem::Client,
    a: &RunArgs,
    e: &redsem::Error,
    waited: Duration,
    deadline: Instant,
) -> String {
    let name = a.name();
    // the counts alone: none of the entries is shown
    let count = client.inspect_listing(name, 0);
    let busy = match tokio::time::timeout_at(deadline.max(Instant::now() + COUNT_WAIT), count).await
    {
        Ok(Ok(s)) => format!(
            "; {} of {} permits in use, {} waiting",
            s.in_use, s.limit, s.waiter_count
        ),
        Ok(Err(e)) => format!(
            "; how busy it is could not be read: {}",
            common::describe(&e)
        ),
        Err(_) => "; Redis did not answer when asked how busy it is (stalled, overloaded or \
                   unreachable: that may be why the permits were not granted)"
            .to_owned(),
    };
    let why = match e {
        redsem::Error::NoPermits { reason, .. } if a.nonblock => {
            format!("not free right now (-n): {reason}")
        }
        redsem::Error::NoPermits { reason, .. } => {
            format!("not free right now (--timeout 0): {reason}")
        }
        _ => format!("not granted within {}", fmt_dur(waited)),
    };
    format!(
        "redsem: timeout: {} permit(s) of semaphore {name:?} {why}{busy}; the command was not run",
        a.permits
    )
}

/// The command to run under `permit`: in a process group of its own, with the permit in its
/// environment (see [`RUN_HELP`]), and dying with redsem.
fn command(
    g: &Global,
    a: &RunArgs,
    program: &OsStr,
    args: &[OsString],
    permit: &redsem::Permit,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .process_group(0)
        .env("REDSEM_NAME", a.name())
        .env("REDSEM_SLOTS", slots_var(permit))
        .env("REDSEM_FENCES", fmt_fences(permit.fences()))
        .env("REDSEM_HOLDER", permit.holder_id())
        .env("REDSEM_TICKET", permit.ticket().to_string());
    // redsem's own URL often carries a password: the command gets it only when asked
    if a.pass_url {
        cmd.env("REDSEM_URL", g.redis_url());
    } else {
        cmd.env_remove("REDSEM_URL");
    }
    die_with_parent(&mut cmd);
    cmd
}

/// The command could not be started (`e`): releases the permits, shuts the client down and
/// says why; returns the exit status (127: not found, 126: not executable).
async fn cannot_spawn(
    e: &std::io::Error,
    program: &OsStr,
    permit: redsem::Permit,
    client: &redsem::Client,
) -> u8 {
    let (code, what) = match e.kind() {
        std::io::ErrorKind::NotFound => (EXIT_NOT_FOUND, "command not found".to_owned()),
        std::io::ErrorKind::PermissionDenied => {
            (EXIT_NOT_EXECUTABLE, "permission denied".to_owned())
        }
        _ => (EXIT_NOT_EXECUTABLE, e.to_string()),
    };
    let deadline = Instant::now() + RELEASE_WAIT;
    let _ = tokio::time::timeout_at(deadline, permit.release()).await;
    shutdown_by(client, deadline).await;
    say!(
        "redsem: cannot run {:?}: {what}; the permits were released",
        program.to_string_lossy()
    );
    code
}

/// Supervises the command (process group `pgid`) until it exits: forwards signals, and stops
/// it (SIGTERM, then SIGKILL) when `permit` is lost, or before its lease could run out in
/// Redis. Returns its exit status, and redsem's exit status when it had to be stopped.
async fn watch(
    child: &mut tokio::process::Child,
    permit: &redsem::Permit,
    terminal: &Terminal,
    stop: Stopping,
    a: &RunArgs,
    signals: &mut Signals,
) -> (std::io::Result<std::process::ExitStatus>, Option<u8>) {
    let pgid = terminal.pgid;
    // SIGCHLD: the command stopped (see Terminal::follow_stop); one that stopped before this
    // listened is found by the first look
    let mut chld = signal(SignalKind::child()).ok();
    terminal.follow_stop();
    let mut w = Watch {
        a,
        stop,
        pgid,
        stopped: None,
        kill_at: None,
    };
    let lost = permit.lost();
    tokio::pin!(lost);
    // The moment the lease could run out in Redis, as last seen while the permit was not
    // lost: it only moves later (with renewals).
    let mut deadline = Instant::now() + permit.lease_left();
    let status = loop {
        if !permit.is_lost() {
            deadline = Instant::now() + permit.lease_left();
        }
        let term_at = deadline
            .checked_sub(stop.kill_after)
            .unwrap_or_else(Instant::now);
        tokio::select! {
            biased;
            st = child.wait() => break st,
            // a renewal found the entry gone, or the client gave it up: the slot may be
            // another's already
            // (or the maximum hold time was reached: Redis no longer renews the permits, which
            // keep the lease they had)
            reason = &mut lost, if w.stopped.is_none() => w.lost(reason, deadline),
            // no renewal confirmed in time: stop the command before the lease can run out
            _ = tokio::time::sleep_until(term_at), if w.stopped.is_none() => {
                w.lease_running_out(permit.lease_left());
            }
            // (without a kill time the branch is disabled and its sleep never polled)
            _ = tokio::time::sleep_until(w.kill_at.unwrap_or_else(Instant::now)),
                if w.kill_at.is_some() => w.kill(),
            sig = signals.recv() => w.forward(sig),
            // the command stopped (Ctrl-Z) while it had the terminal: so does redsem
            Some(()) = async { chld.as_mut()?.recv().await }, if terminal.ours.is_some() => {
                terminal.follow_stop();
            }
        }
    };
    (status, w.stopped)
}

/// What [`watch`] knows of the command it stops.
struct Watch<'a> {
    a: &'a RunArgs,
    stop: Stopping,
    /// The command's process group.
    pgid: i32,
    /// Once the command is being stopped (SIGTERM sent): redsem's exit status then.
    stopped: Option<u8>,
    /// When SIGKILL is due, once SIGTERM was sent; `None` once SIGKILL was sent.
    kill_at: Option<Instant>,
}

impl Watch<'_> {
    /// The permit was lost (`reason`) while the command ran: SIGTERM now, SIGKILL after
    /// `--kill-after` or at `deadline`, whichever comes first.
    fn lost(&mut self, reason: redsem::LostReason, deadline: Instant) {
        let name = self.a.name();
        let now = Instant::now();
        let at = (now + self.stop.kill_after).min(deadline.max(now));
        let (why, status) = match (reason, self.a.max_hold) {
            (redsem::LostReason::MaxHold, Some(max)) => (
                format!(
                    "the maximum hold time of semaphore {name:?} was reached \
                     (--max-hold {}) while the command ran",
                    fmt_dur(max)
                ),
                EXIT_MAX_HOLD,
            ),
            _ => (
                format!("lost the slot of semaphore {name:?} while the command ran: {reason}"),
                EXIT_LOST,
            ),
        };
        say!(
            "redsem: {why}; sending SIGTERM to its process group {}, SIGKILL in {}",
            self.pgid,
            fmt_dur(at - now)
        );
        killpg(self.pgid, libc::SIGTERM);
        self.stopped = Some(status);
        self.kill_at = Some(at);
    }

    /// The time to stop the command came, `left` before its lease could run out: SIGTERM
    /// now and SIGKILL then, unless a renewal moved the deadline on meanwhile.
    fn lease_running_out(&mut self, left: Duration) {
        if left <= self.stop.kill_after {
            say!(
                "redsem: about to lose the slot of semaphore {:?}: Redis has not \
                 confirmed a renewal of its lease, which could run out in Redis in {}; \
                 sending SIGTERM to the command's process group {}, SIGKILL in {}",
                self.a.name(),
                fmt_dur(left),
                self.pgid,
                fmt_dur(left)
            );
            killpg(self.pgid, libc::SIGTERM);
            self.stopped = Some(EXIT_LOST);
            self.kill_at = Some(Instant::now() + left);
        }
        // else a renewal moved the deadline on: wait for the new one
    }

    /// SIGTERM did not stop the command in time.
    fn kill(&mut self) {
        say!(
            "redsem: the command did not exit after SIGTERM; sending SIGKILL to process \
             group {} before its slot can be granted elsewhere",
            self.pgid
        );
        killpg(self.pgid, libc::SIGKILL);
        self.kill_at = None;
    }

    /// Forwards a signal redsem received to the command's group.
    fn forward(&self, sig: i32) {
        if self.a.verbose {
            say!(
                "redsem: forwarding {} to process group {}",
                signal_name(sig),
                self.pgid
            );
        }
        killpg(self.pgid, sig);
    }
}

/// Releases the permits of a command that exited by itself, waiting up to [`RELEASE_WAIT`]
/// for Redis to confirm, and shuts the client down.
async fn release(permit: redsem::Permit, client: &redsem::Client, a: &RunArgs) {
    let name = a.name();
    let held = permit.holder_id().to_owned();
    let deadline = Instant::now() + RELEASE_WAIT;
    match tokio::time::timeout_at(deadline, permit.release()).await {
        Ok(Ok(())) => {
            if a.verbose {
                say!("redsem: released {held} of {name:?}");
            }
        }
        Ok(Err(e)) => say!(
            "redsem: warning: could not release the permits ({}); they free when their lease expires in Redis (within {})",
            common::describe(&e),
            fmt_dur(a.lease)
        ),
        Err(_) => say!(
            "redsem: warning: Redis did not confirm the release within {}; the permits free when their lease expires in Redis (within {})",
            fmt_dur(RELEASE_WAIT),
            fmt_dur(a.lease)
        ),
    }
    shutdown_by(client, deadline).await;
}

/// The acquisition `run` makes, `waited` into its wait: `--permits`, how long to wait (what is
/// left of `--timeout`; `-n`), and `--max-hold`.
fn acquire_options(a: &RunArgs, waited: Duration) -> redsem::AcquireOptions {
    let mut opts = redsem::AcquireOptions::new()
        .permits(a.permits)
        .priority(a.priority);
    match a.wait_limit() {
        Some(t) if t.is_zero() => opts = opts.try_only(true),
        // (a wait that queues again once its time is up gives up at once)
        Some(t) => opts = opts.timeout(t.saturating_sub(waited).max(Duration::from_millis(1))),
        None => {}
    }
    if let Some(max_hold) = a.max_hold {
        opts = opts.max_hold(max_hold);
    }
    opts
}

/// How often `run -v` reads the queue while it waits (one `stats` script call each).
const PROGRESS_POLL: Duration = Duration::from_secs(1);
/// The longest `run -v` stays silent while it waits and nothing changes.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// `run -v` while waiting: one line on stderr when the request's place in the queue or the
/// holders change, and at least every [`PROGRESS_EVERY`]: the position in the queue, who
/// holds, and the oldest wait. Never returns (it is dropped when the acquisition ends).
async fn progress(client: &redsem::Client, name: &str, permits: u32, started: Instant) {
    // this client's entries are `<client id>.<handle>-<n>`, and `run` makes one
    let mine = format!("{}.", client.id());
    let mut shown: Option<(Option<usize>, Vec<String>)> = None;
    let mut shown_at = Instant::now();
    let mut tick = tokio::time::interval_at(Instant::now() + PROGRESS_POLL, PROGRESS_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // (times are the ticks': a slow answer does not push the next line a poll later)
        let ticked = tick.tick().await;
        let due = ticked.duration_since(shown_at) >= PROGRESS_EVERY;
        let s = match tokio::time::timeout(PROGRESS_EVERY, client.inspect(name)).await {
            Ok(Ok(s)) => s,
            failed => {
                // said too, at the same pace (counted to now: the check itself may have
                // waited): silence would look like a long queue
                if shown.is_some() || shown_at.elapsed() >= PROGRESS_EVERY {
                    let why = match failed {
                        Ok(Err(e)) => common::describe(&e),
                        _ => format!("Redis did not answer within {}", fmt_dur(PROGRESS_EVERY)),
                    };
                    say!(
                        "redsem: waiting {} for {permits} permit(s) of {name:?}: cannot read the \
                         queue: {why}",
                        fmt_dur(started.elapsed()),
                    );
                    shown = None;
                    shown_at = Instant::now();
                }
                continue;
            }
        };
        let me = s.waiters.iter().find(|w| w.id.starts_with(&mine));
        let state = (
            me.map(|w| w.position),
            s.holders.iter().map(|h| h.id.clone()).collect::<Vec<_>>(),
        );
        if shown.as_ref() == Some(&state) && !due {
            continue;
        }
        say!("{}", progress_line(&s, me, permits, started.elapsed()));
        shown = Some(state);
        shown_at = ticked;
    }
}

/// One line of `run -v`'s progress (see [`progress`]).
fn progress_line(
    s: &redsem::Stats,
    me: Option<&redsem::WaiterInfo>,
    permits: u32,
    waited: Duration,
) -> String {
    let place = match me {
        Some(w) if w.position == 0 => format!("next in the queue of {}", s.waiter_count),
        Some(w) => format!(
            "position {} of {} in the queue ({} ahead)",
            w.position + 1,
            s.waiter_count,
            w.position
        ),
        // (the snapshot lists the head of the queue only)
        None if s.waiter_count > s.waiters.len() => format!(
            "behind the first {} of the {} in the queue",
            s.waiters.len(),
            s.waiter_count
        ),
        None => "not queued yet".to_owned(),
    };
    let holders = match s.holders.as_slice() {
        [] => "nobody holds a permit".to_owned(),
        hs => {
            let mut names: Vec<String> = hs
                .iter()
                .take(3)
                .map(|h| {
                    format!(
                        "{:?} ({} for {})",
                        common::truncate(&h.label, 60),
                        h.permits,
                        fmt_dur(h.held)
                    )
                })
                .collect();
            if s.holder_count > 3 {
                names.push(format!("{} more", s.holder_count.max(hs.len()) - 3));
            }
            format!("held by {}", names.join(", "))
        }
    };
    format!(
        "redsem: waiting {} for {permits} permit(s) of {:?}: {place}; {} of {} permits in use, \
         {holders}; the oldest wait is {}",
        fmt_dur(waited),
        s.name,
        s.in_use,
        s.limit,
        fmt_dur(s.oldest_wait().unwrap_or_default())
    )
}

/// Opens the semaphore: with the stored limit when there is one (an operator may have
/// changed it with `redsem limit`), unless `--strict-limit`; else creates it with `--limit`.
/// One script call decides (the library's [`redsem::LimitPolicy`]), so a limit changed
/// meanwhile is simply the one used.
async fn open(
    client: &redsem::Client,
    a: &RunArgs,
    label: &str,
    stop: Stopping,
) -> Result<redsem::Semaphore, Failure> {
    use redsem::LimitPolicy;
    let name = a.name();
    // Without --limit, or when the permits asked for exceed it, nothing may be created: the
    // stored limit is adopted (and the request checked against it), or the open fails.
    let (limit, policy) = match a.limit {
        Some(l) if a.permits <= l && a.strict_limit => (l, LimitPolicy::Require),
        Some(l) if a.permits <= l => (l, LimitPolicy::CreateOrAdopt),
        // (the limit given with Adopt is not used)
        given => (given.unwrap_or(1), LimitPolicy::Adopt),
    };
    let opened = client
        .semaphore(name, limit)
        .lease(a.lease)
        .renew_every(stop.renew_every)
        .label(label)
        .allow_evicting_policy(a.allow_evicting_policy)
        .limit_policy(policy)
        .open()
        .await;
    let sem = match opened {
        Err(redsem::Error::LimitConflict { stored, .. }) => {
            return Err(strict_mismatch(name, limit, stored));
        }
        Err(redsem::Error::UnknownSemaphore { .. }) => {
            return Err(match a.limit {
                Some(l) => too_many(name, a.permits, l),
                None => Failure::Other(format!(
                    "semaphore {name:?} does not exist: give --limit L to create it (`redsem list` shows what exists)"
                )),
            });
        }
        r => r?,
    };
    let stored = sem.limit();
    if let Some(l) = a.limit.filter(|&l| l != stored) {
        if a.strict_limit {
            return Err(strict_mismatch(name, l, stored));
        }
        if a.verbose {
            say!("redsem: semaphore {name:?} has limit {stored} in Redis, not {l}: using {stored}");
        }
    }
    if a.permits > stored {
        return Err(too_many(name, a.permits, stored));
    }
    Ok(sem)
}

/// The error of a request for more permits than the limit, found before anything is queued
/// or created.
fn too_many(name: &str, permits: u32, limit: u32) -> Failure {
    Failure::Other(format!(
        "--permits {permits} is more than semaphore {name:?} has: its limit is {limit}, so the request could never be granted (nothing was queued or created)"
    ))
}

/// The error of `--strict-limit` when the stored limit is another.
fn strict_mismatch(name: &str, limit: u32, stored: u32) -> Failure {
    Failure::Other(format!(
        "semaphore {name:?} has limit {stored} in Redis, not {limit} (--strict-limit): change it for everyone with `redsem limit {name} {limit}`, or run without --strict-limit to use {stored}"
    ))
}

/// The program to execute and its arguments: the command, or `sh -c` and the command's
/// words joined by spaces (`--shell`).
fn program_and_args(a: &RunArgs) -> (OsString, Vec<OsString>) {
    let command = a.command();
    if a.shell {
        let script = command.join(OsStr::new(" "));
        ("sh".into(), vec!["-c".into(), script])
    } else {
        (command[0].clone(), command[1..].to_vec())
    }
}

/// The refusal of a command word that is not a program but a mistyped option (`--lable`,
/// `--timout 5s`: everything after NAME that clap does not know is the command), naming the
/// option meant when one is close: it would otherwise fail as "command not found" (exit 127),
/// which reads as the command's own failure.
fn mistyped_option(program: &OsStr) -> Option<String> {
    let word = program.to_str()?;
    if !word.starts_with('-') {
        return None;
    }
    let typed = word.trim_start_matches('-').split('=').next().unwrap_or("");
    let cli = <crate::Cli as clap::CommandFactory>::command();
    let longs = cli
        .find_subcommand("run")
        .into_iter()
        .flat_map(|run| run.get_arguments())
        .chain(cli.get_arguments())
        .filter_map(|a| a.get_long());
    let meant = longs
        .map(|long| (strsim::jaro(typed, long), long))
        .filter(|(similarity, _)| *similarity > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map_or(String::new(), |(_, long)| {
            format!(" (did you mean --{long}?)")
        });
    Some(format!(
        "unexpected argument '{word}' found{meant}: options go before the command, and a \
         command does not start with '-'"
    ))
}

/// Whether `program` can be executed, as far as can be told before running it: a path
/// must name an executable file, a bare name must be found in `PATH`. Errors are the exit
/// code and the reason.
fn check_program(program: &OsStr) -> Result<(), (u8, &'static str)> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let path = Path::new(program);
    if path.components().count() > 1 || program.as_encoded_bytes().contains(&b'/') {
        return match executable(path) {
            Ok(true) => Ok(()),
            Ok(false) => Err((EXIT_NOT_EXECUTABLE, "not an executable file")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err((EXIT_NOT_FOUND, "no such file"))
            }
            Err(_) => Err((EXIT_NOT_EXECUTABLE, "permission denied")),
        };
    }
    let found = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| executable(&dir.join(program)).unwrap_or(false))
    });
    if found {
        Ok(())
    } else {
        Err((EXIT_NOT_FOUND, "command not found"))
    }
}

/// The shell convention: the exit code, or 128 + the signal that killed the process.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        (None, None) => EXIT_ERROR,
    }
}

/// Shuts the client down, waiting at most [`RELEASE_WAIT`]: every release is done before the
/// process exits, or left to the leases.
async fn shutdown(client: &redsem::Client) {
    shutdown_by(client, Instant::now() + RELEASE_WAIT).await;
}

/// [`shutdown`], waiting until `deadline` at most.
async fn shutdown_by(client: &redsem::Client, deadline: Instant) {
    let _ = tokio::time::timeout_at(deadline, client.shutdown()).await;
}

fn slots_var(permit: &redsem::Permit) -> String {
    permit
        .slots()
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn default_label(command: &[OsString]) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    // one line of printable text, as the library requires of a label
    let cmd = command
        .iter()
        .map(|s| s.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
        .replace(|c: char| c.is_control(), " ");
    common::truncate(
        &format!("{}:{} {cmd}", host.trim(), std::process::id()),
        100,
    )
}

/// Sends `sig` to the process group `pgid` (errors such as "no such group" are ignored:
/// everyone in it may have exited already), then SIGCONT: a stopped process (Ctrl-Z,
/// SIGSTOP) would otherwise get a SIGTERM only once someone continues it, and hold the
/// permits until then (SIGKILL ends a stopped process as it is).
fn killpg(pgid: i32, sig: i32) {
    if pgid > 1 {
        // SAFETY: killpg has no memory-safety preconditions.
        unsafe {
            libc::killpg(pgid, sig);
            if sig != libc::SIGKILL && sig != libc::SIGCONT {
                libc::killpg(pgid, libc::SIGCONT);
            }
        }
    }
}

/// Asks Linux to send the command SIGTERM if redsem dies (even by SIGKILL), so that it does
/// not run on without the permits once their lease expires.
#[cfg(target_os = "linux")]
fn die_with_parent(cmd: &mut tokio::process::Command) {
    // SAFETY: the closure runs in the forked child before exec and only calls
    // async-signal-safe functions (prctl, getppid, kill, getpid).
    let parent = std::process::id() as libc::pid_t;
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong);
            if libc::getppid() != parent {
                // redsem died before prctl took effect
                libc::kill(libc::getpid(), libc::SIGTERM);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_cmd: &mut tokio::process::Command) {}

/// The controlling terminal, when redsem runs in its foreground: the command's process
/// group gets it (so that the command can read from it and gets Ctrl-C directly), and
/// redsem takes it back when the command exits.
struct Terminal {
    /// The command's process group (its pid).
    pgid: i32,
    /// redsem's own process group, while the command's has the terminal.
    ours: Option<libc::pid_t>,
}

impl Terminal {
    fn hand_to(pgid: i32) -> Terminal {
        let none = Terminal { pgid, ours: None };
        let stdin = std::io::stdin();
        if pgid <= 1 || !stdin.is_terminal() {
            return none;
        }
        // SAFETY: plain syscalls on fd 0 and our own process group.
        unsafe {
            let ours = libc::getpgrp();
            if libc::tcgetpgrp(0) != ours {
                return none; // we run in the background
            }
            if libc::tcsetpgrp(0, pgid) != 0 {
                return none;
            }
            // the command may have tried to read before it had the terminal, and stopped
            libc::killpg(pgid, libc::SIGCONT);
            Terminal {
                pgid,
                ours: Some(ours),
            }
        }
    }

    /// Gives the terminal to the process group `to` (SIGTTOU, which a background process
    /// changing it would get, ignored meanwhile).
    fn give(to: libc::pid_t) {
        // SAFETY: plain syscalls; SIGTTOU's disposition is restored afterwards.
        unsafe {
            let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::tcsetpgrp(0, to);
            libc::signal(libc::SIGTTOU, old);
        }
    }

    /// After a SIGCHLD: if the command stopped (Ctrl-Z, or it read the terminal from the
    /// background), redsem takes the terminal back and stops its own process group with
    /// SIGTSTP, as a shell job, so that the shell gets its prompt back (as `sudo` does).
    /// When the shell continues it (`fg`, `bg`), the command gets the terminal again if
    /// redsem is in the foreground, and SIGCONT. While both are stopped nothing renews the
    /// permit: stopped longer than its lease, it is lost, and the command stopped at once
    /// when continued.
    fn follow_stop(&self) {
        let Some(ours) = self.ours else { return };
        // SAFETY: waitid on our own child (WNOHANG: it does not block; without WEXITED it
        // does not reap it, which tokio does), then plain signal and terminal syscalls.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let stopped = libc::waitid(
                libc::P_PID,
                self.pgid as libc::id_t,
                &mut info,
                libc::WSTOPPED | libc::WNOHANG,
            ) == 0
                && info.si_pid() == self.pgid;
            if !stopped {
                return;
            }
            Terminal::give(ours);
            libc::killpg(ours, libc::SIGTSTP);
            // continued
            if libc::tcgetpgrp(0) == ours {
                Terminal::give(self.pgid);
            }
            libc::killpg(self.pgid, libc::SIGCONT);
        }
    }

    fn take_back(self) {
        if let Some(ours) = self.ours {
            Terminal::give(ours);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn the_default_kill_after_is_a_quarter_of_the_lease_at_most_10s() {
        let d = Stopping::new(secs(10.0), None).unwrap();
        assert_eq!(d.kill_after, secs(2.5), "the default --lease 10s");
        assert_eq!(d.renew_every, secs(1.875));
        assert_eq!(
            Stopping::new(secs(3.0), None).unwrap().kill_after,
            secs(0.75)
        );
        assert_eq!(
            Stopping::new(secs(3600.0), None).unwrap().kill_after,
            secs(10.0)
        );
    }

    #[test]
    fn a_kill_after_above_half_the_lease_is_refused() {
        assert!(Stopping::new(secs(10.0), Some(secs(5.0))).is_ok());
        assert!(Stopping::new(secs(10.0), Some(Duration::ZERO)).is_ok());
        let e = Stopping::new(secs(10.0), Some(secs(10.0))).unwrap_err();
        assert!(e.contains("at most half the lease (5.0s)"), "{e}");
        assert!(e.contains("--lease 20.0s or more"), "{e}");
        assert!(Stopping::new(secs(10.0), Some(secs(5.001))).is_err());
    }

    /// Renewals every (lease − kill_after) / 4 never bring the local deadline within
    /// kill_after in normal operation: the deadline counts from the renewal before the last
    /// (lease − margin − 2 intervals, and each renewal up to an eighth of its interval late
    /// on the library's grid), with room to spare for a late renewal.
    #[test]
    fn normal_renewals_leave_room_beyond_kill_after() {
        for (lease, kill_after) in [(10.0, None), (3.0, None), (1.0, Some(0.5)), (60.0, None)] {
            let lease = secs(lease);
            let s = Stopping::new(lease, kill_after.map(secs)).unwrap();
            let margin = (lease / 10).min(secs(1.0));
            let lowest = lease - margin - s.renew_every * 9 / 4;
            assert!(lowest > s.kill_after, "{lease:?}: {s:?}");
            assert!(s.renew_every <= lease / 3, "the library's rule");
        }
    }
}

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
    self, EXIT_ERROR, EXIT_LOST, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_REMOVED, Failure,
    fmt_dur, fmt_fences,
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

--limit creates the semaphore; an existing one keeps the limit stored in Redis (which
`redsem limit` changes for everyone), and redsem uses that (with --strict-limit, a different
stored limit is an error). The command is looked up before waiting: a command that cannot
run fails at once (126, 127).

The command runs in its own process group. SIGINT, SIGTERM and SIGHUP sent to redsem are
forwarded to that group; the permits are released as soon as the command exits. If the
slot is lost (the lease could not be renewed, or an operator released it), the group gets
SIGTERM, then SIGKILL after --kill-after. If redsem itself is killed, the command gets
SIGTERM (Linux) and the permits free within one lease.";

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
    let mut signals = Signals::install()
        .map_err(|e| Failure::Other(format!("cannot install signal handlers: {e}")))?;
    let name = a.name().to_owned();
    let (program, args) = program_and_args(&a);
    let label = a
        .label
        .clone()
        .unwrap_or_else(|| default_label(a.command()));

    // Do not queue for a command that cannot run.
    if let Err((code, what)) = check_program(&program) {
        say!("redsem: cannot run {:?}: {what}", program.to_string_lossy());
        return Ok(code);
    }

    // Nothing is queued yet: a signal here just stops.
    let setup = async {
        let client = common::connect(g).await?;
        let sem = open(&client, &a, &label).await?;
        Ok::<_, Failure>((client, sem))
    };
    let (client, sem) = tokio::select! {
        r = setup => r?,
        sig = signals.recv() => return Ok(128 + sig as u8),
    };

    let started = Instant::now();
    if a.verbose {
        say!(
            "redsem: waiting for {} permit(s) of {name:?} (limit {})",
            a.permits,
            sem.limit()
        );
    }
    let acquire = async {
        match a.wait_limit() {
            Some(t) if t.is_zero() => sem.try_acquire_many(a.permits).await,
            Some(t) => sem.acquire_many_timeout(a.permits, t).await,
            None => sem.acquire_many(a.permits).await,
        }
    };
    let acquired = tokio::select! {
        r = acquire => r,
        sig = signals.recv() => {
            // the cancelled acquire leaves the queue in the background: let it finish
            shutdown(&client).await;
            return Ok(128 + sig as u8);
        }
    };
    let permit = match acquired {
        Ok(p) => p,
        Err(e @ (redsem::Error::Timeout { .. } | redsem::Error::NoPermits { .. })) => {
            shutdown(&client).await;
            let busy = match client.inspect(&name).await {
                Ok(s) => format!(
                    "; {} of {} permits in use, {} waiting",
                    s.in_use,
                    s.limit,
                    s.waiters.len()
                ),
                Err(_) => String::new(),
            };
            let why = match e {
                redsem::Error::NoPermits { reason, .. } if a.nonblock => {
                    format!("not free right now (-n): {reason}")
                }
                redsem::Error::NoPermits { reason, .. } => {
                    format!("not free right now (--timeout 0): {reason}")
                }
                _ => format!("not granted within {}", fmt_dur(started.elapsed())),
            };
            say!(
                "redsem: timeout: {} permit(s) of semaphore {name:?} {why}{busy}; the command was not run",
                a.permits
            );
            return Ok(a.conflict_exit_code);
        }
        Err(redsem::Error::RemovedFromQueue { .. }) => {
            shutdown(&client).await;
            say!(
                "redsem: an operator removed this request for {} permit(s) of semaphore {name:?} from the queue (`redsem release`); the command was not run",
                a.permits
            );
            return Ok(EXIT_REMOVED);
        }
        Err(e) => {
            shutdown(&client).await;
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

    let mut cmd = tokio::process::Command::new(&program);
    cmd.args(&args)
        .process_group(0)
        .env("REDSEM_NAME", &name)
        .env("REDSEM_SLOTS", slots_var(&permit))
        .env("REDSEM_FENCES", fmt_fences(permit.fences()))
        .env("REDSEM_HOLDER", permit.holder_id())
        .env("REDSEM_TICKET", permit.ticket().to_string());
    die_with_parent(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let (code, what) = match e.kind() {
                std::io::ErrorKind::NotFound => (EXIT_NOT_FOUND, "command not found".to_owned()),
                std::io::ErrorKind::PermissionDenied => {
                    (EXIT_NOT_EXECUTABLE, "permission denied".to_owned())
                }
                _ => (EXIT_NOT_EXECUTABLE, e.to_string()),
            };
            let _ = tokio::time::timeout(Duration::from_secs(3), permit.release()).await;
            shutdown(&client).await;
            say!(
                "redsem: cannot run {:?}: {what}; the permits were released",
                program.to_string_lossy()
            );
            return Ok(code);
        }
    };
    let pgid = child.id().map(|p| p as i32).unwrap_or(0);
    let terminal = Terminal::hand_to(pgid);

    let lost = permit.lost();
    tokio::pin!(lost);
    let mut lost_at: Option<Instant> = None;
    let mut killed = false;
    let status = loop {
        let kill_at = lost_at.map(|t| t + a.kill_after);
        tokio::select! {
            st = child.wait() => break st,
            reason = &mut lost, if lost_at.is_none() => {
                say!(
                    "redsem: lost the slot of semaphore {name:?} while the command ran: {reason}; \
                     sending SIGTERM to its process group {pgid}, SIGKILL in {}",
                    fmt_dur(a.kill_after)
                );
                killpg(pgid, libc::SIGTERM);
                lost_at = Some(Instant::now());
            }
            // (without a kill time the branch is disabled and its sleep never polled)
            _ = tokio::time::sleep_until(kill_at.unwrap_or_else(Instant::now)),
                if kill_at.is_some() && !killed => {
                say!(
                    "redsem: the command did not exit within {} of SIGTERM; sending SIGKILL to process group {pgid}",
                    fmt_dur(a.kill_after)
                );
                killpg(pgid, libc::SIGKILL);
                killed = true;
            }
            sig = signals.recv() => {
                if a.verbose {
                    say!("redsem: forwarding {} to process group {pgid}", signal_name(sig));
                }
                killpg(pgid, sig);
            }
        }
    };
    terminal.take_back();
    let status = status.map_err(|e| Failure::Other(format!("cannot wait for the command: {e}")))?;

    if lost_at.is_some() {
        // the lease is gone: nothing of the group may keep using the resource
        killpg(pgid, libc::SIGKILL);
        drop(permit);
        shutdown(&client).await;
        return Ok(EXIT_LOST);
    }
    let held = permit.holder_id().to_owned();
    match tokio::time::timeout(Duration::from_secs(3), permit.release()).await {
        Ok(Ok(())) => {
            if a.verbose {
                say!("redsem: released {held} of {name:?}");
            }
        }
        Ok(Err(e)) => say!(
            "redsem: warning: could not release the permits ({}); they free when the lease expires (within {})",
            common::describe(&e),
            fmt_dur(a.lease)
        ),
        Err(_) => say!(
            "redsem: warning: Redis did not confirm the release in time; the permits free when the lease expires (within {})",
            fmt_dur(a.lease)
        ),
    }
    shutdown(&client).await;
    Ok(exit_code(status))
}

/// Opens the semaphore: with the stored limit when there is one (an operator may have
/// changed it with `redsem limit`), unless `--strict-limit`; else creates it with `--limit`.
async fn open(
    client: &redsem::Client,
    a: &RunArgs,
    label: &str,
) -> Result<redsem::Semaphore, Failure> {
    let name = a.name();
    let open = |limit: u32| {
        client
            .semaphore(name, limit)
            .lease(a.lease)
            .label(common::truncate(label, 200))
            .allow_evicting_policy(a.allow_evicting_policy)
            .open()
    };
    let mut limit = match a.limit {
        Some(l) => l,
        // without --limit, the semaphore must exist: read its limit (this creates nothing)
        None => match client.inspect(name).await {
            Ok(s) => s.limit,
            Err(redsem::Error::UnknownSemaphore { .. }) => {
                return Err(Failure::Other(format!(
                    "semaphore {name:?} does not exist: give --limit L to create it (`redsem list` shows what exists)"
                )));
            }
            Err(e) => return Err(e.into()),
        },
    };
    // the stored limit can change between the read and the open: adopt it (a few times)
    for _ in 0..3 {
        match open(limit).await {
            Err(redsem::Error::LimitConflict { stored, .. }) if a.strict_limit => {
                return Err(Failure::Other(format!(
                    "semaphore {name:?} has limit {stored} in Redis, not {limit} (--strict-limit): change it for everyone with `redsem limit {name} {limit}`, or run without --strict-limit to use {stored}"
                )));
            }
            Err(redsem::Error::LimitConflict { stored, .. }) => {
                if a.verbose {
                    say!(
                        "redsem: semaphore {name:?} has limit {stored} in Redis, not {limit}: using {stored}"
                    );
                }
                limit = stored;
            }
            r => return Ok(r?),
        }
    }
    Ok(open(limit).await?)
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

/// Shuts the client down (bounded): every release is done before the process exits.
async fn shutdown(client: &redsem::Client) {
    let _ = tokio::time::timeout(Duration::from_secs(3), client.shutdown()).await;
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
    let cmd = command
        .iter()
        .map(|s| s.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    common::truncate(
        &format!("{}:{} {cmd}", host.trim(), std::process::id()),
        100,
    )
}

/// Sends `sig` to the process group `pgid` (errors such as "no such group" are ignored:
/// everyone in it may have exited already).
fn killpg(pgid: i32, sig: i32) {
    if pgid > 1 {
        // SAFETY: killpg has no memory-safety preconditions.
        unsafe {
            libc::killpg(pgid, sig);
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
    ours: Option<libc::pid_t>,
}

impl Terminal {
    fn hand_to(pgid: i32) -> Terminal {
        let stdin = std::io::stdin();
        if pgid <= 1 || !stdin.is_terminal() {
            return Terminal { ours: None };
        }
        // SAFETY: plain syscalls on fd 0 and our own process group.
        unsafe {
            let ours = libc::getpgrp();
            if libc::tcgetpgrp(0) != ours {
                return Terminal { ours: None }; // we run in the background
            }
            if libc::tcsetpgrp(0, pgid) != 0 {
                return Terminal { ours: None };
            }
            // the command may have tried to read before it had the terminal, and stopped
            libc::killpg(pgid, libc::SIGCONT);
            Terminal { ours: Some(ours) }
        }
    }

    fn take_back(self) {
        if let Some(ours) = self.ours {
            // SAFETY: plain syscalls; SIGTTOU is ignored around tcsetpgrp from the background
            // and its disposition restored afterwards.
            unsafe {
                let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                libc::tcsetpgrp(0, ours);
                libc::signal(libc::SIGTTOU, old);
            }
        }
    }
}

"""`python -m redsem run|stats`: the Rust `redsem` CLI's `run` and `stats`, in Python.

    python -m redsem run NAME --limit L [--permits K] [--lease 10s] [--timeout 30s]
                         [--label TEXT] [--kill-after 10s] [-v] -- CMD ARGS...
    python -m redsem stats NAME [--json]

Connection: `--url URL` (alias `--redis-url`), else `$REDSEM_URL`, else `$REDIS_URL`, else
redis://127.0.0.1:6379/; `--prefix` / `$REDSEM_PREFIX`. Exit codes and the command's
environment are those of `redsem run` (see `run --help`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import sys
import time
from typing import Any, List, Optional, Sequence, Tuple

from . import _protocol
from .client import Client
from .errors import LimitConflict, NoPermits, RedsemError, Timeout, UnknownSemaphore, Unreachable, AuthError
from .stats import Stats

EXIT_LOST = 75
EXIT_TIMEOUT = 124
EXIT_REDSEM_ERROR = 125
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
# operator commands (stats)
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNKNOWN = 3

RUN_EPILOG = """\
Environment of the command:
  REDSEM_NAME    the semaphore's name
  REDSEM_SLOTS   the slots held, comma-separated (e.g. 0,3), each in 0..limit
  REDSEM_FENCES  slot:generation fencing tokens, comma-separated (e.g. 0:17,3:4)
  REDSEM_HOLDER  the holder id (as in `redsem stats`)
  REDSEM_TICKET  the FIFO ticket number the permits were granted under

--limit creates the semaphore; an existing one keeps the limit stored in Redis, and that is
used. The command runs in its own process group; SIGINT, SIGTERM and SIGHUP are forwarded
to it. If the slot is lost, the group gets SIGTERM, then SIGKILL after --kill-after.

Exit status: the command's own; 128+N if it was killed by signal N (or redsem got signal N
while waiting); 75 the slot was lost; 124 no permits within --timeout; 125 redsem's own
error; 126 the command could not be executed; 127 the command was not found."""


def say(msg: str) -> None:
    try:
        print(msg, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def parse_duration(s: str) -> float:
    """`10s`, `250ms`, `1m30s`, `2h`, or a plain number of seconds."""
    s = s.strip()
    try:
        v = float(s)
    except ValueError:
        parts = re.findall(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)", s)
        if not parts or "".join(f"{n}{u}" for n, u in parts) != s.replace(" ", ""):
            raise argparse.ArgumentTypeError(f"{s!r} is not a duration like 10s, 1m30s or 250ms") from None
        scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
        v = sum(float(n) * scale[u] for n, u in parts)
    if v < 0 or v != v:
        raise argparse.ArgumentTypeError(f"{s!r} is not a valid number of seconds")
    return v


def fmt_dur(secs: float) -> str:
    """`340ms`, `12.3s`, `4m05s`, `2h03m`, `3d04h` (as the Rust CLI)."""
    ms, s = int(secs * 1000), int(secs)
    if ms < 1000:
        return f"{ms}ms"
    if s < 60:
        return f"{secs:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02}m"
    return f"{s // 86400}d{s % 86400 // 3600:02}h"


def q(s: str) -> str:
    """A name quoted as the Rust CLI prints it."""
    return json.dumps(s, ensure_ascii=False)


def redact(url: str) -> str:
    """The URL with its password hidden."""
    return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)


def default_url() -> str:
    return os.environ.get("REDSEM_URL") or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/"


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors exit with `exit_code`."""

    def __init__(self, *args: Any, exit_code: int = EXIT_USAGE, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.exit_code = exit_code

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(self.exit_code, f"{self.prog}: error: {message}\n")


def _globals(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection")
    g.add_argument("--url", "--redis-url", dest="url", default=None,
                   help="Redis URL (default: $REDSEM_URL, else $REDIS_URL, else redis://127.0.0.1:6379/)")
    g.add_argument("--prefix", default=os.environ.get("REDSEM_PREFIX", _protocol.DEFAULT_PREFIX),
                   help="key prefix of the semaphores (default: $REDSEM_PREFIX or redsem)")
    g.add_argument("--connect-timeout", type=parse_duration, default=3.0, metavar="D")


_GLOBAL_VALUE_OPTS = {"--url", "--redis-url", "--prefix", "--connect-timeout"}
_RUN_VALUE_OPTS = _GLOBAL_VALUE_OPTS | {"--name", "--id", "--limit", "-j", "--permits", "--lease", "--timeout",
                                        "--label", "--kill-after"}


def _split_command(args: Sequence[str]) -> Tuple[List[str], List[str]]:
    """`run`'s arguments as (options and NAME, command): the command follows `--`, or starts
    at the first positional after NAME."""
    args = list(args)
    if "--" in args:
        i = args.index("--")
        return args[:i], args[i + 1:]
    named = any(a in ("--name", "--id") or a.startswith(("--name=", "--id=")) for a in args)
    i = 0
    while i < len(args):
        a = args[i]
        if a in _RUN_VALUE_OPTS:
            i += 2
        elif a.startswith("-") and a != "-":
            i += 1
        elif not named:
            named = True
            i += 1
        else:
            break
    return args[:i], args[i:]


def _run_parser() -> _Parser:
    p = _Parser(prog="python -m redsem run", exit_code=EXIT_REDSEM_ERROR, epilog=RUN_EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter,
                usage="python -m redsem run [OPTIONS] NAME --limit L -- CMD...",
                description="Run a command while holding permits of a semaphore (waits in FIFO order).")
    p.add_argument("name", nargs="?", help="name of the semaphore")
    p.add_argument("--name", "--id", dest="name_opt", metavar="NAME", help="the name, as an option")
    p.add_argument("--limit", "-j", type=int, required=True, metavar="L",
                   help="most permits held at once (creates the semaphore; an existing one keeps its limit)")
    p.add_argument("--permits", type=int, default=1, metavar="K", help="permits this command needs at once")
    p.add_argument("--allow-evicting-policy", action="store_true",
                   default=os.environ.get("REDSEM_ALLOW_EVICTING_POLICY", "") not in ("", "0", "false", "no"),
                   help="run even when Redis's maxmemory-policy can evict the semaphore's keys "
                        "(default: refuse, exit 125; env REDSEM_ALLOW_EVICTING_POLICY)")
    p.add_argument("--lease", type=parse_duration, default=10.0, help="lease of the permits (default 10s)")
    p.add_argument("--timeout", type=parse_duration, default=None,
                   help="give up waiting after this long (exit 124); 0: only if free right now")
    p.add_argument("--label", help="label shown to operators (default: host:pid and the command)")
    p.add_argument("--kill-after", type=parse_duration, default=10.0, metavar="DURATION",
                   help="when the slot is lost, time between SIGTERM and SIGKILL (default 10s)")
    p.add_argument("-v", "--verbose", action="store_true", help="report waiting, acquisition and release")
    _globals(p)
    return p


def _stats_parser() -> _Parser:
    p = _Parser(prog="python -m redsem stats", description="Show one semaphore: limit, holders, queue.")
    p.add_argument("name")
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    _globals(p)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in _GLOBAL_VALUE_OPTS else 1
    head, sub, rest = argv[:i], argv[i] if i < len(argv) else None, argv[i + 1:]
    if sub == "run":
        opts, command = _split_command(rest)
        a = _run_parser().parse_args(head + opts)
        a.command = command
        if not command:
            _run_parser().error("the command to run is missing (after --)")
        name = a.name_opt or a.name
        if not name or (a.name_opt and a.name):
            _run_parser().error("give the semaphore's NAME once")
        a.name = name
        return asyncio.run(_run(a))
    if sub == "stats":
        return asyncio.run(_stats(_stats_parser().parse_args(head + rest)))
    asked = sub is None and any(h in head for h in ("-h", "--help"))
    out = sys.stdout if asked else sys.stderr
    if sub is not None:
        print(f"python -m redsem: unknown command {sub!r}", file=out)
    print("usage: python -m redsem [--url URL] [--prefix P] {run,stats} ...\n\n"
          "  run NAME --limit L [options] -- CMD...   run CMD while holding permits (see run --help)\n"
          "  stats NAME [--json]                      show one semaphore", file=out)
    return 0 if asked else EXIT_USAGE


def _connect(a: argparse.Namespace, label: Optional[str] = None) -> Tuple[Client, str]:
    url = a.url or default_url()
    if url.startswith("/"):
        url = "unix://" + url
    return Client.from_url(url, prefix=a.prefix, label=label, connect_timeout=a.connect_timeout), url


async def _open_client(a: argparse.Namespace, label: Optional[str] = None) -> Client:
    client, url = _connect(a, label)
    try:
        await client.ping()
    except (Unreachable, AuthError) as e:
        await client.close()
        raise RedsemError(f"cannot connect to {redact(url)}: {e}") from e
    return client


# -- stats -----------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    lines = []
    for cells in [list(header)] + [list(r) for r in rows]:
        line = "  ".join(c if i + 1 == len(cells) else c.ljust(widths[i]) for i, c in enumerate(cells))
        lines.append(line.rstrip())
    return "\n".join(lines) + "\n"


def render_stats(s: Stats) -> str:
    """The human view of a snapshot, as `redsem stats` prints it."""
    oldest = f", oldest wait {fmt_dur(s.oldest_wait)}" if s.oldest_wait is not None else ""
    out = (f"semaphore {q(s.name)}: limit {s.limit}, {s.in_use} in use, {s.available} available; "
           f"{len(s.holders)} holder(s), {len(s.waiters)} waiter(s){oldest}\n"
           f"granted {s.grants_total} time(s) since creation, {s.expired_total} lease(s) expired\n\n")
    if s.holders:
        out += "HOLDERS\n" + _table(
            ["ID", "PERMITS", "SLOT:FENCE", "HELD", "LEASE LEFT", "LABEL"],
            [[h.id, str(h.permits), ",".join(map(str, h.fences)), fmt_dur(h.held), fmt_dur(h.lease_left), h.label[:60]]
             for h in s.holders])
    else:
        out += "HOLDERS: none\n"
    out += "\n"
    if s.waiters:
        out += "QUEUE (FIFO order)\n" + _table(
            ["POS", "ID", "PERMITS", "TICKET", "WAITED", "LABEL"],
            [[str(w.position), w.id, str(w.permits), str(w.ticket), fmt_dur(w.waited), w.label[:60]]
             for w in s.waiters])
    else:
        out += "QUEUE: empty\n"
    return out


async def _stats(a: argparse.Namespace) -> int:
    try:
        client = await _open_client(a)
    except RedsemError as e:
        say(f"redsem: {e}")
        return EXIT_ERROR
    try:
        s = await client.inspect(a.name)
    except UnknownSemaphore:
        say(f"redsem: unknown semaphore {q(a.name)}: nothing under key prefix {q(a.prefix)} "
            "(check the name, --prefix and --url)")
        return EXIT_UNKNOWN
    except RedsemError as e:
        say(f"redsem: {e}")
        return EXIT_ERROR
    finally:
        await client.close()
    sys.stdout.write(json.dumps(s.to_json(), indent=2) + "\n" if a.json else render_stats(s))
    return 0


# -- run -------------------------------------------------------------------------------------


def _check_program(program: str) -> Optional[Tuple[int, str]]:
    """Whether `program` can be executed, as far as can be told before running it."""
    if "/" in program:
        if not os.path.exists(program):
            return EXIT_NOT_FOUND, "no such file"
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            return EXIT_NOT_EXECUTABLE, "not an executable file"
        return None
    if shutil.which(program) is None:
        return EXIT_NOT_FOUND, "command not found"
    return None


def _default_label(command: Sequence[str]) -> str:
    label = f"{socket.gethostname()}:{os.getpid()} {' '.join(command)}"
    return label if len(label.encode()) <= 100 else label.encode()[:97].decode(errors="ignore") + "…"


def _child_setup() -> Any:
    """The function to run in the child before exec: its own process group, and SIGTERM when
    redsem dies (Linux: parent-death signal). Everything it needs is looked up before the fork
    (no import or allocation-heavy work in the child)."""
    parent = os.getpid()
    prctl = None
    if sys.platform.startswith("linux"):
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    term = int(signal.SIGTERM)

    def setup() -> None:
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(1, term)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # redsem died before prctl took effect
                os.kill(os.getpid(), term)

    return setup


def _killpg(pgid: int, sig: int) -> None:
    if pgid > 1:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass  # everyone in it exited already


class _Terminal:
    """Hands the controlling terminal to the command's group while it runs in the foreground."""

    def __init__(self, pgid: int):
        self.ours: Optional[int] = None
        try:
            if pgid > 1 and os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
                os.tcsetpgrp(0, pgid)
                _killpg(pgid, signal.SIGCONT)
                self.ours = os.getpgrp()
        except OSError:
            pass

    def take_back(self) -> None:
        if self.ours is not None:
            old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            try:
                os.tcsetpgrp(0, self.ours)
            except OSError:
                pass
            finally:
                signal.signal(signal.SIGTTOU, old)


async def _race(work: "asyncio.Future[Any]", sigs: "asyncio.Queue[int]") -> Optional[int]:
    """Waits for `work`; returns a signal number instead (cancelling `work`) if one comes first."""
    sig = asyncio.ensure_future(sigs.get())
    await asyncio.wait({work, sig}, return_when=asyncio.FIRST_COMPLETED)
    if work.done():
        sig.cancel()
        return None
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    return sig.result()


async def _run(a: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    sigs: "asyncio.Queue[int]" = asyncio.Queue()
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(s, sigs.put_nowait, int(s))
    program = a.command[0]
    bad = _check_program(program)
    if bad:
        say(f"redsem: cannot run {q(program)}: {bad[1]}")
        return bad[0]
    label = a.label if a.label is not None else _default_label(a.command)
    client: Optional[Client] = None
    try:
        # nothing is queued yet: a signal here just stops
        setup = asyncio.ensure_future(_open_client(a, label[:200]))
        sig = await _race(setup, sigs)
        if sig is not None:
            return 128 + sig
        client = setup.result()
        open_sem = asyncio.ensure_future(_open_adopting(client, a))
        sig = await _race(open_sem, sigs)
        if sig is not None:
            return 128 + sig
        sem = open_sem.result()
        started = time.monotonic()
        if a.verbose:
            say(f"redsem: waiting for {a.permits} permit(s) of {q(a.name)} (limit {sem.limit})")
        if a.timeout == 0:
            acquiring = asyncio.ensure_future(sem.try_acquire(a.permits))
        else:
            acquiring = asyncio.ensure_future(sem._acquire(a.permits, a.timeout, False))
        sig = await _race(acquiring, sigs)
        if sig is not None:
            return 128 + sig  # the cancelled acquire gave its ticket up; close() flushes
        try:
            permit = acquiring.result()
        except (Timeout, NoPermits) as e:
            try:
                st = await client.inspect(a.name)
                busy = f"; {st.in_use} of {st.limit} permits in use, {len(st.waiters)} waiting"
            except RedsemError:
                busy = ""
            why = ("not free right now (--timeout 0)" if isinstance(e, NoPermits)
                   else f"not granted within {fmt_dur(time.monotonic() - started)}")
            say(f"redsem: timeout: {a.permits} permit(s) of semaphore {q(a.name)} {why}{busy}; the command was not run")
            return EXIT_TIMEOUT
        fences = ",".join(map(str, permit.fences))
        if a.verbose:
            say(f"redsem: acquired slot(s) {fences} of {q(a.name)} after {fmt_dur(time.monotonic() - started)} "
                f"(holder {permit.holder_id})")
        return await _supervise(a, permit, sigs)
    except RedsemError as e:
        say(f"redsem: {e}")
        return EXIT_REDSEM_ERROR
    finally:
        if client is not None:
            await client.close()


async def _open_adopting(client: Client, a: argparse.Namespace) -> Any:
    """Opens the semaphore with --limit, or with the limit stored in Redis if it exists."""
    limit = a.limit
    for attempt in range(4):
        try:
            return await client.semaphore(a.name, limit=limit, lease=a.lease,
                                          allow_evicting_policy=a.allow_evicting_policy)
        except LimitConflict as e:
            if attempt == 3:
                raise
            if a.verbose:
                say(f"redsem: semaphore {q(a.name)} has limit {e.stored} in Redis, not {limit}: using {e.stored}")
            limit = e.stored


async def _supervise(a: argparse.Namespace, permit: Any, sigs: "asyncio.Queue[int]") -> int:
    """Runs the command while holding `permit`; returns the exit code."""
    env = dict(os.environ)
    env.update(REDSEM_NAME=a.name, REDSEM_SLOTS=",".join(map(str, permit.slots)),
               REDSEM_FENCES=",".join(map(str, permit.fences)), REDSEM_HOLDER=permit.holder_id,
               REDSEM_TICKET=str(permit.ticket))
    try:
        proc = await asyncio.create_subprocess_exec(*a.command, env=env, preexec_fn=_child_setup())
    except OSError as e:
        code, what = ((EXIT_NOT_FOUND, "command not found") if isinstance(e, FileNotFoundError)
                      else (EXIT_NOT_EXECUTABLE, "permission denied") if isinstance(e, PermissionError)
                      else (EXIT_NOT_EXECUTABLE, str(e)))
        await asyncio.wait_for(permit.release(), 3)
        say(f"redsem: cannot run {q(a.command[0])}: {what}; the permits were released")
        return code
    pgid = proc.pid
    terminal = _Terminal(pgid)
    waiting = asyncio.ensure_future(proc.wait())
    lost = asyncio.ensure_future(permit.wait_lost())
    sig = asyncio.ensure_future(sigs.get())
    kill_at: Optional[float] = None
    killed = False
    try:
        while not waiting.done():
            pending = {waiting, sig} | ({lost} if kill_at is None else set())
            delay = None if kill_at is None or killed else max(0.0, kill_at - time.monotonic())
            done, _ = await asyncio.wait(pending, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            if lost in done and kill_at is None:
                say(f"redsem: lost the slot of semaphore {q(a.name)} while the command ran: {lost.result()}; "
                    f"sending SIGTERM to its process group {pgid}, SIGKILL in {fmt_dur(a.kill_after)}")
                _killpg(pgid, signal.SIGTERM)
                kill_at = time.monotonic() + a.kill_after
            if sig in done:
                if a.verbose:
                    say(f"redsem: forwarding {signal.Signals(sig.result()).name} to process group {pgid}")
                _killpg(pgid, sig.result())
                sig = asyncio.ensure_future(sigs.get())
            if kill_at is not None and not killed and time.monotonic() >= kill_at and not waiting.done():
                say(f"redsem: the command did not exit within {fmt_dur(a.kill_after)} of SIGTERM; "
                    f"sending SIGKILL to process group {pgid}")
                _killpg(pgid, signal.SIGKILL)
                killed = True
    finally:
        terminal.take_back()
        lost.cancel()
        sig.cancel()
    rc = waiting.result()
    if kill_at is not None:
        _killpg(pgid, signal.SIGKILL)  # the lease is gone: nothing of the group may go on
        return EXIT_LOST
    try:
        await asyncio.wait_for(permit.release(), 3)
        if a.verbose:
            say(f"redsem: released {permit.holder_id} of {q(a.name)}")
    except asyncio.TimeoutError:
        say("redsem: warning: Redis did not confirm the release in time; the permits free when the lease "
            f"expires (within {fmt_dur(a.lease)})")
    return rc if rc >= 0 else 128 - rc

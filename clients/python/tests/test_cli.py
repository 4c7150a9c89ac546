"""`python -m redsem run|stats`: environment, exit codes, signals, as the Rust `redsem run`."""

import json
import os
import signal
import subprocess
import sys
import time

from redsem.sync import Client


def env_for(server, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDSEM_", "REDIS_URL"))}
    env["REDSEM_URL"] = server.url
    env.update(extra)
    return env


def cli(server, *args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "redsem", *args], env=env or env_for(server),
                          capture_output=True, text=True, timeout=120, **kw)


def spawn(server, *args, **kw):
    return subprocess.Popen([sys.executable, "-m", "redsem", *args], env=env_for(server),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def wait_for(cond, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_the_command_gets_its_slots_and_fences_and_its_exit_code_is_kept(server, name):
    r = cli(server, "run", name, "--limit", "2", "--",
            "sh", "-c", 'echo "$REDSEM_NAME|$REDSEM_SLOTS|$REDSEM_FENCES|$REDSEM_TICKET|$REDSEM_HOLDER"; exit 3')
    assert r.returncode == 3, r.stderr
    got_name, slots, fences, ticket, holder = r.stdout.strip().split("|")
    assert (got_name, slots, ticket) == (name, "0", "1")
    slot, first = fences.split(":")
    assert slot == "0" and int(first) > 0, fences
    assert holder.count("-") == 1
    r = cli(server, "run", "--name", name, "--limit", "2", "--permits", "2", "sh", "-c", 'echo "$REDSEM_FENCES"')
    assert r.returncode == 0, r.stderr
    both = dict(f.split(":") for f in r.stdout.strip().split(","))
    assert sorted(both) == ["0", "1"]
    assert int(both["0"]) > int(first), "slot 0's generation grows with every grant"


def test_an_existing_semaphore_keeps_its_stored_limit(server, name):
    assert cli(server, "run", name, "--limit", "2", "--", "true").returncode == 0
    r = cli(server, "run", "-v", name, "--limit", "5", "--", "true")
    assert r.returncode == 0, r.stderr
    assert "has limit 2 in Redis, not 5: using 2" in r.stderr


def test_no_permits_within_the_timeout_exits_124(server, name):
    with Client(server.url) as c:
        sem = c.semaphore(name, limit=1)
        with sem.acquire():
            r = cli(server, "run", name, "--limit", "1", "--timeout", "300ms", "--", "echo", "ran")
            assert (r.returncode, r.stdout) == (124, ""), r.stderr
            assert "not granted within" in r.stderr and "1 of 1 permits in use" in r.stderr
            r = cli(server, "run", name, "--limit", "1", "--timeout", "0", "--", "echo", "ran")
            assert (r.returncode, r.stdout) == (124, ""), r.stderr
            assert "not free right now" in r.stderr
        c._run(c._client.flush())
        assert c.inspect(name).waiters == [], "the timed-out tickets were given up"


def test_commands_that_cannot_run_and_redsem_errors(server, name, tmp_path):
    r = cli(server, "run", name, "--limit", "1", "--", "no-such-tool-here")
    assert r.returncode == 127 and "command not found" in r.stderr
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    r = cli(server, "run", name, "--limit", "1", "--", str(script))
    assert r.returncode == 126 and "not an executable file" in r.stderr
    r = cli(server, "run", name, "--limit", "1", "--permits", "2", "--", "true")
    assert r.returncode == 125 and "requested 2 permits at once, but the limit is 1" in r.stderr
    r = cli(server, "run", name, "--", "true")
    assert r.returncode == 125, "--limit is required"
    r = cli(server, "run", name, "--limit", "1", "--", "true", env=env_for(server, REDSEM_URL="redis://127.0.0.1:1/"))
    assert r.returncode == 125 and "cannot connect to redis://127.0.0.1:1/" in r.stderr


def test_redsem_url_comes_before_redis_url(server, name):
    env = env_for(server, REDIS_URL="redis://127.0.0.1:1/")
    assert cli(server, "run", name, "--limit", "1", "--", "true", env=env).returncode == 0
    env.pop("REDSEM_URL")
    assert cli(server, "run", name, "--limit", "1", "--", "true", env=env).returncode == 125
    env["REDIS_URL"] = server.url
    assert cli(server, "run", name, "--limit", "1", "--", "true", env=env).returncode == 0
    env["REDIS_URL"] = "redis://127.0.0.1:1/"
    assert cli(server, "--url", server.url, "run", name, "--limit", "1", "--", "true", env=env).returncode == 0


def test_signals_are_forwarded_to_the_command(server, name):
    p = spawn(server, "run", name, "--limit", "1", "--", "sh", "-c",
              'trap "echo got TERM; exit 7" TERM; echo ready; while :; do sleep 0.05; done')
    try:
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        assert (p.returncode, out.strip()) == (7, "got TERM"), err
    finally:
        p.kill()
    with Client(server.url) as c:
        assert c.inspect(name).in_use == 0, "released as soon as the command exited"


def test_a_lost_permit_terminates_the_command_and_exits_75(server, name, tmp_path):
    pidfile = tmp_path / "pid"
    p = spawn(server, "run", name, "--limit", "1", "--lease", "1s", "--kill-after", "1s", "--",
              "sh", "-c", f'echo $$ > {pidfile}; trap "" TERM; while :; do sleep 0.05; done')
    try:
        with Client(server.url) as c:
            wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
            (holder,) = c.inspect(name).holders
            assert c.force_release(name, holder.id)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 75, err
        assert "lost the slot" in err and "SIGKILL" in err, "TERM was ignored: KILL after --kill-after"
        child = int(pidfile.read_text())
        wait_for(lambda: not _alive(child))
    finally:
        p.kill()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().split(")")[1].split()[0] != "Z"


def test_stats(server, name):
    assert cli(server, "run", name, "--limit", "3", "--", "true").returncode == 0
    r = cli(server, "stats", name)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f'semaphore "{name}": limit 3, 0 in use, 3 available; 0 holder(s), 0 waiter(s)\n')
    assert "granted 1 time(s) since creation" in r.stdout
    js = json.loads(cli(server, "stats", name, "--json").stdout)
    assert (js["name"], js["limit"], js["grants_total"]) == (name, 3, 1)
    r = cli(server, "stats", name + "-none")
    assert r.returncode == 3 and "unknown semaphore" in r.stderr


def test_the_command_gets_sigterm_when_redsem_is_killed(server, name, tmp_path):
    pidfile = tmp_path / "pid"
    p = spawn(server, "run", name, "--limit", "1", "--lease", "1s", "--",
              "sh", "-c", f'echo $$ > {pidfile}; while :; do sleep 0.05; done')
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
        p.kill()
        p.wait()
        wait_for(lambda: not _alive(int(pidfile.read_text())))
    finally:
        p.kill()
    with Client(server.url) as c:
        sem = c.semaphore(name, limit=1, lease=1.0)
        with sem.acquire(timeout=30):  # the permit frees within its lease
            pass


def test_run_refuses_an_evicting_policy_unless_allowed(own_server, name):
    import redis
    redis.Redis(port=own_server.port).config_set("maxmemory-policy", "allkeys-lru")
    r = cli(own_server, "run", name, "--limit", "1", "--", "true")
    assert r.returncode == 125, r.stderr
    assert "maxmemory-policy is allkeys-lru" in r.stderr, r.stderr
    r = cli(own_server, "run", name, "--limit", "1", "--allow-evicting-policy", "--", "true")
    assert r.returncode == 0, r.stderr
    r = cli(own_server, "run", name, "--limit", "1", "--", "true",
            env=env_for(own_server, REDSEM_ALLOW_EVICTING_POLICY="1"))
    assert r.returncode == 0, r.stderr

//! `redsem run`, tested through the built binary against a private Redis server.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

/// 8 `redsem run` in parallel with limit 2: each command records its own start and end;
/// never more than 2 ran at once, all 8 ran, concurrent holders had distinct slots, and
/// each slot's fencing token grew with every holder.
#[test]
fn eight_parallel_runs_never_exceed_the_limit() {
    let server = Server::start(Flavor::Redis);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("events.log");
    let script = r#"echo "start $REDSEM_SLOTS $REDSEM_FENCES $(date +%s%N)" >> "$LOG"; sleep 0.3; echo "end $REDSEM_SLOTS $REDSEM_FENCES $(date +%s%N)" >> "$LOG""#;
    let mut runs: Vec<Background> = (0..8)
        .map(|i| {
            Background::spawn(
                redsem(&server)
                    .args(["run", "--name", "par", "--limit", "2", "--label"])
                    .arg(format!("job-{i}"))
                    .args(["--", "sh", "-c", script])
                    .env("LOG", &log)
                    .stderr(Stdio::piped()),
            )
        })
        .collect();
    for r in &mut runs {
        let (rc, err) = r.finish(Duration::from_secs(60));
        assert_eq!(rc, 0, "redsem run failed: {err}");
    }

    // (time, is_start, slot, fence)
    let text = std::fs::read_to_string(&log).unwrap();
    let mut events: Vec<(u128, bool, u32, String)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 4, "bad line {l:?}");
            (
                f[3].parse().unwrap(),
                f[0] == "start",
                f[1].parse().unwrap(),
                f[2].to_owned(),
            )
        })
        .collect();
    assert_eq!(
        events.iter().filter(|e| e.1).count(),
        8,
        "all 8 ran:\n{text}"
    );
    assert_eq!(
        events.iter().filter(|e| !e.1).count(),
        8,
        "all 8 ended:\n{text}"
    );
    events.sort();
    let mut running = BTreeSet::new();
    let mut most = 0;
    let mut last_fence: BTreeMap<u32, u64> = BTreeMap::new();
    for (_, start, slot, fence) in &events {
        if *start {
            assert!(
                running.insert(*slot),
                "slot {slot} held twice at once:\n{text}"
            );
            most = most.max(running.len());
            let (s, generation) = fence.split_once(':').unwrap();
            assert_eq!(s.parse::<u32>().unwrap(), *slot);
            let generation: u64 = generation.parse().unwrap();
            let prev = last_fence.insert(*slot, generation).unwrap_or(0);
            assert!(
                generation > prev,
                "fence of slot {slot} did not grow:\n{text}"
            );
        } else {
            assert!(running.remove(slot));
        }
    }
    assert!(most <= 2, "{most} commands ran at once:\n{text}");
    assert_eq!(most, 2, "the two permits were never used together:\n{text}");
    assert!(running.is_empty());
    assert_eq!(counts(&server, "par"), Some((0, 0)));
    let s = stats_json(&server, "par");
    assert_eq!(s["grants_total"], 8);
}

/// The environment of the command, and its exit code passed through.
#[test]
fn the_command_sees_its_slot_and_its_exit_code_is_returned() {
    let server = Server::start(Flavor::Redis);
    let out = run(redsem(&server).args([
        "run",
        "--name",
        "env",
        "--limit",
        "3",
        "--permits",
        "2",
        "--",
        "sh",
        "-c",
        "echo \"$REDSEM_NAME|$REDSEM_SLOTS|$REDSEM_FENCES|$REDSEM_TICKET|$REDSEM_HOLDER\"; exit 7",
    ]));
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    let line = stdout(&out);
    let f: Vec<&str> = line.trim().split('|').collect();
    assert_eq!([f[0], f[1], f[3]], ["env", "0,1", "1"], "{line}");
    // fencing tokens slot:generation, generations from Redis's clock (µs)
    let fences: Vec<(&str, u64)> = f[2]
        .split(',')
        .map(|t| {
            let (s, g) = t.split_once(':').unwrap();
            (s, g.parse().unwrap())
        })
        .collect();
    assert_eq!(
        fences.iter().map(|f| f.0).collect::<Vec<_>>(),
        ["0", "1"],
        "{line}"
    );
    assert!(fences.iter().all(|f| f.1 > 1_000_000_000_000_000), "{line}");
    assert!(!f[4].is_empty());
    // released at once
    assert_eq!(counts(&server, "env"), Some((0, 0)));

    let out = run(redsem(&server).args([
        "run",
        "--name",
        "env",
        "--limit",
        "3",
        "--",
        "no-such-command-xyz",
    ]));
    assert_eq!(code(&out), 127, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("command not found"),
        "{}",
        stderr(&out)
    );
    let dir = tempfile::tempdir().unwrap();
    let not_executable = dir.path().join("data.txt");
    std::fs::write(&not_executable, "not a program\n").unwrap();
    let out = run(redsem(&server)
        .args(["run", "--name", "env", "--limit", "3", "--"])
        .arg(&not_executable));
    assert_eq!(code(&out), 126, "{}", stderr(&out));
    assert_eq!(
        counts(&server, "env"),
        Some((0, 0)),
        "a failed exec releases the permits"
    );
}

/// The lease is deleted behind a running command (as if Redis lost it): the command's
/// whole process group gets SIGTERM, then SIGKILL since it ignores SIGTERM; redsem exits 75.
#[test]
fn a_lost_lease_kills_the_process_group() {
    let server = Server::start(Flavor::Redis);
    let dir = tempfile::tempdir().unwrap();
    let script =
        r#"trap '' TERM; echo $$ > "$DIR/sh.pid"; sleep 60 & echo $! > "$DIR/sleep.pid"; wait"#;
    let mut r = Background::spawn(
        redsem(&server)
            .args([
                "run",
                "--name",
                "lost",
                "--limit",
                "1",
                "--lease",
                "3s",
                "--kill-after",
                "1s",
            ])
            .args(["--", "sh", "-c", script])
            .env("DIR", dir.path())
            .stderr(Stdio::piped()),
    );
    let sh = read_pid(&dir.path().join("sh.pid"));
    let sleep = read_pid(&dir.path().join("sleep.pid"));
    assert!(!is_dead(sh) && !is_dead(sleep));

    let mut del = vec!["DEL"];
    let keys = keys("lost");
    del.extend(keys.iter().map(String::as_str));
    server.cmd(&del);
    let deleted = Instant::now();

    let (rc, err) = r.finish(Duration::from_secs(20));
    assert_eq!(rc, 75, "{err}");
    assert!(err.contains("lost the slot"), "{err}");
    assert!(err.contains("SIGTERM") && err.contains("SIGKILL"), "{err}");
    // one renewal interval (1s) + the grace period (1s), with slack for a loaded machine
    assert!(deleted.elapsed() < Duration::from_secs(10));
    wait_until(Duration::from_secs(5), "the process group to die", || {
        is_dead(sh) && is_dead(sleep)
    });
}

/// `run --max-hold 1s -- sleep 30`: the command is stopped soon after 1 s (SIGTERM to its
/// group) with a message naming the maximum hold time, redsem exits 77, and the slot is
/// free at once (a waiter gets it long before the 30 s lease). A zero is refused.
#[test]
fn max_hold_stops_the_command_and_frees_the_slot() {
    let server = Server::start(Flavor::Redis);
    let started = Instant::now();
    let mut r = Background::spawn(
        redsem(&server)
            .args([
                "run",
                "mh",
                "--limit",
                "1",
                "--lease",
                "30s",
                "--max-hold",
                "1s",
            ])
            .args(["--", "sleep", "30"])
            .stderr(Stdio::piped()),
    );
    wait_until(Duration::from_secs(20), "the holder", || {
        counts(&server, "mh").is_some_and(|(holders, _)| holders == 1)
    });
    let mut next = Background::spawn(
        redsem(&server)
            .args(["run", "mh", "--timeout", "25s", "--", "true"])
            .stderr(Stdio::piped()),
    );
    let (rc, err) = r.finish(Duration::from_secs(25));
    let took = started.elapsed();
    assert_eq!(rc, 77, "{err}");
    assert!(err.contains("maximum hold time"), "{err}");
    assert!(err.contains("--max-hold 1.0s"), "{err}");
    assert!(err.contains("SIGTERM"), "{err}");
    assert!(took >= Duration::from_secs(1), "stopped after {took:?}");
    assert!(
        took < Duration::from_secs(20),
        "stopped only after {took:?}"
    );
    let ended = Instant::now();
    let (rc, err) = next.finish(Duration::from_secs(25));
    assert_eq!(rc, 0, "{err}");
    assert!(
        ended.elapsed() < Duration::from_secs(10),
        "the waiter got the slot long before the 30 s lease"
    );
    assert_eq!(counts(&server, "mh"), Some((0, 0)));

    for bad in ["0", "0s"] {
        let out = run(redsem(&server).args(["run", "mh", "--max-hold", bad, "--", "true"]));
        assert_eq!(code(&out), 125, "{}", stderr(&out));
        assert!(stderr(&out).contains("above zero"), "{}", stderr(&out));
    }
}

/// An operator's `redsem release` of a running holder: the command is terminated (exit 75),
/// and the next holder of its slot gets a higher token.
#[test]
fn an_operator_release_terminates_the_command() {
    let server = Server::start(Flavor::Redis);
    let dir = tempfile::tempdir().unwrap();
    let mut r = Background::spawn(
        redsem(&server)
            .args(["run", "--name", "op", "--limit", "1", "--lease", "3s"])
            .args([
                "--",
                "sh",
                "-c",
                r#"echo "$REDSEM_FENCES" > "$DIR/fence"; echo "$REDSEM_HOLDER" > "$DIR/holder"; exec sleep 60"#,
            ])
            .env("DIR", dir.path())
            .stderr(Stdio::piped()),
    );
    let holder_file = dir.path().join("holder");
    wait_until(Duration::from_secs(20), "the command to start", || {
        std::fs::read_to_string(&holder_file).is_ok_and(|s| s.ends_with('\n'))
    });
    let holder = std::fs::read_to_string(&holder_file)
        .unwrap()
        .trim()
        .to_owned();
    let out = run(redsem(&server).args(["release", "op", "--holder", &holder]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains(&holder), "{}", stdout(&out));

    let (rc, err) = r.finish(Duration::from_secs(20));
    assert_eq!(rc, 75, "{err}");
    assert!(err.contains("lost the slot"), "{err}");

    let out = run(redsem(&server).args([
        "run",
        "--name",
        "op",
        "--limit",
        "1",
        "--",
        "sh",
        "-c",
        "echo $REDSEM_FENCES",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let generation = |t: &str| -> u64 { t.trim().strip_prefix("0:").unwrap().parse().unwrap() };
    let evicted = std::fs::read_to_string(dir.path().join("fence")).unwrap();
    assert!(
        generation(&stdout(&out)) > generation(&evicted),
        "{} after {evicted}",
        stdout(&out)
    );

    let out = run(redsem(&server).args(["release", "op", "--holder", &holder]));
    assert_eq!(code(&out), 125, "releasing twice: not found");
}

/// No permit within --timeout: exit 124, the command does not run, and the ticket leaves
/// the queue at once.
#[test]
fn timing_out_exits_124() {
    let server = Server::start(Flavor::Redis);
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let _holder = Background::spawn(
        redsem(&server).args(["run", "--name", "busy", "--limit", "1", "--", "sleep", "60"]),
    );
    wait_until(Duration::from_secs(20), "the holder", || {
        counts(&server, "busy") == Some((1, 0))
    });

    let started = Instant::now();
    let out = run(redsem(&server)
        .args([
            "run",
            "--name",
            "busy",
            "--limit",
            "1",
            "--timeout",
            "700ms",
            "--",
            "touch",
        ])
        .arg(&marker));
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert!(stderr(&out).contains("timeout"), "{}", stderr(&out));
    assert_eq!(stderr(&out).trim().lines().count(), 1, "{}", stderr(&out));
    assert!(!marker.exists(), "the command must not run");
    assert_eq!(
        counts(&server, "busy"),
        Some((1, 0)),
        "the ticket left the queue"
    );

    let out = run(redsem(&server)
        .args([
            "run",
            "--name",
            "busy",
            "--limit",
            "1",
            "--timeout",
            "0",
            "--",
            "touch",
        ])
        .arg(&marker));
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert!(!marker.exists());
}

/// Redis stops answering (SIGSTOP) while a `run --timeout` waits: it gives up at its timeout
/// and exits within about a second more (leaving the queue and counting the holders for its
/// message share one bound), not after a response timeout, and its message says that Redis
/// did not answer rather than report the semaphore as busy.
#[test]
fn timing_out_while_redis_is_stalled_exits_soon_and_says_why() {
    let server = Server::start(Flavor::Redis);
    let _holder = Background::spawn(redsem(&server).args([
        "run", "--name", "stall", "--limit", "1", "--", "sleep", "60",
    ]));
    wait_until(Duration::from_secs(20), "the holder", || {
        counts(&server, "stall") == Some((1, 0))
    });
    let started = Instant::now();
    let mut waiter = Background::spawn(
        redsem(&server)
            .args(["run", "--name", "stall", "--limit", "1", "--timeout", "3s"])
            .args(["--", "true"])
            .stderr(Stdio::piped()),
    );
    wait_until(Duration::from_secs(2), "the waiter", || {
        counts(&server, "stall") == Some((1, 1))
    });
    server.pause();
    let (rc, err) = waiter.finish(Duration::from_secs(30));
    let took = started.elapsed();
    server.resume();
    assert_eq!(rc, 124, "{err}");
    assert!(err.contains("Redis did not answer"), "{err}");
    // the timeout (3 s), about 1 s to leave the queue and count, and generous slack; a
    // response timeout (5 s) more before the fix
    assert!(
        took < Duration::from_millis(6_500),
        "exited {took:?} after it started: {err}"
    );
}

/// Redis stops answering (SIGSTOP) for most of the queued runs' lease: the holder, whose
/// lease is shorter than the stall, is stopped (75), and once Redis answers again the
/// waiters are granted with leases last confirmed before the stall. Each waits for renewals
/// to confirm its lease before its command starts (or, lost first, queues again): every
/// command runs, none is started only to be stopped at once.
#[test]
fn queued_runs_survive_a_redis_stall_shorter_than_their_lease() {
    let server = Server::start(Flavor::Redis);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ran.log");
    let mut holder = Background::spawn(
        redsem(&server)
            .args(["run", "--name", "st", "--limit", "1", "--lease", "4s"])
            .args(["--", "sleep", "60"])
            .stderr(Stdio::piped()),
    );
    wait_until(Duration::from_secs(20), "the holder", || {
        counts(&server, "st") == Some((1, 0))
    });
    let mut waiters: Vec<Background> = (0..2)
        .map(|i| {
            let w = Background::spawn(
                redsem(&server)
                    .args(["run", "--name", "st", "--limit", "1", "-v"])
                    .args(["--", "sh", "-c", r#"echo "$W" >> "$LOG""#])
                    .env("W", format!("w{i}"))
                    .env("LOG", &log)
                    .stderr(Stdio::piped()),
            );
            // queued in this order
            wait_until(Duration::from_secs(20), "the waiter", || {
                counts(&server, "st") == Some((1, i + 1))
            });
            w
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    server.pause();
    std::thread::sleep(Duration::from_secs(7));
    server.resume();

    let (rc, err) = holder.finish(Duration::from_secs(30));
    assert_eq!(
        rc, 75,
        "the holder's 4 s lease ran out during the stall: {err}"
    );
    for (i, w) in waiters.iter_mut().enumerate() {
        let (rc, err) = w.finish(Duration::from_secs(60));
        assert_eq!(rc, 0, "waiter {i}: {err}");
        assert!(!err.contains("SIGTERM"), "waiter {i} was stopped: {err}");
        // -v says that Redis does not answer (its check waits at most 5 s)
        assert!(
            err.contains("cannot read the queue: Redis"),
            "waiter {i}: {err}"
        );
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let mut ran: Vec<&str> = text.lines().collect();
    ran.sort_unstable();
    assert_eq!(ran, ["w0", "w1"], "{text}");
}

/// SIGTERM to `redsem run` reaches the command's process group; the slot is free as soon
/// as redsem exits (not after the 30 s lease), so a waiter gets it at once. A signal to a
/// waiting `redsem run` takes its ticket out of the queue.
#[test]
fn sigterm_reaches_the_command_and_frees_the_slot_at_once() {
    let server = Server::start(Flavor::Redis);
    let dir = tempfile::tempdir().unwrap();
    let script = r#"trap 'echo TERM > "$DIR/got"; exit 0' TERM; echo $$ > "$DIR/sh.pid"; while :; do sleep 0.05; done"#;
    let mut holder = Background::spawn(
        redsem(&server)
            .args([
                "run", "--name", "sig", "--limit", "1", "--lease", "30s", "--", "sh", "-c", script,
            ])
            .env("DIR", dir.path())
            .stderr(Stdio::piped()),
    );
    read_pid(&dir.path().join("sh.pid"));

    // a waiter that gives up on SIGINT
    let mut quitter = Background::spawn(
        redsem(&server)
            .args(["run", "--name", "sig", "--limit", "1", "--", "true"])
            .stderr(Stdio::piped()),
    );
    // and one that will get the slot
    let mut next = Background::spawn(
        redsem(&server)
            .args([
                "run",
                "--name",
                "sig",
                "--limit",
                "1",
                "--timeout",
                "20s",
                "--",
                "true",
            ])
            .stderr(Stdio::piped()),
    );
    wait_until(Duration::from_secs(20), "two waiters", || {
        counts(&server, "sig") == Some((1, 2))
    });
    quitter.signal(libc::SIGINT);
    let (rc, err) = quitter.finish(Duration::from_secs(10));
    assert_eq!(rc, 130, "{err}");
    assert_eq!(
        counts(&server, "sig"),
        Some((1, 1)),
        "the ticket left the queue at once"
    );

    let sent = Instant::now();
    holder.signal(libc::SIGTERM);
    let (rc, err) = holder.finish(Duration::from_secs(10));
    assert_eq!(rc, 0, "the command handled SIGTERM and exited 0: {err}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("got"))
            .unwrap()
            .trim(),
        "TERM"
    );
    let (rc, err) = next.finish(Duration::from_secs(20));
    assert_eq!(rc, 0, "{err}");
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "the waiter got the slot long before the 30 s lease"
    );
    assert_eq!(counts(&server, "sig"), Some((0, 0)));

    // a command killed by the forwarded signal: 128 + 15
    let mut r = Background::spawn(
        redsem(&server)
            .args([
                "run", "--name", "sig", "--limit", "1", "--lease", "30s", "--", "sh", "-c",
            ])
            .arg(r#"echo $$ > "$DIR/sleep.pid"; exec sleep 60"#)
            .env("DIR", dir.path())
            .stderr(Stdio::piped()),
    );
    let pid = read_pid(&dir.path().join("sleep.pid"));
    r.signal(libc::SIGTERM);
    let (rc, err) = r.finish(Duration::from_secs(10));
    assert_eq!(rc, 143, "{err}");
    assert!(is_dead(pid));
    assert_eq!(counts(&server, "sig"), Some((0, 0)));
}

/// A stopped command (SIGSTOP, Ctrl-Z) still gets the signals `redsem run` forwards, and the
/// SIGTERM of a lost lease: each is followed by SIGCONT, so the command ends and frees its
/// slot now, not whenever someone continues it.
#[test]
fn a_stopped_command_still_ends_on_a_forwarded_signal() {
    let server = Server::start(Flavor::Redis);
    let dir = tempfile::tempdir().unwrap();
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        let mut r = Background::spawn(
            redsem(&server)
                .args([
                    "run", "--name", "stopped", "--limit", "1", "--lease", "30s", "--",
                ])
                .args(["sh", "-c", r#"echo $$ > "$DIR/sleep.pid"; exec sleep 60"#])
                .env("DIR", dir.path())
                .stderr(Stdio::piped()),
        );
        let pid = read_pid(&dir.path().join("sleep.pid"));
        std::fs::remove_file(dir.path().join("sleep.pid")).unwrap();
        // SAFETY: a plain syscall on the command's pid.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        wait_until(Duration::from_secs(10), "the command stopped", || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
                st.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('T'))
            })
        });
        r.signal(sig);
        let (rc, err) = r.finish(Duration::from_secs(10));
        assert_eq!(rc, 128 + sig, "signal {sig}: {err}");
        assert!(is_dead(pid), "signal {sig}");
        assert_eq!(counts(&server, "stopped"), Some((0, 0)), "signal {sig}");
    }
}

/// `redsem run` killed with SIGKILL: the command gets SIGTERM (parent-death signal), and
/// the slot frees when its lease expires.
#[test]
fn a_killed_redsem_frees_the_slot_within_its_lease() {
    let server = Server::start(Flavor::Redis);
    let dir = tempfile::tempdir().unwrap();
    let mut r = Background::spawn(
        redsem(&server)
            .args([
                "run", "--name", "kill9", "--limit", "1", "--lease", "2s", "--", "sh", "-c",
            ])
            .arg(r#"echo $$ > "$DIR/sleep.pid"; exec sleep 60"#)
            .env("DIR", dir.path()),
    );
    let pid = read_pid(&dir.path().join("sleep.pid"));
    r.signal(libc::SIGKILL);
    r.wait_timeout(Duration::from_secs(5)).unwrap();
    wait_until(
        Duration::from_secs(5),
        "the command to die with redsem",
        || is_dead(pid),
    );
    let killed = Instant::now();
    let out = run(redsem(&server).args([
        "run",
        "--name",
        "kill9",
        "--limit",
        "1",
        "--timeout",
        "10s",
        "--",
        "true",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "freed within the 2 s lease"
    );
}

/// A Redis whose maxmemory-policy can evict the semaphore's keys: `run` refuses (exit 125,
/// naming the policy) unless --allow-evicting-policy or REDSEM_ALLOW_EVICTING_POLICY says
/// the risk is accepted.
#[test]
fn an_evicting_policy_is_refused_unless_allowed() {
    let server = Server::start_with(
        Flavor::Redis,
        test_support::ServerOptions {
            extra_args: vec!["--maxmemory-policy".into(), "allkeys-lru".into()],
            ..Default::default()
        },
    );
    let out = run(redsem(&server).args(["run", "ev", "--limit", "1", "--", "echo", "ran"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("maxmemory-policy is allkeys-lru"),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).is_empty());
    let out = run(redsem(&server).args([
        "run",
        "ev",
        "--limit",
        "1",
        "--allow-evicting-policy",
        "--",
        "echo",
        "ran",
    ]));
    assert_eq!(
        (code(&out), stdout(&out).trim()),
        (0, "ran"),
        "{}",
        stderr(&out)
    );
    let out = run(redsem(&server)
        .env("REDSEM_ALLOW_EVICTING_POLICY", "1")
        .args(["run", "ev", "--", "echo", "ran"]));
    assert_eq!(
        (code(&out), stdout(&out).trim()),
        (0, "ran"),
        "{}",
        stderr(&out)
    );
}

/// Nanoseconds since the Unix epoch (the clock `date +%s%N` reads).
fn unix_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Redis stops answering (SIGSTOP) longer than the lease, and the command ignores SIGTERM:
/// with the default --kill-after, the command's whole group is dead before the lease can
/// run out in Redis (SIGTERM --kill-after before the local deadline, SIGKILL at it), so it
/// never runs next to the slot's next holder.
#[test]
fn a_command_that_ignores_sigterm_is_dead_before_its_slot_can_be_granted_again() {
    for flavor in test_support::flavors() {
        let server = Server::start(flavor);
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("first.log");
        let script = r#"trap '' TERM; echo $$ > "$DIR/sh.pid"; while :; do date +%s%N >> "$DIR/first.log"; sleep 0.05; done"#;
        let mut first = Background::spawn(
            redsem(&server)
                .args(["run", "stop", "--limit", "1", "--lease", "3s"])
                .args(["--", "sh", "-c", script])
                .env("DIR", dir.path())
                .stderr(Stdio::piped()),
        );
        let sh = read_pid(&dir.path().join("sh.pid"));
        std::thread::sleep(Duration::from_millis(1500)); // a few renewals

        let paused = unix_ns();
        server.pause();
        let unpause = Instant::now() + Duration::from_secs(4);
        while !is_dead(sh) && Instant::now() < unpause {
            std::thread::sleep(Duration::from_millis(20));
        }
        let dead_before_resume = is_dead(sh);
        std::thread::sleep(unpause.saturating_duration_since(Instant::now()));
        server.resume();

        // the slot's next holder, once Redis answers again
        let out = run(redsem(&server).args([
            "run",
            "stop",
            "--limit",
            "1",
            "--timeout",
            "20s",
            "--",
            "sh",
            "-c",
            "date +%s%N",
        ]));
        assert_eq!(code(&out), 0, "{flavor}: {}", stderr(&out));
        let second_started: u128 = stdout(&out).trim().parse().unwrap();
        let (rc, err) = first.finish(Duration::from_secs(20));
        println!("{flavor}: {err}");
        assert_eq!(rc, 75, "{flavor}: {err}");
        assert!(err.contains("SIGTERM") && err.contains("SIGKILL"), "{err}");
        assert!(
            dead_before_resume,
            "{flavor}: still running when Redis resumed: {err}"
        );

        let text = std::fs::read_to_string(&log).unwrap();
        let last: u128 = text.lines().filter_map(|l| l.parse().ok()).max().unwrap();
        // every renewal Redis saw came before the pause: its lease ran out by pause + 3 s
        assert!(
            last < paused + 3_000_000_000,
            "{flavor}: the command wrote {} ms after the pause, beyond the 3 s lease: {err}",
            (last - paused) / 1_000_000
        );
        assert!(
            last < second_started,
            "{flavor}: the command ran next to the slot's next holder: {err}"
        );
    }
}

/// A --kill-after the lease cannot accommodate is refused before anything is sent to Redis.
#[test]
fn a_kill_after_the_lease_cannot_accommodate_is_refused() {
    let server = Server::start(Flavor::Redis);
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let out = run(redsem(&server)
        .args([
            "run",
            "ka",
            "--limit",
            "1",
            "--kill-after",
            "10s",
            "--",
            "touch",
        ])
        .arg(&marker));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--kill-after 10.0s does not fit --lease 10.0s")
            && err.contains("at most half the lease (5.0s)")
            && err.contains("--lease 20.0s or more"),
        "{err}"
    );
    assert!(!marker.exists());
    assert_eq!(server.cmd(&["DBSIZE"]).as_int(), Some(0), "nothing created");
    // half the lease fits
    let out = run(redsem(&server).args([
        "run",
        "ka",
        "--limit",
        "1",
        "--lease",
        "2s",
        "--kill-after",
        "1s",
        "--",
        "true",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

/// Redis goes away while the command runs: once the command ends, `run` waits about a second
/// for the release (not the 3 s + 3 s it used to), says that the lease frees the permits, and
/// exits with the command's status.
#[test]
fn with_redis_gone_run_exits_soon_after_the_command() {
    let mut server = Server::start(Flavor::Redis);
    let dir = tempfile::tempdir().unwrap();
    let script = r#"touch "$DIR/started"; while [ ! -e "$DIR/go" ]; do sleep 0.02; done; exit 3"#;
    let mut r = Background::spawn(
        redsem(&server)
            .args(["run", "gone", "--limit", "1", "--lease", "30s"])
            .args(["--", "sh", "-c", script])
            .env("DIR", dir.path())
            .stderr(Stdio::piped()),
    );
    wait_until(Duration::from_secs(20), "the command to start", || {
        dir.path().join("started").exists()
    });
    server.kill();
    std::fs::write(dir.path().join("go"), "").unwrap();
    let ended = Instant::now();
    let (rc, err) = r.finish(Duration::from_secs(20));
    let took = ended.elapsed();
    println!("exited {took:?} after the command: {err}");
    assert_eq!(rc, 3, "the command's status: {err}");
    assert!(err.contains("lease expires"), "{err}");
    // 1 s for the release, with slack for a loaded machine
    assert!(took < Duration::from_millis(2500), "{took:?}: {err}");
}

/// The command does not inherit REDSEM_URL (often with a password) unless --pass-url, which
/// gives it the URL redsem connected with; REDIS_URL, not redsem's own, is passed on.
#[test]
fn the_command_gets_the_redis_url_only_when_asked() {
    let server = Server::start_with(
        Flavor::Redis,
        ServerOptions {
            password: Some("s3cret".into()),
            ..Default::default()
        },
    );
    let url = server.url().replace("redis://", "redis://:s3cret@");
    let show = r#"echo "${REDSEM_URL-unset}|${REDIS_URL-unset}""#;
    let out = run(redsem_at("redis://generic:6379/")
        .env("REDSEM_URL", &url)
        .args(["run", "env", "--limit", "1", "--", "sh", "-c", show]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "unset|redis://generic:6379/");

    let out = run(redsem_at("redis://generic:6379/")
        .env("REDSEM_URL", &url)
        .args(["run", "env", "--pass-url", "--", "sh", "-c", show]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), format!("{url}|redis://generic:6379/"));

    // --redis-url: passed on as REDSEM_URL when asked
    let out = run(redsem_at("redis://generic:6379/").args([
        "--redis-url",
        &url,
        "run",
        "env",
        "--pass-url",
        "--",
        "sh",
        "-c",
        show,
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), format!("{url}|redis://generic:6379/"));
}

/// A `run` that cannot be granted (more permits than the limit, or none) fails before it
/// creates the semaphore: nothing is left in Redis. More permits than --limit are fine when
/// the semaphore exists with a larger stored limit (unless --strict-limit).
#[test]
fn a_run_that_cannot_be_granted_creates_nothing() {
    let server = Server::start(Flavor::Redis);
    let out =
        run(redsem(&server).args(["run", "new", "--limit", "2", "--permits", "3", "--", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--permits 3 is more than semaphore \"new\" has: its limit is 2"),
        "{}",
        stderr(&out)
    );
    let out =
        run(redsem(&server).args(["run", "new", "--limit", "2", "--permits", "0", "--", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert_eq!(server.cmd(&["DBSIZE"]).as_int(), Some(0), "nothing created");

    // an existing semaphore of limit 4: its stored limit counts
    let out = run(redsem(&server).args(["run", "big", "--limit", "4", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let three = ["--permits", "3", "--", "sh", "-c", "echo $REDSEM_SLOTS"];
    let out = run(redsem(&server)
        .args(["run", "big", "--limit", "2"])
        .args(three));
    assert_eq!(
        (code(&out), stdout(&out).trim()),
        (0, "0,1,2"),
        "{}",
        stderr(&out)
    );
    let out = run(redsem(&server)
        .args(["run", "big", "--limit", "2", "--strict-limit"])
        .args(three));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(stderr(&out).contains("--strict-limit"), "{}", stderr(&out));
    let out = run(redsem(&server).args(["run", "big", "--permits", "5", "--", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(stderr(&out).contains("its limit is 4"), "{}", stderr(&out));
    assert_eq!(counts(&server, "big"), Some((0, 0)));
}

/// `run -v` while waiting prints, one line each, its place in the queue, who holds and the
/// oldest wait: when they change, and at least every few seconds.
#[test]
fn verbose_waiting_prints_progress() {
    let server = Server::start(Flavor::Redis);
    let holder = Background::spawn(redsem(&server).args([
        "run",
        "prog",
        "--limit",
        "1",
        "--label",
        "the holder",
        "--",
        "sleep",
        "60",
    ]));
    wait_until(Duration::from_secs(20), "the holder", || {
        counts(&server, "prog") == Some((1, 0))
    });
    let _first = Background::spawn(
        redsem(&server).args(["run", "prog", "--label", "first", "--", "sleep", "3"]),
    );
    wait_until(Duration::from_secs(20), "the first waiter", || {
        counts(&server, "prog") == Some((1, 1))
    });
    let mut me = Background::spawn(
        redsem(&server)
            .args(["run", "prog", "-v", "--label", "me", "--", "true"])
            .stderr(Stdio::piped()),
    );
    wait_until(Duration::from_secs(20), "the second waiter", || {
        counts(&server, "prog") == Some((1, 2))
    });
    // two positions, then, with nothing changing, a line at least every 5 s
    std::thread::sleep(Duration::from_secs(7));
    holder.signal(libc::SIGTERM);
    let (rc, err) = me.finish(Duration::from_secs(30));
    assert_eq!(rc, 0, "{err}");
    let progress: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("redsem: waiting ") && l.contains(" permit(s) of \"prog\": "))
        .collect();
    let second = progress
        .iter()
        .filter(|l| l.contains("position 2 of 2 in the queue (1 ahead)"))
        .count();
    assert!(second >= 2, "a line on start and one within 5 s: {err}");
    assert!(
        progress
            .iter()
            .any(|l| l.contains(r#"held by "the holder" (1 for "#)
                && l.contains("1 of 1 permits in use")
                && l.contains("the oldest wait is ")),
        "{err}"
    );
    assert!(
        progress
            .iter()
            .any(|l| l.contains("next in the queue of 1") && l.contains(r#"held by "first""#)),
        "the change is printed: {err}"
    );
    assert!(err.contains("acquired slot(s)"), "{err}");
}

/// `--priority`: a higher class runs first, FIFO within a class; `stats` shows the classes;
/// a class outside 0..=9 is refused before anything is queued.
#[test]
fn a_higher_priority_runs_first() {
    let server = Server::start(Flavor::Redis);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("order.log");
    let gate = dir.path().join("gate");
    // the holder waits until the gate file exists
    let mut holder = Background::spawn(
        redsem(&server)
            .args(["run", "prio", "--limit", "1", "--", "sh", "-c"])
            .arg(format!(
                "while [ ! -e {} ]; do sleep 0.05; done",
                gate.display()
            ))
            .stderr(Stdio::piped()),
    );
    wait_until(Duration::from_secs(20), "the holder", || {
        counts(&server, "prio") == Some((1, 0))
    });
    let mut queued = Vec::new();
    for (i, (label, priority)) in [("low-a", "0"), ("high", "7"), ("low-b", "0"), ("mid", "3")]
        .into_iter()
        .enumerate()
    {
        queued.push(Background::spawn(
            redsem(&server)
                .args(["run", "prio", "--label", label, "--priority", priority])
                .args(["--", "sh", "-c", r#"echo "$L" >> "$LOG""#])
                .env("LOG", &log)
                .env("L", label)
                .stderr(Stdio::piped()),
        ));
        wait_until(Duration::from_secs(20), "the request to queue", || {
            counts(&server, "prio") == Some((1, i + 1))
        });
    }
    let out = run(redsem(&server).args(["stats", "prio"]));
    let text = stdout(&out);
    assert!(text.contains("higher priority first"), "{text}");
    assert!(text.contains("PRIORITY"), "{text}");
    let waiters = stats_json(&server, "prio")["waiters"].clone();
    let order: Vec<(String, u64)> = waiters
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["label"].as_str().unwrap().to_owned(),
                w["priority"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        order,
        [
            ("high".to_owned(), 7),
            ("mid".to_owned(), 3),
            ("low-a".to_owned(), 0),
            ("low-b".to_owned(), 0)
        ]
    );

    std::fs::write(&gate, "").unwrap();
    let (rc, err) = holder.finish(Duration::from_secs(60));
    assert_eq!(rc, 0, "{err}");
    for mut q in queued {
        let (rc, err) = q.finish(Duration::from_secs(60));
        assert_eq!(rc, 0, "{err}");
    }
    let ran = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        ran.lines().collect::<Vec<_>>(),
        ["high", "mid", "low-a", "low-b"]
    );

    let out = run(redsem(&server).args(["run", "prio", "--priority", "10", "--", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("\"10\" is not a priority class: a whole number in 0..=9"),
        "{}",
        stderr(&out)
    );
    assert_eq!(counts(&server, "prio"), Some((0, 0)));
}

/// Ctrl-Z in an interactive shell stops `redsem run` with its command, as a shell job: the
/// shell gets its prompt back (before, redsem ran on with the command stopped, and the
/// terminal was wedged: even Ctrl-C went to the stopped command), `fg` continues both, and
/// Ctrl-C then ends the command (exit 130) and frees the slot. A real terminal: `script`
/// gives `bash -i` a pseudo-terminal, and the keys are written to it.
#[test]
fn ctrl_z_stops_the_run_as_a_job_and_fg_continues_it() {
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};

    let server = Server::start(Flavor::Redis);
    let launcher = cli_command();
    let mut line: Vec<String> = std::iter::once(launcher.get_program())
        .chain(launcher.get_args())
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    line.extend(["run", "tz", "--limit", "1", "--", "sh", "-c"].map(String::from));
    line.push("'while :; do echo tick; sleep 0.2; done'".into());
    let mut shell = std::process::Command::new("script")
        .args(["-q", "-c", "bash --norc --noprofile -i", "/dev/null"])
        .env("REDSEM_URL", server.url())
        .env("PS1", "prompt$ ")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("script (util-linux) runs bash in a pseudo-terminal");
    // (on a failure too: killing `script` hangs the terminal up, which ends the shell's jobs)
    struct KillOnDrop(i32);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            // SAFETY: a plain syscall on our own child.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
    let _session = KillOnDrop(shell.id() as i32);
    let out = Arc::new(Mutex::new(String::new()));
    let mut stdout = shell.stdout.take().unwrap();
    let sink = out.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let mut keys = shell.stdin.take().unwrap();
    let mut type_keys = |k: &str| {
        keys.write_all(k.as_bytes()).unwrap();
        keys.flush().unwrap();
    };
    let ticks = |out: &Arc<Mutex<String>>| out.lock().unwrap().matches("tick\r\n").count();
    let shown = |out: &Arc<Mutex<String>>| out.lock().unwrap().clone();

    std::thread::sleep(Duration::from_millis(300));
    type_keys(&format!("{}\n", line.join(" ")));
    wait_until(Duration::from_secs(20), "the command ticks", || {
        ticks(&out) >= 2
    });
    type_keys("\x1a"); // Ctrl-Z
    wait_until(
        Duration::from_secs(10),
        "the shell says the job stopped",
        || shown(&out).contains("Stopped"),
    );
    type_keys("echo prompt-is-back\n");
    wait_until(Duration::from_secs(10), "the shell's prompt", || {
        shown(&out).contains("prompt-is-back\r\n")
    });
    let stopped_at = ticks(&out);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        ticks(&out),
        stopped_at,
        "the command ran on while stopped: {}",
        shown(&out)
    );
    assert_eq!(
        counts(&server, "tz"),
        Some((1, 0)),
        "the slot is still held"
    );

    type_keys("fg\n");
    wait_until(Duration::from_secs(10), "the command ticks again", || {
        ticks(&out) >= stopped_at + 2
    });
    type_keys("\x03"); // Ctrl-C
    std::thread::sleep(Duration::from_millis(300));
    type_keys("echo rc=$?\n");
    wait_until(Duration::from_secs(10), "redsem's exit status", || {
        shown(&out).contains("rc=130")
    });
    assert_eq!(counts(&server, "tz"), Some((0, 0)), "{}", shown(&out));
    type_keys("exit\n");
    drop(keys);
    let _ = shell.wait();
}

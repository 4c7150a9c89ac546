//! `redsem run`'s naming, flock/consul-style flags, environment variables and the exit-status
//! scheme, tested through the built binary against a private Redis server.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;

/// A `redsem run` holding the only permit of `name` (limit 1) until dropped.
fn hold(server: &Server, name: &str) -> Background {
    let holder = Background::spawn(
        redsem(server)
            .args(["run", name, "--limit", "1", "--", "sleep", "60"])
            .stderr(Stdio::null()),
    );
    wait_until(Duration::from_secs(20), "the holder", || {
        counts(server, name) == Some((1, 0))
    });
    holder
}

/// The positional NAME (with and without `--`), and `--name` / `--id` as before: each runs
/// the command with the right name and arguments; a missing NAME or command is a usage error.
#[test]
fn the_name_is_positional_and_name_and_id_still_work() {
    let server = Server::start(Flavor::Redis);
    let echo = r#"echo "$REDSEM_NAME|$*""#;
    let forms: [&[&str]; 5] = [
        &[
            "run", "pos", "--limit", "2", "--", "sh", "-c", echo, "sh", "a", "-b",
        ],
        &[
            "run", "pos", "--limit", "2", "sh", "-c", echo, "sh", "a", "-b",
        ],
        &[
            "run", "--limit", "2", "pos", "--", "sh", "-c", echo, "sh", "a", "-b",
        ],
        &[
            "run", "--name", "pos", "--limit", "2", "--", "sh", "-c", echo, "sh", "a", "-b",
        ],
        &[
            "run", "--id", "pos", "-j", "2", "sh", "-c", echo, "sh", "a", "-b",
        ],
    ];
    for args in forms {
        let out = run(redsem(&server).args(args));
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        assert_eq!(stdout(&out).trim(), "pos|a -b", "{args:?}");
    }
    assert_eq!(stats_json(&server, "pos")["grants_total"], 5);

    for args in [
        &["run", "--limit", "2"][..],
        &["run", "pos", "--limit", "2"],
        &["run", "--name", "pos", "--limit", "2"],
        &["run", "--name", "pos", "--limit", "2", "--"],
    ] {
        let out = run(redsem(&server).args(args));
        assert_eq!(code(&out), 125, "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("Usage: redsem run"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

/// `-n` fails at once while another process holds, with 124 or the `-E` status, and the
/// command does not run; `-E` applies to `--timeout` too, and `REDSEM_TIMEOUT` is a timeout.
#[test]
fn nonblock_and_conflict_exit_code() {
    let server = Server::start(Flavor::Redis);
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let _holder = hold(&server, "busy");

    let touch = |extra: &[&str]| {
        let out = run(redsem(&server)
            .args(["run", "busy"])
            .args(extra)
            .args(["--", "touch"])
            .arg(&marker));
        assert!(!marker.exists(), "{extra:?}: the command must not run");
        out
    };
    let out = touch(&["-n"]);
    assert_eq!(code(&out), 124, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not free right now"),
        "{}",
        stderr(&out)
    );
    let out = touch(&["--nonblock", "-E", "1"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let out = touch(&["--timeout", "300ms", "--conflict-exit-code", "7"]);
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not granted within"),
        "{}",
        stderr(&out)
    );
    let out = run(redsem(&server)
        .args(["run", "busy", "-E", "9", "--", "touch"])
        .arg(&marker)
        .env("REDSEM_TIMEOUT", "0"));
    assert_eq!(code(&out), 9, "{}", stderr(&out));
    assert!(!marker.exists());
    assert_eq!(counts(&server, "busy"), Some((1, 0)), "nobody left queued");

    // and when the permit is free, -n just runs the command
    let out = run(redsem(&server).args(["run", "free", "--limit", "1", "-n", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(redsem(&server).args(["run", "busy", "-E", "300", "--", "true"]));
    assert_eq!(code(&out), 125, "-E takes 0..=255: {}", stderr(&out));
}

/// Without `--limit`, `run` uses the stored limit of an existing semaphore, and refuses
/// (creating nothing) a missing one; `--strict-limit` refuses a stored limit other than
/// `--limit`, where plain `run` adopts it.
#[test]
fn the_limit_is_optional_once_the_semaphore_exists_and_strict_limit_checks_it() {
    let server = Server::start(Flavor::Redis);
    let out = run(redsem(&server).args(["run", "fresh", "--", "true"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("does not exist") && stderr(&out).contains("--limit"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        server.cmd(&["EXISTS", "redsem:{fresh}:cfg"]).as_int(),
        Some(0),
        "nothing created"
    );

    let out = run(redsem(&server).args(["run", "fresh", "--limit", "3", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(redsem(&server).args(["run", "fresh", "-v", "--", "sh", "-c", "echo ran"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "ran");
    assert!(stderr(&out).contains("(limit 3)"), "{}", stderr(&out));

    let out = run(redsem(&server).args([
        "run",
        "fresh",
        "--limit",
        "3",
        "--strict-limit",
        "--",
        "true",
    ]));
    assert_eq!(code(&out), 0, "the same limit: {}", stderr(&out));
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let out = run(redsem(&server)
        .args([
            "run",
            "fresh",
            "--limit",
            "4",
            "--strict-limit",
            "--",
            "touch",
        ])
        .arg(&marker));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("limit 3") && err.contains("--strict-limit"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!marker.exists(), "the command must not run");
    let out = run(redsem(&server)
        .args(["run", "fresh", "--limit", "4", "--", "touch"])
        .arg(&marker));
    assert_eq!(
        code(&out),
        0,
        "without --strict-limit: adopted, {}",
        stderr(&out)
    );
    assert!(marker.exists());
    assert_eq!(stats_json(&server, "fresh")["limit"], 3);

    let out = run(redsem(&server).args(["run", "fresh", "--strict-limit", "--", "true"]));
    assert_eq!(
        code(&out),
        125,
        "--strict-limit needs --limit: {}",
        stderr(&out)
    );
}

/// `REDSEM_URL` is taken before `REDIS_URL` (which the command inherits unchanged), and
/// `--redis-url` before both; `REDSEM_LABEL` and `REDSEM_LEASE` configure the holder.
#[test]
fn environment_variables_configure_run() {
    let server = Server::start(Flavor::Redis);
    let nowhere = format!("redis://127.0.0.1:{}/", test_support::free_port());
    let out = run(redsem_at(&nowhere).env("REDSEM_URL", server.url()).args([
        "run",
        "env",
        "--limit",
        "1",
        "--",
        "sh",
        "-c",
        "echo $REDIS_URL",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim(),
        nowhere,
        "the command's REDIS_URL is untouched"
    );
    let out = run(redsem_at(&server.url())
        .env("REDSEM_URL", &nowhere)
        .args(["list"]));
    assert_eq!(
        code(&out),
        125,
        "REDSEM_URL beats REDIS_URL: {}",
        stderr(&out)
    );
    let out = run(redsem_at(&nowhere).env("REDSEM_URL", &nowhere).args([
        "--redis-url",
        &server.url(),
        "list",
    ]));
    assert_eq!(code(&out), 0, "--redis-url beats both: {}", stderr(&out));
    assert!(stdout(&out).contains("env"), "{}", stdout(&out));
    // (`--url`, what a newcomer tries first, is the same option)
    let out =
        run(redsem_at(&nowhere)
            .env("REDSEM_URL", &nowhere)
            .args(["list", "--url", &server.url()]));
    assert_eq!(code(&out), 0, "--url is --redis-url: {}", stderr(&out));
    assert!(stdout(&out).contains("env"), "{}", stdout(&out));

    let _holder = Background::spawn(
        redsem(&server)
            .args(["run", "env", "--", "sleep", "60"])
            .env("REDSEM_LABEL", "label from the environment")
            .env("REDSEM_LEASE", "3s"),
    );
    wait_until(Duration::from_secs(20), "the holder", || {
        counts(&server, "env") == Some((1, 0))
    });
    let h = &stats_json(&server, "env")["holders"][0];
    assert_eq!(h["label"], "label from the environment");
    let lease_left = h["lease_left"].as_u64().unwrap();
    assert!(
        lease_left <= 3000,
        "a 3 s lease, not the default 10 s: {lease_left} ms left"
    );
}

/// `--shell` runs the words through `sh -c`; without it, a script is not a program.
#[test]
fn shell_runs_the_command_through_sh() {
    let server = Server::start(Flavor::Redis);
    let out = run(redsem(&server).args([
        "run",
        "sh",
        "--limit",
        "1",
        "--shell",
        "--",
        "echo \"$REDSEM_NAME\" &&",
        "echo a   b",
        "; exit 4",
    ]));
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert_eq!(stdout(&out), "sh\na b\n");
    let out = run(redsem(&server).args(["run", "sh", "--", "echo hi && exit 4"]));
    assert_eq!(code(&out), 127, "{}", stderr(&out));
}

/// One exit-status table, in `redsem --help`, `redsem run --help` and README-cli.md; and the
/// operator commands use its 125 for every failure (usage, unknown names, unreachable).
#[test]
fn one_exit_status_table_for_every_subcommand() {
    let help = |args: &[&str]| {
        let out = run(cli_command().args(args));
        assert_eq!(code(&out), 0);
        let text = stdout(&out);
        let at = text
            .find("Exit status (every subcommand)")
            .expect("an exit-status table");
        text[at..].trim_end().to_owned()
    };
    let table = help(&["--help"]);
    assert_eq!(help(&["run", "--help"]), table);
    for status in [
        "0 ", "1-123 ", "75 ", "77 ", "124 ", "125 ", "126 ", "127 ", "128+N ",
    ] {
        assert!(
            table.lines().any(|l| l.trim_start().starts_with(status)),
            "{status} missing:\n{table}"
        );
    }
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README-cli.md")).unwrap();
    assert!(
        readme.contains(&table),
        "README-cli.md does not show the table of `redsem --help` (run transcripts/make-transcripts.sh)"
    );

    let server = Server::start(Flavor::Redis);
    let nowhere = format!("redis://127.0.0.1:{}/", test_support::free_port());
    for (args, url) in [
        (&["stats"][..], server.url()),
        (&["stats", "ghost"], server.url()),
        (&["watch", "ghost", "--iterations", "1"], server.url()),
        (&["limit", "ghost", "2"], server.url()),
        (&["release", "ghost", "--holder", "x"], server.url()),
        (&["list", "--no-such-flag"], server.url()),
        (&["list"], nowhere.clone()),
        (&["run", "ghost", "--", "true"], server.url()),
        (&["run", "x", "--limit", "1", "--", "true"], nowhere.clone()),
    ] {
        let out = run(redsem_at(&url).args(args));
        assert_eq!(code(&out), 125, "{args:?}: {}", stderr(&out));
    }
}

/// One wording per validation, whatever the path; a bad value from the environment names
/// the variable; negative numbers and durations are read as values and refused; a very
/// long lease runs with a warning; labels are one line of text; `--version` names the
/// protocol.
#[test]
fn bad_values_are_refused_in_one_wording_that_names_their_source() {
    let server = Server::start(Flavor::Redis);
    let refused = |cmd: &mut std::process::Command, expected: &str| {
        let out = run(cmd);
        assert_eq!(code(&out), 125, "{expected}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(expected),
            "{expected}: {}",
            stderr(&out)
        );
        stderr(&out)
    };
    // the limit's range, in the library's words, on every path
    for limit in ["0", "-3", "100001", "99999999999"] {
        let expected = format!("limit {limit} is outside 1..=100000");
        refused(
            redsem(&server).args(["run", "v", "--limit", limit, "--", "true"]),
            &expected,
        );
        refused(
            redsem(&server).args(["run", "v", "-j", limit, "--", "true"]),
            &expected,
        );
    }
    refused(
        redsem(&server).args(["limit", "v", "0"]),
        "limit 0 is outside 1..=100000",
    );
    refused(
        redsem(&server).args(["limit", "v", "100001"]),
        "limit 100001 is outside 1..=100000",
    );
    refused(
        redsem(&server).args(["run", "v", "--limit", "many", "--", "true"]),
        r#""many" is not a limit: a whole number in 1..=100000"#,
    );
    refused(
        redsem(&server).args(["run", "v", "--limit", "2", "--permits", "-1", "--", "true"]),
        "--permits -1 is not a number of permits",
    );
    // negative durations are values, refused as such
    for flag in ["--lease", "--timeout", "--kill-after"] {
        refused(
            redsem(&server).args(["run", "v", "--limit", "2", flag, "-5s", "--", "true"]),
            r#""-5s" is negative: a duration is 0 or more"#,
        );
    }
    // a lease below the library's minimum is a bad value too, worded as the others
    for lease in ["0", "100ms"] {
        let err = refused(
            redsem(&server).args(["run", "v", "--limit", "2", "--lease", lease, "--", "true"]),
            "is shorter than the shortest lease, 250ms",
        );
        assert!(err.contains("--lease"), "{err}");
    }
    refused(
        redsem(&server).args(["watch", "v", "--iterations", "0"]),
        "--iterations <N>",
    );
    // a bad value from the environment names the variable; a typed one does not
    let err = refused(
        redsem(&server)
            .env("REDSEM_LEASE", "abc")
            .args(["run", "v", "--limit", "2", "--", "true"]),
        "from the environment variable REDSEM_LEASE",
    );
    assert!(err.contains("is not a duration"), "{err}");
    let err = refused(
        redsem(&server)
            .env("REDSEM_LEASE", "abc")
            .args(["run", "v", "--limit", "2", "--lease", "abc", "--", "true"]),
        "is not a duration",
    );
    assert!(!err.contains("environment variable"), "{err}");
    refused(
        redsem(&server)
            .env("REDSEM_TIMEOUT", "-1s")
            .args(["run", "v", "--limit", "2", "--", "true"]),
        "for '--timeout <TIMEOUT>' from the environment variable REDSEM_TIMEOUT",
    );
    // a negative duration reaches the parser, which names what is wrong, on a global option too
    refused(
        redsem(&server).args(["--connect-timeout", "-1s", "list"]),
        "\"-1s\" is negative",
    );
    // a mistyped option is not run as the command (exit 127, the command's "not found")
    refused(
        redsem(&server).args(["run", "v", "--limit", "2", "--lable", "x", "--", "true"]),
        "unexpected argument '--lable' found (did you mean --label?)",
    );
    // labels: one line of printable text, from a flag or the environment
    refused(
        redsem(&server).args(["run", "v", "--limit", "2", "--label", "a\nb", "--", "true"]),
        r#""a\nb" contains the control character '\n'"#,
    );
    refused(
        redsem(&server).args([
            "run",
            "v",
            "--limit",
            "2",
            "--label",
            &"x".repeat(201),
            "--",
            "true",
        ]),
        "label is 201 bytes long; the maximum is 200",
    );
    refused(
        redsem(&server)
            .env("REDSEM_LABEL", "a\x1b[31mb")
            .args(["run", "v", "--limit", "2", "--", "true"]),
        "from the environment variable REDSEM_LABEL",
    );
    assert_eq!(
        server.cmd(&["DBSIZE"]).as_int(),
        Some(0),
        "a refused run created something"
    );
    // a command with a newline still runs: its default label is made one line
    let out =
        run(redsem(&server).args(["run", "v", "--limit", "2", "--", "sh", "-c", "true\ntrue"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    // a lease of a year runs, with a warning about what a crash then costs
    let out = run(redsem(&server).args(["run", "v", "--lease", "365d", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("warning: --lease 365d") && err.contains("stay blocked for up to 365d"),
        "{err}"
    );
    let out = run(redsem(&server).args(["run", "v", "--lease", "30s", "--", "true"]));
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));

    let out = run(cli_command().arg("--version"));
    assert_eq!(code(&out), 0);
    let expected = format!("(protocol {})", redsem::PROTOCOL_VERSION);
    assert!(stdout(&out).contains(&expected), "{}", stdout(&out));
}

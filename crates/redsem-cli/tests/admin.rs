//! The operator commands (`stats`, `list`, `watch`, `limit`, `release`, `exporter`) and
//! error reporting, tested through the built binary against a private Redis server.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::Value;

/// One holder and one waiter of `name` (limit 1), kept until dropped.
fn busy(server: &Server, name: &str) -> (Background, Background) {
    let holder = Background::spawn(redsem(server).args([
        "run",
        name,
        "--limit",
        "1",
        "--label",
        "the holder",
        "--",
        "sleep",
        "60",
    ]));
    wait_until(Duration::from_secs(20), "the holder", || {
        counts(server, name) == Some((1, 0))
    });
    let waiter = Background::spawn(redsem(server).args([
        "run",
        name,
        "--limit",
        "1",
        "--label",
        "the waiter",
        "--",
        "true",
    ]));
    wait_until(Duration::from_secs(20), "the waiter", || {
        counts(server, name) == Some((1, 1))
    });
    (holder, waiter)
}

fn assert_u64(v: &Value, what: &str) {
    assert!(v.is_u64(), "{what} should be an unsigned integer: {v}");
}

/// The schema of `stats --json` (documented in README-cli.md).
#[test]
fn stats_json_schema() {
    let server = Server::start(Flavor::Redis);
    let _busy = busy(&server, "schema");
    let s = stats_json(&server, "schema");
    let obj = s.as_object().unwrap();
    let mut fields: Vec<&str> = obj.keys().map(String::as_str).collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "available",
            "expired_total",
            "grants_total",
            "holder_count",
            "holders",
            "in_use",
            "limit",
            "name",
            "repairs_total",
            "server_time_ms",
            "waiter_count",
            "waiters"
        ]
    );
    assert_eq!(s["repairs_total"], 0);
    assert_eq!(s["name"], "schema");
    assert_eq!(s["limit"], 1);
    assert_eq!(s["in_use"], 1);
    assert_eq!(s["available"], 0);
    assert_eq!(s["grants_total"], 1);
    assert_eq!(s["expired_total"], 0);
    assert_u64(&s["server_time_ms"], "server_time_ms");

    let h = &s["holders"][0];
    let mut fields: Vec<&str> = h.as_object().unwrap().keys().map(String::as_str).collect();
    fields.sort();
    assert_eq!(
        fields,
        ["fences", "held", "id", "label", "lease_left", "permits"]
    );
    assert!(h["id"].is_string());
    assert_eq!(h["label"], "the holder");
    assert_eq!(h["permits"], 1);
    let fences = h["fences"].as_array().unwrap();
    assert_eq!(fences.len(), 1);
    assert_eq!(fences[0]["slot"], 0);
    assert_u64(&fences[0]["generation"], "generation");
    assert_u64(&h["held"], "held (ms)");
    assert_u64(&h["lease_left"], "lease_left (ms)");

    let w = &s["waiters"][0];
    let mut fields: Vec<&str> = w.as_object().unwrap().keys().map(String::as_str).collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "id",
            "label",
            "lease_left",
            "permits",
            "position",
            "priority",
            "ticket",
            "waited"
        ]
    );
    assert_eq!(w["label"], "the waiter");
    assert_eq!(w["permits"], 1);
    assert_eq!(w["position"], 0);
    assert_eq!(w["ticket"], 2);
    assert_u64(&w["waited"], "waited (ms)");
    assert_u64(&w["lease_left"], "lease_left (ms)");

    // the human view names the same things
    let out = run(redsem(&server).args(["stats", "schema"]));
    assert_eq!(code(&out), 0);
    let text = stdout(&out);
    assert!(text.contains("limit 1, 1 in use"), "{text}");
    assert!(
        text.contains("the holder") && text.contains("the waiter"),
        "{text}"
    );
}

/// `list` shows every semaphore under the prefix, and only those; it creates nothing.
#[test]
fn list_shows_every_semaphore_under_the_prefix() {
    let server = Server::start(Flavor::Redis);
    let out = run(redsem(&server).args(["list"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("no semaphores"), "{}", stdout(&out));

    let _busy = busy(&server, "alpha");
    let out = run(redsem(&server).args(["run", "beta", "--limit", "5", "--", "true"]));
    assert_eq!(code(&out), 0);
    let out = run(redsem(&server).args([
        "--prefix", "other", "run", "gamma", "--limit", "1", "--", "true",
    ]));
    assert_eq!(code(&out), 0);

    let out = run(redsem(&server).args(["list", "--json"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha", "beta"]);
    let alpha = &v[0];
    assert_eq!(alpha["limit"], 1);
    assert_eq!(alpha["holders"], 1);
    assert_eq!(alpha["waiters"], 1);
    assert!(alpha["oldest_wait_ms"].is_u64());
    assert_eq!(v[1]["limit"], 5);
    assert!(v[1]["oldest_wait_ms"].is_null());

    let out = run(redsem(&server).args(["list"]));
    let text = stdout(&out);
    assert!(text.starts_with("NAME"), "{text}");
    assert!(
        text.contains("alpha") && text.contains("beta") && !text.contains("gamma"),
        "{text}"
    );

    let out = run(redsem(&server).args(["--prefix", "other", "list", "--json"]));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1);

    // inspecting never creates
    let out = run(redsem(&server).args(["stats", "ghost"]));
    assert_eq!(code(&out), 125);
    assert_eq!(
        server.cmd(&["EXISTS", "redsem:{ghost}:cfg"]).as_int(),
        Some(0)
    );
}

/// `limit` resizes live (a grown limit admits the waiter at once); `release` of an unknown
/// holder or semaphore exits 3.
#[test]
fn limit_resizes_live_and_release_reports_unknown_holders() {
    let server = Server::start(Flavor::Redis);
    let (_holder, mut waiter) = busy(&server, "grow");
    let out = run(redsem(&server).args(["limit", "grow", "2"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("limit 1 -> 2"), "{}", stdout(&out));
    // the waiter (opened with --limit 1) is admitted and its `true` exits 0
    let (code_w, err) = waiter.finish(Duration::from_secs(10));
    assert_eq!(code_w, 0, "{err}");
    assert_eq!(stats_json(&server, "grow")["limit"], 2);

    let out = run(redsem(&server).args(["limit", "nope", "2"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert_eq!(
        server.cmd(&["EXISTS", "redsem:{nope}:cfg"]).as_int(),
        Some(0)
    );
    let out = run(redsem(&server).args(["limit", "grow", "0"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));

    let out = run(redsem(&server).args(["release", "grow", "--holder", "nobody"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no holder or waiter"),
        "{}",
        stderr(&out)
    );
    let out = run(redsem(&server).args(["release", "nope", "--holder", "x"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));

    // `run` adopts the stored limit (an operator changed it) whatever its --limit says
    let out = run(redsem(&server).args([
        "run", "-v", "grow", "--limit", "7", "--", "sh", "-c", "echo ran",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "ran");
    assert!(stderr(&out).contains("using 2"), "{}", stderr(&out));
    assert_eq!(stats_json(&server, "grow")["limit"], 2);
    // more permits than the stored limit: redsem's own error, 125
    let out = run(redsem(&server).args([
        "run",
        "grow",
        "--limit",
        "7",
        "--permits",
        "3",
        "--",
        "true",
    ]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(stderr(&out).contains("limit is 2"), "{}", stderr(&out));
}

/// `limit NAME +N` / `-N` change the stored limit by N, atomically (`-N` is a value, not a
/// flag); a change out of range is refused with the current limit; nothing is created.
#[test]
fn limit_takes_relative_changes() {
    let server = Server::start(Flavor::Redis);
    let out = run(redsem(&server).args(["run", "rel", "--limit", "2", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(redsem(&server).args(["limit", "rel", "+1"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("limit 2 -> 3"), "{}", stdout(&out));
    assert_eq!(stats_json(&server, "rel")["limit"], 3);
    let out = run(redsem(&server).args(["limit", "rel", "-2"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("limit 3 -> 1"), "{}", stdout(&out));
    let out = run(redsem(&server).args(["limit", "rel", "-3"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(stderr(&out).contains("its limit is 1"), "{}", stderr(&out));
    assert_eq!(stats_json(&server, "rel")["limit"], 1);
    let out = run(redsem(&server).args(["limit", "rel", "4"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("limit 1 -> 4"), "{}", stdout(&out));
    for bad in ["+", "1.5", "+-1", "four"] {
        let out = run(redsem(&server).args(["limit", "rel", bad]));
        assert_eq!(code(&out), 125, "{bad}: {}", stderr(&out));
        assert!(stderr(&out).contains("+1 or -2"), "{bad}: {}", stderr(&out));
    }
    assert_eq!(stats_json(&server, "rel")["limit"], 4);
    let out = run(redsem(&server).args(["limit", "none", "+1"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert_eq!(
        server.cmd(&["EXISTS", "redsem:{none}:cfg"]).as_int(),
        Some(0)
    );
}

/// `release` of a queued waiter removes it from the queue, and says so; the waiter's `run`
/// does not run its command, says why, and exits 76 (not queue again silently). `release` of
/// a holder says it released a holder.
#[test]
fn release_of_a_waiter_removes_it_and_its_run_exits_76() {
    let server = Server::start(Flavor::Redis);
    let _holder = Background::spawn(redsem(&server).args([
        "run",
        "cancel",
        "--limit",
        "1",
        "--label",
        "the holder",
        "--",
        "sleep",
        "60",
    ]));
    wait_until(Duration::from_secs(20), "the holder", || {
        counts(&server, "cancel") == Some((1, 0))
    });
    let mut waiter = Background::spawn(
        redsem(&server)
            .args([
                "run",
                "cancel",
                "--limit",
                "1",
                "--label",
                "the waiter",
                "--",
                "true",
            ])
            .stderr(Stdio::piped()),
    );
    wait_until(Duration::from_secs(20), "the waiter", || {
        counts(&server, "cancel") == Some((1, 1))
    });
    let s = stats_json(&server, "cancel");
    let waiter_id = s["waiters"][0]["id"].as_str().unwrap().to_owned();
    let holder_id = s["holders"][0]["id"].as_str().unwrap().to_owned();
    let out = run(redsem(&server).args(["release", "cancel", "--holder", &waiter_id]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!(
            "removed waiter {waiter_id} (the waiter, queue position 0) from the queue"
        )),
        "{}",
        stdout(&out)
    );
    let (code_w, err) = waiter.finish(Duration::from_secs(10));
    assert_eq!(code_w, 76, "{err}");
    assert!(
        err.contains("an operator removed this request") && err.contains("the command was not run"),
        "{err}"
    );
    assert_eq!(
        counts(&server, "cancel"),
        Some((1, 0)),
        "nobody queued again"
    );
    let out = run(redsem(&server).args(["release", "cancel", "--holder", &holder_id]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("released holder {holder_id} (the holder,")),
        "{}",
        stdout(&out)
    );
}

/// `limit` that shrinks below a queued request says which requests it rejected, and the
/// waiter's `run` names the limit as it is now.
#[test]
fn limit_reports_the_requests_a_shrink_rejected() {
    let server = Server::start(Flavor::Redis);
    let _holder = Background::spawn(
        redsem(&server).args(["run", "narrow", "--limit", "2", "--", "sleep", "60"]),
    );
    wait_until(Duration::from_secs(20), "the holder", || {
        counts(&server, "narrow") == Some((1, 0))
    });
    let mut waiter = Background::spawn(
        redsem(&server)
            .args([
                "run",
                "narrow",
                "--limit",
                "2",
                "--permits",
                "2",
                "--label",
                "two seats",
                "--",
                "true",
            ])
            .stderr(Stdio::piped()),
    );
    wait_until(Duration::from_secs(20), "the waiter", || {
        counts(&server, "narrow") == Some((1, 1))
    });
    let out = run(redsem(&server).args(["limit", "narrow", "1"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("limit 2 -> 1"), "{text}");
    assert!(
        text.contains("rejected 1 queued request(s) larger than the new limit")
            && text.contains("two seats"),
        "{text}"
    );
    let (code_w, err) = waiter.finish(Duration::from_secs(10));
    assert_eq!(code_w, 125, "{err}");
    assert!(
        err.contains("requested 2 permits at once, but the limit is 1"),
        "{err}"
    );
}

/// Another program's hash at a semaphore's `cfg` key: every command says "not a redsem
/// semaphore" (not "protocol version 1"), `run` does not adopt it, `delete --force` leaves it
/// alone, and only `delete --force --delete-foreign-data` removes it.
#[test]
fn a_foreign_hash_is_not_a_semaphore_and_delete_leaves_it_unless_told() {
    let server = Server::start(Flavor::Redis);
    server.cmd(&["HSET", "redsem:{fruit}:cfg", "limit", "banana"]);
    server.cmd(&["HSET", "redsem:{prefs}:cfg", "theme", "dark"]);
    for name in ["fruit", "prefs"] {
        for args in [
            vec!["stats", name],
            vec!["limit", name, "3"],
            vec!["run", name, "--limit", "1", "--", "true"],
            vec!["delete", name],
            vec!["delete", name, "--force"],
        ] {
            let out = run(redsem(&server).args(&args));
            let err = stderr(&out);
            assert_eq!(code(&out), 125, "{args:?}: {err}");
            assert!(
                err.contains("is not a redsem semaphore") && !err.contains("protocol version"),
                "{args:?}: {err}"
            );
        }
        assert_eq!(
            server
                .cmd(&["HLEN", &format!("redsem:{{{name}}}:cfg")])
                .as_int(),
            Some(1),
            "{name}: the foreign hash was changed"
        );
    }
    // `list` shows the semaphores it can read, names those it cannot, and does not exit 0:
    // a script must not take an incomplete listing for the whole
    let out = run(redsem(&server).args(["run", "real", "--limit", "2", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    for json in [false, true] {
        let args: &[&str] = if json { &["list", "--json"] } else { &["list"] };
        let out = run(redsem(&server).args(args));
        let (text, err) = (stdout(&out), stderr(&out));
        assert_eq!(code(&out), 125, "{args:?}: {err}");
        assert!(
            text.contains("real") && !text.contains("fruit"),
            "{args:?}: {text}"
        );
        assert!(
            err.contains("skipping \"fruit\"")
                && err.contains(
                    "2 semaphore(s) could not be read (above): the listing is incomplete"
                ),
            "{args:?}: {err}"
        );
    }
    let out = run(redsem(&server).args(["delete", "real"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(redsem(&server).args(["list"]));
    assert_eq!(code(&out), 125);
    assert!(!stdout(&out).contains("no semaphores"), "{}", stdout(&out));

    let out = run(redsem(&server).args(["delete", "fruit", "--delete-foreign-data"]));
    assert_eq!(code(&out), 125, "needs --force: {}", stderr(&out));
    let out = run(redsem(&server).args(["delete", "fruit", "--force", "--delete-foreign-data"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        server.cmd(&["EXISTS", "redsem:{fruit}:cfg"]).as_int(),
        Some(0)
    );
}

/// `watch --iterations N` whose last refresh failed (Redis gone) exits 125, not 0, and its
/// error lines are redsem's (`redsem: error: ...`); it keeps watching meanwhile.
#[test]
fn watch_exits_125_when_its_last_refresh_failed() {
    let mut server = Server::start(Flavor::Redis);
    let out = run(redsem(&server).args(["run", "gone", "--limit", "1", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let mut w = Background::spawn(
        redsem(&server)
            .args(["watch", "gone", "--interval", "1s", "--iterations", "3"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    std::thread::sleep(Duration::from_millis(400));
    server.kill();
    let (rc, err) = w.finish(Duration::from_secs(30));
    let mut text = String::new();
    let mut stdout = w.0.as_mut().unwrap().stdout.take().unwrap();
    std::io::Read::read_to_string(&mut stdout, &mut text).unwrap();
    assert_eq!(rc, 125, "{err}\n{text}");
    assert_eq!(text.matches("redsem watch \"gone\"").count(), 3, "{text}");
    assert!(text.contains("redsem: error: "), "{text}");
}

/// `watch` without a terminal prints one block per refresh, with the alerts.
#[test]
fn watch_prints_blocks_and_alerts() {
    let server = Server::start(Flavor::Redis);
    // limit 2: one holder of 1 permit, a request for 2 at the head: waiters while 1 is free
    let _h = Background::spawn(
        redsem(&server).args(["run", "hol", "--limit", "2", "--", "sleep", "60"]),
    );
    wait_until(Duration::from_secs(20), "the holder", || {
        counts(&server, "hol") == Some((1, 0))
    });
    let _w = Background::spawn(redsem(&server).args([
        "run",
        "hol",
        "--limit",
        "2",
        "--permits",
        "2",
        "--",
        "true",
    ]));
    wait_until(Duration::from_secs(20), "the waiter", || {
        counts(&server, "hol") == Some((1, 1))
    });

    let out =
        run(redsem(&server).args(["watch", "hol", "--interval", "200ms", "--iterations", "2"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.matches("redsem watch \"hol\"").count(), 2, "{text}");
    assert!(
        !text.contains('\x1b'),
        "no escape sequences without a terminal: {text}"
    );
    assert!(text.contains("wait trend"), "{text}");
    assert!(
        text.contains("WARNING: 1 waiter(s) stay queued while 1 permit(s) are free"),
        "{text}"
    );

    // limit 1: a holder and two waiters: the queue stays above the limit
    let _h2 = Background::spawn(
        redsem(&server).args(["run", "long", "--limit", "1", "--", "sleep", "60"]),
    );
    wait_until(Duration::from_secs(20), "the holder", || {
        counts(&server, "long") == Some((1, 0))
    });
    let _w2: Vec<Background> = (0..2)
        .map(|_| {
            Background::spawn(redsem(&server).args(["run", "long", "--limit", "1", "--", "true"]))
        })
        .collect();
    wait_until(Duration::from_secs(20), "the waiters", || {
        counts(&server, "long") == Some((1, 2))
    });
    let out = run(redsem(&server).args([
        "watch",
        "long",
        "--interval",
        "200ms",
        "--iterations",
        "1",
        "--alert-after",
        "60s",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        !text.contains("WARNING"),
        "not before --alert-after: {text}"
    );

    // Waits are counted from when Redis queued them: once both waiters have waited 2 s, a
    // watch started now alerts on its first refresh.
    wait_until(Duration::from_secs(20), "2 s of waiting", || {
        stats_json(&server, "long")["waiters"][1]["waited"]
            .as_u64()
            .is_some_and(|ms| ms >= 2_000)
    });
    let out = run(redsem(&server).args([
        "watch",
        "long",
        "--interval",
        "200ms",
        "--iterations",
        "1",
        "--alert-after",
        "2s",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("WARNING: the queue (2) has stayed above the limit (1) for"),
        "{text}"
    );
    assert!(
        text.contains("WARNING: the head of the queue has waited"),
        "{text}"
    );
    assert!(text.contains("every permit in use"), "{text}");

    let out = run(redsem(&server).args(["watch", "ghost", "--iterations", "1"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
}

/// The exporter, scraped over HTTP.
#[test]
fn exporter_is_scraped_over_http() {
    let server = Server::start(Flavor::Redis);
    let _busy = busy(&server, "lic\"ence");
    let out = run(redsem(&server).args(["run", "idle", "--limit", "4", "--", "true"]));
    assert_eq!(code(&out), 0);

    let (_exporter, addr) = spawn_exporter(&server);

    let response = http_get(&addr, "/metrics");
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(length, body.len());
    for expected in [
        r#"redsem_semaphore_limit{semaphore="idle"} 4"#,
        r#"redsem_semaphore_limit{semaphore="lic\"ence"} 1"#,
        r#"redsem_semaphore_holders{semaphore="lic\"ence"} 1"#,
        r#"redsem_semaphore_permits_in_use{semaphore="lic\"ence"} 1"#,
        r#"redsem_semaphore_waiters{semaphore="lic\"ence"} 1"#,
        r#"redsem_semaphore_waiters{semaphore="idle"} 0"#,
        r#"redsem_semaphore_grants_total{semaphore="lic\"ence"} 1"#,
        r#"redsem_semaphore_grants_total{semaphore="idle"} 1"#,
        r#"redsem_semaphore_expired_total{semaphore="idle"} 0"#,
        r#"redsem_semaphore_oldest_wait_seconds{semaphore="idle"} 0.000"#,
        "# TYPE redsem_semaphore_grants_total counter",
        "# TYPE redsem_semaphore_limit gauge",
        "redsem_exporter_up 1",
    ] {
        assert!(
            body.lines().any(|l| l == expected),
            "missing {expected:?} in:\n{body}"
        );
    }
    let wait: f64 = body
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"redsem_semaphore_oldest_wait_seconds{semaphore="lic\"ence"} "#)
        })
        .unwrap()
        .parse()
        .unwrap();
    assert!(wait > 0.0, "{body}");
    // every sample line is `name{labels} value` or `name value`
    for l in body.lines().filter(|l| !l.starts_with('#')) {
        let (_, value) = l.rsplit_once(' ').unwrap();
        value
            .parse::<f64>()
            .unwrap_or_else(|_| panic!("bad sample {l:?}"));
    }

    assert!(http_get(&addr, "/other").starts_with("HTTP/1.1 404"));

    // Redis gone: still serving, redsem_exporter_up 0
    drop(_busy);
    drop(server);
    let response = http_get(&addr, "/metrics");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("\nredsem_exporter_up 0\n"), "{response}");
}

/// Every error is one line a person understands, with a non-zero exit.
#[test]
fn errors_are_one_line_with_a_nonzero_exit() {
    let server = Server::start(Flavor::Redis);
    let secured = Server::start_with(
        Flavor::Redis,
        ServerOptions {
            password: Some("s3cret".into()),
            ..ServerOptions::default()
        },
    );
    server.cmd(&["SET", "redsem:{foreign}:cfg", "not a hash"]);
    let free = test_support::free_port();
    let unreachable = format!("redis://127.0.0.1:{free}/");
    let bad_password = format!("redis://:wrong@127.0.0.1:{}/", secured.port());
    let url = server.url();

    let cases: Vec<(Vec<String>, &str, i32, &str)> = vec![
        (
            vec!["stats".into(), "nope".into()],
            &url,
            125,
            "unknown semaphore \"nope\"",
        ),
        (
            vec!["stats".into(), "x".into()],
            &*unreachable,
            125,
            "cannot connect to",
        ),
        (
            vec!["list".into()],
            "htp://nowhere",
            125,
            "cannot parse Redis URL",
        ),
        (
            // a mistyped scheme: the message quotes the URL, without its password
            vec!["list".into()],
            "redis//u:wrong@127.0.0.1:1/",
            125,
            "cannot parse Redis URL",
        ),
        (
            vec!["stats".into(), "x".into()],
            &*bad_password,
            125,
            "authentication failed",
        ),
        (
            vec!["stats".into(), "foreign".into()],
            &url,
            125,
            "WRONGTYPE",
        ),
        (
            vec!["limit".into(), "foreign".into(), "3".into()],
            &url,
            125,
            "WRONGTYPE",
        ),
        (
            vec![
                "run".into(),
                "x".into(),
                "--limit".into(),
                "1".into(),
                "--".into(),
                "true".into(),
            ],
            &*unreachable,
            125,
            "cannot connect to",
        ),
        (
            vec![
                "run".into(),
                "foreign".into(),
                "--limit".into(),
                "1".into(),
                "--".into(),
                "true".into(),
            ],
            &url,
            125,
            "WRONGTYPE",
        ),
        (
            vec![
                "run".into(),
                "a b".into(),
                "--limit".into(),
                "1".into(),
                "--".into(),
                "true".into(),
            ],
            &url,
            125,
            "whitespace",
        ),
    ];
    for (args, url, want_code, needle) in cases {
        let out = run(redsem_at(url).args(&args));
        let err = stderr(&out);
        assert_eq!(code(&out), want_code, "{args:?}: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: not one line: {err}"
        );
        assert!(err.starts_with("redsem: "), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {needle:?} not in {err}");
        assert!(
            !err.contains("s3cret") && !err.contains(":wrong@"),
            "password shown: {err}"
        );
    }

    // usage errors: 125 too (not clap's 2), for every subcommand: `run`'s 1..=123 belong to
    // the command
    let out = run(redsem(&server).args(["stats"]));
    assert_eq!(code(&out), 125);
    let out = run(redsem(&server).args(["run", "x", "--limit", "1"]));
    assert_eq!(code(&out), 125);
}

/// `--redis-url` with a unix socket (and a bare socket path).
#[test]
fn unix_sockets_work() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("redis.sock");
    let server = Server::start_with(
        Flavor::Redis,
        ServerOptions {
            extra_args: vec!["--unixsocket".into(), sock.display().to_string()],
            ..ServerOptions::default()
        },
    );
    let out = run(redsem_at(&format!("unix://{}", sock.display()))
        .args(["run", "sock", "--limit", "1", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(redsem_at(&sock.display().to_string()).args(["list", "--json"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["name"], "sock");
    drop(server);
}

/// `rediss://` with a private CA (`--tls-ca` or `REDSEM_TLS_CA`, or `SSL_CERT_FILE` for the
/// system roots), client certificates, and a clear error when the CA is unknown.
#[test]
fn tls_urls_work() {
    let certs = test_support::TlsCerts::generate();
    let server = test_support::TlsServer::start(Flavor::Redis, &certs, false);
    let url = server.tls_url();
    let out = run(redsem_at(&url).arg("--tls-ca").arg(&certs.ca).args([
        "run",
        "tls",
        "--limit",
        "1",
        "--",
        "sh",
        "-c",
        "echo $REDSEM_FENCES",
    ]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).trim().starts_with("0:"), "{}", stdout(&out));
    let out = run(redsem_at(&url)
        .env("REDSEM_TLS_CA", &certs.ca)
        .args(["stats", "tls"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(redsem_at(&url)
        .env("SSL_CERT_FILE", &certs.ca)
        .args(["stats", "tls"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    let out = run(redsem_at(&url)
        .arg("--tls-ca")
        .arg(&certs.other_ca)
        .args(["stats", "tls"]));
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("certificate") && err.contains("--tls-ca"),
        "{err}"
    );

    // a server that requires client certificates
    let mtls = test_support::TlsServer::start(Flavor::Redis, &certs, true);
    let out = run(redsem_at(&mtls.tls_url())
        .arg("--tls-ca")
        .arg(&certs.ca)
        .arg("--tls-cert")
        .arg(&certs.client_cert)
        .arg("--tls-key")
        .arg(&certs.client_key)
        .args(["run", "mtls", "--limit", "1", "--", "true"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = run(redsem_at(&mtls.tls_url())
        .arg("--tls-ca")
        .arg(&certs.ca)
        .args(["list"]));
    assert_eq!(code(&out), 125, "no client certificate: refused");
    assert!(stderr(&out).contains("--tls-cert"), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).trim_end().lines().count(),
        1,
        "{}",
        stderr(&out)
    );
}

/// A Redis Cluster (`redis+cluster://`): `run` holds a slot, `list` finds semaphores on every
/// master, the exporter serves them.
#[test]
fn cluster_urls_work() {
    let cluster = test_support::Cluster::start(Flavor::Redis);
    let url = cluster.url();
    let names = ["alpha", "bravo", "charlie", "delta", "echo"];
    for name in names {
        let out = run(redsem_at(&url).args([
            "run",
            name,
            "--limit",
            "2",
            "--",
            "sh",
            "-c",
            "echo $REDSEM_SLOTS",
        ]));
        assert_eq!(code(&out), 0, "{name}: {}", stderr(&out));
        assert_eq!(stdout(&out).trim(), "0");
    }
    // the names hash to several masters
    let masters: std::collections::BTreeSet<usize> = names
        .iter()
        .map(|n| cluster.master_for_key(&format!("redsem:{{{n}}}:cfg")))
        .collect();
    assert!(masters.len() > 1, "all names on one master: {masters:?}");

    let out = run(redsem_at(&url).args(["list", "--json"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed, names);
    let out = run(redsem_at(&url).args(["stats", "charlie", "--json"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["grants_total"], 1);
}

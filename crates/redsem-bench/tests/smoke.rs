//! CI smoke run of the benchmark so it cannot rot: every design in every scenario with few
//! jobs, against the private redis-server the binary starts itself (REDIS_URL removed).
//! Asserts correctness only (every job done, never more holders than the limit, leased
//! designs recover from SIGKILLed holders and the counter does not, the memory figures
//! exist, the idle waiters are all queued and nobody is granted while they idle), never
//! timings.

use std::process::Command;

use serde_json::Value;

fn f(v: &Value, key: &str) -> f64 {
    v["figures"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("figure {key} missing in {v}"))
}

/// Runs the benchmark binary with `args` (plus a JSON file, REDIS_URL removed); returns its
/// stdout and the JSON report.
fn bench(args: &[&str]) -> (String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_redsem-bench"))
        .args(args)
        .arg("--json")
        .arg(&json)
        .env_remove("REDIS_URL")
        .output()
        .expect("running redsem-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "redsem-bench failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    eprintln!(
        "{args:?} took {:.1} s\n{stdout}",
        started.elapsed().as_secs_f64()
    );
    let report = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // `report FILE` prints the saved run's tables exactly as the run printed them
    let again = Command::new(env!("CARGO_BIN_EXE_redsem-bench"))
        .arg("report")
        .arg(&json)
        .output()
        .expect("running redsem-bench report");
    assert!(
        again.status.success(),
        "redsem-bench report failed: {again:?}"
    );
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        stdout,
        "report differs from the run"
    );
    (stdout, report)
}

/// [`bench`] of `scenarios` for the baseline `counter` (skipped) and `redsem`, one repetition,
/// at 0.2 % of the size, without charts, with `extra` options.
fn bench_tiny(scenarios: &str, extra: &[&str]) -> (String, Value) {
    let mut args = vec![
        "run",
        "--scenarios",
        scenarios,
        "--designs",
        "counter,redsem",
    ];
    args.extend(["--reps", "1", "--jobs-scale", "0.002", "--no-svg"]);
    args.extend(extra);
    bench(&args)
}

#[test]
fn idle_many_and_synced_run_at_a_tiny_size() {
    let (stdout, report) = bench_tiny(
        "idle,many,synced",
        &[
            // three fallback polls (1 s each): a 1 s window can fall between two waiter checks and
            // see no script call at all
            "--idle-window-s",
            "3",
            "--idle-queue-timeout-s",
            "60",
        ],
    );
    for s in ["idle", "many", "synced"] {
        assert!(
            stdout.contains(&format!("## Scenario `{s}`")),
            "no {s} table"
        );
    }
    let results = report["results"].as_array().unwrap();
    let count = |scenario: &str, design: &str| {
        results
            .iter()
            .filter(|r| r["scenario"] == scenario && r["design"] == design)
            .count()
    };
    // one row per number of waiters; the baselines skipped with one row
    assert_eq!(count("idle", "redsem"), 3);
    assert_eq!(count("idle", "counter"), 1);
    assert_eq!(count("many", "redsem"), 1);
    assert_eq!(count("many", "counter"), 1);
    // plain and synced mode
    assert_eq!(count("synced", "redsem"), 2);
    assert_eq!(count("synced", "counter"), 1);
    let mut waiters = Vec::new();
    let mut round_trips = [0.0; 2];
    for r in results {
        let what = format!("{}/{}", r["scenario"], r["design"]);
        if r["design"] == "counter" {
            assert!(r["skipped"].is_string(), "{what}");
            continue;
        }
        let reps = r["reps"].as_array().unwrap();
        assert_eq!(reps.len(), 1, "{what}");
        let rep = &reps[0];
        assert_eq!(rep["complete"], true, "{what}: {rep}");
        if r["scenario"] == "synced" {
            assert_eq!(rep["jobs_done"], rep["jobs_expected"], "{what}: {rep}");
            assert_eq!(f(rep, "acquire_errors"), 0.0, "{what}: {rep}");
            let replicas = r["params"]["synced_replicas"].as_u64().unwrap() as usize;
            round_trips[replicas] = f(rep, "round_trips_per_job");
            continue;
        }
        assert_eq!(f(rep, "grants_after_queued"), 0.0, "{what}: {rep}");
        // every waiter was queued; Redis was watched and saw the heartbeats
        let expected = if r["scenario"] == "idle" {
            let p = &r["params"];
            p["procs"].as_f64().unwrap() * p["jobs_per_proc"].as_f64().unwrap()
        } else {
            r["params"]["semaphores"].as_f64().unwrap()
        };
        assert_eq!(f(rep, "queued"), expected, "{what}: {rep}");
        assert!(f(rep, "script_calls_per_s") > 0.0, "{what}: {rep}");
        assert!(f(rep, "redis_cpu_pct") >= 0.0, "{what}: {rep}");
        assert!(f(rep, "window_s") >= 3.0, "{what}: {rep}");
        if r["scenario"] == "idle" {
            waiters.push(expected);
        }
    }
    assert!(waiters.windows(2).all(|w| w[0] < w[1]), "{waiters:?}");
    // synced mode: one more script call and a WAIT per grant (the same fixed costs otherwise)
    assert!(
        round_trips[1] - round_trips[0] > 1.5,
        "round trips per cycle, plain and synced: {round_trips:?}"
    );
}

#[test]
fn admin_runs_at_a_tiny_size() {
    let (stdout, report) = bench_tiny("admin", &[]);
    assert!(stdout.contains("## Scenario `admin`"), "no admin table");
    // the target of the idle limit-100,000 semaphore's memory is checked, whatever its verdict
    assert!(stdout.contains("≤ 64 KiB: "), "no memory target");
    let results = report["results"].as_array().unwrap();
    let rows: Vec<&Value> = results.iter().filter(|r| r["design"] == "redsem").collect();
    assert_eq!(
        rows.len(),
        5,
        "0 to 10,000 waiters (scaled), and the idle limit-100,000 row"
    );
    assert!(
        results
            .iter()
            .any(|r| r["design"] == "counter" && r["skipped"].is_string())
    );
    for r in rows {
        let rep = &r["reps"][0];
        let what = format!(
            "{} waiters, limit {}: {rep}",
            r["params"]["waiters"], r["params"]["limit"]
        );
        assert_eq!(rep["complete"], true, "{what}");
        assert_eq!(
            f(rep, "queued"),
            r["params"]["waiters"].as_f64().unwrap(),
            "{what}"
        );
        assert!(f(rep, "memory_bytes") > 0.0, "{what}");
        for op in ["open", "stats", "counts", "run"] {
            assert!(f(rep, &format!("{op}_redis_us")) > 0.0, "{op}: {what}");
            assert!(f(rep, &format!("{op}_round_trips")) >= 1.0, "{op}: {what}");
        }
    }
}

#[test]
fn every_design_and_scenario_runs_correctly() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("svg");
    let (stdout, report) = bench(&[
        "run",
        "--scenarios",
        "all",
        "--designs",
        "all",
        "--reps",
        "1",
        "--jobs-scale",
        "0.05",
        "--start-margin-ms",
        "300",
        "--crash-lease-ms",
        "1000",
        "--give-up-s",
        "3",
        "--memory-settle-ms",
        "500",
        "--svg-dir",
        svg.to_str().unwrap(),
    ]);
    for s in ["base", "crash", "scale", "throughput", "handoff", "memory"] {
        assert!(
            stdout.contains(&format!("## Scenario `{s}`")),
            "no {s} table"
        );
    }

    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 6 * 6, "every scenario x design has an entry");
    for r in results {
        let scenario = r["scenario"].as_str().unwrap();
        let design = r["design"].as_str().unwrap();
        let what = format!("{scenario}/{design}");
        if let Some(why) = r["skipped"].as_str() {
            assert!(
                scenario == "memory" && !["redsem", "fifo-notify"].contains(&design),
                "{what} unexpectedly skipped: {why}"
            );
            continue;
        }
        let reps = r["reps"].as_array().unwrap();
        assert_eq!(reps.len(), 1, "{what}");
        let limit = r["params"]["limit"].as_f64().unwrap();
        for rep in reps {
            match scenario {
                "crash" => {
                    let recovered = f(rep, "recovered") == 1.0;
                    assert_eq!(
                        recovered,
                        design != "counter",
                        "{what}: recovered={recovered}: {rep}"
                    );
                }
                "memory" => {
                    assert_eq!(rep["complete"], true, "{what}: {rep}");
                    let waiters = r["params"]["workers"].as_f64().unwrap();
                    assert_eq!(f(rep, "waiters"), waiters, "{what}");
                    assert!(f(rep, "redis_connections") >= 1.0, "{what}: {rep}");
                    assert!(f(rep, "rss_peak_kib") > 0.0, "{what}: {rep}");
                }
                _ => {
                    assert_eq!(rep["timed_out"], false, "{what}: {rep}");
                    assert_eq!(rep["jobs_done"], rep["jobs_expected"], "{what}: {rep}");
                    assert_eq!(rep["complete"], true, "{what}: {rep}");
                    let holders = f(rep, "max_holders");
                    assert!(
                        holders >= 1.0 && holders <= limit,
                        "{what}: {holders} holders, limit {limit}"
                    );
                    assert!(f(rep, "redis_cmds_per_job") > 0.0, "{what}");
                    assert!(f(rep, "round_trips_per_job") > 0.0, "{what}");
                    // a hold is never shorter than asked (it ends at a deadline, not after a
                    // sleep that may be cut short)
                    let asked = r["params"]["hold_ms"].as_f64().unwrap();
                    if asked > 0.0 {
                        assert!(f(rep, "hold_mean_ms") >= asked * 0.999, "{what}: {rep}");
                        assert!(f(rep, "hold_p99_ms") >= asked * 0.999, "{what}: {rep}");
                        assert!(f(rep, "slot_use") > 0.0, "{what}: {rep}");
                    }
                }
            }
        }
    }
    for name in ["base-wait-cdf.svg", "base-holders.svg"] {
        let text = std::fs::read_to_string(svg.join(name)).unwrap();
        assert!(text.contains("<text"), "{name} has no text");
    }
}

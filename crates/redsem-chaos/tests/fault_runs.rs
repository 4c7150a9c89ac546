//! Short runs of the chaos binary with one of the fault kinds that change the server set-up:
//! `failover-replica` (a replica, promoted by the runner, the proxies re-pointed) and
//! `clock-step` (Valkey under libfaketime). Each must inject its faults for real (no
//! `no-replica`, `replica-not-in-sync`, `promotion-failed` or `no-clock`), keep the workers
//! working across them, and pass the checker.

use std::path::{Path, PathBuf};
use std::process::Command;

use redsem_chaos::checker;
use test_support::Flavor;

/// Runs `redsem-chaos` for `seconds` with only `fault`; returns the run's directory.
fn run(fault: &str, seconds: u32, out: &Path) -> PathBuf {
    let status = Command::new(env!("CARGO_BIN_EXE_redsem-chaos"))
        .args(["--seconds", &seconds.to_string(), "--seed", "3"])
        .args(["--workers", "4", "--tasks", "2", "--min-acquisitions", "20"])
        .args(["--faults", fault, "--keep", "--out"])
        .arg(out)
        .status()
        .expect("cannot run redsem-chaos");
    let dir = std::fs::read_dir(out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.is_dir())
        .expect("no run directory");
    assert!(
        status.success(),
        "the {fault} run failed: see {}",
        dir.display()
    );
    dir
}

/// Runs `redsem-chaos` briefly with only `fault`; asserts that it was injected, for real each
/// time (its detail starts with `done`), and that the checker finds no violation. Returns
/// the run's directory.
fn run_and_check(fault: &str, done: &str) -> (tempfile::TempDir, PathBuf) {
    let out = tempfile::tempdir().unwrap();
    let dir = run(fault, 6, out.path());
    let text = std::fs::read_to_string(dir.join("runner.log")).unwrap();
    let details: Vec<&str> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[0] == "fault" && f.get(3) == Some(&fault)).then(|| f[6])
        })
        .collect();
    assert!(!details.is_empty(), "no {fault} was injected");
    for d in &details {
        assert!(d.starts_with(done), "a {fault} did not happen: {d}");
    }
    let r = checker::check(&dir).unwrap();
    assert_eq!(r.total_violations(), 0, "{}", r.text());
    (out, dir)
}

#[test]
fn failovers_to_a_lagging_replica_are_followed_by_the_workers() {
    run_and_check("failover-replica", "lag=");
}

#[test]
fn steps_of_the_servers_clock_are_injected_and_judged() {
    let require = std::env::var("REDSEM_REQUIRE_VALKEY").is_ok_and(|v| v == "1");
    if test_support::server_binary(Flavor::Valkey).is_none()
        || test_support::FakeClock::new().is_none()
    {
        assert!(!require, "clock-step needs Valkey and libfaketime");
        eprintln!("fault_runs: no Valkey or libfaketime, skipping clock-step");
        return;
    }
    let (_out, dir) = run_and_check("clock-step", "step=");
    let cfg: redsem_chaos::config::Config =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg.flavor, "valkey", "clock-step runs on Valkey");
}

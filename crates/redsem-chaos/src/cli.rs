//! The command line: `redsem-chaos [--seconds S] [--seed X]...` runs, `redsem-chaos check DIR`
//! re-checks the logs of a run.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use crate::checker;
use crate::config::{Config, FaultKind};

/// Options of a chaos run.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Length of the fault phase, in seconds (plus ~10 s of set-up, calm, stop and checks).
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Seed of the fault schedule and of the workers' choices; `random` draws one (printed
    /// first). Repeat for several runs in a row.
    #[arg(long = "seed", default_value = "random")]
    pub seeds: Vec<String>,
    /// Worker processes running at once (a killed one is replaced).
    #[arg(long, default_value_t = 12)]
    pub workers: u32,
    /// Concurrent acquire loops per worker process.
    #[arg(long, default_value_t = 3)]
    pub tasks: u32,
    /// Lease of holders and waiters, in ms.
    #[arg(long, default_value_t = 500)]
    pub lease_ms: u64,
    /// Renewal interval, in ms.
    #[arg(long, default_value_t = 125)]
    pub renew_ms: u64,
    /// Fallback poll interval of waiters, in ms.
    #[arg(long, default_value_t = 250)]
    pub fallback_ms: u64,
    /// Tolerance added to every time bound the checker enforces, in ms.
    #[arg(long, default_value_t = 50)]
    pub slack_ms: u64,
    /// Period of the snapshots of Redis, in ms.
    #[arg(long, default_value_t = 40)]
    pub snapshot_ms: u64,
    /// Shortest gap between two faults, in ms.
    #[arg(long, default_value_t = 100)]
    pub fault_gap_min_ms: u64,
    /// Longest gap between two faults, in ms.
    #[arg(long, default_value_t = 500)]
    pub fault_gap_max_ms: u64,
    /// Fault kinds to inject, comma-separated (default: all of them but `clock-step`, which
    /// needs Valkey).
    #[arg(long, value_delimiter = ',')]
    pub faults: Vec<FaultKind>,
    /// Fault kinds not to inject, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub without: Vec<FaultKind>,
    /// Fault kinds to inject besides those of `--faults` (or the default ones),
    /// comma-separated: `--with clock-step` is every kind.
    #[arg(long, value_delimiter = ',')]
    pub with: Vec<FaultKind>,
    /// `redis` or `valkey` (`clock-step` runs on Valkey whatever this says: Redis 7.0.15
    /// hangs under libfaketime).
    #[arg(long, default_value = "redis")]
    pub flavor: String,
    /// The workers run redsem's scripts (EVALSHA) instead of its Functions library (FCALL),
    /// the path of servers where the library cannot be used.
    #[arg(long)]
    pub scripts_only: bool,
    /// Where the logs go (one directory per run inside).
    #[arg(long, default_value = "target/chaos")]
    pub out: PathBuf,
    /// Keep the logs of passing runs too (failing runs always keep theirs).
    #[arg(long)]
    pub keep: bool,
    /// Fail unless at least this many acquisitions were made (a run that did nothing proves
    /// nothing).
    #[arg(long, default_value_t = 100)]
    pub min_acquisitions: usize,
}

/// Options of `check`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The directory of a run (holding config.json and the logs).
    pub dir: PathBuf,
}

/// Runs one chaos run per seed; returns the process exit code (0: every run passed).
///
/// # Errors
/// Set-up failures (no server binary, unwritable directory).
pub fn run(args: RunArgs) -> anyhow::Result<u8> {
    let seeds: Vec<u64> = args
        .seeds
        .iter()
        .map(|s| {
            if s == "random" {
                Ok(fastrand::u64(1..u64::from(u32::MAX)))
            } else {
                s.parse().with_context(|| format!("bad seed {s:?}"))
            }
        })
        .collect::<anyhow::Result<_>>()?;
    println!(
        "redsem-chaos: seeds {} ({} s each)",
        seeds
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        args.seconds
    );
    // what the run was given besides its length and seeds: the fault kinds, when they are
    // not the default ones, and the path the workers take
    let kinds = config(&args, 0).faults;
    let mut extra = if kinds == FaultKind::defaults() {
        String::new()
    } else {
        let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
        format!(" --faults {}", names.join(","))
    };
    if args.scripts_only {
        extra.push_str(" --scripts-only");
    }
    let mut failed = Vec::new();
    for seed in seeds {
        println!(
            "redsem-chaos: seed {seed}: reproduce with `cargo run --release -p redsem-chaos -- --seconds {} --seed {seed}{extra}`",
            args.seconds
        );
        if !run_one(&args, seed)? {
            failed.push(seed);
        }
    }
    if failed.is_empty() {
        Ok(0)
    } else {
        let list: Vec<String> = failed.iter().map(u64::to_string).collect();
        eprintln!(
            "redsem-chaos: FAILED for seed {} — reproduce with `cargo run --release -p redsem-chaos -- --seconds {} --seed {}{extra}`",
            list.join(", "),
            args.seconds,
            list[0]
        );
        Ok(1)
    }
}

fn config(args: &RunArgs, seed: u64) -> Config {
    let mut faults: Vec<FaultKind> = if args.faults.is_empty() {
        FaultKind::defaults()
    } else {
        args.faults.clone()
    };
    for &k in &args.with {
        if !faults.contains(&k) {
            faults.push(k);
        }
    }
    faults.retain(|k| !args.without.contains(k));
    let mut flavor = args.flavor.clone();
    if faults.contains(&FaultKind::ClockStep) && flavor != "valkey" {
        println!(
            "redsem-chaos: clock-step needs libfaketime, under which Redis 7.0.15 hangs: this run uses Valkey"
        );
        flavor = "valkey".to_owned();
    }
    Config {
        seed,
        seconds: args.seconds,
        workers: args.workers,
        tasks: args.tasks,
        lease_ms: args.lease_ms,
        renew_ms: args.renew_ms,
        fallback_ms: args.fallback_ms,
        slack_ms: args.slack_ms,
        snapshot_ms: args.snapshot_ms,
        fault_gap_ms: (
            args.fault_gap_min_ms,
            args.fault_gap_max_ms.max(args.fault_gap_min_ms),
        ),
        faults,
        sems: Config::default_sems(),
        flavor,
        stall_ms: 20,
        scripts_only: args.scripts_only,
    }
}

fn run_one(args: &RunArgs, seed: u64) -> anyhow::Result<bool> {
    let cfg = config(args, seed);
    let stamp = crate::now_us() / 1_000_000;
    let dir = args.out.join(format!("seed-{seed}-{stamp}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&cfg)?)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(crate::runner::execute(&cfg, &dir))?;
    rt.shutdown_timeout(Duration::from_secs(5));
    let report = checker::check(&dir)?;
    let ok = finish(&report, &dir, args.min_acquisitions)?;
    if ok && !args.keep {
        remove_logs(&dir);
    }
    Ok(ok)
}

fn finish(report: &checker::Report, dir: &Path, min_acquisitions: usize) -> anyhow::Result<bool> {
    let text = report.text();
    std::fs::write(dir.join("report.txt"), &text)?;
    std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(report)?)?;
    println!("{text}");
    let mut ok = report.total_violations() == 0;
    if report.acquisitions < min_acquisitions {
        println!(
            "redsem-chaos: only {} acquisitions (at least {min_acquisitions} wanted): the run proves too little",
            report.acquisitions
        );
        ok = false;
    }
    println!(
        "redsem-chaos: seed {}: {} — logs and report in {}",
        report.seed,
        if ok { "PASSED" } else { "FAILED" },
        dir.display()
    );
    Ok(ok)
}

fn remove_logs(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if !name.starts_with("report.") && name != "config.json" {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Re-checks the logs of a run; returns the exit code.
///
/// # Errors
/// Missing or unreadable logs.
pub fn check(args: CheckArgs) -> anyhow::Result<u8> {
    let report = checker::check(&args.dir)?;
    let ok = finish(&report, &args.dir, 0)?;
    Ok(if ok { 0 } else { 1 })
}

//! `redsem-bench`: benchmark of the `redsem` library against the reference design's four
//! Redis semaphores (see [`designs`]), every worker a real OS process that follows the
//! peers' worker contract (see [`worker`]), so `shared/bench/peers/driver.py` can run it too.
//!
//! `cargo run --release -p redsem-bench` runs the default scenarios ([`scenarios`]; `idle`,
//! `many`, `synced` and `admin` only when named) for every design against a private `redis-server` it
//! starts and stops itself (`test-support`'s [`Server`], in a process group of its own) unless
//! `REDIS_URL` is set, prints one markdown table per scenario ([`report`]), and writes SVG
//! charts ([`chart`]) and optionally JSON.

#![warn(missing_docs)]

pub mod chart;
pub mod designs;
pub mod harness;
pub mod hold;
pub mod metrics;
pub mod report;
pub mod scenarios;
pub mod worker;

use std::time::Instant;

use serde_json::json;
use test_support::{Flavor, Server, ServerOptions};

use crate::harness::Harness;
use crate::scenarios::{Progress, Report, RunArgs};

/// Exit code after Ctrl-C / SIGTERM.
pub const EXIT_INTERRUPTED: i32 = 130;

/// How to install Redis, for the error message when `redis-server` is missing.
pub const INSTALL_HINT: &str = "install it with `sudo apt-get install redis-server` \
    (Debian/Ubuntu; `sudo dnf install redis` on Fedora, `brew install redis` on macOS), \
    or set REDIS_URL to a Redis the benchmark may FLUSHALL";

/// Starts the private `redis-server` of a run: `test-support`'s server (a free loopback port,
/// no persistence, a temporary directory, killed with this process), in a process group of its
/// own so that a terminal's Ctrl-C reaches only the benchmark, which stops its workers first.
/// `extra_args` go to `redis-server` (e.g. `--replicaof`).
pub(crate) fn start_private_redis(extra_args: Vec<String>) -> anyhow::Result<Server> {
    if test_support::server_binary(Flavor::Redis).is_none() {
        anyhow::bail!("redis-server not found on PATH; {INSTALL_HINT}");
    }
    let opts = ServerOptions {
        own_process_group: true,
        enable_debug: false,
        extra_args,
        ..ServerOptions::default()
    };
    // test-support reports a server that does not come up by panicking (with its log)
    std::panic::catch_unwind(|| Server::start_with(Flavor::Redis, opts)).map_err(|e| {
        let why = e
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| e.downcast_ref::<&str>().copied())
            .unwrap_or("it did not start");
        anyhow::anyhow!("could not start a private redis-server: {why}")
    })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The `run` sub-command: starts a private Redis if needed, runs the selected scenarios,
/// prints the tables, writes JSON/SVG, stops Redis (also on error, panic and Ctrl-C).
/// Returns the process exit code.
pub fn run(a: RunArgs) -> anyhow::Result<i32> {
    let (scenarios, designs) = scenarios::selection(&a)?;
    anyhow::ensure!(a.reps >= 1, "--reps must be >= 1");
    anyhow::ensure!(
        a.jobs_scale > 0.0 && a.jobs_scale.is_finite(),
        "--jobs-scale must be > 0"
    );
    let mut server = match &a.redis_url {
        Some(_) => None,
        None => {
            let s = start_private_redis(Vec::new())?;
            eprintln!(
                "started a private redis-server on {} (pid {}), stopped at the end",
                s.url(),
                s.pid()
            );
            Some(s)
        }
    };
    let url = match (&a.redis_url, &server) {
        (Some(u), _) => u.clone(),
        (None, Some(s)) => s.url(),
        (None, None) => unreachable!("a server was started when no URL was given"),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let outcome = rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = body(&a, &url, &scenarios, &designs) => r.map(Some),
            _ = tokio::signal::ctrl_c() => Ok(None),
            _ = term.recv() => Ok(None),
        }
    });
    // dropping the runtime drops every worker handle (kill_on_drop) before Redis stops
    drop(rt);
    if let Some(s) = server.as_mut() {
        s.stop();
    }
    match outcome? {
        None => {
            eprintln!("interrupted: workers killed, private redis-server stopped");
            Ok(EXIT_INTERRUPTED)
        }
        Some(report) => {
            print!("{}", report::render(&report));
            if let Some(path) = &a.json {
                report::write_json(&report, path)?;
                eprintln!("wrote {}", path.display());
            }
            if !a.no_svg {
                for f in chart::write_charts(&report.results, &a.svg_dir)? {
                    eprintln!("wrote {}", f.display());
                }
            }
            Ok(0)
        }
    }
}

/// Prints the tables of a run saved by `--json`, exactly as the run printed them.
///
/// # Errors
/// The file cannot be read, or is not a report this version wrote.
pub fn print_saved(path: &std::path::Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let report: Report = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{} is not a redsem-bench report: {e}", path.display()))?;
    print!("{}", report::render(&report));
    Ok(())
}

async fn body(
    a: &RunArgs,
    url: &str,
    scenarios: &[scenarios::ScenarioKind],
    designs: &[designs::DesignKind],
) -> anyhow::Result<Report> {
    let h = Harness::new(url).await?;
    let t0 = Instant::now();
    let load0 = loadavg();
    let version = h.snapshot().await?.redis_version;
    let total = scenarios::run_count(a, scenarios, designs);
    let progress = Progress::new(total);
    let results = scenarios::run_all(&h, a, scenarios, designs, &progress).await;
    progress.finish();
    let results = results?;
    let meta = [
        ("tool", json!(format!("redsem-bench {}", env!("CARGO_PKG_VERSION")))),
        ("redis_version", json!(version)),
        (
            "redis",
            json!(if a.redis_url.is_some() { url.to_string() } else { "private redis-server".into() }),
        ),
        (
            "nproc",
            json!(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)),
        ),
        ("reps", json!(a.reps)),
        ("jobs_scale", json!(a.jobs_scale)),
        ("scenarios", json!(scenarios.iter().map(|s| s.name()).collect::<Vec<_>>())),
        ("designs", json!(designs.iter().map(|d| d.name()).collect::<Vec<_>>())),
        ("loadavg_start", json!(load0)),
        ("loadavg_end", json!(loadavg())),
        ("elapsed_s", json!(t0.elapsed().as_secs_f64())),
        (
            "worker_runtime",
            json!("one process per worker, single-threaded tokio runtime, one multiplexed redis-rs connection"),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Ok(Report { meta, results })
}

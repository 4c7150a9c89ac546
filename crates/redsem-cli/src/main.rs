//! `redsem`: the command-line tool of the redsem distributed semaphores.
//!
//! A thin layer over the `redsem` library: `run` executes a command while holding permits of
//! a semaphore (like GNU `sem`, `consul lock` or `etcdctl lock`, but distributed, fair and
//! fenced); `stats`, `list`, `watch`, `limit` and `release` let an operator see and steer
//! semaphores; `exporter` serves Prometheus metrics. See `README-cli.md` beside this crate.

#[macro_use]
mod common;
mod exporter;
mod run;
mod show;
mod watch;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use common::parse_duration;

/// Distributed, fair (FIFO), crash-safe and fenced semaphores on Redis.
///
/// Run a command while holding a permit ("at most 4 of these jobs at once, across every
/// machine"), and inspect, watch, resize and export metrics of semaphores.
#[derive(Parser, Debug)]
#[command(
    name = "redsem",
    version,
    propagate_version = true,
    max_term_width = 100
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options shared by every subcommand.
#[derive(Args, Debug, Clone)]
pub struct Global {
    // The help is an attribute, not a doc comment: rustdoc would read `[user:password@]`
    // as an intra-doc link.
    #[arg(
        long,
        help = "Redis URL: redis://[user:password@]host:port[/db], unix:///path/to/redis.sock \
                (or a bare /path/to/redis.sock), redis+cluster://host:port[,host:port...] \
                (Redis Cluster), redis+sentinel://host:port[,host:port...]/master-name \
                (Sentinel); rediss... for TLS",
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379/",
        global = true,
        help_heading = "Connection"
    )]
    pub redis_url: String,

    /// Key prefix of the semaphores (every process that shares a semaphore must use the same).
    #[arg(
        long,
        env = "REDSEM_PREFIX",
        hide_env_values = true,
        default_value = redsem::DEFAULT_PREFIX,
        global = true,
        help_heading = "Connection"
    )]
    pub prefix: String,

    /// How long to try to reach Redis before giving up.
    #[arg(
        long,
        default_value = "3s",
        value_parser = parse_duration,
        global = true,
        help_heading = "Connection"
    )]
    pub connect_timeout: Duration,

    /// TLS: trust only the CA certificates in this PEM file (default: the system's roots).
    #[arg(
        long,
        env = "REDSEM_TLS_CA",
        value_name = "PEM",
        global = true,
        help_heading = "Connection"
    )]
    pub tls_ca: Option<PathBuf>,

    /// TLS: client certificate (PEM), for servers that require one (with --tls-key).
    #[arg(
        long,
        env = "REDSEM_TLS_CERT",
        value_name = "PEM",
        requires = "tls_key",
        global = true,
        help_heading = "Connection"
    )]
    pub tls_cert: Option<PathBuf>,

    /// TLS: private key of the client certificate (PEM).
    #[arg(
        long,
        env = "REDSEM_TLS_KEY",
        value_name = "PEM",
        requires = "tls_cert",
        global = true,
        help_heading = "Connection"
    )]
    pub tls_key: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command while holding permits of a semaphore (waits in FIFO order).
    #[command(
        after_long_help = run::EXIT_CODES_HELP,
        override_usage = "redsem run [OPTIONS] --name <NAME> --limit <L> -- <CMD>..."
    )]
    Run(RunArgs),
    /// Show one semaphore: limit, holders, queue.
    Stats(StatsArgs),
    /// List every semaphore under the prefix: limit, holders, waiters, oldest wait.
    List(ListArgs),
    /// Live view of a semaphore: holders, queue, wait-time trend, alerts.
    Watch(WatchArgs),
    /// Change the limit of an existing semaphore, live, for every process.
    Limit(LimitArgs),
    /// Operator's release of a holder (or a queued waiter): its slots' fences advance.
    Release(ReleaseArgs),
    /// Serve Prometheus metrics of every semaphore under the prefix.
    Exporter(ExporterArgs),
}

/// Arguments of `redsem run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Name of the semaphore (GNU sem: --id).
    #[arg(long, visible_alias = "id", value_name = "NAME")]
    pub name: String,

    /// Most permits held at once, across every machine (GNU sem: -j): the limit the semaphore
    /// is created with. An existing semaphore keeps the limit stored in Redis, which
    /// `redsem limit` changes for everyone.
    #[arg(long, short = 'j', value_name = "L")]
    pub limit: u32,

    /// Permits this command needs at once.
    #[arg(long, default_value_t = 1, value_name = "K")]
    pub permits: u32,

    /// Lease of the permits, renewed while the command runs. If redsem dies, the permits
    /// free within one lease.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub lease: Duration,

    /// Give up waiting after this long (exit 124). 0 means: only if free right now.
    /// Default: wait as long as it takes.
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,

    /// Label shown to operators in `stats` and `watch` (default: host:pid and the command).
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,

    /// When the slot is lost, how long the command has to exit after SIGTERM before its
    /// process group gets SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub kill_after: Duration,

    /// Report waiting, acquisition (slots, fences) and release on stderr.
    #[arg(long, short)]
    pub verbose: bool,

    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Arguments of `redsem stats`.
#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Name of the semaphore.
    pub name: String,
    /// Print the snapshot as JSON (schema in the README).
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `redsem list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `redsem watch`.
#[derive(Args, Debug)]
pub struct WatchArgs {
    /// Name of the semaphore.
    pub name: String,
    /// Time between refreshes.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Warn when more waiters than the limit stay queued for longer than this.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub alert_after: Duration,
    /// Stop after this many refreshes (default: until interrupted).
    #[arg(long, value_name = "N")]
    pub iterations: Option<u64>,
}

/// Arguments of `redsem limit`.
#[derive(Args, Debug)]
pub struct LimitArgs {
    /// Name of the semaphore.
    pub name: String,
    /// The new limit.
    pub limit: u32,
}

/// Arguments of `redsem release`.
#[derive(Args, Debug)]
pub struct ReleaseArgs {
    /// Name of the semaphore.
    pub name: String,
    /// Holder (or waiter) id, as shown by `redsem stats`.
    #[arg(long, value_name = "ID")]
    pub holder: String,
}

/// Arguments of `redsem exporter`.
#[derive(Args, Debug)]
pub struct ExporterArgs {
    /// Address to serve http://ADDR/metrics on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:9721", value_name = "ADDR")]
    pub listen: String,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            let code = match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
                // `run` keeps 1..=123 for the command's own exit codes
                _ if invoked_run() => run::EXIT_REDSEM_ERROR,
                _ => common::EXIT_USAGE,
            };
            return ExitCode::from(code);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say!("redsem: cannot start the async runtime: {e}");
            return ExitCode::from(common::EXIT_ERROR);
        }
    };
    let is_run = matches!(cli.command, Command::Run(_));
    let result = runtime.block_on(async move {
        let g = cli.global;
        match cli.command {
            Command::Run(a) => run::run(&g, a).await,
            Command::Stats(a) => show::stats(&g, a).await,
            Command::List(a) => show::list(&g, a).await,
            Command::Watch(a) => watch::watch(&g, a).await,
            Command::Limit(a) => show::limit(&g, a).await,
            Command::Release(a) => show::release(&g, a).await,
            Command::Exporter(a) => exporter::serve(&g, a).await,
        }
    });
    // Background tasks (renewals, subscriber) stop with the runtime.
    drop(runtime);
    match result {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            say!("redsem: {}", failure.one_line());
            ExitCode::from(if is_run {
                run::EXIT_REDSEM_ERROR
            } else {
                failure.exit_code()
            })
        }
    }
}

/// Whether the (unparsable) command line asked for `run`: its first word that is not an
/// option or an option's value.
fn invoked_run() -> bool {
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--redis-url" | "--prefix" | "--connect-timeout" | "--tls-ca" | "--tls-cert"
            | "--tls-key" => {
                args.next();
            }
            s if s.starts_with('-') => {}
            s => return s == "run",
        }
    }
    false
}

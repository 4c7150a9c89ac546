//! `redsem`: the command-line tool of the redsem distributed semaphores.
//!
//! A thin layer over the `redsem` library: `run` executes a command while holding permits of
//! a semaphore (like GNU `sem`, `consul lock` or `etcdctl lock`, but distributed, fair and
//! fenced); `stats`, `list`, `watch`, `limit`, `release` and `delete` let an operator see and steer
//! semaphores; `exporter` serves Prometheus metrics. See `README-cli.md` beside this crate.
//!
//! The CLI is a library so that every entry point runs the same code: the `redsem` binary
//! (`src/main.rs`), `python -m redsem` and the Python package's `redsem` script, and
//! `npx redsem` (the Node.js package) all call [`main`].

#[macro_use]
mod common;
mod exporter;
mod run;
mod show;
mod watch;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use common::parse_duration;

/// Distributed, fair (FIFO), crash-safe and fenced semaphores on Redis.
///
/// Run a command while holding a permit ("at most 4 of these jobs at once, across every
/// machine"), and inspect, watch, resize, delete and export metrics of semaphores.
#[derive(Parser, Debug)]
#[command(
    name = "redsem",
    version,
    propagate_version = true,
    max_term_width = 100,
    after_help = common::EXIT_STATUS_HELP
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
        long = "redis-url",
        // (`--url`, which newcomers try first, works too)
        alias = "url",
        help = "Redis URL: redis://[user:password@]host:port[/db], unix:///path/to/redis.sock \
                (or a bare /path/to/redis.sock), redis+cluster://host:port[,host:port...] \
                (Redis Cluster), redis+sentinel://host:port[,host:port...]/master-name \
                (Sentinel); rediss... for TLS. Default: $REDSEM_URL, else $REDIS_URL, else \
                redis://127.0.0.1:6379/",
        value_name = "URL",
        env = "REDSEM_URL",
        hide_env_values = true,
        global = true,
        help_heading = "Connection"
    )]
    redis_url: Option<String>,

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
        // (`-1s` reaches the parser, which says what is wrong with it)
        allow_hyphen_values = true,
        help_heading = "Connection"
    )]
    pub connect_timeout: Duration,

    /// Run redsem's scripts with EVALSHA instead of its Redis Functions library (FCALL). Not
    /// needed to get them where the library cannot be used: redsem falls back by itself.
    /// (`load-library` loads the library whatever it says: that is what it is for.)
    #[arg(
        long,
        env = "REDSEM_SCRIPTS_ONLY",
        value_parser = clap::builder::FalseyValueParser::new(),
        global = true,
        help_heading = "Connection"
    )]
    pub scripts_only: bool,

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

/// Where the Redis URL comes from when `--redis-url` and `REDSEM_URL` are absent: the generic
/// variable (which the command of `run` inherits too), then the default.
const FALLBACK_URL_VAR: &str = "REDIS_URL";
/// The Redis URL when nothing names one.
const DEFAULT_URL: &str = "redis://127.0.0.1:6379/";

impl Global {
    /// The Redis URL: `--redis-url`, else `REDSEM_URL`, else `REDIS_URL`, else the default.
    pub fn redis_url(&self) -> String {
        self.redis_url
            .clone()
            .or_else(|| std::env::var(FALLBACK_URL_VAR).ok())
            .unwrap_or_else(|| DEFAULT_URL.to_owned())
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command while holding permits of a semaphore (waits in FIFO order).
    #[command(
        after_long_help = format!("{}\n\n{}", run::RUN_HELP, common::EXIT_STATUS_HELP),
        override_usage = "redsem run [OPTIONS] <NAME> [--] <CMD>..."
    )]
    Run(RunArgs),
    /// Show one semaphore: limit, holders, queue.
    Stats(StatsArgs),
    /// List every semaphore under the prefix: limit, holders, waiters, oldest wait. One it
    /// cannot read (a foreign key, refused by ACL) is named on stderr and the exit status is
    /// 125: the listing is incomplete.
    List(ListArgs),
    /// Live view of a semaphore: holders, queue, wait-time trend, alerts.
    Watch(WatchArgs),
    /// Change the limit of an existing semaphore (L, or +N/-N), live, for every process.
    Limit(LimitArgs),
    /// Operator's release of a holder (or a queued waiter): it learns it at its next renewal.
    Release(ReleaseArgs),
    /// Delete a semaphore and every key of it; refused while in use, unless --force.
    Delete(DeleteArgs),
    /// Serve Prometheus metrics of every semaphore under the prefix.
    Exporter(ExporterArgs),
    /// Load redsem's Redis Functions library (on a cluster, on every master), as a user
    /// allowed FUNCTION LOAD, for applications that may not load it (docs/security.md).
    LoadLibrary,
}

/// Arguments of `redsem run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Name of the semaphore (as `etcdctl lock NAME -- cmd`).
    #[arg(value_name = "NAME")]
    name: Option<String>,

    /// The name as an option, as in GNU sem's --id (and redsem before NAME was positional);
    /// every word after the options is then the command.
    #[arg(long = "name", visible_alias = "id", value_name = "NAME")]
    name_option: Option<String>,

    /// Most permits held at once, across every machine (GNU sem: -j). Creates the semaphore
    /// with this limit; optional once it exists. An existing semaphore keeps the limit stored
    /// in Redis (which `redsem limit` changes for everyone), and redsem uses that one.
    #[arg(
        long,
        short = 'j',
        value_name = "L",
        value_parser = common::parse_limit,
        allow_negative_numbers = true
    )]
    pub limit: Option<u32>,

    /// Fail (exit 125) when the semaphore exists with a limit other than --limit, instead of
    /// using the stored one (as `consul lock -n`).
    #[arg(long, requires = "limit")]
    pub strict_limit: bool,

    /// Run even when Redis's maxmemory-policy can evict the semaphore's keys (allkeys-*, or
    /// volatile-* with a TTL on one of them); by default that fails (exit 125) with the policy
    /// named. An evicted key never lets more than the limit in, but holders whose record was
    /// evicted learn it only at their next renewal.
    #[arg(
        long,
        env = "REDSEM_ALLOW_EVICTING_POLICY",
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    pub allow_evicting_policy: bool,

    /// Permits this command needs at once (at least 1, at most the limit).
    #[arg(
        long,
        default_value_t = 1,
        value_name = "K",
        value_parser = common::parse_permits,
        allow_negative_numbers = true
    )]
    pub permits: u32,

    /// Priority class of the request, 0 (the default) to 9: higher classes are served first,
    /// FIFO within a class, and a request is overtaken by at most 1000 later requests per
    /// class above its own, so none starves.
    #[arg(
        long,
        env = "REDSEM_PRIORITY",
        default_value_t = 0,
        value_name = "P",
        value_parser = common::parse_priority,
        allow_negative_numbers = true
    )]
    pub priority: u8,

    /// Lease of the permits, renewed while the command runs. If redsem dies, the permits
    /// free within one lease. At least 250ms.
    #[arg(long, env = "REDSEM_LEASE", default_value = "10s", value_parser = common::parse_lease)]
    pub lease: Duration,

    /// Give up waiting after this long (exit 124, or -E). 0 means: only if free right now.
    /// Default: wait as long as it takes.
    #[arg(long, env = "REDSEM_TIMEOUT", value_parser = parse_duration)]
    pub timeout: Option<Duration>,

    /// Longest the command may hold the permits, counted from the grant: then it is stopped
    /// as on a lost slot (SIGTERM to its process group, SIGKILL after --kill-after) and
    /// redsem exits 77. Redis stops renewing the permits at that moment, and they are
    /// released as soon as the command is gone. Default: as long as the command runs.
    #[arg(long, env = "REDSEM_MAX_HOLD", value_name = "DURATION", value_parser = common::parse_max_hold)]
    pub max_hold: Option<Duration>,

    /// Do not wait: fail (exit 124, or -E) unless the permits are free right now. The same
    /// as --timeout 0 (flock: -n).
    #[arg(long, short = 'n')]
    pub nonblock: bool,

    /// Exit status when the permits could not be had in time (--timeout, -n), as flock's -E
    /// (whose default is 1; redsem keeps 124, as GNU timeout).
    #[arg(
        long,
        short = 'E',
        value_name = "N",
        default_value_t = common::EXIT_TIMEOUT
    )]
    pub conflict_exit_code: u8,

    /// Label shown to operators in `stats` and `watch`: one line of printable text, at most 200
    /// bytes (default: host:pid and the command).
    #[arg(long, env = "REDSEM_LABEL", value_name = "TEXT", value_parser = common::parse_label)]
    pub label: Option<String>,

    /// Run the command through `sh -c`: its words, joined by spaces, are the script (as
    /// `consul lock`), e.g. `redsem run --shell jobs -- 'make && make test'`.
    #[arg(long)]
    pub shell: bool,

    /// How long the command has to exit after SIGTERM before its process group gets SIGKILL,
    /// when the slot is lost or could run out. While Redis does not confirm renewals, SIGTERM
    /// comes this long before the lease could run out in Redis, and SIGKILL at that moment,
    /// so the command is dead before the slot can be granted elsewhere. Default: a quarter of
    /// --lease, at most 10s; at most half of --lease.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub kill_after: Option<Duration>,

    /// Give the command the Redis URL redsem connected with (password included) as
    /// REDSEM_URL, e.g. for a `redsem run` or a fencing check inside it. Without it, REDSEM_URL
    /// is removed from the command's environment (REDIS_URL, not redsem's own, is left as it
    /// is).
    #[arg(long)]
    pub pass_url: bool,

    /// Report waiting, acquisition (slots, fences) and release on stderr.
    #[arg(long, short)]
    pub verbose: bool,

    /// The command and its arguments (after `--`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<OsString>,
}

impl RunArgs {
    /// Settles which words are the name and which the command: with `--name`, the word clap
    /// took for the positional NAME is the command's first. Errors are usage errors.
    fn settle(&mut self) -> Result<(), clap::Error> {
        use clap::CommandFactory;
        use clap::error::ErrorKind;
        if let Some(name) = self.name_option.take()
            && let Some(first) = self.name.replace(name)
        {
            self.command.insert(0, first.into());
        }
        let missing = match (&self.name, self.command.is_empty()) {
            (None, _) => Some("the semaphore's NAME"),
            (Some(_), true) => Some("the command to run (after NAME, or after `--`)"),
            _ => None,
        };
        match missing {
            Some(what) => {
                let mut cli = Cli::command();
                cli.build(); // names the subcommand `redsem run` in the usage line
                let run = cli.find_subcommand_mut("run").expect("`run` exists");
                Err(run.error(
                    ErrorKind::MissingRequiredArgument,
                    format!("`redsem run` needs {what}"),
                ))
            }
            None => Ok(()),
        }
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }

    /// The command and its arguments, as given.
    pub fn command(&self) -> &[OsString] {
        &self.command
    }

    /// How long to wait: `-n` is `--timeout 0`.
    pub fn wait_limit(&self) -> Option<Duration> {
        if self.nonblock {
            Some(Duration::ZERO)
        } else {
            self.timeout
        }
    }
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
    /// Warn when the head of the queue has waited longer than this, or more waiters than the
    /// limit stay queued for longer than this (both counted from when Redis queued them).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub alert_after: Duration,
    /// Stop after this many refreshes, at least 1 (default: until interrupted); the exit
    /// status is then 125 if the last refresh failed (Redis unreachable), else 0.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: Option<u64>,
}

/// Arguments of `redsem limit`.
#[derive(Args, Debug)]
pub struct LimitArgs {
    /// Name of the semaphore.
    pub name: String,
    /// The new limit (e.g. 4), or a change of the stored limit, applied atomically: +N adds
    /// N permits, -N takes N away (two concurrent changes both count).
    #[arg(
        value_name = "L|+N|-N",
        value_parser = parse_limit_change,
        allow_negative_numbers = true
    )]
    pub limit: LimitChange,
}

/// What `redsem limit` does to the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitChange {
    /// Set it to this value.
    To(u32),
    /// Add this (negative: take away), atomically.
    By(i64),
}

/// `4` sets the limit, `+2` and `-1` change it.
fn parse_limit_change(s: &str) -> Result<LimitChange, String> {
    let bad = || format!("{s:?} is not a limit (e.g. 4) nor a change of it (e.g. +1 or -2)");
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    if let Some(n) = s.strip_prefix('+').filter(|d| digits(d)) {
        n.parse().map(LimitChange::By).map_err(|_| bad())
    } else if let Some(n) = s.strip_prefix('-').filter(|d| digits(d)) {
        n.parse::<i64>()
            .map(|n| LimitChange::By(-n))
            .map_err(|_| bad())
    } else if digits(s) {
        s.parse().map(LimitChange::To).map_err(|_| bad())
    } else {
        Err(bad())
    }
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

/// Arguments of `redsem delete`.
#[derive(Args, Debug)]
pub struct DeleteArgs {
    /// Name of the semaphore.
    pub name: String,
    /// Delete even while permits are held or requests queued: holders lose their permits at
    /// their next renewal (a `redsem run` command is then terminated, exit 75), waiters queue
    /// again (re-creating the semaphore with the limit their handle uses: for a `redsem run`,
    /// the stored limit it found when it started). Refused when a key under the
    /// semaphore's names holds another program's data ("not a redsem semaphore").
    #[arg(long)]
    pub force: bool,
    /// With --force: delete every key under the semaphore's names even when it holds
    /// another program's data (a foreign `cfg` hash, a key of another type). Check first.
    #[arg(long, requires = "force")]
    pub delete_foreign_data: bool,
}

/// Arguments of `redsem exporter`.
#[derive(Args, Debug)]
pub struct ExporterArgs {
    /// Address to serve http://ADDR/metrics on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:9721", value_name = "ADDR")]
    pub listen: String,
}

/// The command line's definition, with `--version` showing the protocol version too (clients
/// of different protocol versions refuse each other's semaphores).
fn command() -> clap::Command {
    use clap::CommandFactory;
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let version = VERSION.get_or_init(|| {
        format!(
            "{} (protocol {})",
            env!("CARGO_PKG_VERSION"),
            redsem::PROTOCOL_VERSION
        )
    });
    Cli::command().version(version.as_str())
}

/// clap's message for `e`, naming the environment variable when the bad value came from one
/// (clap names only the option, which the user did not type), with a value that holds control
/// characters escaped.
fn name_the_env_var(e: &clap::Error, args: &[OsString]) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let mut message = e.render().to_string();
    if !matches!(
        e.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return message;
    }
    let (Some(ContextValue::String(arg)), Some(ContextValue::String(value))) = (
        e.get(ContextKind::InvalidArg),
        e.get(ContextKind::InvalidValue),
    ) else {
        return message;
    };
    // a value with a newline or an escape is shown escaped, on one line
    if value.chars().any(char::is_control) {
        message = message.replacen(&format!("'{value}'"), &format!("{value:?}"), 1);
    }
    // `arg` is the option as clap shows it: `--lease <LEASE>`
    let Some(long) = arg
        .split_whitespace()
        .next()
        .and_then(|a| a.strip_prefix("--"))
    else {
        return message;
    };
    let typed = args.iter().skip(1).any(|a| {
        let a = a.to_string_lossy();
        a == format!("--{long}") || a.starts_with(&format!("--{long}="))
    });
    let root = command();
    let env = std::iter::once(&root)
        .chain(root.get_subcommands())
        .flat_map(|c| c.get_arguments())
        .filter(|a| a.get_long() == Some(long))
        .find_map(|a| a.get_env())
        .filter(|env| std::env::var_os(env).is_some_and(|v| v.to_string_lossy() == *value));
    match env {
        Some(env) if !typed => message.replacen(
            &format!("for '{arg}'"),
            &format!(
                "for '{arg}' from the environment variable {}",
                env.to_string_lossy()
            ),
            1,
        ),
        _ => message,
    }
}

/// Runs the `redsem` command line on `args` (the first is the program's name, as in
/// `std::env::args_os()`) and returns the process's exit status (the scheme of
/// `redsem --help`; `run` passes its command's status through).
///
/// It builds a tokio runtime of its own on the calling thread and blocks until the
/// subcommand ends, so call it from a thread that runs no async runtime (a binding's main
/// thread, before any other work). `run` forwards SIGINT, SIGTERM and SIGHUP of the whole
/// process to its command while it runs.
pub fn main<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    use clap::FromArgMatches;
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let parsed = command()
        .try_get_matches_from(&args)
        .and_then(|mut m| Cli::from_arg_matches_mut(&mut m))
        .and_then(|mut cli| {
            if let Command::Run(a) = &mut cli.command {
                a.settle()?;
            }
            Ok(cli)
        });
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return 0;
            }
            eprint!("{}", name_the_env_var(&e, &args));
            // not clap's 2: `run` keeps 1..=123 for the command's own exit statuses
            return common::EXIT_ERROR;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say!("redsem: cannot start the async runtime: {e}");
            return common::EXIT_ERROR;
        }
    };
    let result = runtime.block_on(async move {
        let g = cli.global;
        match cli.command {
            Command::Run(a) => run::run(&g, a).await,
            Command::Stats(a) => show::stats(&g, a).await,
            Command::List(a) => show::list(&g, a).await,
            Command::Watch(a) => watch::watch(&g, a).await,
            Command::Limit(a) => show::limit(&g, a).await,
            Command::Release(a) => show::release(&g, a).await,
            Command::Delete(a) => show::delete(&g, a).await,
            Command::Exporter(a) => exporter::serve(&g, a).await,
            Command::LoadLibrary => show::load_library(&g).await,
        }
    });
    // Background tasks (renewals, subscriber) stop with the runtime.
    drop(runtime);
    match result {
        Ok(code) => code,
        Err(failure) => {
            say!("redsem: {}", failure.one_line());
            common::EXIT_ERROR
        }
    }
}

//! Private Redis / Valkey servers (single, [`Cluster`], [`Sentinels`], TLS with throwaway
//! certificates) and a fault-injecting TCP proxy for redsem's tests; and [`source`], what a
//! crate's files say about its structure (import cycles, long functions), for structural
//! tests.
//!
//! Everything here is synchronous, so it works from plain `#[test]`s and from
//! `#[tokio::test]`s alike, and it keeps no process-wide state that would break tests running
//! in parallel, either as threads (`cargo test`) or as processes (`cargo nextest`). Ports
//! are reserved across processes with lock files, so a server restarting on its port does not
//! lose it to another test's server.
//!
//! ```no_run
//! use test_support::{Server, flavors};
//!
//! for flavor in flavors() {
//!     let server = Server::start(flavor);
//!     assert_eq!(server.cmd(&["SET", "k", "v"]).as_str(), Some("OK"));
//!     println!("{flavor} listens at {}", server.url());
//! }
//! ```

pub mod cluster;
pub mod proxy;
mod resp;
pub mod sentinel;
mod server;
pub mod source;
pub mod tls;

pub use cluster::{Cluster, ClusterOptions};
pub use proxy::FaultProxy;
pub use resp::Reply;
pub use sentinel::{SentinelOptions, Sentinels};
pub use server::{Server, ServerOptions};
pub use tls::{TlsCerts, TlsServer};

use std::fmt;
use std::fs::File;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Once;

/// Which server implementation to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flavor {
    Redis,
    Valkey,
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Flavor::Redis => "redis",
            Flavor::Valkey => "valkey",
        })
    }
}

impl Flavor {
    fn env_var(self) -> &'static str {
        match self {
            Flavor::Redis => "REDSEM_REDIS_SERVER",
            Flavor::Valkey => "REDSEM_VALKEY_SERVER",
        }
    }

    fn program(self) -> &'static str {
        match self {
            Flavor::Redis => "redis-server",
            Flavor::Valkey => "valkey-server",
        }
    }

    pub(crate) fn install_hint(self) -> &'static str {
        match self {
            Flavor::Redis => "apt-get install -y redis-server (or run scripts/install-deps.sh)",
            Flavor::Valkey => {
                "run scripts/install-deps.sh (it puts valkey-server in .cache/valkey/)"
            }
        }
    }
}

/// The flavours to test: Redis always, Valkey when its binary is found.
///
/// With `REDSEM_REQUIRE_VALKEY=1` a missing Valkey is an error (a panic) instead of a skip.
pub fn flavors() -> Vec<Flavor> {
    let mut all = vec![Flavor::Redis];
    if server_binary(Flavor::Valkey).is_some() {
        all.push(Flavor::Valkey);
    } else if std::env::var("REDSEM_REQUIRE_VALKEY").is_ok_and(|v| v == "1") {
        panic!(
            "REDSEM_REQUIRE_VALKEY=1 but no valkey-server was found (looked at $REDSEM_VALKEY_SERVER, \
             {}, and PATH): run `bash scripts/install-deps.sh`",
            valkey_cache_path().display()
        );
    } else {
        static NOTE: Once = Once::new();
        NOTE.call_once(|| {
            eprintln!("test-support: valkey-server not found, testing Redis only (run scripts/install-deps.sh)")
        });
    }
    all
}

/// Where the binary of `flavor` is, if anywhere.
///
/// Redis: `$REDSEM_REDIS_SERVER`, else `redis-server` on `PATH`.
/// Valkey: `$REDSEM_VALKEY_SERVER`, else `<workspace>/.cache/valkey/valkey-server`, else
/// `valkey-server` on `PATH`. An environment variable that names no executable is a mistake
/// worth a panic rather than a silent fallback.
pub fn server_binary(flavor: Flavor) -> Option<PathBuf> {
    if let Some(value) = std::env::var_os(flavor.env_var()).filter(|v| !v.is_empty()) {
        let given = PathBuf::from(&value);
        let found = if given.components().count() > 1 {
            is_executable(&given).then_some(given)
        } else {
            find_on_path(&value.to_string_lossy())
        };
        return Some(found.unwrap_or_else(|| {
            panic!(
                "{}={} is not an executable file",
                flavor.env_var(),
                value.to_string_lossy()
            )
        }));
    }
    if flavor == Flavor::Valkey {
        let cached = valkey_cache_path();
        if is_executable(&cached) {
            return Some(cached);
        }
    }
    find_on_path(flavor.program())
}

/// A clock of its own for a server process: `libfaketime` preloaded, reading its offset from a
/// file at every call, so that a test can step the server's clock (`TIME`, lease expiries)
/// while it runs. Works with Valkey 9; Redis 7.0.15 hangs under it (its `clock_gettime`
/// recursion check fails), so the clock-step tests use Valkey.
pub struct FakeClock {
    dir: tempfile::TempDir,
}

impl FakeClock {
    /// `None` (with a note) when `libfaketime.so.1` is not installed (`$REDSEM_FAKETIME_LIB`,
    /// else `.cache/libfaketime/libfaketime.so.1` from `scripts/install-deps.sh`). With
    /// `REDSEM_REQUIRE_VALKEY=1` (CI) a missing library is an error (a panic) instead.
    pub fn new() -> Option<FakeClock> {
        let lib = Self::lib();
        if !lib.is_file() {
            if std::env::var("REDSEM_REQUIRE_VALKEY").is_ok_and(|v| v == "1") {
                panic!(
                    "REDSEM_REQUIRE_VALKEY=1 but libfaketime was not found at {}: run `bash scripts/install-deps.sh`",
                    lib.display()
                );
            }
            eprintln!(
                "test-support: libfaketime not found at {}, skipping (run scripts/install-deps.sh)",
                lib.display()
            );
            return None;
        }
        let clock = FakeClock {
            dir: tempfile::Builder::new()
                .prefix("redsem-faketime-")
                .tempdir()
                .expect("cannot create a temp dir for the fake clock"),
        };
        clock.set_offset_ms(0);
        Some(clock)
    }

    fn lib() -> PathBuf {
        std::env::var_os("REDSEM_FAKETIME_LIB")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join(".cache/libfaketime/libfaketime.so.1"))
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("offset")
    }

    /// The environment that makes a server process use this clock (see [`ServerOptions::env`]).
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), Self::lib().display().to_string()),
            (
                "FAKETIME_TIMESTAMP_FILE".into(),
                self.file().display().to_string(),
            ),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
        ]
    }

    /// Sets the server's clock to the real time plus `ms` (negative: behind); takes effect at
    /// its next clock read.
    pub fn set_offset_ms(&self, ms: i64) {
        let text = format!(
            "{}{:.3}\n",
            if ms < 0 { "-" } else { "+" },
            ms.unsigned_abs() as f64 / 1000.0
        );
        let tmp = self.dir.path().join("offset.tmp");
        std::fs::write(&tmp, text).expect("cannot write the fake clock's offset");
        std::fs::rename(&tmp, self.file()).expect("cannot move the fake clock's offset in place");
    }
}

fn valkey_cache_path() -> PathBuf {
    workspace_root().join(".cache/valkey/valkey-server")
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The root of the redsem workspace (the directory holding the top `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// A loopback port that is free right now and not reserved by another test's server.
pub fn free_port() -> u16 {
    reserve_port().port
}

/// A port reserved for one server for as long as this value lives: an exclusive `flock` on
/// `<tmp>/redsem-test-ports/<port>.lock`, which every process using this crate honours.
pub(crate) struct PortLease {
    pub(crate) port: u16,
    _lock: File,
}

pub(crate) fn reserve_port() -> PortLease {
    let dir = std::env::temp_dir().join("redsem-test-ports");
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    for _ in 0..1000 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("cannot bind a loopback port");
        let port = listener.local_addr().unwrap().port();
        let path = dir.join(format!("{port}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return PortLease { port, _lock: file };
        }
    }
    panic!("no free loopback port found after 1000 tries");
}

//! One private server process per [`Server`], on a reserved loopback port, in a temp dir.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{OnceLock, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use crate::resp::{Conn, Reply};
use crate::{Flavor, PortLease, reserve_port, server_binary};

const READY_TIMEOUT: Duration = Duration::from_secs(10);
const CMD_TIMEOUT: Duration = Duration::from_secs(30);
const START_ATTEMPTS: usize = 10;

/// How to configure a [`Server`] beyond the defaults.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Extra command-line arguments, e.g. `["--maxmemory", "10mb"]`.
    pub extra_args: Vec<String>,
    /// Lines of an ACL file, e.g. `"user app on >pw ~redsem:* &redsem:* +@all"`.
    pub acl_users: Vec<String>,
    /// Password of the `default` user (`requirepass`). [`Server::cmd`] authenticates with it.
    pub password: Option<String>,
    /// `--enable-debug-command yes` (the default) so tests can use `DEBUG`.
    pub enable_debug: bool,
    /// Environment variables of the server process, e.g. `LD_PRELOAD` (see [`FakeClock`](crate::FakeClock)).
    pub env: Vec<(String, String)>,
    /// Start the server in a process group of its own (default: the caller's), so that a
    /// terminal's Ctrl-C reaches only the program that started it, which can then stop its
    /// other processes before the server (the benchmark does this).
    pub own_process_group: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            extra_args: Vec::new(),
            acl_users: Vec::new(),
            password: None,
            enable_debug: true,
            own_process_group: false,
            env: Vec::new(),
        }
    }
}

/// A private `redis-server` or `valkey-server` process, killed (and its data dir removed)
/// on drop, even when the test panics. It saves nothing: killing it loses its data.
pub struct Server {
    flavor: Flavor,
    binary: PathBuf,
    opts: ServerOptions,
    lease: PortLease,
    dir: tempfile::TempDir,
    child: Option<Child>,
    pid: u32,
    paused: AtomicBool,
}

enum LaunchError {
    PortTaken,
    Failed(String),
}

impl Server {
    /// Starts a server with default options. Panics (saying how to install it) when the
    /// binary is missing, or with the server's log when it does not come up.
    pub fn start(flavor: Flavor) -> Server {
        Server::start_with(flavor, ServerOptions::default())
    }

    pub fn start_with(flavor: Flavor, opts: ServerOptions) -> Server {
        let binary = server_binary(flavor)
            .unwrap_or_else(|| panic!("{} not found: {}", flavor.program(), flavor.install_hint()));
        let dir = tempfile::Builder::new()
            .prefix(&format!("redsem-{flavor}-"))
            .tempdir()
            .expect("cannot create a temp dir for the server");
        let mut server = Server {
            flavor,
            binary,
            opts,
            lease: reserve_port(),
            dir,
            child: None,
            pid: 0,
            paused: AtomicBool::new(false),
        };
        server.write_acl_file();
        for _ in 0..START_ATTEMPTS {
            match server.launch() {
                Ok(()) => return server,
                Err(LaunchError::PortTaken) => server.lease = reserve_port(),
                Err(LaunchError::Failed(why)) => server.fail(&why),
            }
        }
        server.fail(&format!(
            "no port could be bound in {START_ATTEMPTS} attempts"
        ))
    }

    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    pub fn port(&self) -> u16 {
        self.lease.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port()))
    }

    /// `redis://127.0.0.1:PORT/` (without credentials).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port())
    }

    /// The process id of the current (or last) server process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The server's working directory (holds `server.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Whether the server process is alive (paused counts as alive).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILL, then reap: a crash. The data is lost.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused.store(false, Ordering::SeqCst);
    }

    /// A clean stop: `SHUTDOWN NOSAVE`, else SIGTERM, else SIGKILL, then reap.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        self.resume_if_paused();
        let _ = self.call(&["SHUTDOWN", "NOSAVE"], Duration::from_secs(2));
        let mut exited = wait_timeout(&mut child, Duration::from_secs(5));
        if !exited {
            signal(self.pid, libc::SIGTERM);
            exited = wait_timeout(&mut child, Duration::from_secs(5));
        }
        if !exited {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, with empty data (killing it first if it
    /// still runs), and waits until it answers.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.launch() {
                Ok(()) => return,
                Err(LaunchError::PortTaken) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(100))
                }
                Err(LaunchError::PortTaken) => {
                    self.fail("its port stayed taken by another process")
                }
                Err(LaunchError::Failed(why)) => self.fail(&why),
            }
        }
    }

    /// SIGSTOP: the server keeps its connections but answers nothing until [`Server::resume`].
    pub fn pause(&self) {
        assert!(
            self.child.is_some(),
            "pause: the {} server is not running",
            self.flavor
        );
        signal(self.pid, libc::SIGSTOP);
        self.paused.store(true, Ordering::SeqCst);
    }

    /// SIGCONT.
    pub fn resume(&self) {
        assert!(
            self.child.is_some(),
            "resume: the {} server is not running",
            self.flavor
        );
        signal(self.pid, libc::SIGCONT);
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Sends one command on a new connection (authenticated as `default` when a password
    /// is set) and returns the reply; error replies are returned, I/O errors panic.
    pub fn cmd(&self, args: &[&str]) -> Reply {
        self.try_cmd(args).unwrap_or_else(|e| {
            panic!(
                "{} server on port {}: {args:?} failed: {e}\n--- server log ---\n{}",
                self.flavor,
                self.port(),
                tail(&self.log(), 30)
            )
        })
    }

    /// [`Server::cmd`] without the panic: I/O errors (a killed or paused server) come back.
    pub fn try_cmd(&self, args: &[&str]) -> io::Result<Reply> {
        self.call(args, CMD_TIMEOUT)
    }

    /// Sends one command authenticated as `user` (e.g. one of the ACL users).
    pub fn cmd_as(&self, user: &str, password: &str, args: &[&str]) -> Reply {
        let mut conn = Conn::connect(self.addr(), CMD_TIMEOUT).expect("connect");
        let auth = conn.call(&["AUTH", user, password]).expect("AUTH");
        assert!(auth.is_ok(), "AUTH {user} failed: {auth}");
        conn.call(args).expect("command")
    }

    /// The server's log (and anything it printed), for failure diagnostics.
    pub fn log(&self) -> String {
        let mut log = std::fs::read_to_string(self.dir().join("server.log")).unwrap_or_default();
        let stdio = std::fs::read_to_string(self.dir().join("stdio.log")).unwrap_or_default();
        if !stdio.trim().is_empty() {
            log.push_str("\n--- stdout/stderr ---\n");
            log.push_str(&stdio);
        }
        log
    }

    fn call(&self, args: &[&str], timeout: Duration) -> io::Result<Reply> {
        let mut conn = Conn::connect(self.addr(), timeout)?;
        if let Some(pw) = &self.opts.password {
            let auth = conn.call(&["AUTH", pw])?;
            if !auth.is_ok() {
                return Err(io::Error::other(format!("AUTH failed: {auth}")));
            }
        }
        conn.call(args)
    }

    fn write_acl_file(&self) {
        if self.opts.acl_users.is_empty() {
            return;
        }
        // The ACL file replaces `requirepass`, so the default user's password goes in it.
        let mut lines = self.opts.acl_users.clone();
        if let Some(pw) = &self.opts.password
            && !lines
                .iter()
                .any(|l| l.trim_start().starts_with("user default "))
        {
            lines.push(format!("user default on >{pw} ~* &* +@all"));
        }
        std::fs::write(self.dir().join("users.acl"), lines.join("\n") + "\n")
            .expect("cannot write the ACL file");
    }

    fn args(&self) -> Vec<String> {
        let dir = self.dir().display().to_string();
        let mut args: Vec<String> = [
            "--port",
            &self.port().to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            &dir,
            "--logfile",
            &format!("{dir}/server.log"),
            "--maxclients",
            "10000",
        ]
        .map(String::from)
        .into();
        if self.opts.enable_debug {
            args.extend(["--enable-debug-command".into(), "yes".into()]);
        }
        if !self.opts.acl_users.is_empty() {
            args.extend(["--aclfile".into(), format!("{dir}/users.acl")]);
        } else if let Some(pw) = &self.opts.password {
            args.extend(["--requirepass".into(), pw.clone()]);
        }
        args.extend(self.opts.extra_args.iter().cloned());
        args
    }

    /// Spawns the process on the current port and waits until it answers as itself.
    fn launch(&mut self) -> Result<(), LaunchError> {
        let log_path = self.dir().join("server.log");
        let log_start = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0) as usize;
        let stdio = File::options()
            .create(true)
            .append(true)
            .open(self.dir().join("stdio.log"))
            .expect("cannot open stdio.log");
        let mut cmd = Command::new(&self.binary);
        cmd.args(self.args())
            .current_dir(self.dir())
            .stdin(Stdio::null())
            .stdout(stdio.try_clone().unwrap())
            .stderr(stdio);
        cmd.envs(self.opts.env.iter().map(|(k, v)| (k, v)));
        if self.opts.own_process_group {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        let child = spawn(cmd).map_err(|e| {
            LaunchError::Failed(format!("cannot execute {}: {e}", self.binary.display()))
        })?;
        self.pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        let me = format!("process_id:{}\r\n", self.pid);
        loop {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                let log = std::fs::read(&log_path).unwrap_or_default();
                let new = String::from_utf8_lossy(log.get(log_start..).unwrap_or_default());
                if new.contains("Address already in use") {
                    return Err(LaunchError::PortTaken);
                }
                return Err(LaunchError::Failed(format!(
                    "the server exited at start ({status})"
                )));
            }
            // INFO's process_id tells our server apart from a stranger that holds the port.
            let info = self.call(&["INFO", "server"], Duration::from_millis(500));
            if let Ok(Reply::Bulk(text)) = &info
                && text.contains(&me)
            {
                return Ok(());
            }
            if let Ok(Reply::Error(e)) = &info
                && !e.starts_with("LOADING")
            {
                return Err(LaunchError::Failed(format!("INFO failed: {e}")));
            }
            if Instant::now() > deadline {
                return Err(LaunchError::Failed(format!(
                    "it did not answer within {READY_TIMEOUT:?} (last: {info:?})"
                )));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn fail(&mut self, why: &str) -> ! {
        self.kill();
        panic!(
            "{} server ({}) on port {} failed: {why}\n--- server log ---\n{}",
            self.flavor,
            self.binary.display(),
            self.port(),
            tail(&self.log(), 60)
        );
    }

    fn resume_if_paused(&self) {
        if self.paused.swap(false, Ordering::SeqCst) {
            signal(self.pid, libc::SIGCONT);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if thread::panicking() && self.child.is_some() {
            eprintln!(
                "--- {} server on port {} (pid {}), last log lines ---\n{}",
                self.flavor,
                self.port(),
                self.pid,
                tail(&self.log(), 20)
            );
        }
        self.kill();
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("flavor", &self.flavor)
            .field("port", &self.port())
            .field("pid", &self.pid)
            .field("running", &self.child.is_some())
            .finish()
    }
}

pub(crate) fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of a child we have not reaped yet.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

pub(crate) fn wait_timeout(child: &mut Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return true;
        }
        thread::sleep(Duration::from_millis(10));
    }
    false
}

pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` from one long-lived thread, with `PR_SET_PDEATHSIG = SIGKILL`: servers die
/// with the test process even when it is killed (a timeout) and no `Drop` runs. The signal
/// fires when the *spawning thread* exits, hence a thread that lives as long as the process.
pub(crate) fn spawn(cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("test-support-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(spawn_here(&mut cmd));
                }
            })
            .expect("cannot start the spawner thread");
        tx
    });
    let (tx, rx) = mpsc::channel();
    spawner.send((cmd, tx)).expect("the spawner thread is gone");
    rx.recv().expect("the spawner thread is gone")
}

#[cfg(target_os = "linux")]
fn spawn_here(cmd: &mut Command) -> io::Result<Child> {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook only calls prctl, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    };
    cmd.spawn()
}

#[cfg(not(target_os = "linux"))]
fn spawn_here(cmd: &mut Command) -> io::Result<Child> {
    cmd.spawn()
}

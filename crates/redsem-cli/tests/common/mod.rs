//! Helpers for the tests that run the built `redsem` binary against a private server.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

#[allow(unused_imports)]
pub use test_support::{Flavor, Server, ServerOptions};

/// The command that starts the CLI under test: the built `redsem` binary, or, when
/// `REDSEM_CLI_LAUNCHER` is set, that command (its words split on whitespace), e.g.
/// `/venv/bin/python -m redsem` or `node clients/node/bin/redsem.js`: the same suite then
/// checks the Python and Node.js packages' entry points, which run the same CLI code.
pub fn cli_command() -> Command {
    match std::env::var("REDSEM_CLI_LAUNCHER") {
        Ok(launcher) if !launcher.trim().is_empty() => {
            let mut words = launcher.split_whitespace();
            let mut c = Command::new(words.next().unwrap());
            c.args(words);
            c
        }
        _ => Command::new(env!("CARGO_BIN_EXE_redsem")),
    }
}

/// The binary under test, pointed at `server` with the default prefix.
pub fn redsem(server: &Server) -> Command {
    redsem_at(&server.url())
}

/// The binary under test, pointed at `url`.
pub fn redsem_at(url: &str) -> Command {
    let mut c = cli_command();
    c.env("REDIS_URL", url).stdin(Stdio::null());
    for var in [
        "REDSEM_URL",
        "REDSEM_PREFIX",
        "REDSEM_LEASE",
        "REDSEM_TIMEOUT",
        "REDSEM_LABEL",
    ] {
        c.env_remove(var);
    }
    c
}

/// Runs to completion; panics if it takes longer than a minute.
pub fn run(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start redsem");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        out.read_to_end(&mut v).unwrap();
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        err.read_to_end(&mut v).unwrap();
        v
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("redsem hung: {cmd:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

pub fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A process started in the background, killed (SIGKILL) and reaped on drop.
pub struct Background(pub Option<Child>);

impl Background {
    pub fn spawn(cmd: &mut Command) -> Background {
        Background(Some(cmd.spawn().expect("cannot start redsem")))
    }

    pub fn pid(&self) -> i32 {
        self.0.as_ref().unwrap().id() as i32
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    /// Waits for the exit status, at most `limit`.
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let child = self.0.as_mut().unwrap();
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the exit and returns (exit code, stderr).
    pub fn finish(&mut self, limit: Duration) -> (i32, String) {
        let st = self
            .wait_timeout(limit)
            .unwrap_or_else(|| panic!("redsem did not exit within {limit:?}"));
        let mut err = String::new();
        if let Some(mut e) = self.0.as_mut().unwrap().stderr.take() {
            e.read_to_string(&mut err).unwrap();
        }
        (st.code().unwrap_or(-1), err)
    }

    /// Reads stderr lines until one contains `needle`; returns that line.
    pub fn stderr_line_with(&mut self, needle: &str) -> String {
        let err = self
            .0
            .as_mut()
            .unwrap()
            .stderr
            .take()
            .expect("stderr piped");
        let mut reader = BufReader::new(err);
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap() == 0 {
                panic!("stderr closed before a line with {needle:?}");
            }
            if line.contains(needle) {
                return line.trim().to_owned();
            }
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Polls `cond` every 20 ms until it holds; panics with `what` after `limit`.
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `redsem stats NAME --json`, parsed.
pub fn stats_json(server: &Server, name: &str) -> serde_json::Value {
    let out = run(redsem(server).args(["stats", name, "--json"]));
    assert_eq!(code(&out), 0, "stats failed: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("stats --json is JSON")
}

/// (holders, waiters) of `name`, or `None` while it does not exist.
pub fn counts(server: &Server, name: &str) -> Option<(usize, usize)> {
    let out = run(redsem(server).args(["stats", name, "--json"]));
    if code(&out) != 0 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Some((
        v["holders"].as_array().unwrap().len(),
        v["waiters"].as_array().unwrap().len(),
    ))
}

/// Whether the process `pid` is gone (or a zombie nobody reaped yet).
pub fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // state is the field after the parenthesised command name
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// Reads a pid written by a test command into `path`, waiting for it to appear.
pub fn read_pid(path: &Path) -> i32 {
    let mut pid = None;
    wait_until(Duration::from_secs(20), "the command to start", || {
        pid = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        pid.is_some()
    });
    pid.unwrap()
}

/// Every key of semaphore `name` under the default prefix.
pub fn keys(name: &str) -> Vec<String> {
    ["cfg", "queue", "exp", "meta", "slots", "free", "own"]
        .iter()
        .map(|s| format!("redsem:{{{name}}}:{s}"))
        .collect()
}

/// An HTTP/1.1 GET of `path` from `addr` (`host:port`): the whole response, head and body.
pub fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    response
}

/// A running `redsem exporter --listen 127.0.0.1:0` against `server`, and its address.
pub fn spawn_exporter(server: &Server) -> (Background, String) {
    spawn_exporter_with(&mut redsem(server))
}

/// [`spawn_exporter`] with the command `cmd` (its URL, its environment).
pub fn spawn_exporter_with(cmd: &mut Command) -> (Background, String) {
    let mut exporter = Background::spawn(
        cmd.args(["exporter", "--listen", "127.0.0.1:0"])
            .stderr(Stdio::piped()),
    );
    let line = exporter.stderr_line_with("serving http://");
    let addr = line
        .split("http://")
        .nth(1)
        .unwrap()
        .trim_end_matches("/metrics")
        .to_owned();
    (exporter, addr)
}

//! A private `redis-server` for one benchmark run: a free loopback port, no persistence, a
//! temporary directory, stopped when the guard is dropped (normal end, error, panic unwind,
//! and Ctrl-C/SIGTERM, which the harness turns into a normal return) and, as a last resort,
//! by the kernel when the harness itself dies (`PR_SET_PDEATHSIG`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How to install Redis, for the error message when `redis-server` is missing.
pub const INSTALL_HINT: &str = "install it with `sudo apt-get install redis-server` \
    (Debian/Ubuntu; `sudo dnf install redis` on Fedora, `brew install redis` on macOS), \
    or set REDIS_URL to a Redis the benchmark may FLUSHALL";

/// A running private Redis; dropping it stops the server and removes its directory.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

/// Finds an executable on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl RedisServer {
    /// Starts `redis-server` on a free loopback port and waits until it answers PING.
    ///
    /// Must be called from the thread that lives as long as the server should (the main
    /// thread): `PR_SET_PDEATHSIG` fires when the *thread* that forked exits.
    pub fn start() -> anyhow::Result<RedisServer> {
        let Some(bin) = which("redis-server") else {
            bail!("redis-server not found on PATH; {INSTALL_HINT}");
        };
        let mut last_err = None;
        for _ in 0..5 {
            let port = free_port()?;
            match Self::start_on(&bin, port) {
                Ok(s) => return Ok(s),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("could not start redis-server")))
    }

    fn start_on(bin: &Path, port: u16) -> anyhow::Result<RedisServer> {
        let dir = tempfile::Builder::new()
            .prefix("redsem-bench-redis-")
            .tempdir()?;
        let log = dir.path().join("redis.log");
        let mut cmd = Command::new(bin);
        cmd.arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--maxclients", "10000", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // own process group: the terminal's Ctrl-C reaches only the harness, which then
            // stops everything in order
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut server = RedisServer {
            child: Some(child),
            port,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if ping(port) {
                return Ok(server);
            }
            if let Some(c) = server.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(5).collect();
                server.child = None;
                bail!(
                    "redis-server exited ({status}) on port {port}: {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                );
            }
            if Instant::now() > deadline {
                bail!("redis-server on port {port} did not answer PING within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's URL (`redis://127.0.0.1:PORT/0`).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The server's working directory (log file `redis.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops the server: SIGTERM, then SIGKILL after 3 s. Idempotent.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id() as libc::pid_t;
        // SAFETY: plain kill(2) of our own child, which has not been reaped yet.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    ) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_and_stops() {
        if which("redis-server").is_none() {
            eprintln!("redis-server not on PATH; skipped");
            return;
        }
        let mut s = RedisServer::start().unwrap();
        let port = s.port();
        assert!(ping(port));
        let pid = s.pid().unwrap();
        s.stop();
        assert!(!ping(port));
        // SAFETY: probing with signal 0.
        assert_ne!(unsafe { libc::kill(pid as i32, 0) }, 0);
    }
}

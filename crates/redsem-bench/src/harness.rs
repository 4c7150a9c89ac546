//! The parent side: spawns worker processes (this binary re-executed in `worker` mode, each in
//! its own process group, killed with the harness), hands them a shared wall-clock
//! `start-at`, collects their JSON lines while they run, and talks to Redis (FLUSHALL,
//! CONFIG RESETSTAT, INFO, CLIENT LIST, key state) around each run, as `driver.py` does.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::designs::DesignKind;
use crate::metrics::{JobRecord, RedisSnapshot};
use crate::worker::now_ns;

/// The contract parameters of one worker process.
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    /// Design to run.
    pub design: DesignKind,
    /// Semaphore name.
    pub name: String,
    /// Maximum simultaneous holders.
    pub limit: u32,
    /// Concurrent tasks.
    pub workers: u32,
    /// Jobs of this process.
    pub jobs: u64,
    /// Hold per job, ms.
    pub hold_ms: f64,
    /// Lease, ms.
    pub lease_ms: u64,
    /// Shared start, epoch ms (0 = at once).
    pub start_at_ms: u64,
    /// Print `acquired` events.
    pub announce: bool,
    /// Semaphores the process opens (`--semaphores`, not in the contract; 1 = the contract's
    /// one semaphore named `name`).
    pub semaphores: u32,
    /// `redsem` only: grants wait for this many replicas (`--synced-replicas`, not in the
    /// contract; 0 = off).
    pub synced_replicas: u32,
}

/// What one worker process printed.
#[derive(Debug, Default)]
pub struct WorkerOutput {
    /// Its job lines (with `proc` set to the process index).
    pub jobs: Vec<JobRecord>,
    /// `acq_ns` of its `acquired` events.
    pub acquired: Vec<u64>,
    /// Its summary line, if any.
    pub summary: Option<serde_json::Value>,
    /// The last few KiB of its stderr.
    pub stderr_tail: String,
    /// Exit status (None if it could not be reaped).
    pub status: Option<ExitStatus>,
}

/// A running worker process.
pub struct WorkerProc {
    child: tokio::process::Child,
    /// Process id (= its process group id).
    pub pid: u32,
    shared: Arc<Mutex<WorkerOutput>>,
    acquired: watch::Receiver<usize>,
    stdout_task: JoinHandle<()>,
    stderr_task: JoinHandle<String>,
}

impl WorkerProc {
    /// Waits until the process announced `n` acquisitions; returns their `acq_ns`, or None at
    /// the deadline or if the process ended first.
    pub async fn wait_acquired(&mut self, n: usize, deadline: Instant) -> Option<Vec<u64>> {
        let res = tokio::time::timeout_at(deadline, self.acquired.wait_for(|&c| c >= n)).await;
        match res {
            Ok(Ok(_)) => Some(self.shared.lock().unwrap().acquired.clone()),
            _ => None,
        }
    }

    /// SIGKILL to the process's whole group (`kill -9 -PGID`).
    pub fn kill_group(&self) {
        // SAFETY: killpg on the group we created for this child; harmless if it is gone.
        unsafe {
            libc::killpg(self.pid as libc::pid_t, libc::SIGKILL);
        }
    }

    /// Waits for exit until `deadline`; false on timeout (the process still runs).
    pub async fn wait_until(&mut self, deadline: Instant) -> bool {
        match tokio::time::timeout_at(deadline, self.child.wait()).await {
            Ok(Ok(status)) => {
                self.shared.lock().unwrap().status = Some(status);
                true
            }
            Ok(Err(_)) => true,
            Err(_) => false,
        }
    }

    /// Reaps the process (kill it first if it should not finish) and collects its output.
    pub async fn finish(mut self) -> WorkerOutput {
        if let Ok(status) = self.child.wait().await {
            self.shared.lock().unwrap().status = Some(status);
        }
        let _ = (&mut self.stdout_task).await;
        let tail = (&mut self.stderr_task).await.unwrap_or_default();
        let mut out = std::mem::take(&mut *self.shared.lock().unwrap());
        out.stderr_tail = tail;
        out
    }
}

/// Connection to Redis plus the knowledge of how to start workers.
pub struct Harness {
    /// The Redis every worker uses.
    pub redis_url: String,
    admin: MultiplexedConnection,
    exe: PathBuf,
}

impl Harness {
    /// Connects the admin connection; workers are this executable in `worker` mode.
    pub async fn new(redis_url: &str) -> anyhow::Result<Harness> {
        let admin = crate::designs::connect(redis_url)
            .await
            .with_context(|| format!("connecting to {redis_url}"))?;
        Ok(Harness {
            redis_url: redis_url.to_string(),
            admin,
            exe: std::env::current_exe()?,
        })
    }

    /// `FLUSHALL` + `CONFIG RESETSTAT`, before every run (as `driver.py`).
    pub async fn reset(&self) -> anyhow::Result<()> {
        let mut con = self.admin.clone();
        redis::cmd("FLUSHALL").exec_async(&mut con).await?;
        self.reset_stats().await
    }

    /// `CONFIG RESETSTAT`: `INFO commandstats` counts from zero (its own call included).
    pub async fn reset_stats(&self) -> anyhow::Result<()> {
        self.query::<()>(redis::cmd("CONFIG").arg("RESETSTAT"))
            .await
    }

    /// Any command on the harness's own connection.
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> anyhow::Result<T> {
        let mut con = self.admin.clone();
        Ok(cmd.query_async(&mut con).await?)
    }

    /// `INFO all`, parsed.
    pub async fn snapshot(&self) -> anyhow::Result<RedisSnapshot> {
        let mut con = self.admin.clone();
        let info: String = redis::cmd("INFO").arg("all").query_async(&mut con).await?;
        Ok(RedisSnapshot::parse(&info))
    }

    /// `CLIENT LIST` text.
    pub async fn client_list(&self) -> anyhow::Result<String> {
        let mut con = self.admin.clone();
        Ok(redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut con)
            .await?)
    }

    /// Every key with a short description of its value (`string` value, `zset card=N`, ...).
    pub async fn key_state(&self) -> anyhow::Result<BTreeMap<String, String>> {
        let mut con = self.admin.clone();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut con).await?;
        let mut state = BTreeMap::new();
        for k in keys {
            let t: String = redis::cmd("TYPE").arg(&k).query_async(&mut con).await?;
            let v = match t.as_str() {
                "string" => redis::cmd("GET")
                    .arg(&k)
                    .query_async::<Option<String>>(&mut con)
                    .await?
                    .unwrap_or_default(),
                "zset" => format!(
                    "zset card={}",
                    redis::cmd("ZCARD")
                        .arg(&k)
                        .query_async::<u64>(&mut con)
                        .await?
                ),
                "list" => format!(
                    "list len={}",
                    redis::cmd("LLEN")
                        .arg(&k)
                        .query_async::<u64>(&mut con)
                        .await?
                ),
                "hash" => format!(
                    "hash len={}",
                    redis::cmd("HLEN")
                        .arg(&k)
                        .query_async::<u64>(&mut con)
                        .await?
                ),
                other => other.to_string(),
            };
            state.insert(k, v);
        }
        Ok(state)
    }

    /// Starts one worker process: own process group, SIGKILLed if the harness dies
    /// (`PR_SET_PDEATHSIG`) or drops the handle; contract flags *and* `SEM_*` variables.
    pub fn spawn(&self, spec: &WorkerSpec, index: usize) -> anyhow::Result<WorkerProc> {
        let mut cmd = std::process::Command::new(&self.exe);
        cmd.arg("worker")
            .arg("--design")
            .arg(spec.design.name())
            .arg("--redis-url")
            .arg(&self.redis_url)
            .arg("--name")
            .arg(&spec.name)
            .arg("--limit")
            .arg(spec.limit.to_string())
            .arg("--workers")
            .arg(spec.workers.to_string())
            .arg("--jobs")
            .arg(spec.jobs.to_string())
            .arg("--hold-ms")
            .arg(spec.hold_ms.to_string())
            .arg("--lease-ms")
            .arg(spec.lease_ms.to_string())
            .arg("--start-at-ms")
            .arg(spec.start_at_ms.to_string());
        if spec.announce {
            cmd.arg("--announce");
        }
        if spec.semaphores > 1 {
            cmd.arg("--semaphores")
                .arg(spec.semaphores.to_string())
                .env("SEM_SEMAPHORES", spec.semaphores.to_string());
        }
        if spec.synced_replicas > 0 {
            cmd.arg("--synced-replicas")
                .arg(spec.synced_replicas.to_string())
                .env("SEM_SYNCED_REPLICAS", spec.synced_replicas.to_string());
        }
        cmd.env("SEM_REDIS_URL", &self.redis_url)
            .env("SEM_NAME", &spec.name)
            .env("SEM_LIMIT", spec.limit.to_string())
            .env("SEM_WORKERS", spec.workers.to_string())
            .env("SEM_JOBS", spec.jobs.to_string())
            .env("SEM_HOLD_MS", spec.hold_ms.to_string())
            .env("SEM_LEASE_MS", spec.lease_ms.to_string())
            .env("SEM_START_AT_MS", spec.start_at_ms.to_string())
            .env("SEM_ANNOUNCE", if spec.announce { "1" } else { "0" })
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
            // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        let mut child = cmd.spawn().context("spawning a worker process")?;
        let pid = child.id().unwrap_or(0);
        let stdout = child.stdout.take().context("worker stdout")?;
        let mut stderr = child.stderr.take().context("worker stderr")?;
        let shared = Arc::new(Mutex::new(WorkerOutput::default()));
        let (tx, rx) = watch::channel(0usize);
        let sh = shared.clone();
        let stdout_task = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(line.trim()) else {
                    continue;
                };
                let mut out = sh.lock().unwrap();
                if v.get("event").and_then(|e| e.as_str()) == Some("acquired") {
                    if let Some(t) = v.get("acq_ns").and_then(|t| t.as_u64()) {
                        out.acquired.push(t);
                        tx.send_replace(out.acquired.len());
                    }
                } else if let Some(s) = v.get("summary") {
                    out.summary = Some(s.clone());
                } else if v.get("event").is_none()
                    && let Ok(mut job) = serde_json::from_value::<JobRecord>(v)
                {
                    job.proc = index;
                    out.jobs.push(job);
                }
            }
        });
        let stderr_task = tokio::spawn(async move {
            let mut tail: Vec<u8> = Vec::new();
            let mut buf = [0u8; 8192];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > 16384 {
                    tail.drain(..tail.len() - 8192);
                }
            }
            String::from_utf8_lossy(&tail).into_owned()
        });
        Ok(WorkerProc {
            child,
            pid,
            shared,
            acquired: rx,
            stdout_task,
            stderr_task,
        })
    }

    /// Starts `specs` together, waits for all of them until `timeout` after the start, kills
    /// the rest then; returns their outputs and whether the timeout hit.
    pub async fn run_procs(
        &self,
        specs: &[WorkerSpec],
        timeout: Duration,
    ) -> anyhow::Result<(Vec<WorkerOutput>, bool)> {
        let mut procs = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            procs.push(self.spawn(s, i)?);
        }
        let start_ns = specs
            .iter()
            .map(|s| s.start_at_ms * 1_000_000)
            .max()
            .unwrap_or(0);
        let to_start = Duration::from_nanos(start_ns.saturating_sub(now_ns()));
        let deadline = Instant::now() + to_start + timeout;
        let mut timed_out = false;
        for p in procs.iter_mut() {
            if !p.wait_until(deadline).await {
                timed_out = true;
                break;
            }
        }
        if timed_out {
            for p in &procs {
                p.kill_group();
            }
        }
        let mut outs = Vec::new();
        for p in procs {
            outs.push(p.finish().await);
        }
        Ok((outs, timed_out))
    }
}
